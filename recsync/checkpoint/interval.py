"""How often to checkpoint, and whether partial recovery pays (docs/design.md §7, the CPR paper).

Inputs: O, the time a checkpoint costs training (measured: how long the shards are blocked by
a snapshot); F, the mean time between failures; S, the number of PS shards; R, the time a
recovery costs. Over a run of length D with failures D / F:

- full recovery (everything rolls back to the last checkpoint): each failure loses on average
  half an interval of work, plus R. Expected overhead fraction O/T + T/(2F) + R/F, smallest at
  Young's interval T = sqrt(2 O F).
- partial recovery (only the failed shard rolls back): no work is redone, but each failure
  loses the failed shard's updates of, on average, half an interval: the expected portion of
  lost samples is PLS = (D/F) x (T/2)/D x 1/S = T / (2 F S). The longest interval that keeps it
  under a target is T = 2 F S x PLS_target, with overhead O/T + R/F.

Partial recovery is chosen only when its expected overhead is lower. Plain functions, tested
against hand computations.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass


def young_interval(save_cost_s: float, mtbf_s: float) -> float:
    """sqrt(2 O F): the checkpoint interval that minimizes full recovery's expected overhead."""
    return math.sqrt(2.0 * save_cost_s * mtbf_s)


def full_overhead(interval_s: float, save_cost_s: float, mtbf_s: float,
                  recovery_s: float = 0.0) -> float:
    """Expected fraction of wall time lost with full recovery: O/T + T/(2F) + R/F."""
    return save_cost_s / interval_s + interval_s / (2.0 * mtbf_s) + recovery_s / mtbf_s


def partial_interval(mtbf_s: float, shards: int, pls_target: float) -> float:
    """The longest interval whose expected PLS, T / (2 F S), stays at or under the target."""
    return 2.0 * mtbf_s * shards * pls_target


def expected_pls(interval_s: float, mtbf_s: float, shards: int) -> float:
    return interval_s / (2.0 * mtbf_s * shards)


def partial_overhead(interval_s: float, save_cost_s: float, mtbf_s: float,
                     recovery_s: float = 0.0) -> float:
    """Expected fraction of wall time lost with partial recovery: O/T + R/F."""
    return save_cost_s / interval_s + recovery_s / mtbf_s


@dataclass(frozen=True)
class Decision:
    kind: str  # "full" or "partial"
    interval_s: float
    expected_overhead: float
    expected_pls: float
    full_interval_s: float
    full_overhead: float
    partial_interval_s: float
    partial_overhead: float
    inputs: dict

    def as_dict(self) -> dict:
        return asdict(self)

    def text(self) -> str:
        i = self.inputs
        return (f"checkpoint interval: save cost {i['save_cost_s'] * 1e3:.1f} ms, MTBF "
                f"{i['mtbf_s']:g} s, {i['shards']} shards, PLS target {i['pls_target']:g}: "
                f"full recovery every {self.full_interval_s:.1f} s (Young) would cost "
                f"{self.full_overhead:.2%}, partial every {self.partial_interval_s:.1f} s "
                f"{self.partial_overhead:.2%} (expected PLS {self.expected_pls:.4f} if chosen); "
                f"{self.kind} chosen")


def choose(save_cost_s: float, mtbf_s: float, shards: int, pls_target: float,
           recovery_s: float = 0.0, partial_recovery_s: float = 0.0) -> Decision:
    """The interval and kind of recovery with the lower expected overhead (partial only if it
    is strictly lower)."""
    if save_cost_s < 0 or mtbf_s <= 0 or shards < 1 or pls_target <= 0:
        raise ValueError(f"need save cost >= 0, MTBF > 0, shards >= 1, PLS target > 0; got "
                         f"{save_cost_s}, {mtbf_s}, {shards}, {pls_target}")
    t_full = max(young_interval(save_cost_s, mtbf_s), 1e-3)
    o_full = full_overhead(t_full, save_cost_s, mtbf_s, recovery_s)
    t_part = partial_interval(mtbf_s, shards, pls_target)
    o_part = partial_overhead(t_part, save_cost_s, mtbf_s, partial_recovery_s)
    partial = o_part < o_full
    interval = t_part if partial else t_full
    return Decision("partial" if partial else "full", interval, o_part if partial else o_full,
                    expected_pls(interval, mtbf_s, shards) if partial else 0.0, t_full, o_full,
                    t_part, o_part,
                    {"save_cost_s": save_cost_s, "mtbf_s": mtbf_s, "shards": shards,
                     "pls_target": pls_target, "recovery_s": recovery_s,
                     "partial_recovery_s": partial_recovery_s})
