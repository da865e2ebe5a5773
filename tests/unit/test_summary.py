"""summary.json (recsync/run/summary.py): every mode's key is there, None unless the run used the
mode; the workers' figures go to the mode the run ended in; worker restarts in the recovery
section."""

from __future__ import annotations

import pytest

import recsync.run.summary as summary
from recsync.config import load_config
from recsync.modes.base import Mode
from recsync.run.record import RunRecord


def section_mode(name, key):
    def make(cls, cfg, workers, shards, waits):
        return {"mode": name, "workers": workers, "shards": len(shards), "waits": waits}
    return type(name, (Mode,), {"name": name, "summary_key": key,
                                "summary": classmethod(make)})


@pytest.fixture
def modes(monkeypatch):
    fake = {"a": section_mode("a", None), "b": section_mode("b", "bee"),
            "c": section_mode("c", "sea"), "d": section_mode("d", "sea")}
    monkeypatch.setattr(summary, "MODES", fake)
    return fake


def test_every_section_key_is_there_and_none_unless_used(modes):
    cfg = load_config(None, [])
    assert summary.mode_sections(cfg, ["a"], None, [], {}) == {"bee": None, "sea": None}
    assert summary.mode_sections(cfg, ["local"], None, [], {}) == {"bee": None, "sea": None}


def test_the_workers_figures_go_to_the_last_mode(modes):
    cfg = load_config(None, [])
    got = summary.mode_sections(cfg, ["b", "c", "b"], [{"x": 1}], [{}, {}], {"step_s": 2})
    assert got["bee"] == {"mode": "b", "workers": [{"x": 1}], "shards": 2, "waits": {"step_s": 2}}
    assert got["sea"]["workers"] is None  # used, then left: only the shards' figures
    got = summary.mode_sections(cfg, ["d"], [None, None], [], {})  # workers without figures
    assert got == {"bee": None, "sea": {"mode": "d", "workers": None, "shards": 0, "waits": {}}}


def test_worker_restarts_are_listed_from_the_events():
    cfg = load_config(None, ['mode="async"', 'recovery.kind="partial"',
                             "recovery.checkpoint_every_s=1"])
    record = RunRecord()
    record.event(3.0, "killed worker 1", emulated=True, target="worker", index=1)
    record.event(3.5, "worker(s) [1] died; restarted", dead=[1], restarted=[1])
    record.event(9.0, "checkpoint: ...")
    record.event(9.5, "worker(s) [0] died; every worker restarted", dead=[0], restarted=[0, 1])
    got = summary.recovery_summary(cfg, record, {}, 10.0)["worker_restarts"]
    assert got == [{"time_s": 3.5, "dead": [1], "restarted": [1]},
                   {"time_s": 9.5, "dead": [0], "restarted": [0, 1]}]
