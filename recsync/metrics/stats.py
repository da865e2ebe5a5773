"""Small distributions kept as counts ({value: how many}): staleness, sync gaps, τ."""

from __future__ import annotations


def merged_counts(parts) -> dict[int, int]:
    """{value: how many} summed over parts (keys may be strings: JSON and Ray hand them so)."""
    counts: dict[int, int] = {}
    for part in parts:
        for k, n in part.items():
            counts[int(k)] = counts.get(int(k), 0) + n
    return counts


def distribution(counts: dict[int, int]) -> dict:
    """Mean, p99 and max of integer values given as {value: how many times}."""
    if not counts:
        return {"mean": None, "p99": None, "max": None}
    values = sorted(counts)
    total = sum(counts.values())
    p99, seen = values[-1], 0
    for v in values:
        seen += counts[v]
        if seen >= 0.99 * total:
            p99 = v
            break
    return {"mean": sum(v * n for v, n in counts.items()) / total, "p99": p99,
            "max": values[-1]}
