"""Checkpoints (docs/design.md §7): files written atomically with checksums (files.py), and a
background writer that takes in-memory snapshots so that training blocks only for the copy
(writer.py)."""
