"""The CPU a benchmark reports for its measured window is the CPU of that window: metrics'
time_s counts from the first step, so start-up (imports, building the model) must not be in it."""

import json

from recsync.bench import overhead as ov
from recsync.config import load_config


class FakeSampler:
    windows: list = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def cpu_between(self, t0, t1):
        FakeSampler.windows.append((t0, t1))
        return None

    def result(self):
        return {"peak_total_rss": 0, "worker_peak_rss": None}


def test_the_measured_window_starts_after_start_up(monkeypatch, tmp_path):
    now = [1000.0]
    monkeypatch.setattr(ov.time, "perf_counter", lambda: now[0])
    monkeypatch.setattr(ov, "RssSampler", FakeSampler)

    def fake_run(cfg, out_dir, overwrite):
        records = [{"time_s": t, "samples": s} for t, s in
                   [(0.5, 0), (1.0, 4096), (6.0, 6 * 4096), (16.0, 16 * 4096)]]
        (out_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
        return {"samples_per_s": 1.0, "samples": 16 * 4096, "wall_s": 30.0, "startup_s": 12.0}

    monkeypatch.setattr(ov, "run_training", fake_run)
    cfg = load_config(None, ["train.batch_size=4096"])  # mode local: one worker
    result = ov.run_arm(cfg, tmp_path, "arm")
    assert result["window_start_s"] == 6.0 and result["window_s"] == 10.0
    assert FakeSampler.windows == [(1000.0 + 12.0 + 6.0, 1000.0 + 12.0 + 16.0)]


def test_the_rate_leaves_out_the_wait_between_the_end_and_the_last_poll():
    # 1,000 samples a second until 5.2 s; the watch loop's last poll is at 5.5 s
    records = [{"time_s": t, "samples": min(int(t * 1000), 5200)}
               for t in (0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0, 5.5)]
    rate = ov.steady_rate(records, warmup_samples=1000)
    assert rate["samples_per_s"] == 1000.0
    assert (rate["window_start_s"], rate["window_s"]) == (1.0, 4.0)
    # too few records while training went on: the last one is used
    assert ov.steady_rate(records[-2:], warmup_samples=1000)["window_s"] == 0.5
