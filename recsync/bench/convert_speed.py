"""Throughput of ``recsync data convert`` on a Criteo-shaped CSV: a label, 13 integer columns
(some empty) and 26 columns of 8-hex-digit categories (Zipf-distributed over vocabularies of
10 to 10^6 values, some empty), with a header.

    python -m recsync.bench.convert_speed [ROWS] [DIR]

``measure_convert`` is what a ``recsync bench`` scenario calls: it writes the CSV, then converts
it in a child process (so that process's peak memory is the conversion's alone) with a schema
of 13 log1p dense and 26 categorical features and a time-ordered 10% eval split (so the
counting pass is included).
"""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv

NUM_DENSE, NUM_CATS = 13, 26

SCHEMA = """\
[label]
column = "label"

[split]
eval_fraction = 0.1

""" + "".join(f'[[dense]]\nname = "I{i + 1}"\ntransform = "log1p"\n\n' for i in range(NUM_DENSE)) \
    + "".join(f'[[categorical]]\nname = "C{i + 1}"\n\n' for i in range(NUM_CATS))


def write_csv(path: Path, rows: int, seed: int = 0, chunk_rows: int = 100_000) -> int:
    """Write the benchmark CSV; returns its size in bytes."""
    rng = np.random.default_rng(seed)
    vocab_sizes = np.logspace(1, 6, NUM_CATS).astype(np.int64)
    vocabs = [pa.array([f"{v:08x}" for v in rng.integers(0, 2**32, n)]) for n in vocab_sizes]
    names = ["label"] + [f"I{i + 1}" for i in range(NUM_DENSE)] + \
        [f"C{i + 1}" for i in range(NUM_CATS)]
    opts = pcsv.WriteOptions(include_header=True, quoting_style="none")
    with pcsv.CSVWriter(str(path), pa.schema([(n, pa.string()) for n in names]),
                        write_options=opts) as w:
        for start in range(0, rows, chunk_rows):
            n = min(chunk_rows, rows - start)
            cols = [pa.array(rng.random(n) < 0.25).cast(pa.int8()).cast(pa.string())]
            for _ in range(NUM_DENSE):
                x = np.floor(rng.lognormal(1.5, 2.0, n)).astype(np.int64)
                cols.append(pa.array(x, mask=rng.random(n) < 0.2).cast(pa.string()))
            for vocab in vocabs:
                rank = np.minimum(np.floor(rng.pareto(0.5, n)), len(vocab) - 1).astype(np.int64)
                cols.append(vocab.take(pa.array(rank, mask=rng.random(n) < 0.05)))
            w.write_table(pa.table(cols, names=names))
    return path.stat().st_size


def _child(csv_path: str, schema_path: str, out: str) -> None:
    import resource

    from recsync.data.convert import convert
    r = convert([csv_path], schema_path, out, progress=False)
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"rows": r.rows_written, "seconds": r.seconds, "peak_rss_mb": peak_kb / 1024}))


def measure_convert(tmpdir, rows: int = 1_000_000, rounds: int = 1) -> dict:
    """Write a ``rows``-row CSV under ``tmpdir`` and convert it ``rounds`` times; returns
    rows_per_s (of the median round), peak_rss_mb (the highest of the converting processes),
    seconds (per round), csv_bytes and rows."""
    tmp = Path(tmpdir)
    tmp.mkdir(parents=True, exist_ok=True)
    csv_path, schema_path, out = tmp / "bench.csv", tmp / "schema.toml", tmp / "data"
    t0 = time.perf_counter()
    size = write_csv(csv_path, rows)
    gen_s = time.perf_counter() - t0
    schema_path.write_text(SCHEMA)
    code = ("import sys; from recsync.bench.convert_speed import _child; "
            "_child(*sys.argv[1:])")
    results = []
    for _ in range(rounds):
        done = subprocess.run([sys.executable, "-c", code, str(csv_path), str(schema_path),
                               str(out)], capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"converting {csv_path} failed: {done.stderr.strip()[-2000:]}")
        results.append(json.loads(done.stdout.strip().splitlines()[-1]))
        shutil.rmtree(out)
    csv_path.unlink()
    seconds = [r["seconds"] for r in results]
    return {"rows": results[0]["rows"], "seconds": seconds,
            "rows_per_s": results[0]["rows"] / statistics.median(seconds),
            "peak_rss_mb": max(r["peak_rss_mb"] for r in results), "csv_bytes": size,
            "generate_s": gen_s}


if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
    if len(sys.argv) > 2:
        print(json.dumps(measure_convert(sys.argv[2], n), indent=2))
    else:
        with tempfile.TemporaryDirectory() as d:
            print(json.dumps(measure_convert(d, n), indent=2))
