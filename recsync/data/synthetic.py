"""Seeded synthetic CTR data with Criteo's shape and a planted teacher (docs/design.md §4).

Every row has 13 dense and 26 categorical features. Ids are Zipf-distributed per table. The
label is drawn from a known click probability::

    logit = bias + Σ_j w_j·dense_j + Σ_t a_t[id_t] + Σ_{(t,u) in pairs} <V_t[id_t], V_u[id_u]>

Per-id effects a_t and latent vectors V_t shrink with an id's popularity rank, because an effect
seen a handful of times in the data cannot be learned by any model. The pairwise terms are a
factorization machine over eight mid-size tables: DLRM's dot interaction can
represent them, a logistic regression cannot, which is what makes the teacher non-trivial.
The bias is calibrated so that the mean click probability is ``target_ctr``.

Because the click probability of every eval row is known, the AUC and logloss of the
Bayes-optimal scorer on the eval split (scoring each row by its true probability, against the
labels actually drawn) are computed exactly and stored in the data set's metadata: that is the
quality ceiling a trained model is compared with.

Generation is deterministic for a given seed and configuration, whatever the number of processes:
each chunk of rows draws from its own stream seeded by (seed, split, chunk index).
"""

from __future__ import annotations

import math
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from multiprocessing import get_context
from pathlib import Path

import numpy as np

from recsync.data.format import (NUM_DENSE, NUM_TABLES, SPLITS, SplitInfo, part_name,
                                 write_meta, write_part)
from recsync.data.output import staged_output

# Cardinalities of the 26 categorical features of the Criteo Kaggle data set; synthetic tables
# take these, capped at ``max_table_rows``, so small and huge tables mix as in the real data.
CRITEO_KAGGLE_CARDINALITIES = (
    1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194, 27,
    14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572,
)
CHUNK_ROWS = 262_144  # rows per generated chunk, and per part file


@dataclass(frozen=True)
class SynthSpec:
    """What to generate. All fields feed the teacher, so all of them are saved in meta.json."""

    seed: int = 0
    max_table_rows: int = 100_000
    """cap on every table's cardinality (rows)"""
    zipf_exponent: float = 1.1
    """Zipf exponent s of the id distribution, p(rank r) ∝ r^-s"""
    target_ctr: float = 0.25
    """mean click probability the bias is calibrated to"""
    id_effect_scale: float = 0.4
    """std of a head id's additive logit effect"""
    interacting_tables: tuple[int, ...] = (0, 1, 4, 5, 7, 10, 12, 14)
    """tables (0-based) whose ids interact pairwise through latent vectors: mid-size ones
    (24 to 15k ids), whose ids are seen often enough that an interaction can be learned"""
    latent_dim: int = 4
    interaction_scale: float = 0.5
    """scale s of latent vectors: each pair's dot product has std about s²"""
    head_rank: float = 20.0
    """effects shrink as (1 + rank / head_rank)^-0.5: ids rarer than this carry less signal"""
    dense_scale: float = 0.15
    """std of the weight of each (log-transformed) dense feature"""

    def table_rows(self) -> list[int]:
        return [min(c, self.max_table_rows) for c in CRITEO_KAGGLE_CARDINALITIES]


class Teacher:
    """The planted model: id sampling and true click probabilities, rebuilt from a SynthSpec."""

    def __init__(self, spec: SynthSpec):
        if spec.seed < 0:
            raise ValueError(f"seed must be >= 0, got {spec.seed}")
        if spec.max_table_rows < 2:
            raise ValueError(f"max_table_rows must be >= 2, got {spec.max_table_rows}")
        if not 0.0 < spec.target_ctr < 1.0:
            raise ValueError(f"target_ctr must be in (0, 1), got {spec.target_ctr}")
        if spec.zipf_exponent <= 0 or spec.zipf_exponent == 1.0:
            raise ValueError(f"zipf_exponent must be > 0 and != 1, got {spec.zipf_exponent}")
        self.spec = spec
        self.rows = spec.table_rows()
        rng = np.random.default_rng([spec.seed, 0x7EAC])
        self.dense_mu = rng.uniform(0.0, 3.0, NUM_DENSE)
        self.dense_sigma = rng.uniform(0.5, 1.5, NUM_DENSE)
        self.dense_missing = rng.uniform(0.0, 0.3, NUM_DENSE)
        self.dense_w = rng.normal(0.0, spec.dense_scale, NUM_DENSE).astype(np.float32)
        # Effects are indexed by popularity rank; ids are a fixed bijection of ranks (below).
        self.id_effects, self.latents = [], []
        for t, n in enumerate(self.rows):
            shrink = (1.0 + np.arange(n) / spec.head_rank) ** -0.5
            self.id_effects.append((rng.normal(0.0, spec.id_effect_scale, n) * shrink)
                                   .astype(np.float32))
            if t in spec.interacting_tables:
                # Component std s·k^-1/4 gives each dot product a std of about s²; each side
                # takes the square root of the shrink so that the product shrinks like an effect.
                v = rng.normal(0.0, spec.interaction_scale * spec.latent_dim ** -0.25,
                               (n, spec.latent_dim)) * np.sqrt(shrink)[:, None]
                # component-major: 1-D gathers are several times faster than 2-D row gathers
                self.latents.append(np.ascontiguousarray(v.T, dtype=np.float32))
        # rank -> id: a fixed random permutation per table, so that hot ids are scattered over
        # the table as hashed ids are in real data (one int32 gather per value).
        self.rank_to_id = [rng.permutation(n).astype(np.int32) for n in self.rows]
        self.bias = 0.0
        self.bias = self._calibrate_bias(rng)

    def sample(self, rng: np.random.Generator, num_rows: int):
        """Draw rows: (dense float32 [n,13], ids int32 [n,26], click probability float32 [n])."""
        s = self.spec.zipf_exponent
        f32 = np.float32
        z = rng.standard_normal((num_rows, NUM_DENSE), dtype=f32)
        x = np.floor(np.exp(z * self.dense_sigma.astype(f32) + self.dense_mu.astype(f32)))
        x[rng.random((num_rows, NUM_DENSE), dtype=f32) < self.dense_missing] = 0.0
        dense = np.log1p(x)
        logit = dense @ self.dense_w + f32(self.bias)
        ids = np.empty((NUM_TABLES, num_rows), dtype=np.int32)  # table-major: contiguous writes
        ranks = []
        for t, n in enumerate(self.rows):
            # Inverse CDF of the continuous power law on [1, n + 1): floor gives a bounded Zipf.
            u = rng.random(num_rows, dtype=f32)
            c = (n + 1.0) ** (1.0 - s) - 1.0
            r = np.power(f32(1.0) + u * f32(c), f32(1.0 / (1.0 - s)))
            rank = r.astype(np.int32)
            rank -= 1
            np.minimum(rank, n - 1, out=rank)  # float rounding at the top end
            ids[t] = self.rank_to_id[t][rank]
            logit += self.id_effects[t][rank]
            ranks.append(rank)
        # Σ_{t<u} <V_t, V_u> = ½ Σ_c [(Σ_t V_tc)² − Σ_t V_tc²]  (factorization-machine identity)
        for c in range(self.spec.latent_dim):
            comp = [lat[c][ranks[t]] for lat, t in zip(self.latents, self.spec.interacting_tables)]
            total = np.sum(comp, axis=0)
            logit += f32(0.5) * (total * total - np.sum(np.square(comp), axis=0))
        prob = 1.0 / (1.0 + np.exp(-logit))
        return dense, ids.T, prob.astype(f32)

    def _calibrate_bias(self, rng: np.random.Generator) -> float:
        """Bisect the bias so that the mean click probability on a large sample is target_ctr."""
        _, _, p0 = self.sample(rng, 50_000)
        p0 = np.clip(p0.astype(np.float64), 1e-12, 1 - 1e-12)
        logit0 = np.log(p0) - np.log1p(-p0)
        lo, hi = -20.0, 20.0
        for _ in range(60):
            mid = (lo + hi) / 2
            if np.mean(1.0 / (1.0 + np.exp(-(logit0 + mid)))) < self.spec.target_ctr:
                lo = mid
            else:
                hi = mid
        return (lo + hi) / 2


_TEACHERS: dict[SynthSpec, Teacher] = {}


def _teacher(spec: SynthSpec) -> Teacher:
    """One teacher per process and spec (building it draws ~10M numbers)."""
    if spec not in _TEACHERS:
        _TEACHERS[spec] = Teacher(spec)
    return _TEACHERS[spec]


def generate_chunk(spec: SynthSpec, split_index: int, chunk_index: int, num_rows: int):
    """One chunk of rows with labels: (dense, ids, label float32, prob float32)."""
    rng = np.random.default_rng([spec.seed, split_index, chunk_index])
    dense, ids, prob = _teacher(spec).sample(rng, num_rows)
    label = (rng.random(num_rows, dtype=np.float32) < prob).astype(np.float32)
    return dense, ids, label, prob


def _write_chunk(spec: SynthSpec, out: Path, split_index: int, chunk_index: int, num_rows: int):
    """Generate one chunk and write it as its own part; return what the eval metrics need."""
    dense, ids, label, prob = generate_chunk(spec, split_index, chunk_index, num_rows)
    write_part(out / SPLITS[split_index], part_name(chunk_index), dense, ids, label)
    return (label, prob) if SPLITS[split_index] == "eval" else None


def _write_splits(out: Path, spec: SynthSpec, rows: int, eval_rows: int, processes: int,
                  progress: bool):
    """Generate and write every part into ``out``; return the eval labels and probabilities
    (per chunk) and the splits' infos."""
    from recsync.metrics.progress import progress as bar_or_lines

    jobs = [(split_i, c, min(CHUNK_ROWS, n - c * CHUNK_ROWS))
            for split_i, n in ((0, rows), (1, eval_rows))
            for c in range(math.ceil(n / CHUNK_ROWS))]
    splits = {name: SplitInfo() for name in SPLITS}
    for name in SPLITS:
        (out / name).mkdir()
    eval_labels, eval_probs = [], []
    # the teacher was built before, once; forked children inherit it
    ctx = get_context("fork")  # children use numpy only; fork needs no __main__ guard
    with (bar_or_lines(rows + eval_rows, "row", "synth", progress) as bar,
          ProcessPoolExecutor(max_workers=max(1, processes), mp_context=ctx) as pool):
        done = pool.map(_write_chunk, *zip(*[(spec, out, s, c, n) for s, c, n in jobs]))
        for (split_i, chunk_i, n), eval_part in zip(jobs, done):
            info = splits[SPLITS[split_i]]
            info.parts.append({"name": part_name(chunk_i), "rows": n})
            info.rows += n
            if eval_part is not None:
                eval_labels.append(eval_part[0])
                eval_probs.append(eval_part[1])
            bar.update(n)
    return eval_labels, eval_probs, splits


@dataclass
class SynthReport:
    train_rows: int
    eval_rows: int
    seconds: float
    rows_per_s: float
    bayes_auc: float
    bayes_logloss: float
    ctr: float


def generate(out_dir: str | Path, *, rows: int, eval_rows: int | None = None,
             spec: SynthSpec = SynthSpec(), processes: int = 2, overwrite: bool = False,
             progress: bool = True) -> SynthReport:
    """Write a synthetic data set (train + eval splits and meta.json) to ``out_dir``.

    ``eval_rows`` defaults to a tenth of ``rows``. Uses ``processes`` worker processes; the output
    does not depend on that number. The data set is written beside ``out_dir`` and replaces it
    only when complete (data/output.py): FileExistsError if ``out_dir`` holds a data set and not
    ``overwrite``, or holds anything that is not a data set.
    """
    from sklearn.metrics import log_loss, roc_auc_score

    if rows < 1:
        raise ValueError(f"rows must be >= 1, got {rows}")
    eval_rows = max(1, rows // 10) if eval_rows is None else eval_rows
    if eval_rows < 1:
        raise ValueError(f"eval_rows must be >= 1, got {eval_rows}")
    out = Path(out_dir)
    start = time.perf_counter()
    teacher = _teacher(spec)  # checks the spec before anything on disk is touched
    with staged_output(out, overwrite) as tmp:
        eval_labels, eval_probs, splits = _write_splits(tmp, spec, rows, eval_rows, processes,
                                                        progress)
        y, p = np.concatenate(eval_labels), np.concatenate(eval_probs).astype(np.float64)
        both_classes = 0 < y.sum() < len(y)
        bayes_auc = float(roc_auc_score(y, p)) if both_classes else float("nan")
        bayes_logloss = float(log_loss(y, p, labels=[0, 1]))
        write_meta(tmp, table_rows=teacher.rows, splits=splits,
                   source={"kind": "synthetic", "spec": asdict(spec), "bias": teacher.bias},
                   synthetic={"bayes_auc": bayes_auc, "bayes_logloss": bayes_logloss,
                              "eval_ctr": float(y.mean()),
                              "note": "Bayes-optimal scorer (true click probability) on this "
                                      "eval split's drawn labels"})
    seconds = time.perf_counter() - start
    return SynthReport(train_rows=rows, eval_rows=eval_rows, seconds=seconds,
                       rows_per_s=(rows + eval_rows) / seconds, bayes_auc=bayes_auc,
                       bayes_logloss=bayes_logloss, ctr=float(y.mean()))
