"""Simulated runs (recsync/simulate) on a small data set: the order of events, the staleness it
gives, sync's one update per step, every chunk once, the outputs and their SIMULATED label.
No Ray."""

from __future__ import annotations

import json
import math

import pytest
import torch

import recsync
from recsync.config import RunConfig
from recsync.data.synthetic import SynthSpec, generate
from recsync.simulation.output import console_lines
from recsync.simulation.run import LINE_EVERY_S, simulate
from recsync.simulation.timing import Speeds, Timing

BATCH = 32
ROWS = 6_400  # 200 batches, one chunk each


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("simdata")
    generate(root, rows=ROWS, eval_rows=512, spec=SynthSpec(seed=2, max_table_rows=50),
             processes=1, progress=False)
    return root


def config(data, mode: str, workers: int, **keys) -> RunConfig:
    cfg = RunConfig.model_validate({
        "mode": mode, "data": {"path": str(data), "chunk_rows": BATCH},
        "cluster": {"workers": workers, "ps_shards": 2},
        "model": {"embedding_dim": 4, "bottom_mlp": [8], "top_mlp": [8, 4]},
        "train": {"batch_size": BATCH, "eval_sample_rows": 256, "threads": 1},
        "output": {"progress": False, "plot": False}})
    return recsync.override(cfg, **keys) if keys else cfg


def free_network(**kwargs) -> Timing:
    """Only compute takes time: the order of events is the workers' speeds alone."""
    return Timing(**{"compute_s": 0.01, "pull_side_s": 0.0, "push_side_s": 0.0,
                     "latency_s": 0.0, "bytes_per_s": math.inf, "pull_s_per_row": 0.0,
                     "push_s_per_row": 0.0, "pull_call_s": 0.0, "push_call_s": 0.0,
                     "collective_latency_s": 0.0, "collective_cpu_s_per_call": 0.0,
                     "collective_cpu_s_per_message": 0.0, "collective_cpu_s_per_byte": 0.0,
                     **kwargs})


def trace(tmp_path, factors) -> Speeds:
    path = tmp_path / "speeds.json"
    path.write_text(json.dumps(factors))
    return Speeds(kind="trace", trace=str(path))


def test_a_worker_twice_as_slow_does_half_the_steps(data, tmp_path):
    timing = free_network(speeds=trace(tmp_path, [1.0, 2.0]))
    s = simulate(config(data, "async", 2), tmp_path / "out", timing=timing)
    fast, slow = (w["steps"] for w in s["per_worker"])
    assert fast + slow == ROWS // BATCH
    assert abs(fast - 2 * slow) <= 2, (fast, slow)
    assert s["simulated"]["per_worker"][1]["factor_at_start"] == 2.0


@pytest.mark.parametrize("workers", [4, 8])
def test_async_staleness_of_n_equal_workers_is_n_minus_1(data, tmp_path, workers):
    """Between a worker's pull and its push every other worker pushes once: the staleness the
    event order gives is N - 1. (The speeds differ by 1% so that the workers do not stay in
    exact step: with every push at the same instant, ties decide the order, not time.)"""
    timing = free_network(speeds=trace(tmp_path, [1 + 0.01 * r for r in range(workers)]))
    s = simulate(config(data, "async", workers), tmp_path / "out", timing=timing)
    assert s["staleness"]["mean"] == pytest.approx(workers - 1, abs=0.25)
    assert s["staleness"]["p99"] <= workers


def test_jitter_breaks_the_ties_of_workers_in_exact_step(data, tmp_path):
    """Equal workers without jitter push at the same instants, and the ties decide the order
    (all pushes, then all pulls: staleness 0 .. N-1, mean (N-1) / 2); with a little jitter each
    worker sees every other's push once: N - 1."""
    workers = 4
    tied = simulate(config(data, "async", workers), tmp_path / "tied", timing=free_network())
    jittered = simulate(config(data, "async", workers), tmp_path / "jitter",
                        timing=free_network(jitter=0.05))
    assert tied["staleness"]["mean"] == pytest.approx((workers - 1) / 2, abs=0.1)
    assert jittered["staleness"]["mean"] == pytest.approx(workers - 1, abs=0.3)


def test_a_jitter_common_to_every_worker_keeps_them_in_step(data, tmp_path):
    """A jitter all common (one draw per bin of the clock, every worker's) moves equal workers
    alike: they stay in exact step as without jitter (the ties' staleness); a part of their
    own sets them apart again."""
    workers = 4
    common = simulate(config(data, "async", workers), tmp_path / "common",
                      timing=free_network(jitter=0.05, jitter_common=1.0))
    half = simulate(config(data, "async", workers), tmp_path / "half",
                    timing=free_network(jitter=0.05, jitter_common=0.5))
    assert common["staleness"]["mean"] == pytest.approx((workers - 1) / 2, abs=0.1)
    assert half["staleness"]["mean"] == pytest.approx(workers - 1, abs=0.3)
    with pytest.raises(ValueError, match="jitter_common"):
        Timing(jitter_common=1.5)


def test_async_on_a_single_worker_is_never_stale(data, tmp_path):
    s = simulate(config(data, "async", 1), tmp_path / "out", timing=free_network())
    assert s["staleness"]["max"] == 0


def test_a_pull_never_overtakes_its_own_workers_push(data, tmp_path):
    """A push carries more bytes than the next pull's request, so it would arrive later; one
    caller's calls to a shard arrive in order (as Ray runs them): one worker is never stale."""
    timing = Timing(compute_s=0.01, pull_side_s=0.0, push_side_s=0.0, bytes_per_s=1e6)
    s = simulate(config(data, "async", 1), tmp_path / "out", timing=timing)
    assert s["staleness"]["max"] == 0


def test_the_workers_own_cpu_is_charged_around_the_compute_and_measured_when_not_given(
        data, tmp_path):
    steps = ROWS // BATCH
    costs = free_network(pull_side_s=0.002, push_side_s=0.003)
    s = simulate(config(data, "async", 1), tmp_path / "given", timing=costs)
    assert s["train_s"] == pytest.approx(steps * 0.015, rel=1e-6)
    assert s["simulated"]["measured_here"] == []
    measured = simulate(config(data, "async", 1), tmp_path / "measured",
                        timing=Timing(compute_s=0.01))
    assert measured["simulated"]["measured_here"] == ["pull_side_s", "push_side_s"]
    t = measured["simulated"]["timing"]
    assert t["pull_side_s"] > 0 and t["push_side_s"] > 0


def test_cpu_after_the_compute_is_outside_the_staleness_window(data, tmp_path):
    """Time after the push left (push_side_s) is not between a pull and its push: with it as
    long as the compute, two equal workers' staleness halves (each sees the other's push in
    half its window's share of time)."""
    def staleness(pull_side, push_side):
        timing = free_network(pull_side_s=pull_side, push_side_s=push_side,
                              speeds=trace(tmp_path, [1.0, 1.01]))
        return simulate(config(data, "async", 2), tmp_path / f"{pull_side}-{push_side}",
                        timing=timing)["staleness"]["mean"]

    inside, outside = staleness(0.01, 0.0), staleness(0.0, 0.01)
    assert inside == pytest.approx(1.0, abs=0.1)
    assert outside == pytest.approx(0.5, abs=0.1)


def test_a_shards_fixed_cost_per_call_is_charged_whatever_its_rows(data, tmp_path):
    """One worker, pulls and pushes of a few rows: each step waits its pull's fixed cost at
    the shards (served in parallel), and the push's cost delays the next pull behind it."""
    steps = ROWS // BATCH
    pull_only = simulate(config(data, "async", 1), tmp_path / "pull",
                         timing=free_network(pull_call_s=0.004))
    assert pull_only["train_s"] == pytest.approx(steps * 0.014, rel=1e-6)
    both = simulate(config(data, "async", 1), tmp_path / "both",
                    timing=free_network(pull_call_s=0.004, push_call_s=0.003))
    assert both["train_s"] == pytest.approx(steps * 0.017, rel=1e-6)


def test_a_workers_pull_round_trip_is_the_latency_both_ways_and_the_shards_service(data,
                                                                                    tmp_path):
    """Reported per worker (what scenario simulated's validation fits its latency to): the
    two shards serve the pull in parallel, 1 ms there, 4 ms of service, 1 ms back."""
    run = simulate(config(data, "async", 1), tmp_path / "rtt",
                   timing=free_network(pull_call_s=0.004, latency_s=0.001))
    (worker,) = run["simulated"]["per_worker"]
    assert worker["pull_s"] == pytest.approx(0.006, rel=1e-6)


def test_paced_cpu_is_a_floor_that_the_sections_waits_count_toward(data, tmp_path):
    """As the EMULATED runtime paces a worker: the section up to the compute lasts the
    longer of its wait (the pull's 4 ms at the shards) and its CPU, not their sum."""
    steps = ROWS // BATCH

    def train_s(name, **kwargs):
        timing = free_network(pull_call_s=0.004, **kwargs)
        return simulate(config(data, "async", 1), tmp_path / name, timing=timing)["train_s"]

    assert train_s("added", pull_side_s=0.003) == pytest.approx(steps * 0.017, rel=1e-6)
    assert train_s("hidden", pull_side_s=0.003, paced=True) == pytest.approx(steps * 0.014,
                                                                              rel=1e-6)
    assert train_s("longer", pull_side_s=0.006, paced=True) == pytest.approx(steps * 0.016,
                                                                              rel=1e-6)


def test_an_all_reduces_cpu_slows_a_slower_worker_and_is_a_floor_when_paced(data, tmp_path):
    """Sync at 2 workers, each all-reduce 2 messages of 5 ms of each member's CPU. The ring's
    time holds that CPU at full speed: equal workers take no more. A worker twice as slow takes
    its extra 10 ms after the step; paced, each member's section after the compute lasts at
    least its CPU x factor, and the fast one's 10 ms wait for the slow one at the all-reduce
    counts toward its own 10 ms."""
    steps = ROWS // BATCH // 2

    def train_s(name, factors, **kwargs):
        timing = free_network(collective_cpu_s_per_message=0.005,
                              speeds=trace(tmp_path, factors), **kwargs)
        return simulate(config(data, "sync", 2), tmp_path / name, timing=timing)["train_s"]

    assert train_s("equal", [1.0, 1.0]) == pytest.approx(steps * 0.01, rel=1e-6)
    # the slow worker: 20 ms of compute + 10 ms more of the all-reduce's CPU; the last step
    # (no batch anywhere) is its all-reduce alone
    assert train_s("slower", [1.0, 2.0]) == pytest.approx(steps * 0.03 + 0.01, rel=1e-6)
    assert train_s("paced", [1.0, 2.0], paced=True) == pytest.approx(
        steps * 0.04 + 0.02, rel=1e-6)
    t = Timing(collective_cpu_s_per_call=5e-3, collective_cpu_s_per_message=1e-3,
               collective_cpu_s_per_byte=1e-6)
    assert t.all_reduce_cpu_s(4_000, 4) == pytest.approx(5e-3 + 6 * (1e-3 + 1_000 * 1e-6))
    assert t.all_reduce_cpu_s(4_000, 1) == 0.0


def test_sync_applies_exactly_one_update_per_global_step(data, tmp_path):
    workers = 4
    timing = free_network(speeds=trace(tmp_path, [1.0, 1.0, 3.0, 1.0]))
    s = simulate(config(data, "sync", workers), tmp_path / "out", timing=timing)
    steps = ROWS // BATCH // workers
    assert [w["steps"] for w in s["per_worker"]] == [steps] * workers  # in lockstep
    assert s["steps"] == steps  # the most of any worker, as a real run's summary counts
    # one update per global step on every shard (in the last step no worker had a batch: the
    # all-reduce says so and nothing is pushed)
    assert [sh["version"] for sh in s["per_shard"]] == [steps] * 2
    assert s["staleness"]["max"] == 0
    assert s["simulated"]["all_reduce_rounds"] == steps + 1
    # the straggler sets the pace: every step takes its 3 x compute (the last step, without
    # a batch anywhere, computes nothing)
    assert s["train_s"] == pytest.approx(3 * 0.01 * steps, rel=1e-6)


def test_every_chunk_is_consumed_exactly_once(data, tmp_path):
    timing = free_network(speeds=Speeds(kind="stragglers", share=0.3, seed=1))
    s = simulate(config(data, "gba", 8), tmp_path / "out", timing=timing)
    q = s["queue"]
    assert q["chunks"] == q["completed"] == ROWS // BATCH
    assert q["completed_more_than_once"] == q["completed_never"] == 0
    assert q["pending"] == q["leased"] == 0
    assert s["samples"] == ROWS


def test_gba_applies_one_update_per_global_batch(data, tmp_path):
    workers = 4
    s = simulate(config(data, "gba", workers), tmp_path / "out", timing=free_network())
    # every push reaches both shards; each applies the mean of `workers` of them at a time
    assert [sh["version"] for sh in s["per_shard"]] == [ROWS // BATCH // workers] * 2
    assert s["gba"]["applied"] == 2 * ROWS // BATCH


def test_the_outputs_exist_and_are_labelled_simulated(data, tmp_path):
    out = tmp_path / "out"
    cfg = recsync.override(config(data, "async", 3), **{"output.plot": True})
    returned = simulate(cfg, out, timing=free_network())
    for name in ("config.toml", "metrics.jsonl", "summary.json", "training.png"):
        assert (out / name).exists(), name
    written = json.loads((out / "summary.json").read_text())
    assert written["label"] == "SIMULATED" and returned["label"] == "SIMULATED"
    sim = written["simulated"]
    assert "SIMULATED" in sim["label"] and sim["simulated_train_s"] == written["train_s"]
    assert sim["real_wall_s"] > 0 and sim["real_wall_s"] != sim["simulated_train_s"]
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [x for x in lines if "time_s" in x and x.get("loss") is not None]
    assert steps and all(x["simulated"] for x in steps)
    assert any(x.get("eval") for x in lines)
    # on the simulated clock: the last line at the end, or the watch loop's first tick after
    assert written["train_s"] <= lines[-1]["time_s"] < written["train_s"] + LINE_EVERY_S
    printed = console_lines(written, out)
    assert printed[0].startswith("SIMULATED") and any("real wall time" in x for x in printed)


def test_the_last_line_is_written_at_the_watch_loops_next_tick(data, tmp_path):
    """A real run's watch loop sees the end at its next poll: the last line's time (and a rate
    measured up to it) includes that wait; the summary's train_s is the last worker's end."""
    cfg = recsync.override(config(data, "async", 2), **{"train.eval_every_samples": 10**12})
    s = simulate(cfg, tmp_path / "out", timing=free_network(compute_s=0.0123))
    lines = [json.loads(x) for x in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()
             if '"time_s"' in x]
    assert s["train_s"] == pytest.approx(ROWS // BATCH // 2 * 0.0123, rel=1e-6)
    last = lines[-1]["time_s"]
    assert last > s["train_s"] and last / LINE_EVERY_S == pytest.approx(round(last / LINE_EVERY_S))
    assert lines[-1]["samples"] == ROWS


def test_an_end_a_rounding_error_past_a_tick_is_the_last_lines_time(data, tmp_path):
    """Twenty steps of 0.1 s end at 2.0000000000000004 s (floating point), past the tick at
    2.0 that the last line would take: the line is written at the end itself."""
    cfg = recsync.override(config(data, "async", 1), **{"train.max_steps": 20,
                                                        "train.eval_every_samples": 10**12})
    s = simulate(cfg, tmp_path / "out", timing=free_network(compute_s=0.1))
    last = json.loads((tmp_path / "out" / "metrics.jsonl").read_text().splitlines()[-1])
    assert s["train_s"] > 2.0 and last["time_s"] == s["train_s"] and last["samples"] == 20 * BATCH


def test_the_same_run_twice_gives_the_same_updates(data, tmp_path):
    # (both costs given: measured ones would differ from run to run)
    timing = Timing(compute_s=0.004, pull_side_s=0.001, push_side_s=0.001,
                    speeds=Speeds(kind="lognormal", seed=4))
    a = simulate(config(data, "gba", 5), tmp_path / "a", timing=timing)
    b = simulate(config(data, "gba", 5), tmp_path / "b", timing=timing)
    assert a["eval"]["auc"] == b["eval"]["auc"]
    assert a["staleness"] == b["staleness"] and a["train_s"] == b["train_s"]


def test_eager_overlaps_its_pull_with_compute_on_the_simulated_clock(data, tmp_path):
    """Eager sends the next batch's pull before computing: its waits (on the simulated clock)
    are far below the compute time, and the pull misses the worker's own last push (each
    update's τ is at least 1 where another worker pushed meanwhile)."""
    timing = free_network(latency_s=0.002)
    cfg = recsync.override(config(data, "eager", 2), **{"eager.own_update": "none"})
    s = simulate(cfg, tmp_path / "out", timing=timing)
    split = s["eager"]["iteration_s"]  # per step, simulated seconds
    assert split["compute"] == pytest.approx(0.01)
    assert split["pull_wait"] < 0.5 * split["compute"]
    assert s["samples"] == ROWS and s["staleness"]["mean"] >= 1.0
    seq = simulate(recsync.override(cfg, **{"eager.overlap": False}), tmp_path / "seq",
                   timing=timing)
    # sequential: every step waits a pull's and a push's round trip (4 x 2 ms)
    assert seq["eager"]["iteration_s"]["pull_wait"] == pytest.approx(0.004)
    assert s["train_s"] < 0.9 * seq["train_s"]


@pytest.mark.parametrize("mode", ["shadow", "foreground"])
def test_what_the_simulator_cannot_run_is_refused_by_name(data, tmp_path, mode):
    cfg = config(data, mode, 2, **{"shadow.hogwild_threads": 2})
    with pytest.raises(ValueError, match=r"does not model shadow.hogwild_threads > 1"):
        simulate(cfg, tmp_path / "out", timing=free_network())
    assert not (tmp_path / "out").exists()


def test_python_call_sets_workers_and_shards(data, tmp_path):
    result = recsync.simulate(config(data, "async", 1), tmp_path / "out", workers=3, shards=1,
                              timing=free_network())
    assert result.summary["workers"] == 3 and result.summary["ps_shards"] == 1
    assert len(result.summary["per_worker"]) == 3


def test_the_command_prints_simulated_and_real_times(data, tmp_path):
    from click.testing import CliRunner

    from recsync.cli import main
    args = ["simulate", "--set", f"data.path={json.dumps(str(data))}",
            "--set", f"data.chunk_rows={BATCH}", "--set", f"train.batch_size={BATCH}",
            "--set", "model.embedding_dim=4", "--set", "model.bottom_mlp=[8]",
            "--set", "model.top_mlp=[8, 4]", "--set", "output.progress=false",
            "--set", "output.plot=false", "--set", "train.threads=1",
            "--workers", "3", "--shards", "2", "--compute-ms", "2",
            "--speeds", "stragglers", "--straggler-share", "0.34"]
    result = CliRunner().invoke(main, [*args, "--set", 'mode="gba"', "--out",
                                       str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    assert any(line.startswith("SIMULATED gba: 3 workers, 2 PS shards")
               for line in result.output.splitlines())
    assert "real wall time of this process" in result.output
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["simulated"]["speed_factors"]["slower_than_1"] == 1
    refused = CliRunner().invoke(main, [*args, "--set", 'mode="shadow"', "--set",
                                        "shadow.hogwild_threads=2", "--out",
                                        str(tmp_path / "no")])
    assert refused.exit_code != 0
    assert "does not model shadow.hogwild_threads > 1" in refused.output
    assert not (tmp_path / "no").exists()
