"""A seeded fuzz of checkpoint folders from elsewhere (issue 29): a real run's job checkpoint and
a shard's chain (a full checkpoint and a partial one on it), written by ``files.write``, then
mutated: manifests (keys deleted, values of the wrong type, huge numbers, control characters,
data files named ``../x``, ``/dev/zero`` or an absolute path, symlinks leading out, truncated
or garbage JSON, JSON nested 100,000 deep) and data files (truncated, bytes flipped, with and
without a matching checksum, a FIFO, a folder). Every reader of a resume runs on each: loading,
the newest chain, ``job.restorable``, ``run.resume_point`` and what a rollback or resharding
reads of the meta. Each must return or raise CheckpointError/ValueError in one line, within a
time bound (a hang fails the case, not CI), and open nothing outside the folder: the outside
files named are a FIFO (opening it would block) and a valid copy of a data file, and every
file opened is recorded (an audit hook)."""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import signal
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from cores import test_core
from recsync.checkpoint import files, job, reshard
from recsync.config import RunConfig
from recsync.embedding.row_optim import RowAdagrad
from recsync.embedding.spec import TableSpec

CASES = 360
SEED = 29
CASE_S = 3.0  # per case: a hang fails it
BAD = [[], {}, "", "x", None, True, False, -1, 0, 10**30, 2**63, 1.5, float("nan"),
       "\x1b[31mred\x07", "../x", "/dev/zero", "a" * 5000, [1, "2"], {"a": [{}]}, [[[[]]]]]
DATA_NAMES = ["../x", "/dev/zero", "../outside/fifo", "../outside/copy.npz", "ckpt-000001.npz",
              "sub/../ckpt-000002.npz", "./ckpt-000002.npz", "ckpt-000002.npz\x00",
              "CKPT-000002.NPZ", "ckpt-000002.npz/", "", "/"]

_opened: list[str] = []
_recording = [False]


def _audit(event, args):
    if _recording[0] and event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
        _opened.append(os.fsdecode(args[0]))


sys.addaudithook(_audit)


class Hang(BaseException):
    """Raised by the per-case alarm: no reader's ``except Exception`` can take it for a
    refusal."""


def _expire(signum, frame):
    raise Hang()


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """out/checkpoints/{job,shard-0} of a gba run with one PS shard, and its config."""
    out = tmp_path_factory.mktemp("fuzz") / "run"
    root = out / "checkpoints"
    cfg = RunConfig(mode="gba", recovery={"checkpoint_every_s": 1.0})
    core = test_core([TableSpec("a", 40, 4), TableSpec("b", 20, 4)], RowAdagrad(lr=0.1),
                     mode="gba", shard=0, num_shards=1, num_workers=1, seed=1)
    from cores import push_gba
    rng = np.random.default_rng(0)
    for step in range(3):
        ids = [np.array([1, 3, 7 + step]), np.array([2, 5])]
        push_gba(core, ids, [rng.normal(size=(len(i), 4)).astype(np.float32) for i in ids],
                 None, token=step, samples=8)
    arrays, meta = core.snapshot()
    files.write(job.shard_dir(root, 0), 1, arrays, meta)
    half = {k: (v[: len(v) // 2] if k.startswith("t") else v) for k, v in arrays.items()}
    files.write(job.shard_dir(root, 0), 2, half, {**meta, "partial": "mfu", "base": 1})
    item = [0, "train", 0, 0, 100]
    files.write(job.job_dir(root), 1, {}, {
        "final": False, "mode": "gba", "shard_sequences": [2], "step_index": 0,
        "queue": {"pending": [[0, "train", 1, 0, 100]], "leased": [[item, 2, [0, 0]]],
                  "completed": [[[0, "train", 2, 0, 100], 1]],
                  "by_worker": {"0": {"chunks": 1, "samples": 100}}},
        "unix": time.time(), "done": [{"samples": 100, "steps": 3}], "samples": 100,
        "steps": 3, "train_s": 1.5, "dense_param_groups": None,
        "config": cfg.model_dump(mode="json")})
    return out, cfg


def _paths(obj, prefix=()):
    """Every (path of keys) in a JSON object, to pick one to mutate."""
    out = [prefix] if prefix else []
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += _paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj[:4]):
            out += _paths(v, prefix + (i,))
    return out


def _set(obj, path, value=None, delete=False):
    for k in path[:-1]:
        obj = obj[k]
    if delete:
        del obj[path[-1]]
    else:
        obj[path[-1]] = value


def _mutate(rng: random.Random, run: Path, outside: Path) -> str:
    """One mutation of the checkpoint folder ``run/checkpoints``; what it was."""
    root = run / "checkpoints"
    manifest = rng.choice(sorted(root.glob("*/ckpt-*.json")))
    data = manifest.with_suffix(".npz")
    m = json.loads(manifest.read_text())
    op = rng.choice(["del", "bad", "bad", "meta_bad", "meta_bad", "data_file", "base",
                     "sequences", "meta_whole", "text", "symlink", "data_kind", "data_bytes",
                     "data_bytes_rehashed", "control_key"])
    drop_digest = rng.random() < 0.5  # as an older manifest (or an editor who knew)
    if op == "del":
        path = rng.choice(_paths(m))
        _set(m, path, delete=True)
    elif op == "bad":
        path = (rng.choice(list(m)),)
        _set(m, path, rng.choice(BAD))
    elif op == "meta_bad":
        path = ("meta",) + rng.choice(_paths(m["meta"]) or [("x",)])
        _set(m, path, rng.choice(BAD))
    elif op == "data_file":
        path = ("data_file",)
        m["data_file"] = rng.choice(DATA_NAMES + [str(outside / "fifo"),
                                                  str(outside / "copy.npz")])
        m["bytes"] = rng.choice([m["bytes"], 0])
    elif op == "base":
        path = ("meta", "base")
        m["meta"]["base"] = rng.choice([{}, 0, 3, -1, "1", 10**30, 1.0, None])
    elif op == "sequences":
        path = ("meta", "shard_sequences")
        m["meta"]["shard_sequences"] = rng.choice(["2", [], [0], ["2"], [10**30], [2**63],
                                                   [2, 2, 2], [None], [True], [-5]])
    elif op == "meta_whole":
        path = ("meta",)
        m["meta"] = rng.choice([[], "meta", None, 7, {"final": "yes"}])
    elif op == "control_key":
        path = ("meta", "\x1b]0;title\x07")
        m["meta"]["\x1b]0;title\x07"] = "\r\x00"
    if op in ("text", "symlink", "data_kind", "data_bytes", "data_bytes_rehashed"):
        return _mutate_files(rng, op, manifest, data, outside)
    if drop_digest:
        m.pop("meta_sha256", None)
    manifest.write_text(json.dumps(m))
    return f"{op} {manifest.parent.name}/{manifest.name} {path!r}"


def _mutate_files(rng, op, manifest, data, outside) -> str:
    kind = ""
    if op == "text":
        kind = rng.choice(["truncate", "garbage", "deep", "digits", "empty", "not_object"])
        text = {"truncate": manifest.read_text()[: rng.randrange(1, 200)],
                "garbage": "\udcff".join("x" * 3),
                "deep": "[" * 100_000 + "]" * 100_000,
                "digits": '{"format": "recsync-checkpoint", "sequence": ' + "9" * 5000 + "}",
                "empty": "", "not_object": "[1, 2]"}[kind]
        manifest.write_bytes(text.encode("utf-8", "surrogateescape"))
    elif op == "symlink":
        kind = rng.choice(["data_to_fifo", "data_to_copy", "manifest_to_fifo", "data_loop",
                           "data_to_dev_zero", "folder_to_outside"])
        target = {"data_to_fifo": outside / "fifo", "data_to_copy": outside / "copy.npz",
                  "manifest_to_fifo": outside / "fifo", "data_loop": data,
                  "data_to_dev_zero": Path("/dev/zero"),
                  "folder_to_outside": outside}[kind]
        if kind == "folder_to_outside":  # a sub-folder of a shard's folder
            (manifest.parent / "sub").symlink_to(target)
        else:
            link = manifest if kind == "manifest_to_fifo" else data
            link.unlink()
            link.symlink_to(target)
    elif op == "data_kind":
        kind = rng.choice(["fifo", "folder", "missing"])
        data.unlink()
        {"fifo": lambda: os.mkfifo(data), "folder": data.mkdir, "missing": lambda: None}[kind]()
    else:
        raw = bytearray(data.read_bytes())
        kind = rng.choice(["truncate", "flip", "append"])
        if kind == "truncate":
            raw = raw[: rng.randrange(len(raw))]
        elif kind == "append":
            raw += os.urandom(rng.randrange(1, 64))
        else:
            for _ in range(rng.randrange(1, 8)):
                raw[rng.randrange(len(raw))] ^= 1 << rng.randrange(8)
        data.write_bytes(bytes(raw))
        if op == "data_bytes_rehashed":  # a manifest made to match: the parser meets it
            m = json.loads(manifest.read_text())
            m.update(bytes=len(raw), sha256=hashlib.sha256(raw).hexdigest())
            manifest.write_text(json.dumps(m))
    return f"{op}:{kind} {manifest.parent.name}/{manifest.name}"


def _readers(run: Path, cfg: RunConfig):
    """Every reader of a resume, on the folder ``run``."""
    from recsync.run.driver import resume_point
    root = run / "checkpoints"
    for d in (job.job_dir(root), job.shard_dir(root, 0)):
        for manifest in files.manifests(d):
            yield lambda p=manifest: files.load(p)
        yield lambda d=d: files.latest_chain(d)
        yield lambda d=d: files.interrupted(d)
    yield lambda: job.restorable(root)

    def resume():
        ckpt = resume_point(cfg, run)
        meta = ckpt.meta
        reshard.fold_queue(meta["queue"], 2)
        reshard.fold_counts(meta["done"], 2)
        job.dense_state(ckpt)
        sources = [(str(job.shard_dir(root, k)), s) for k, s in
                   enumerate(meta["shard_sequences"])]
        for shard in range(2):  # resharded onto two
            reshard.snapshot_for(reshard.load_resolved(sources), len(sources), shard, 2,
                                 ({}, {"counts": {}}), "gba")
    yield resume
    yield lambda: [files.prune(d, keep=1) for d in (job.job_dir(root),
                                                     job.shard_dir(root, 0))]


def test_mutated_checkpoints_are_refused_in_one_line_without_hang_or_outside_read(
        pristine, tmp_path):
    source, cfg = pristine
    outside = tmp_path / "outside"
    outside.mkdir()
    os.mkfifo(outside / "fifo")
    shutil.copy(source / "checkpoints" / "shard-0" / "ckpt-000001.npz", outside / "copy.npz")
    for reader in _readers(source, cfg):  # unmutated, every reader goes through
        reader()
    rng = random.Random(SEED)
    tally = {"cases": 0, "tracebacks": [], "outside": [], "hangs": [], "refused": 0}
    began = time.perf_counter()
    old = signal.signal(signal.SIGALRM, _expire)
    try:
        for case in range(CASES):
            run = tmp_path / f"case{case}" / "run"
            shutil.copytree(source, run, symlinks=True)
            what = _mutate(rng, run, outside)
            tally["cases"] += 1
            for reader in _readers(run, cfg):
                _opened.clear()
                _recording[0] = True
                signal.setitimer(signal.ITIMER_REAL, CASE_S)
                try:
                    reader()
                except Hang:
                    tally["hangs"].append(what)
                except ValueError as e:  # CheckpointError, UnsafeName: one line each
                    tally["refused"] += 1
                    if "\n" in str(e) or any(ord(c) < 32 for c in str(e)):
                        tally["tracebacks"].append(f"{what}: not one clean line: {e!r}")
                except Exception as e:  # noqa: BLE001 - counted, reported below
                    tally["tracebacks"].append(f"{what}: {type(e).__name__}: {e}")
                finally:
                    signal.setitimer(signal.ITIMER_REAL, 0)
                    _recording[0] = False
                for p in _opened:
                    real = Path(p).resolve()
                    if not (real.is_relative_to(run.resolve()) or real.suffix in (".py", ".pyc")
                            or real.is_relative_to(Path(sys.prefix).resolve())):
                        tally["outside"].append(f"{what}: opened {p}")
    finally:
        signal.signal(signal.SIGALRM, old)
    seconds = time.perf_counter() - began
    print(f"checkpoint fuzz: {tally['cases']} mutations, {tally['refused']} refusals, "
          f"{len(tally['tracebacks'])} tracebacks, {len(tally['outside'])} reads outside, "
          f"{len(tally['hangs'])} hangs, {seconds:.1f} s")
    assert tally["cases"] >= 300
    assert tally["tracebacks"] == [] and tally["outside"] == [] and tally["hangs"] == []
    assert tally["refused"] > tally["cases"]  # the mutations were seen, not missed
