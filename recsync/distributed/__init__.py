"""A distributed run (PS shards, a work queue and workers on Ray) and the driver's side of it.

- ``handle``: ``DistributedRun``, one run as its parts, each the one owner of what it knows:
  ``actors`` (the actors and the verbs on them, the one part that speaks to Ray, with
  ``spawn``), ``tallies`` (counts, restarts, rate, clock), ``shard_watch`` (the shards'
  processes as the driver saw them, kills, downtime), ``driver_model`` (the driver's model);
  ``recovery_math``: the arithmetic of recoveries (plain functions).
- ``watch``: the one loop that polls them, writes metrics and carries out decisions.
- ``policy``: what a failure means (a plain function from statuses to a ``Decision``, no Ray);
  ``actions`` carries a decision out.
- ``checkpoints``, ``switching``, ``faults``: checkpoint rounds, switching modes at run time,
  injected failures.
- ``train``: a run from start to end; ``ending``: its end (final checkpoint, the trained rows
  gathered, the final evaluation), covered by recovery.
- ``status``, ``errors``: the typed statuses (no Ray) and RunFailed.

The run's record (events, checkpoints, recoveries, modes) is recsync/run/record.py: a local run
keeps one too, and recsync/run/summary.py builds summary.json from it.

This package's ``__init__`` imports nothing: the policy and its tests stay free of Ray.
"""
