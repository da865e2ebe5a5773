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

from recsync.cluster.net import is_loopback
from recsync.config import ClusterConfig

log = logging.getLogger(__name__)


@contextlib.contextmanager
def ray_session(cfg: ClusterConfig, runtime_env: dict | None = None,
                log_to_driver: bool = True):
    """Embedded default: a local Ray instance on loopback with the dashboard off and a bounded
    object store, shut down on exit (also on error and Ctrl-C) and its session folder removed
    (kept with ``cfg.keep_ray_logs``). Its actors run at the driver's priority (Ray's default
    nice 15 lets any other process on the machine take their CPU, which an emulated cluster
    cannot pace against). With ``cfg.address``, or under ``ray job submit`` (RAY_ADDRESS
    set): join that cluster with ``runtime_env`` (the job's own, under ``ray job submit``), and
    only disconnect from it on exit. ``log_to_driver`` False: the processes' output stays in
    Ray's logs (recsync tune: its trials' runs would print over the search's lines)."""
    import ray
    if ray.is_initialized():  # e.g. a test's session-scoped cluster
        yield
        return
    session = None
    try:  # from before ray.init: a signal while it starts still shuts down what it started
        address = cluster_address(cfg)
        if address:
            # a cluster on this machine's loopback (ray start --node-ip-address 127.0.0.1):
            # this driver's node address is 127.0.0.1 too, or it finds no raylet of its own
            host = address.rpartition("://")[2].rpartition(":")[0]
            on_loopback = loopback_node() if is_loopback(host) else contextlib.nullcontext()
            with on_loopback:
                ray.init(address=address, logging_level=logging.WARNING,
                         runtime_env=runtime_env or None, log_to_driver=log_to_driver)
            log.info("joined the Ray cluster at %s", address)
        else:
            private_auth_token(Path.home())
            with loopback_node():  # address "local": never join a cluster left running here
                ctx = ray.init(address="local", include_dashboard=False,
                               object_store_memory=cfg.object_store_mb * 2**20,
                               num_cpus=os.cpu_count(), logging_level=logging.WARNING,
                               configure_logging=True, log_to_driver=log_to_driver,
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


def cluster_address(cfg: ClusterConfig) -> str | None:
    """The Ray cluster a run joins: ``cluster.address``, else RAY_ADDRESS (set by ``ray job
    submit`` and on a cluster's nodes) unless it is "local"; None: the embedded instance."""
    address = cfg.address or os.environ.get("RAY_ADDRESS", "")
    return None if address in ("", "local") else address


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


def runtime_env_for(cluster: ClusterConfig, model_name: str) -> dict:
    """The runtime environment a run that joins a cluster gives its processes:
    ``cluster.runtime_env``, plus the user's model module (``model.name`` =
    "package.module:builder" or "file.py:builder") in ``py_modules`` where it is not installed,
    so that every node imports it, and the driver's RECSYNC_STAGING (cluster/storage.py: every
    process must name a URL's staging folder alike). Under ``ray job submit`` the job's own
    environment holds (its ``--working-dir``/``--py-modules``/``env_vars``): nothing is added."""
    from ray._private.runtime_env.constants import RAY_JOB_CONFIG_JSON_ENV_VAR
    env = dict(cluster.runtime_env)
    if RAY_JOB_CONFIG_JSON_ENV_VAR in os.environ:
        return env
    if "RECSYNC_STAGING" in os.environ:
        env["env_vars"] = {"RECSYNC_STAGING": os.environ["RECSYNC_STAGING"],
                           **env.get("env_vars", {})}
    path = user_module_path(model_name)
    if path is not None:
        modules = list(env.get("py_modules", []))
        if str(path) not in modules:
            env["py_modules"] = [*modules, str(path)]
    return env


def user_module_path(model_name: str) -> Path | None:
    """The file or package directory of a user's model builder that is not installed (not
    under site-packages); None for a built-in model or an installed package."""
    import importlib.util
    where, sep, _ = model_name.rpartition(":")
    if not sep or not where:
        return None
    if where.endswith(".py"):
        return Path(where).resolve()
    spec = importlib.util.find_spec(where.split(".")[0])
    if spec is None or spec.origin is None:
        return None
    path = (Path(next(iter(spec.submodule_search_locations))) if spec.submodule_search_locations
            else Path(spec.origin))
    if {"site-packages", "dist-packages"} & set(path.parts) or path.name == "recsync":
        return None
    return path.resolve()
