"""Seeded fuzz of model directories (issue 29): a real small model directory, model.json and its
tensor files mutated a few hundred ways (keys deleted, types changed, huge, negative and NaN
numbers, control characters, '../x' and absolute names, symlinks and FIFOs, names of code to
run, truncated, swapped and NaN tensors), each loaded under a time bound. Every case must load
or fail with a one-line ValueError; none may run code, read a file outside the directory or
hang. Run: pytest -q -s tests/unit/test_model_dir_fuzz.py (-s prints the figures)."""

from __future__ import annotations

import faulthandler
import json
import math
import os
import random
import shutil
import signal
import struct
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import recsync.model_dir.read as read
from recsync.model_dir.trained import load_model
from test_model_dir_untrusted import EVIL, make_data, write_trained

SEED = 29
RANDOM_CASES = 330
CASE_S = 5.0  # one case's bound: a hang fails the test instead of blocking CI
BACKSTOP_S = 300  # a hang inside C code that no signal interrupts ends the process, loudly
ATTACKS = [("pydoc:pipepager", {"cmd": "id > {marker}"}), ("os:system", {"command": "id > "
                                                                          "{marker}"}),
           ("this:x", {}), ("code/evil.py:build", {}), ("code.evil:build", {}),
           ("subprocess:run", {"args": "id > {marker}", "shell": True})]
BAD = [None, True, False, 0, -1, 1, 2, 2**31, 2**40, 2**63, 2**64, 10**30, -(2**63), 0.5, -0.0,
       1e308, float("nan"), float("inf"), -float("inf"), "", "x", "a\n\x1b[31mred\x00\x7f",
       "../x", "../model.json", "/etc/passwd", "../../../../../etc/passwd", "/dev/zero",
       "dense.safetensors", "table-000.safetensors", "model.json", ".", "..", "code/evil.py",
       "x" * 5000, [], [1], [None], [[]], {}, {"a": 1}, {"name": "x"}, "dlrm", "lr",
       *(name for name, _ in ATTACKS)]
SECTIONS = ["model", "train", "data", "tables", "dense", "dense_optimizer", "format",
            "format_version", "optimizer_state", "run"]


class Hang(KeyboardInterrupt):
    """A case over its bound (a KeyboardInterrupt: no `except Exception` in the code under
    test swallows it)."""


def _alarm(signum, frame):
    raise Hang()


def _paths(node, prefix=()):
    yield prefix
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _paths(v, (*prefix, i))


def _get(meta, path):
    for p in path:
        meta = meta[p]
    return meta


def mutate_json(rng: random.Random, meta: dict, marker: Path) -> str:
    """Apply one random mutation to ``meta`` in place; returns what it did."""
    section = rng.choice(SECTIONS)
    if section not in meta:
        meta[section] = rng.choice(BAD)
        return f"add {section}"
    path = rng.choice(list(_paths(meta[section], (section,))))
    parent, key = (_get(meta, path[:-1]), path[-1]) if len(path) > 1 else (meta, path[0])
    value = parent[key]
    op = rng.choice(["delete", "replace", "replace", "scale", "retype", "add", "dup", "attack"])
    if op == "delete":
        del parent[key]
    elif op == "replace" or (op == "scale" and not isinstance(value, (int, float))):
        parent[key] = rng.choice(BAD)
    elif op == "scale":
        parent[key] = rng.choice([-value, value + 1, value - 1, value * 2**20, value * 2**40,
                                  value * 1e300, 2**63 - 1, -(2**63)])
    elif op == "retype":
        parent[key] = rng.choice([str(value), [value], {"v": value}, json.dumps(value)])
    elif op == "add" and isinstance(value, dict):
        value[rng.choice(["x", "\x00", "../x", "__class__", "file", "rows"])] = rng.choice(BAD)
    elif op == "dup" and isinstance(value, list) and value:
        value.append(json.loads(json.dumps(rng.choice(value))))
        rng.shuffle(value)
    else:
        name, params = rng.choice(ATTACKS)
        meta["model"] = dict(meta.get("model") if isinstance(meta.get("model"), dict) else {},
                             name=name, params={k: v.format(marker=marker) if isinstance(v, str)
                                                else v for k, v in params.items()})
        return f"model.name = {name!r}"
    return f"{op} {'.'.join(map(str, path))}"


def mutate_tensors(rng: random.Random, work: Path, names: list[str]) -> str:
    """Damage one tensor file of ``work`` at random; returns what it did."""
    name = rng.choice(names)
    file = work / name
    raw = file.read_bytes()
    op = rng.choice(["truncate", "flip", "swap", "nan", "dtype", "drop", "extra", "header",
                     "empty", "reverse"])
    if op == "truncate":
        file.write_bytes(raw[:rng.randrange(len(raw))])
    elif op == "flip":
        b = bytearray(raw)
        for _ in range(rng.randint(1, 8)):
            b[rng.randrange(min(len(b), 300))] = rng.randrange(256)
        file.write_bytes(bytes(b))
    elif op == "swap":
        other = rng.choice([n for n in names if n != name])
        file.write_bytes((work / other).read_bytes())
    elif op == "empty":
        file.write_bytes(b"")
    elif op == "header":  # a header claiming an absurd tensor over 16 bytes of data
        shape = rng.choice([[2**40, 2**40], [2**62, 4], [-1], [1, 2**63]])
        head = json.dumps({"rows": {"dtype": "F32", "shape": shape, "data_offsets": [0, 16]}})
        file.write_bytes(struct.pack("<Q", len(head)) + head.encode() + b"\0" * 16)
    else:
        tensors = load_file(str(file))
        key = rng.choice(sorted(tensors))
        t = tensors[key]
        if op == "nan" and t.is_floating_point() and t.numel():
            t.view(-1)[rng.randrange(t.numel())] = rng.choice([math.nan, math.inf, -math.inf])
        elif op == "dtype":
            tensors[key] = t.to(rng.choice([torch.float64, torch.int32, torch.float16]))
        elif op == "drop":
            del tensors[key]
        elif op == "extra":
            tensors["extra\n"] = torch.zeros(3)
        elif op == "reverse" and t.dim() and len(t) > 1:
            tensors[key] = t.flip(0).contiguous()
        save_file(tensors, str(file))
    return f"{op} {name}"


def special_cases(work: Path, outside: Path, marker: Path):
    """The cases a random mutation would rarely hit: (label, setup(work), builder, must_fail).
    must_fail: a regex the one-line error must match."""
    def link(member, target):
        def setup():
            (work / member).unlink()
            (work / member).symlink_to(target)
        return setup

    def replace(member, make):
        def setup():
            (work / member).unlink()
            make(work / member)
        return setup

    def meta_change(change):
        def setup():
            meta = json.loads((work / "model.json").read_text())
            change(meta)
            (work / "model.json").write_text(json.dumps(meta))
        return setup

    cases = []
    for member in ["model.json", "dense.safetensors", "table-000.safetensors",
                   "dense_optimizer.safetensors"]:  # the outside copies are intact
        cases.append((f"symlink {member} outside", link(member, outside / member), None,
                      "leads outside"))
        cases.append((f"symlink {member} ../", link(member, f"../outside/{member}"), None,
                      "leads outside"))
    cases += [
        ("symlink to /etc/passwd", link("table-001.safetensors", "/etc/passwd"), None,
         "leads outside"),
        ("symlink to /dev/zero", link("table-001.safetensors", "/dev/zero"), None,
         "leads outside"),
        ("fifo", replace("table-002.safetensors", os.mkfifo), None, "not a regular file"),
        ("directory", replace("table-002.safetensors", Path.mkdir), None,
         "not a regular file"),
        ("model.json fifo", replace("model.json", os.mkfifo), None, "not a regular file"),
        ("model.json 65 MiB", replace("model.json", lambda p: os.truncate(
            p.open("wb").name, 65 * 2**20)), None, "more than a model.json holds"),
        ("model.json not UTF-8", replace("model.json", lambda p: p.write_bytes(b"\xff{")),
         None, "not valid JSON"),
        ("model.json nested", replace("model.json", lambda p: p.write_text("[" * 100_000)),
         None, "not valid JSON"),
        ("model.json a list", replace("model.json", lambda p: p.write_text("[1]")), None,
         "format is 'list'"),
        ("builder for a built-in", lambda: None, "code/evil.py:build", "is a built-in model"),
        ("table file ../outside", meta_change(lambda m: m["tables"][0].update(
            file="../outside/table-000.safetensors")), None, "not a plain relative name"),
    ]
    for name, params in ATTACKS:
        filled = {k: v.format(marker=marker) if isinstance(v, str) else v
                  for k, v in params.items()}
        cases.append((f"model.name = {name!r}", meta_change(
            lambda m, name=name, filled=filled: m["model"].update(name=name, params=filled)),
            None, "is a user's model; loading it runs that code"))
    return cases


@pytest.fixture(scope="module")
def original(tmp_path_factory):
    data = make_data(tmp_path_factory.mktemp("data"))
    return write_trained(data, tmp_path_factory.mktemp("out"))[1]


def test_fuzzed_model_directories_fail_in_one_line_run_nothing_read_nothing_outside(
        original, tmp_path, monkeypatch, capsys):
    work = Path(shutil.copytree(original, tmp_path / "model"))
    outside = Path(shutil.copytree(original, tmp_path / "outside"))
    (work / "code").mkdir()
    (work / "code" / "evil.py").write_text(EVIL)  # shipped code: it writes work/PWNED
    (work / "code" / "__init__.py").write_text("")
    markers = [work / "PWNED", tmp_path / "PWNED"]
    monkeypatch.chdir(work)
    monkeypatch.syspath_prepend(str(work))
    names = sorted(p.name for p in original.iterdir())
    tensor_names = [n for n in names if n.endswith(".safetensors")]
    pristine = {n: (original / n).read_bytes() for n in names}
    base_meta = json.loads(pristine["model.json"])
    had_this = "this" in sys.modules

    opened: list[Path] = []  # every file the reader opens, resolved
    real_load_file, real_read_bytes = read.load_file, Path.read_bytes
    monkeypatch.setattr(read, "load_file", lambda p: (opened.append(Path(p).resolve()),
                                                      real_load_file(p))[1])
    monkeypatch.setattr(Path, "read_bytes", lambda self: (opened.append(self.resolve()),
                                                          real_read_bytes(self))[1])

    def reset():
        for n in names:
            p = work / n
            if p.is_symlink() or not p.is_file():
                if p.is_dir() and not p.is_symlink():
                    p.rmdir()
                else:
                    p.unlink(missing_ok=True)
            if not p.exists() or p.stat().st_size != len(pristine[n]) or \
                    real_read_bytes(p) != pristine[n]:
                p.write_bytes(pristine[n])

    rng = random.Random(SEED)
    cases = []
    for i in range(RANDOM_CASES):
        def setup(seed=rng.randrange(2**32)):
            r = random.Random(seed)
            did = []
            if r.random() < 0.75:
                meta = json.loads(json.dumps(base_meta))
                for _ in range(r.randint(1, 3)):
                    did.append(mutate_json(r, meta, markers[1]))
                (work / "model.json").write_text(json.dumps(meta))
            else:
                did.append(mutate_tensors(r, work, tensor_names))
            return "; ".join(did)
        cases.append((f"random {i}", setup, None, None))
    cases += special_cases(work, outside, markers[1])

    tracebacks, multi_line, hangs, outside_reads, ran, missed = [], [], [], [], [], []
    loaded = refused = 0
    slowest = 0.0
    begin = time.perf_counter()
    previous = signal.signal(signal.SIGALRM, _alarm)
    faulthandler.dump_traceback_later(BACKSTOP_S, exit=True, file=sys.__stderr__)
    try:
        for label, setup, builder, must_fail in cases:
            reset()
            what = setup() or label
            opened.clear()
            start = time.perf_counter()
            signal.setitimer(signal.ITIMER_REAL, CASE_S)
            try:
                load_model(work, builder=builder)
                loaded += 1
                if must_fail:
                    missed.append(f"{label}: loaded")
            except Hang:
                hangs.append(what)
            except ValueError as e:
                refused += 1
                msg = str(e)
                if "\n" in msg or not all(c.isprintable() for c in msg):
                    multi_line.append(f"{what}: {msg!r}")
                if must_fail and must_fail not in msg:
                    missed.append(f"{label}: {msg}")
            except BaseException as e:  # noqa: BLE001 (what the fuzz hunts)
                tracebacks.append(f"{what}: {type(e).__name__}: {e!r:.300}")
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
            slowest = max(slowest, time.perf_counter() - start)
            root = work.resolve()
            outside_reads += [f"{what}: {p}" for p in opened
                              if p != root and root not in p.parents]
            ran += [f"{what}: {m.name}" for m in markers if m.exists()]
            for m in markers:
                m.unlink(missing_ok=True)
    finally:
        faulthandler.cancel_dump_traceback_later()
        signal.signal(signal.SIGALRM, previous)
    seconds = time.perf_counter() - begin
    imported = [m for m in ("code.evil", "evil") if m in sys.modules]
    if not had_this and "this" in sys.modules:
        imported.append("this")
    with capsys.disabled():
        print(f"\nfuzz: {len(cases)} mutations, {loaded} loaded, {refused} refused, "
              f"tracebacks {len(tracebacks)}, multi-line {len(multi_line)}, reads outside "
              f"{len(outside_reads)}, code run {len(ran) + len(imported)}, hangs {len(hangs)}, "
              f"slowest case {slowest:.2f} s, {seconds:.1f} s")
    assert len(cases) >= 300
    assert tracebacks == [] and multi_line == [] and hangs == []
    assert outside_reads == [] and ran == [] and imported == []
    assert missed == []
    assert refused > len(cases) // 2  # the mutations reach the checks
    assert slowest < CASE_S
