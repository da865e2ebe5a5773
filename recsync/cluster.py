"""Start or join Ray, and always leave nothing behind.

The embedded default is for one machine, so nothing of it listens beyond loopback: Ray (2.60)
binds its gRPC servers (GCS, raylet, object manager, every core worker) to 127.0.0.1 only when
the node's address is 127.0.0.1, and otherwise to every interface; ``ray.init`` takes the node
address from ``_node_ip_address`` only after turning a loopback one into the machine's address,
and takes 127.0.0.1 only where Ray clusters are disabled (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``,
read once when ray is imported: ``loopback_node`` sets the flag Ray derived from it while the
instance starts). Joining a cluster (``cluster.address``) changes nothing of Ray's.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import shutil
import time
from pathlib import Path

from recsync.config import ClusterConfig
from recsync.net import is_loopback

log = logging.getLogger(__name__)


@contextlib.contextmanager
def ray_session(cfg: ClusterConfig):
    """Embedded default: a local Ray instance on loopback with the dashboard off and a bounded
    object store, shut down on exit (also on error and Ctrl-C) and its session folder removed
    (kept with ``cfg.keep_ray_logs``). Its actors run at the driver's priority (Ray's default
    nice 15 lets any other process on the machine take their CPU, which an emulated cluster
    cannot pace against). With ``cfg.address``: join that cluster, and only disconnect from it
    on exit."""
    import ray
    if ray.is_initialized():  # e.g. a test's session-scoped cluster
        yield
        return
    session = None
    try:  # from before ray.init: a signal while it starts still shuts down what it started
        if cfg.address:
            ray.init(address=cfg.address, logging_level=logging.WARNING)
        else:
            private_auth_token(Path.home())
            with loopback_node():  # address "local": never join a cluster left running here
                ctx = ray.init(address="local", include_dashboard=False,
                               object_store_memory=cfg.object_store_mb * 2**20,
                               num_cpus=os.cpu_count(), logging_level=logging.WARNING,
                               configure_logging=True, log_to_driver=True,
                               _system_config={"worker_niceness": 0})
            session = Path(ctx.address_info["session_dir"])
            node_ip = ctx.address_info["node_ip_address"]
            if not is_loopback(node_ip):
                log.warning("the embedded Ray instance runs on %s, not on loopback: its "
                            "processes are reachable from the network", node_ip)
        yield
    finally:
        if ray.is_initialized():
            ray.shutdown()
        if session is not None:
            if cfg.keep_ray_logs:
                log.info("Ray's logs of this run: %s", session)
            else:
                remove_session(session)


@contextlib.contextmanager
def loopback_node():
    """Within: a Ray instance started here gets node address 127.0.0.1 (see the module
    docstring); its processes are told that address on their command lines."""
    from ray._private import ray_constants
    before = ray_constants.ENABLE_RAY_CLUSTER
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = before


def private_auth_token(home: Path) -> Path | None:
    """Ray 2.60 starts a local instance with token authentication and, where no token exists,
    writes one to ~/.ray/auth_token readable by everyone (mode 0644). Create it first, readable
    by its owner only; a token recsync did not create is left as it is, with a warning if
    others can read it. None where Ray's settings say no token file is used."""
    env = os.environ
    if (env.get("RAY_AUTH_MODE", "token").lower() != "token" or env.get("RAY_AUTH_TOKEN")
            or env.get("RAY_AUTH_TOKEN_PATH")):
        return None
    path = home / ".ray" / "auth_token"
    path.parent.mkdir(mode=0o700, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        if path.stat().st_mode & 0o077:
            log.warning("%s (Ray's authentication token) can be read by other users: "
                        "chmod 600 %s", path, path)
        return path
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32))  # as Ray's own: 256 random bits
    return path


def remove_session(session: Path, attempts: int = 5) -> None:
    """Remove a stopped instance's session folder (logs, sockets, spilled objects) and the
    ``session_latest`` link beside it if it names this session. A process still exiting may
    write one last file into it, hence the retries."""
    for attempt in range(attempts):
        try:
            shutil.rmtree(session)
            break
        except FileNotFoundError:
            break
        except OSError as e:
            if attempt == attempts - 1:
                log.warning("could not remove Ray's session folder %s: %s", session, e)
                return
            time.sleep(0.2)
    latest = session.parent / "session_latest"
    with contextlib.suppress(OSError):
        if latest.is_symlink() and Path(os.readlink(latest)) in (session, Path(session.name)):
            latest.unlink()
