"""The validation slice (``train.validation``): the last rows of the training split in time
order, held out of training for model selection, as the eval split is cut from the end of the
data. The training split's parts are in time order (the converters write them so), so the
slice is the tail of its last part(s): the rows kept for training are every row before it.

Pure arithmetic on the parts' row counts; the Dataset (data/reader.py) holds the cut and hands
out chunks of either side. Validation chunks name the "train" split (their rows live there),
so any process can read them without knowing about the cut."""

from __future__ import annotations

VALIDATION = "validation"  # the name of the held-out slice: Dataset.rows / chunks

Range = tuple[int, int, int]  # (part, start, stop) rows of one part


def held_rows(train_rows: int, fraction: float) -> int:
    """Rows held out of ``train_rows`` for ``fraction`` (0: none; else at least one).
    ValueError where nothing would be left to train on."""
    if fraction <= 0:
        return 0
    held = max(1, round(train_rows * fraction))
    if held >= train_rows:
        raise ValueError(f"train.validation = {fraction} holds out {held} of the training "
                         f"split's {train_rows} rows: nothing would be left to train on")
    return held


def cut(part_rows: list[int], held: int) -> tuple[list[Range], list[Range]]:
    """The row ranges kept for training and those held out (the last ``held`` rows), each in
    part order."""
    keep_until = sum(part_rows) - held  # rows before this (counted over all parts) train
    train, valid, first = [], [], 0
    for p, n in enumerate(part_rows):
        split_at = min(max(keep_until - first, 0), n)
        if split_at > 0:
            train.append((p, 0, split_at))
        if split_at < n:
            valid.append((p, split_at, n))
        first += n
    return train, valid
