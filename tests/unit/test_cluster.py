"""recsync.cluster.ray_session without starting Ray (ray.init and ray.shutdown replaced): the
embedded start on loopback, Ray's token file readable by its owner only, the session folder removed
at exit unless cluster.keep_ray_logs. tests/integration/test_loopback.py looks at the sockets
of a real run."""

import logging
import os
import stat
from types import SimpleNamespace

import pytest
import ray
from ray._private import ray_constants

from recsync.cluster.ray_session import private_auth_token, ray_session, remove_session
from recsync.config import ClusterConfig


@pytest.fixture
def no_auth_env(monkeypatch, tmp_path):
    for key in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    return tmp_path / "home"


def _session(root):
    session = root / "session_2026-01-01_00-00-00_000000_1"
    (session / "logs").mkdir(parents=True)
    (session / "logs" / "raylet.out").write_text("log")
    (root / "session_latest").symlink_to(session)
    return session


def test_remove_session_removes_the_folder_and_the_latest_link_to_it(tmp_path):
    session = _session(tmp_path)
    remove_session(session)
    assert not session.exists() and not os.path.lexists(tmp_path / "session_latest")


def test_remove_session_leaves_a_latest_link_to_another_session(tmp_path):
    session = _session(tmp_path)
    other = tmp_path / "session_2026-01-01_00-00-01_000000_2"
    other.mkdir()
    (tmp_path / "session_latest").unlink()
    (tmp_path / "session_latest").symlink_to(other)
    remove_session(session)
    assert not session.exists() and os.readlink(tmp_path / "session_latest") == str(other)


def test_the_auth_token_recsync_creates_is_readable_by_its_owner_only(no_auth_env):
    path = private_auth_token(no_auth_env)
    assert path == no_auth_env / ".ray" / "auth_token"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    token = path.read_text()
    assert len(token) == 64 and int(token, 16) > 0
    assert private_auth_token(no_auth_env) == path and path.read_text() == token  # kept


def test_an_existing_token_is_left_as_it_is_with_a_warning_if_others_can_read_it(no_auth_env,
                                                                                  caplog):
    path = no_auth_env / ".ray" / "auth_token"
    path.parent.mkdir()
    path.write_text("theirs")
    path.chmod(0o644)
    with caplog.at_level(logging.WARNING, logger="recsync.cluster.ray_session"):
        private_auth_token(no_auth_env)
    assert path.read_text() == "theirs" and stat.S_IMODE(path.stat().st_mode) == 0o644
    assert "can be read by other users" in caplog.text


@pytest.mark.parametrize("key, value", [("RAY_AUTH_MODE", "disabled"),
                                        ("RAY_AUTH_TOKEN", "abc"),
                                        ("RAY_AUTH_TOKEN_PATH", "/elsewhere")])
def test_no_token_file_where_ray_is_told_to_use_none(no_auth_env, monkeypatch, key, value):
    monkeypatch.setenv(key, value)
    assert private_auth_token(no_auth_env) is None
    assert not (no_auth_env / ".ray").exists()


class FakeRay:
    """ray.init / ray.shutdown of a run that made ``session``; records what init saw."""

    def __init__(self, session, node_ip="127.0.0.1"):
        self.session, self.node_ip, self.calls = session, node_ip, []

    def is_initialized(self):
        return bool(self.calls) and self.calls[-1][0] == "init"

    def init(self, **kwargs):
        self.calls.append(("init", kwargs, ray_constants.ENABLE_RAY_CLUSTER))
        return SimpleNamespace(address_info={"session_dir": str(self.session),
                                             "node_ip_address": self.node_ip})

    def shutdown(self):
        self.calls.append(("shutdown",))


@pytest.fixture
def fake_ray(monkeypatch, tmp_path, no_auth_env):
    fake = FakeRay(_session(tmp_path / "ray"))
    monkeypatch.setattr(ray, "is_initialized", fake.is_initialized)
    monkeypatch.setattr(ray, "init", fake.init)
    monkeypatch.setattr(ray, "shutdown", fake.shutdown)
    return fake


def test_the_embedded_start_is_on_loopback_and_its_session_folder_goes_at_exit(fake_ray,
                                                                               no_auth_env):
    before = ray_constants.ENABLE_RAY_CLUSTER
    with ray_session(ClusterConfig(object_store_mb=128)):
        assert fake_ray.session.exists()
    (_, kwargs, clusters_during_init), shutdown = fake_ray.calls
    assert clusters_during_init is False and ray_constants.ENABLE_RAY_CLUSTER == before
    # "local": a new instance, never a cluster left running on this machine (RAY_ADDRESS,
    # /tmp/ray/ray_current_cluster)
    assert kwargs["address"] == "local" and kwargs["object_store_memory"] == 128 * 2**20
    assert shutdown == ("shutdown",)
    assert not fake_ray.session.exists()
    assert stat.S_IMODE((no_auth_env / ".ray" / "auth_token").stat().st_mode) == 0o600


def test_keep_ray_logs_keeps_the_session_folder(fake_ray):
    with ray_session(ClusterConfig(keep_ray_logs=True)):
        pass
    assert (fake_ray.session / "logs" / "raylet.out").exists()


def test_the_session_folder_goes_also_when_the_run_fails(fake_ray):
    with pytest.raises(RuntimeError, match="boom"), ray_session(ClusterConfig()):
        raise RuntimeError("boom")
    assert fake_ray.calls[-1] == ("shutdown",) and not fake_ray.session.exists()


def test_an_embedded_start_beyond_loopback_is_reported(fake_ray, caplog):
    fake_ray.node_ip = "10.1.2.3"
    with caplog.at_level(logging.WARNING, logger="recsync.cluster.ray_session"), \
            ray_session(ClusterConfig()):
        pass
    assert "runs on 10.1.2.3, not on loopback" in caplog.text


def test_joining_a_cluster_changes_nothing_of_rays_and_removes_nothing(fake_ray, no_auth_env):
    with ray_session(ClusterConfig(address="10.0.0.1:6379")):
        pass
    (_, kwargs, clusters_during_init), _ = fake_ray.calls
    assert kwargs["address"] == "10.0.0.1:6379" and clusters_during_init is True
    assert fake_ray.session.exists() and not (no_auth_env / ".ray").exists()
