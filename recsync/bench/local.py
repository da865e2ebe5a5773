"""Scenario `local`: recsync's single-process trainer against a hand-written PyTorch loop.

Arms (same DLRM module, 26 tables x 1e6 rows x 16, batch 4096, one intra-op thread, float32
(scenario `dense` measures bfloat16), SGD on embedding rows and Adagrad on dense parameters with
the same learning rates):

- ``plain_torch``: the reference: ``nn.Embedding(sparse=True)`` tables, ``torch.optim.SGD`` on
  them, batches preloaded in memory, nothing else in the loop.
- ``local``: ``recsync train`` as a user runs it (``run.run``): memory-mapped reader, the
  embedding store with lazy row initialisation, metrics logging, progress accounting.

The arms alternate over ``ROUNDS`` rounds; each arm's figure is the median of its rounds, and
``local_vs_plain_speed`` is the ratio of the medians. The scenario also measures the data
pipeline on this machine: synthetic rows generated per second, Criteo lines converted per second
by `recsync data criteo` (preset criteo of `recsync data convert`, on a Criteo-format file of at
least 1M lines written from the synthetic rows), CSV rows
converted per second by `recsync data convert` with a schema (bench/convert_speed.py; ratio
``csv_convert_rows_per_s``) and its peak memory, and rows read per second by the reader.
"""

from __future__ import annotations

import json
import shutil
import statistics
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from recsync.bench.convert_speed import measure_convert
from recsync.bench.criteo_file import write_criteo_tsv
from recsync.config import load_config
from recsync.data.criteo import convert_criteo
from recsync.data.reader import Dataset
from recsync.data.synthetic import SynthSpec, generate
from recsync.metrics.core import auc_logloss
from recsync.model.dlrm import DLRM
from recsync.run.driver import run as run_training

ROUNDS = 3
TABLE_ROWS = 1_000_000
BATCH = 4096
ARM_SETTINGS = [  # shared by both arms
    f"model.table_rows={TABLE_ROWS}", "model.embedding_dim=16", f"train.batch_size={BATCH}",
    "train.threads=1", "train.embedding_optimizer=\"sgd\"", "train.embedding_lr=0.05",
    "train.dense_optimizer=\"adagrad\"", "train.dense_lr=0.01",
    "train.eval_every_samples=1000000000000", "data.shuffle=false", "output.progress=false",
    "output.plot=false",
    "train.dense_precision=\"float32\"",  # as the plain loop: the runtime's cost, like for like
]


def run(out: Path, scale: float) -> dict:
    steps = max(5, round(40 * scale))
    data_rows = max(round(4_000_000 * scale), 1_000_000, steps * BATCH)
    criteo_lines = max(1_000_000, round(1_000_000 * scale))
    measurements, data = _data_pipeline(out, data_rows, criteo_lines)
    cfg = load_config(None, [f"data.path={json.dumps(str(data))}", f"train.max_steps={steps}",
                             *ARM_SETTINGS])
    plain, local = _PlainTorch(cfg, Dataset(data), steps), []
    for r in range(ROUNDS):
        print(f"round {r + 1}/{ROUNDS}: plain_torch ...", flush=True)
        plain.round()
        print(f"round {r + 1}/{ROUNDS}: local ...", flush=True)
        local.append(run_training(cfg, out / "arms" / "local" / f"round{r + 1}", overwrite=True))
    local_sps = [s["samples_per_s"] for s in local]
    arms = {
        "plain_torch": {**plain.summary(), "samples_per_s": statistics.median(plain.sps),
                        "rounds_samples_per_s": plain.sps},
        "local": {**local[-1], "samples_per_s": statistics.median(local_sps),
                  "rounds_samples_per_s": local_sps},
    }
    ratio = arms["local"]["samples_per_s"] / arms["plain_torch"]["samples_per_s"]
    per_round = [a / b for a, b in zip(local_sps, plain.sps)]
    return {
        "scenario": "local",
        "description": (
            f"{ROUNDS} alternating rounds of {steps} steps x {BATCH} samples per arm; "
            f"26 tables x {TABLE_ROWS:,} rows x 16, default DLRM MLPs, 1 intra-op thread. "
            f"plain_torch preloads its batches and initialises its tables before timing; "
            f"local's time includes reading, lazy row initialisation and logging. "
            f"Per-round local/plain ratios: {', '.join(f'{x:.3f}' for x in per_round)}."),
        "arms": arms,
        "ratios": {"local_vs_plain_speed": ratio,
                   "csv_convert_rows_per_s": measurements["csv"]["rows_per_s"]},
        "measurements": measurements,
        "tables": {"Data pipeline (this machine)": [
            ["synthetic rows generated / s", measurements["synth_rows_per_s"],
             f"{measurements['synth_rows']:,} rows, 2 processes, teacher build included"],
            ["Criteo lines converted / s (`recsync data criteo`)",
             measurements["criteo_lines_per_s"],
             f"median of 3 conversions of a {measurements['criteo_lines']:,}-line TSV "
             f"({measurements['criteo_mb']:.0f} MB) written from the synthetic rows"],
            ["rows read / s (in order)", measurements["read_rows_per_s"],
             f"batches of {BATCH}, median of 3 passes over {measurements['read_rows']:,} rows"],
            ["rows read / s (shuffled)", measurements["read_shuffled_rows_per_s"],
             "the same, with the in-chunk shuffle"],
            ["CSV rows converted / s (`recsync data convert`)",
             measurements["csv"]["rows_per_s"],
             f"median of 3 conversions of a {measurements['csv']['rows']:,}-row CSV "
             f"({measurements['csv']['csv_bytes'] / 1e6:.0f} MB: label, 13 integer and 26 "
             f"8-hex-digit string columns) with a 13 log1p + 26 categorical schema; "
             f"seconds {', '.join(f'{s:.2f}' for s in measurements['csv']['seconds'])}"],
            ["peak memory of `recsync data convert` (MB)", measurements["csv"]["peak_rss_mb"],
             "the converting process's maximum resident set, highest of the 3"],
        ]},
        "configs": {"both arms (recsync config of local)": cfg.to_toml()},
    }


def _data_pipeline(out: Path, rows: int, criteo_lines: int) -> tuple[dict, Path]:
    data = out / "data"
    print(f"generating {rows:,} synthetic rows ...", flush=True)
    synth = generate(data, rows=rows, eval_rows=50_000, overwrite=True,
                     spec=SynthSpec(max_table_rows=TABLE_ROWS))
    ds = Dataset(data)
    tsv = out / "criteo_from_synthetic.tsv"
    print("writing a Criteo-format file from the synthetic rows ...", flush=True)
    lines = _write_criteo_copy(ds, tsv, criteo_lines)
    times = []
    for _ in range(3):
        start = time.perf_counter()
        convert_criteo([tsv], out / "criteo_converted", overwrite=True, progress=False)
        times.append(time.perf_counter() - start)
    mb = tsv.stat().st_size / 1e6
    tsv.unlink()
    shutil.rmtree(out / "criteo_converted")
    print(f"converting a {criteo_lines:,}-row CSV with a schema (3 times) ...", flush=True)
    (out / "csv_convert").mkdir(exist_ok=True)
    csv = measure_convert(out / "csv_convert", rows=criteo_lines, rounds=3)
    read = [_read_pass(ds, shuffle=False) for _ in range(3)]
    read_shuffled = [_read_pass(ds, shuffle=True) for _ in range(3)]
    n = ds.rows("train")
    return {"synth_rows": synth.train_rows + synth.eval_rows, "synth_rows_per_s": synth.rows_per_s,
            "criteo_lines": lines, "criteo_mb": mb,
            "criteo_lines_per_s": lines / statistics.median(times),
            "read_rows": n, "read_rows_per_s": n / statistics.median(read),
            "read_shuffled_rows_per_s": n / statistics.median(read_shuffled), "csv": csv}, data


def _write_criteo_copy(ds: Dataset, path: Path, min_lines: int) -> int:
    """The first parts of the train split (at least ``min_lines`` rows) as raw Criteo TSV:
    integers exp(dense) - 1, ids as 8-hex categories. Returns the number of lines."""
    lines = 0
    with open(path, "wb"):
        pass
    for p in ds.parts("train"):
        if lines >= min_lines:
            break
        lines += len(p["label"])
        ints = np.rint(np.expm1(np.asarray(p["dense"], dtype=np.float64))).astype(np.int64)
        tmp = path.with_suffix(".part")
        write_criteo_tsv(tmp, np.asarray(p["label"]).astype(np.int64), ints,
                         np.asarray(p["sparse"]).astype(np.int64))
        with open(path, "ab") as f, open(tmp, "rb") as g:
            f.write(g.read())
        tmp.unlink()
    return lines


def _read_pass(ds: Dataset, shuffle: bool) -> float:
    start = time.perf_counter()
    for chunk in ds.chunks("train", 16 * BATCH):
        for _ in ds.batches(chunk, BATCH, shuffle_seed=0 if shuffle else None):
            pass
    return time.perf_counter() - start


class _PlainTorch:
    """The reference arm: the loop a PyTorch user would write by hand for this model."""

    def __init__(self, cfg, ds: Dataset, steps: int):
        torch.set_num_threads(cfg.train.threads)
        torch.manual_seed(cfg.train.seed)
        m, t = cfg.model, cfg.train
        self.ds, self.cfg, self.sps = ds, cfg, []
        self.model = DLRM(ds.meta["num_dense"], len(ds.table_rows), m.embedding_dim,
                          m.bottom_mlp, m.top_mlp)
        self.tables = nn.ModuleList(nn.Embedding(TABLE_ROWS, m.embedding_dim, sparse=True)
                                    for _ in ds.table_rows)
        for e in self.tables:
            nn.init.uniform_(e.weight, -m.embedding_init_scale, m.embedding_init_scale)
        self.opt_rows = torch.optim.SGD(self.tables.parameters(), lr=t.embedding_lr)
        self.opt_dense = torch.optim.Adagrad(self.model.parameters(), lr=t.dense_lr)
        self.batches = [b for c in ds.chunks("train", 16 * t.batch_size)
                        for b in ds.batches(c, t.batch_size)][:steps]  # what local reads
        self.samples = 0
        self._steps(self.batches[:2])  # warm-up: allocator and optimizer state

    def _steps(self, batches) -> None:
        for b in batches:
            embs = [table(b.sparse[:, i]) for i, table in enumerate(self.tables)]
            loss = F.binary_cross_entropy_with_logits(self.model(b.dense, embs), b.label)
            self.opt_rows.zero_grad()
            self.opt_dense.zero_grad()
            loss.backward()
            self.opt_rows.step()
            self.opt_dense.step()
            self.samples += len(b)

    def round(self) -> None:
        torch.set_num_threads(self.cfg.train.threads)
        start = time.perf_counter()
        self._steps(self.batches)
        self.sps.append(sum(len(b) for b in self.batches) / (time.perf_counter() - start))

    @torch.no_grad()
    def summary(self) -> dict:
        labels, probs = [], []
        for b in (b for c in self.ds.chunks("eval", 65_536) for b in self.ds.batches(c, 65_536)):
            embs = [table(b.sparse[:, i]) for i, table in enumerate(self.tables)]
            probs.append(torch.sigmoid(self.model(b.dense, embs)).numpy())
            labels.append(b.label.numpy())
        return {"mode": "plain_torch", "samples": self.samples,
                "eval": auc_logloss(np.concatenate(labels), np.concatenate(probs))}
