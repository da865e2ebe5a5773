"""`recsync tune` on Ray: a search of three `local` trials writes its table, plot and a best
config that `recsync train` runs, every validation evaluation of every trial reached Ray Tune
(ASHA's input); `recsync tune` stopped by SIGINT half way leaves the finished trials' table
and no Ray process. Run: .venv/bin/pytest -q tests/integration/test_tune_runs.py"""

import json
import os
import signal
import subprocess
import sys
import time

import recsync
from recsync.config import load_config
from recsync.run.driver import run
from runs import SMALL, wait_gone

SPACE = '''
"train.dense_lr" = {loguniform = [1e-3, 1e-1]}
[model]
dropout = {choice = [0.0, 0.2]}
'''


def base_config(tmp_path, data):
    path = tmp_path / "base.toml"
    path.write_text(load_config(None, [f"data.path={json.dumps(str(data))}", *SMALL,
                                       "train.eval_every_samples=1024",
                                       "train.eval_sample_rows=400"]).to_toml())
    space = tmp_path / "space.toml"
    space.write_text(SPACE)
    return path, space


def test_a_search_writes_its_table_and_a_best_config_that_trains(ray_cluster, data, tmp_path):
    base, space = base_config(tmp_path, data)
    out = tmp_path / "search"
    result = recsync.tune(base, space, 3, out, echo=lambda line: None)  # the Python API
    table = json.loads((out / "trials.json").read_text())
    assert table["keys"] == ["train.dense_lr", "model.dropout"]
    assert len(table["trials"]) == 3
    assert {t["status"] for t in table["trials"]} <= {"completed", "stopped"}
    assert any(t["status"] == "completed" for t in table["trials"])
    for t in table["trials"]:
        run_dir = out / "trials" / t["trial"]
        evals = [json.loads(line)["eval"] for line in open(run_dir / "metrics.jsonl")]
        evals = [e for e in evals if e and e["split"] == "validation"]
        # every validation evaluation reached the trial's results in Ray Tune (ASHA's input)
        tune_results = [json.loads(line) for line in
                        open(next((out / "ray_tune").glob(f"*{t['trial']}*")) / "result.json")]
        reported = [r for r in tune_results if "validation_logloss" in r]
        # a trial ASHA stopped ended inside the report of its last evaluation, before the
        # run wrote that evaluation's metrics line
        stopped_at = [] if t["status"] == "completed" else reported[-1:]
        assert [r["validation_logloss"] for r in reported] == \
            [e["logloss"] for e in evals] + [r["validation_logloss"] for r in stopped_at]
        assert [r["evals"] for r in reported] == list(range(1, len(reported) + 1))
        assert t["validation_evals"] == len(reported) >= 1
        if t["status"] == "completed":  # 3,686 training rows: 3 periodic + the end's
            assert len(evals) == 4 and t["eval_auc"] is not None
            assert (run_dir / "summary.json").exists()
    assert (out / "trials.csv").read_text().count("\n") == 4
    assert (out / "validation.png").stat().st_size > 0
    assert len((out / "tune.log").read_text().splitlines()) == 3
    best = min(table["trials"], key=lambda t: t["best_validation_logloss"])
    assert result.best.trial == best["trial"]
    cfg = load_config(out / "best.toml")
    assert cfg.train.dense_lr == best["values"]["train.dense_lr"]
    assert cfg.model.dropout == best["values"]["model.dropout"]
    assert cfg.train.validation == 0.1  # the base had none: the search held out a tenth
    summary = run(cfg, tmp_path / "best_run")
    assert summary["status"] == "completed"


def test_sigint_half_way_keeps_the_finished_trials_and_leaves_no_ray_process(data, tmp_path):
    base, space = base_config(tmp_path, data)
    out = tmp_path / "search"
    cmd = [sys.executable, "-m", "recsync", "tune", "--config", str(base), "--space",
           str(space), "--trials", "12", "--concurrent", "1", "--out", str(out),
           "--set", "train.epochs=3"]
    env = {**os.environ, "RAY_ADDRESS": "local"}  # its own embedded Ray, not the tests'
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    deadline = time.time() + 120
    log = out / "tune.log"
    while not (log.exists() and log.read_text().strip()):
        assert proc.poll() is None and time.time() < deadline, proc.stdout.read()[-3000:]
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    output = proc.communicate(timeout=60)[0]
    assert proc.returncode == 128 + signal.SIGINT, output[-3000:]
    assert "interrupted by SIGINT" in output
    table = json.loads((out / "trials.json").read_text())
    finished = [t for t in table["trials"] if t["status"] in ("completed", "stopped")]
    assert 1 <= len(finished) < 12
    assert len(log.read_text().splitlines()) == len(finished)
    assert all(t["validation_evals"] >= 1 for t in finished)
    assert wait_gone(proc.pid) == []
