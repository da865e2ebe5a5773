"""Does the EMULATED cluster hold with another process burning a core beside it?

Runs a small emulated cluster (2 workers x 0.2 cores, 1 shard x 0.2 cores, worker 0 an emulated
3x straggler, mode sync, 100,000 synthetic rows) twice: on a quiet machine, then with a
``while True: pass`` process burning one core. Prints, per worker and shard, its wall time over
CPU time against 1 / its cores (x the straggler factor) and writes both summaries' ``emulation``
to OUT/emulation.json. The figures are measured; the cluster and the straggler are EMULATED.

    PYTHONPATH=$PWD .venv/bin/python scripts/emulation_beside_a_burner.py OUT
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from recsync.bench import emulated as em
from recsync.bench import overhead as ov
from recsync.bench import stragglers as st
from recsync.run.driver import run

ROWS = 100_000


def one_run(data: Path, out: Path) -> dict:
    cfg = st.arm_config(data, ['mode="sync"', "cluster.workers=2", "cluster.ps_shards=1",
                               *em.emulation_args(0.2, 0.2),
                               "faults.stragglers=[{ worker = 0, factor = 3.0 }]"])
    with ov.embedded_ray():
        summary = run(cfg, out, overwrite=True)
    return summary["emulation"]


def show(name: str, emulation: dict) -> None:
    print(f"{name}: {emulation['label']}")
    for w in emulation["workers"]:
        dev = w["compute_wall_per_cpu"] / w["expected"] - 1
        print(f"  worker {w['rank']}: compute wall / CPU {w['compute_wall_per_cpu']:.3f}, "
              f"expected {w['expected']:.3f} ({dev:+.1%}); whole steps {w['wall_per_cpu']:.3f}; "
              f"unpaced CPU {w['unpaced_cpu_s']:.3f} s")
    for s in emulation["shards"]:
        dev = s["wall_per_cpu"] / s["expected"] - 1
        print(f"  shard {s['shard']}: service / CPU {s['wall_per_cpu']:.3f}, expected "
              f"{s['expected']:.3f} ({dev:+.1%}); late {s['late_s']:.2f} s")


def main(out: Path) -> None:
    data = em.make_data(out / "data", ROWS, 20_000)
    results = {"quiet": one_run(data, out / "quiet")}
    show("quiet", results["quiet"])
    burner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        results["beside_a_burner"] = one_run(data, out / "burner")
    finally:
        burner.kill()
        burner.wait()
    show("beside a process burning a core", results["beside_a_burner"])
    (out / "emulation.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
