"""Scenario `chaos`'s accounting, without Ray: each kill matched to the recovery after it, the
chunks not completed exactly once, the kill schedule, and the stray-process counter on fake
process lists.

Run: .venv/bin/pytest -q tests/unit/test_chaos_accounting.py
"""

from __future__ import annotations

from recsync.bench import chaos, leftovers


def kill(t, target, index):
    return {"time_s": t, "event": f"killed {target} {index}", "emulated": True,
            "target": target, "index": index}


def summary(status="completed", failures=(), recoveries=(), restarts=(), queue=None):
    return {"status": status, "error": None if status == "completed" else "boom",
            "failures": list(failures),
            "queue": queue or {"chunks": 10, "completed": 10, "completed_more_than_once": 0,
                               "completed_never": 0, "pending": 0, "leased": 0,
                               "released": 2, "released_rows": 300},
            "recovery": {"recoveries": list(recoveries), "worker_restarts": list(restarts),
                         "pls": 0.01, "samples_redone": 0, "lost_pushes": 2}}


def test_each_kill_is_matched_to_the_next_time_its_process_served_again():
    s = summary(
        failures=[kill(10.0, "ps", 0), kill(12.0, "worker", 1), kill(20.0, "ps", 0),
                  kill(30.0, "worker", 0), kill(50.0, "ps", 1)],
        # shard 0 back at 13 s (from the kill at 10 s: its recovery was logged at 20 s, in the
        # same pass of the watch loop that then killed it again), and at 24 s
        recoveries=[{"kind": "partial", "shard": 0, "time_s": 20.0, "ready_s": 13.0},
                    {"kind": "partial", "shard": 0, "time_s": 25.0, "ready_s": 24.0}],
        restarts=[{"time_s": 17.0, "dead": [1], "restarted": [1]},
                  {"time_s": 36.0, "dead": [0], "restarted": [0, 1]}])
    got = [(k["target"], k["index"], k["recovered_s"]) for k in chaos.kill_outcomes(s, 2)]
    assert got == [("ps", 0, 13.0), ("worker", 1, 17.0), ("ps", 0, 24.0), ("worker", 0, 36.0),
                   ("ps", 1, None)]  # shard 1 never came back
    a = chaos.account(s, workers=2)
    assert (a["kills_made"], a["kills_made_workers"], a["kills_made_shards"]) == (5, 2, 3)
    assert a["kills_recovered"] == a["kills_survived"] == 4
    assert a["rows_requeued"] == 300 and a["lost_pushes"] == 2 and a["pls"] == 0.01


def test_a_full_recovery_brings_back_every_worker_and_the_shard():
    s = summary(failures=[kill(5.0, "worker", 0), kill(5.0, "ps", 1), kill(40.0, "worker", 1)],
                recoveries=[{"kind": "full", "shard": 1, "time_s": 5.0, "ready_s": 19.0}])
    got = [k["recovered_s"] for k in chaos.kill_outcomes(s, 2)]
    assert got == [19.0, 19.0, None]  # the kill after the rollback is not recovered by it


def test_a_failed_run_survives_none_of_its_kills():
    s = summary(status="failed", failures=[kill(5.0, "worker", 0), kill(9.0, "worker", 1)],
                restarts=[{"time_s": 7.0, "dead": [0], "restarted": [0]}])
    del s["queue"]  # a failed run's summary has no queue counts
    a = chaos.account(s, workers=2)
    assert a["kills_made"] == 2 and a["kills_recovered"] == 1 and a["kills_survived"] == 0
    assert a["status"] == "failed" and a["error"] == "boom"
    assert a["chunks_not_exactly_once"] is None and a["rows_requeued"] is None


def test_chunks_done_twice_or_never_both_count():
    q = {"chunks": 10, "completed": 10, "completed_more_than_once": 1, "completed_never": 1,
         "pending": 0, "leased": 0}
    assert chaos.chunks_not_exactly_once(summary(queue=q)) == 2
    assert chaos.chunks_not_exactly_once(summary()) == 0
    assert chaos.chunks_not_exactly_once(summary(status="failed")) is None


def test_kills_not_injected_are_not_counted():
    s = summary(failures=[{"time_s": 3.0, "event": "killed (by the user)"}, kill(4.0, "ps", 0)],
                recoveries=[{"kind": "partial", "shard": 0, "time_s": 8.0, "ready_s": 7.0}])
    assert chaos.account(s, workers=2)["kills_made"] == 1


def test_the_kill_schedule_is_seeded_spaced_and_kills_both():
    seed, kills = chaos.kill_schedule(1.0)
    assert (seed, kills) == chaos.kill_schedule(1.0)
    assert len(kills) == chaos.KILLS >= 10
    times = [k["at_s"] for k in kills]
    assert times[0] >= chaos.FIRST_KILL_S
    assert all(b - a >= chaos.MIN_GAP_S - 0.1 for a, b in zip(times, times[1:]))  # (rounded)
    targets = [k["target"] for k in kills]
    assert targets.count("worker") >= chaos.MIN_EACH and targets.count("ps") >= chaos.MIN_EACH
    assert {k["index"] for k in kills} <= set(range(max(chaos.WORKERS, chaos.SHARDS)))
    assert len(chaos.kill_schedule(2.0)[1]) == 2 * chaos.KILLS


def test_lock_step_modes_recover_fully_the_others_partially():
    assert chaos.recovery_kind("sync") == chaos.recovery_kind("hybrid") == "full"
    assert {chaos.recovery_kind(m) for m in ("async", "gba", "shadow", "foreground",
                                              "eager")} == {"partial"}


# -- stray processes -------------------------------------------------------------------------
DRIVER = 100


def proc(ppid, created, cmdline="python x"):
    return {"ppid": ppid, "create_time": created, "cmdline": cmdline}


def test_strays_are_the_jobs_processes_that_outlived_it():
    before = {1: proc(0, 1.0), DRIVER: proc(1, 50.0), 101: proc(DRIVER, 51.0, "resource_tracker"),
              900: proc(1, 40.0, "/tmp/ray/session_2026_1_999/raylet")}  # another driver's
    seen = {DRIVER: {"create_time": 50.0, "role": "driver", "cmdline": "bench"},
            200: {"create_time": 60.0, "role": "raylet", "cmdline": "raylet"},
            201: {"create_time": 61.0, "role": "worker", "cmdline": "ray::Worker"},
            202: {"create_time": 62.0, "role": "ps_shard", "cmdline": "ray::PSShard"}}
    now = {**before,
           201: proc(1, 61.0, "ray::Worker"),  # re-parented to init, still alive
           202: proc(1, 99.0, "bash"),  # pid reused by another process: not the shard
           300: proc(301, 70.0, "default_worker.py"),  # below a child of the driver
           301: proc(DRIVER, 69.0, "sh"),
           400: proc(1, 71.0, f"ray::IDLE --session-name=session_2026-11-23_06-00-00_1_{DRIVER}"),
           401: proc(1, 72.0, f"ray::IDLE --session-name=session_2026-11-23_06-00-00_1_{DRIVER}9")}
    got = {s["pid"]: s["why"] for s in leftovers.find(seen, now, DRIVER, before)}
    assert got == {201: "seen during the run (worker)", 300: "a descendant of the driver",
                   301: "a descendant of the driver", 400: "names the driver's Ray session"}
    assert leftovers.find(seen, before, DRIVER, before) == []  # nothing new: no strays


def test_descendants_follow_the_whole_tree():
    now = {DRIVER: proc(1, 1.0), 2: proc(DRIVER, 1.0), 3: proc(2, 1.0), 4: proc(3, 1.0),
           5: proc(1, 1.0)}
    assert leftovers.descendants(now, DRIVER) == {2, 3, 4}


def test_the_counter_waits_for_exiting_processes_and_reads_this_machine():
    counter = leftovers.StrayCounter(grace_s=0.0)
    counter.before_run()
    assert counter.after_run({})["strays"] == []  # nothing started since
