"""recsync.cluster.net: which addresses are loopback, the loopback interface, a socket listening on
one address only."""

import socket

import pytest

from recsync.cluster.net import is_loopback, listening_socket, loopback_interface


@pytest.mark.parametrize("host, loopback", [
    ("127.0.0.1", True), ("127.0.1.1", True), ("::1", True), ("::ffff:127.0.0.1", True),
    ("localhost", True), ("0.0.0.0", False), ("::", False), ("192.0.2.2", False),
    ("::ffff:192.0.2.2", False), ("fd00::2", False), ("example.org", False)])
def test_is_loopback(host, loopback):
    assert is_loopback(host) is loopback


def test_loopback_interface_is_the_one_flagged_loopback(tmp_path):
    for name, flags in (("eth0", "0x1003"), ("weird", "0x9"), ("lo", "0x1")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "flags").write_text(flags + "\n")
    assert loopback_interface(["eth0", "weird", "lo"], str(tmp_path)) == "weird"
    assert loopback_interface(["eth0", "lo0"], str(tmp_path / "none")) == "lo0"
    assert loopback_interface(["eth0"], str(tmp_path / "none")) is None


def test_listening_socket_listens_on_the_host_only():
    with listening_socket("127.0.0.1") as sock:
        host, port = sock.getsockname()
        assert host == "127.0.0.1" and port > 0
        with socket.create_connection((host, port), timeout=5):
            pass
