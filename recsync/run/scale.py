"""`recsync scale RUN_DIR`: ask a running elastic run for another number of workers, or to drain
a node, through a file in its output directory that the driver reads every poll.

A file, not a call: the driver may run anywhere the output directory is reachable from, needs
no port of its own, and a request survives the moment it is made (the driver takes it up at its
next poll, within a second). ``scale.jsonl`` holds the requests, a line each, appended; the
driver takes each up once, in order. The driver's answer goes into its console,
metrics.jsonl's events and summary.json's ``elastic`` section.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from recsync.config import load_config

REQUEST_FILE = "scale.jsonl"


def ask(run_dir: str | Path, workers: int | None = None,
        drain_nodes: list[str] | None = None) -> dict:
    """Add a request to ``run_dir`` (the ``--out`` of a running elastic run): ``workers``, a
    new target between the run's min and max; ``drain_nodes``, nodes (Ray node ids, or a
    prefix of one) whose workers and PS shards move off. Returns the request. ValueError
    (one line) for a directory that holds no running elastic run or a target out of range."""
    run_dir = Path(run_dir)
    if workers is None and not drain_nodes:
        raise ValueError("recsync scale: give --workers N or --drain-node ID")
    config = run_dir / "config.toml"
    if not config.is_file():
        raise ValueError(f"{run_dir}: no config.toml; is it the --out directory of a run?")
    summary = run_dir / "summary.json"
    # a run (or a resumed one) writes config.toml as it starts, summary.json as it ends
    if summary.is_file() and summary.stat().st_mtime >= config.stat().st_mtime:
        raise ValueError(f"{run_dir}: the run has ended (summary.json is written)")
    c = load_config(config).cluster
    if not c.elastic:
        raise ValueError(f"{config}: cluster.workers = {c.workers} is one number; only a run "
                         f"started with a range [min, max] changes its number of workers")
    bad = [n for n in drain_nodes or [] if not is_node_id(n)]
    if bad:
        raise ValueError(f"--drain-node {bad[0]!r}: a Ray node id (or a prefix of one) is hex "
                         f"digits")
    if workers is not None and not c.workers_min <= workers <= c.workers:
        raise ValueError(f"--workers {workers}: the run's range is [{c.workers_min}, "
                         f"{c.workers}] (cluster.workers)")
    request = {"unix": time.time(), "workers": workers, "drain_nodes": list(drain_nodes or [])}
    line = (json.dumps(request) + "\n").encode()
    # one write of an appended line: requests made at once are all kept, each whole
    fd = os.open(run_dir / REQUEST_FILE, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)
    return request


def is_node_id(text) -> bool:
    """Whether ``text`` can be a Ray node id or a prefix of one (hex digits)."""
    return (isinstance(text, str) and 0 < len(text) <= 64
            and all(c in "0123456789abcdef" for c in text))


def well_formed(request) -> bool:
    """Whether a line of the request file is a request as ``ask`` writes it (the file is in an
    output directory anyone with access may append to: the driver takes no other)."""
    if not isinstance(request, dict) or not isinstance(request.get("unix"), (int, float)):
        return False
    workers, nodes = request.get("workers"), request.get("drain_nodes", [])
    return ((workers is None or (isinstance(workers, int) and not isinstance(workers, bool)))
            and isinstance(nodes, list) and all(map(is_node_id, nodes)))


def read(run_dir: str | Path) -> list[dict]:
    """Every request in ``run_dir``, in the order made (a line cut short, or one that is not a
    request as ``ask`` writes it, is left out)."""
    try:
        text = (Path(run_dir) / REQUEST_FILE).read_text()
    except FileNotFoundError:
        return []
    out = []
    for line in text.splitlines():
        try:
            request = json.loads(line)
        except json.JSONDecodeError:
            continue
        if well_formed(request):
            out.append(request)
    return out


class Requests:
    """The driver's side: each request made since ``since_unix`` (the run's start: an earlier
    run's, in a directory resumed or overwritten, are not this run's), once, in order."""

    def __init__(self, run_dir: Path | None, since_unix: float | None = None):
        self.run_dir = run_dir
        self.since = time.time() if since_unix is None else since_unix
        self.taken = 0  # lines of the file read so far

    def new(self) -> list[dict]:
        """The requests made since the last call, oldest first."""
        if self.run_dir is None:
            return []
        try:
            requests = read(self.run_dir)
        except OSError:
            return []
        fresh, self.taken = requests[self.taken:], len(requests)
        return [r for r in fresh if r.get("unix", 0) >= self.since]
