"""Which addresses recsync's own listening sockets use: loopback where every process of a run is
on this machine (the embedded Ray instance), so that nothing of a run is reachable from the
network."""

from __future__ import annotations

import ipaddress
import socket
from pathlib import Path

IFF_LOOPBACK = 0x8  # linux/if.h


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an IP address, also IPv4 mapped into IPv6) is a loopback address."""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return host == "localhost"
    mapped = getattr(ip, "ipv4_mapped", None)
    return (mapped or ip).is_loopback


def loopback_interface(names: list[str] | None = None,
                       sys_class_net: str = "/sys/class/net") -> str | None:
    """The name of the loopback network interface among ``names`` (default: this machine's),
    for GLOO_SOCKET_IFNAME: the one Linux flags IFF_LOOPBACK, else "lo" or "lo0" where
    present; None if there is none."""
    if names is None:
        names = [name for _, name in socket.if_nameindex()]
    for name in names:
        try:
            flags = int((Path(sys_class_net) / name / "flags").read_text(), 16)
        except (OSError, ValueError):
            continue
        if flags & IFF_LOOPBACK:
            return name
    return next((n for n in ("lo", "lo0") if n in names), None)


def listening_socket(host: str) -> socket.socket:
    """A TCP socket listening on ``host`` only, on a free port: a gloo group's store is served
    from it (torch's TCPStore would otherwise listen on every interface)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.bind((host, 0))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    return sock


def join_gloo_group(host: str, port: int, world: int, rank: int, backend: str, sock) -> None:
    """Join the gloo (or NCCL) group whose TCP store listens on ``host``:``port``; ``sock``: that
    store's listening socket where this process serves it (rank 0), else None. With the store on
    loopback, every rank is on this machine: gloo's own connections then use the loopback
    interface too (unless GLOO_SOCKET_IFNAME says otherwise)."""
    import datetime as dt
    import os

    import torch.distributed as dist
    if is_loopback(host) and (interface := loopback_interface()):
        os.environ.setdefault("GLOO_SOCKET_IFNAME", interface)
    fd = sock.detach() if sock is not None else None  # the store owns it from here
    timeout = dt.timedelta(seconds=60)
    store = dist.TCPStore(host, port, world, is_master=fd is not None, timeout=timeout,
                          master_listen_fd=fd)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout)
