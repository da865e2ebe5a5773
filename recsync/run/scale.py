"""`recsync scale RUN_DIR`: ask a running elastic run for another number of workers, or to drain
a node, through a file in its output directory that the driver reads every poll.

A file, not a call: the driver may run anywhere the output directory is reachable from, needs
no port of its own, and a request survives the moment it is made (the driver takes it up at its
next poll, within a second). ``scale.json`` holds the newest request; each carries a sequence
number, so the driver takes each up once. The driver's answer goes into its console,
metrics.jsonl's events and summary.json's ``elastic`` section.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from recsync.config import load_config

REQUEST_FILE = "scale.json"


def ask(run_dir: str | Path, workers: int | None = None,
        drain_nodes: list[str] | None = None) -> dict:
    """Write a request into ``run_dir`` (the ``--out`` of a running elastic run): ``workers``,
    a new target between the run's min and max; ``drain_nodes``, nodes (Ray node ids, or a
    prefix of one) whose workers and PS shards move off. Returns the request. ValueError
    (one line) for a directory that holds no running elastic run or a target out of range."""
    run_dir = Path(run_dir)
    if workers is None and not drain_nodes:
        raise ValueError("recsync scale: give --workers N or --drain-node ID")
    config = run_dir / "config.toml"
    if not config.is_file():
        raise ValueError(f"{run_dir}: no config.toml; is it the --out directory of a run?")
    if (run_dir / "summary.json").is_file():
        raise ValueError(f"{run_dir}: the run has ended (summary.json is written)")
    c = load_config(config).cluster
    if not c.elastic:
        raise ValueError(f"{config}: cluster.workers = {c.workers} is one number; only a run "
                         f"started with a range [min, max] changes its number of workers")
    if workers is not None and not c.workers_min <= workers <= c.workers:
        raise ValueError(f"--workers {workers}: the run's range is [{c.workers_min}, "
                         f"{c.workers}] (cluster.workers)")
    before = read(run_dir)
    request = {"sequence": (before or {}).get("sequence", 0) + 1, "unix": time.time(),
               "workers": workers, "drain_nodes": list(drain_nodes or [])}
    tmp = run_dir / f".{REQUEST_FILE}.tmp-{os.getpid()}"
    tmp.write_text(json.dumps(request))
    os.replace(tmp, run_dir / REQUEST_FILE)  # the driver never reads half a request
    return request


def read(run_dir: str | Path) -> dict | None:
    """The newest request in ``run_dir``, or None."""
    try:
        return json.loads((Path(run_dir) / REQUEST_FILE).read_text())
    except FileNotFoundError:
        return None


class Requests:
    """The driver's side: each request of ``run_dir`` once, in order of asking."""

    def __init__(self, run_dir: Path | None):
        self.run_dir = run_dir
        self.seen = 0
        if run_dir is not None and (old := read(run_dir)) is not None:
            self.seen = old["sequence"]  # an earlier run's, in a directory overwritten

    def new(self) -> dict | None:
        """The request made since the last call, if any (the newest: one made in between is
        overtaken by it)."""
        if self.run_dir is None:
            return None
        try:
            request = read(self.run_dir)
        except (json.JSONDecodeError, OSError):
            return None
        if request is None or request.get("sequence", 0) <= self.seen:
            return None
        self.seen = request["sequence"]
        return request
