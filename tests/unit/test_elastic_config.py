"""Elastic runs without Ray: `cluster.workers = [min, max]` read and checked, `recsync scale`'s
requests (run/scale.py), when a shard move is refused (distributed/shard_move.py), and the
`elastic` benchmark's phase arithmetic."""

import json

import pytest
from click.testing import CliRunner

from recsync.bench.elastic import SETTLE_LINES, join_to_first_step_s, phases
from recsync.cli import main
from recsync.api import save_config
from recsync.config import load_config
from recsync.distributed.shard_move import refusal
from recsync.distributed.spawn import global_batch, shares
from recsync.run import scale


def cfg(*extra):
    return load_config(None, list(extra))


def test_a_range_sets_max_and_min_and_a_number_keeps_a_fixed_run():
    c = cfg('mode="async"', "cluster.workers=[2, 6]").cluster
    assert (c.workers, c.workers_min, c.elastic, c.min_workers) == (6, 2, True, 2)
    fixed = cfg('mode="async"', "cluster.workers=3").cluster
    assert (fixed.workers, fixed.workers_min, fixed.elastic, fixed.min_workers) == (3, None,
                                                                                     False, 3)


@pytest.mark.parametrize("bad", ["[3, 2]", "[0, 2]", "[2]", "[1, 2, 3]", "[1.5, 2]"])
def test_a_bad_range_is_refused_naming_the_key(bad):
    with pytest.raises(Exception, match=r"cluster\.workers = .*range \[min, max\]"):
        cfg('mode="async"', f"cluster.workers={bad}")


@pytest.mark.parametrize("mode, extra, reason", [
    ("gba", ["switching.auto=true"], "cannot switch modes"),
    ("async", ['recovery.kind="full"', "recovery.checkpoint_every_s=1"], "full recovery")])
def test_what_cannot_change_its_workers_is_refused_with_the_reason(mode, extra, reason):
    with pytest.raises(Exception, match=reason):
        cfg(f'mode="{mode}"', "cluster.workers=[2, 4]", *extra)


@pytest.mark.parametrize("mode, extra", [("async", []), ("eager", []), ("gba", []),
                                         ("shadow", ['shadow.algorithm="easgd"']),
                                         ("foreground", ['shadow.algorithm="none"']),
                                         ("shadow", []),  # model averaging by default
                                         ("foreground", ['shadow.algorithm="bmuf"']),
                                         ("sync", []), ("hybrid", [])])
def test_the_elastic_modes_take_a_range(mode, extra):
    assert cfg(f'mode="{mode}"', "cluster.workers=[1, 3]", *extra).cluster.elastic


def test_shadow_joins_from_a_replica_and_with_ma_or_bmuf_forms_its_group_again():
    """Shadow's MA and BMUF rounds have a group that an elastic run forms again
    (regroup_rounds.py); EASGD and none have none."""
    from recsync.modes import MODES
    from recsync.modes.base import JOIN_FROM_REPLICA, JOIN_REPLICA_GROUP
    for algorithm, join in [("ma", JOIN_REPLICA_GROUP), ("bmuf", JOIN_REPLICA_GROUP),
                            ("easgd", JOIN_FROM_REPLICA), ("none", JOIN_FROM_REPLICA)]:
        c = cfg('mode="shadow"', f'shadow.algorithm="{algorithm}"', "cluster.workers=[1, 4]")
        assert MODES["shadow"].elastic_join(c) == MODES["foreground"].elastic_join(c) == join


@pytest.mark.parametrize("workers", [1, 3, 4, 7])
def test_a_group_of_any_size_shares_the_same_global_batch(workers):
    """An elastic sync group's workers split train.batch_size x max rows a step: equal
    shares, the first ones a row more where the size does not divide it."""
    c = cfg('mode="sync"', "cluster.workers=[1, 7]", "train.batch_size=100")
    sizes = shares(global_batch(c), workers)
    assert sum(sizes) == 700 and len(sizes) == workers
    assert sizes == sorted(sizes, reverse=True) and sizes[0] - sizes[-1] <= 1
    assert global_batch(cfg('mode="sync"', "cluster.workers=3", "train.batch_size=100")) == 300


def test_the_saved_config_of_an_elastic_run_reads_back_elastic(tmp_path):
    path = save_config(cfg('mode="gba"', "cluster.workers=[2, 5]"), tmp_path / "c.toml")
    c = load_config(path).cluster
    assert (c.workers_min, c.workers) == (2, 5)


def _running(tmp_path, workers="[2, 4]"):
    save_config(cfg('mode="async"', f"cluster.workers={workers}"), tmp_path / "config.toml")
    return tmp_path


def test_scale_appends_requests_the_driver_takes_once_each_in_order(tmp_path):
    out = _running(tmp_path)
    driver = scale.Requests(out, since_unix=0.0)
    assert driver.new() == []
    scale.ask(out, workers=3)
    scale.ask(out, drain_nodes=["ab12"])  # two within one poll: both taken, in order
    assert [(r["workers"], r["drain_nodes"]) for r in driver.new()] == [(3, []), (None, ["ab12"])]
    assert driver.new() == []
    scale.ask(out, workers=2)
    assert [r["workers"] for r in driver.new()] == [2]


def test_a_request_made_before_the_run_began_is_not_taken(tmp_path):
    out = _running(tmp_path)
    scale.ask(out, workers=3)  # an earlier run's, in a directory resumed
    assert scale.Requests(out).new() == []


def test_a_resumed_run_takes_requests_though_its_earlier_summary_is_there(tmp_path):
    import os
    out = _running(tmp_path)
    (out / "summary.json").write_text("{}")
    os.utime(out / "summary.json", (1, 1))  # older than config.toml: the run was resumed
    assert scale.ask(out, workers=3)["workers"] == 3


@pytest.mark.parametrize("setup, args, message", [
    ("none", {"workers": 3}, "no config.toml"),
    ("ended", {"workers": 3}, "the run has ended"),
    ("fixed", {"workers": 3}, "only a run started with a range"),
    ("elastic", {"workers": 5}, r"range is \[2, 4\]"),
    ("elastic", {}, "give --workers N or --drain-node ID")])
def test_scale_refuses_in_one_line(tmp_path, setup, args, message):
    if setup != "none":
        _running(tmp_path, "3" if setup == "fixed" else "[2, 4]")
    if setup == "ended":
        (tmp_path / "summary.json").write_text("{}")
    with pytest.raises(ValueError, match=message):
        scale.ask(tmp_path, **args)


def test_the_command_says_what_it_asked_and_fails_in_one_line(tmp_path):
    out = _running(tmp_path)
    ok = CliRunner().invoke(main, ["scale", str(out), "--workers", "2"])
    assert ok.exit_code == 0 and "asked the run" in ok.output and "2 workers" in ok.output
    bad = CliRunner().invoke(main, ["scale", str(out), "--workers", "9"])
    assert bad.exit_code == 2 and bad.output.count("\n") == 1 and "range" in bad.output


def test_a_shard_move_needs_a_standby_off_the_drained_node():
    partial = ['mode="async"', 'recovery.kind="partial"', "recovery.checkpoint_every_s=1"]
    assert refusal(cfg(*partial), ["n1"], {"n0"}) is None  # one standby by default
    assert "standby" in refusal(cfg(*partial, "recovery.standby_shards=0"), ["n1"], {"n0"})
    assert "drained node too" in refusal(cfg(*partial), ["n0"], {"n0"})
    assert "no standby is waiting" in refusal(cfg(*partial), [], {"n0"})
    mfu = cfg(*partial, 'recovery.rows="mfu"')
    assert "part of the rows" in refusal(mfu, ["n1"], {"n0"})


@pytest.mark.parametrize("mode, shadow, refused", [
    ("shadow", ['shadow.algorithm="easgd"'], True),  # its background rounds go on
    ("foreground", ['shadow.algorithm="easgd"'], False),
    ("foreground", ['shadow.algorithm="easgd"', "shadow.hogwild_threads=2"], True)])
def test_a_shard_move_is_refused_where_a_pause_does_not_stop_the_calls(mode, shadow, refused):
    c = cfg(f'mode="{mode}"', *shadow, 'recovery.kind="partial"',
            "recovery.checkpoint_every_s=1")
    assert (refusal(c, ["n1"], {"n0"}) is not None) == refused


def test_phases_split_the_metrics_by_worker_count_and_leave_out_the_settling():
    lines = [{"time_s": t / 2, "samples": 1 + t, "workers": 4 if t < 20 else 2,
              "samples_per_s": 400.0 if t < 20 else 200.0} for t in range(40)]
    lines[0]["samples_per_s"] = lines[20]["samples_per_s"] = 1.0  # a settling line: left out
    ph = phases(lines)
    assert [(p["workers"], p["lines"], p["speed"]) for p in ph] == [(4, 20, 400.0),
                                                                    (2, 20, 200.0)]
    assert SETTLE_LINES >= 1


def test_join_to_first_step_runs_from_the_scale_up_request_to_the_last_first_step():
    section = {"max": 4, "requests": [{"workers": 2, "asked_s": 5.0},
                                      {"workers": 4, "asked_s": 10.0}],
               "joins": [{"started_s": 0.0, "first_step_s": 1.0},
                         {"started_s": 14.0, "first_step_s": 15.0},
                         {"started_s": 16.0, "first_step_s": 17.5}]}
    assert join_to_first_step_s(section) == 7.5
    assert join_to_first_step_s({**section, "requests": []}) is None


def test_summary_lines_parse_back(tmp_path):
    """The request file is plain JSON a user can read."""
    out = _running(tmp_path)
    scale.ask(out, workers=2)
    assert json.loads((out / "scale.jsonl").read_text())["workers"] == 2


def test_a_second_poll_keeps_the_first_polls_interval():
    """The watch loop polls again after an elastic run's changes; each worker's status starts a
    new interval at every call, so the line adds both (its loss and step times cover 0.5 s)."""
    from recsync.distributed.status import WorkerStatus
    first = WorkerStatus(0, "running", steps=10, samples=640, loss_sum=32.0, loss_samples=640,
                         step_s=0.4, interval_steps=10)
    second = WorkerStatus(0, "running", steps=11, samples=704, loss_sum=3.0, loss_samples=64,
                          step_s=0.04, interval_steps=1)
    both = second.after(first)
    assert (both.steps, both.samples, both.loss_samples, both.interval_steps) == (11, 704, 704,
                                                                                   11)
    assert both.loss_sum == 35.0 and abs(both.step_s - 0.44) < 1e-12
    with pytest.raises(ValueError):
        second.after(WorkerStatus(1, "running"))


def test_lines_that_are_not_requests_are_not_taken(tmp_path):
    """The request file is in an output directory: a line that is not what `ask` writes (a
    number that is not a whole one, a node id that is not hex) is skipped, not obeyed."""
    out = _running(tmp_path)
    with open(out / "scale.jsonl", "a") as f:
        f.write('{"unix": 1e12, "workers": "3"}\n{"unix": 1e12, "drain_nodes": ["a)b"]}\n[1]\n')
    scale.ask(out, workers=3)
    assert [r["workers"] for r in scale.Requests(out, since_unix=0.0).new()] == [3]
    with pytest.raises(ValueError, match="hex digits"):
        scale.ask(out, drain_nodes=["node-1"])


def test_the_sync_part_checks_the_group_went_4_2_4_in_order():
    from recsync.bench.elastic_sync import went_through
    assert went_through([2, 4, 2, 3, 4], [4, 2, 4])
    assert not went_through([2, 4, 3, 4], [4, 2, 4])
    assert not went_through([4, 2], [4, 2, 4])
