"""Datagrams the kernel dropped for one UDP socket (receive buffer full), from /proc/net/udp.

A flood the intake thread cannot keep up with is dropped by the kernel before the agent sees it;
those drops are in the ``drops`` column of ``/proc/net/udp`` (``udp6`` for IPv6 sockets), on the
line whose ``inode`` is the socket's. Read on each scrape: always current, no per-packet cost.
"""

from __future__ import annotations

import os
import socket

from laggard.parsers.proc_net_udp import parse_udp_drops


def socket_drops(sock: socket.socket, net_root: str = "/proc/self/net") -> int | None:
    """Datagrams the kernel dropped for ``sock`` since it was opened.

    ``/proc/self/net`` is the network namespace of this process, the one the socket lives in
    (a ``--path.procfs`` pointing at a host's /proc would show another namespace's sockets).

    Args:
        sock: a bound UDP socket.
        net_root: directory holding ``udp`` and ``udp6``.

    Returns:
        The drop count, or None where the files are missing or do not list the socket.
    """
    inode = os.fstat(sock.fileno()).st_ino
    name = "udp6" if sock.family == socket.AF_INET6 else "udp"
    try:
        with open(os.path.join(net_root, name)) as f:
            return parse_udp_drops(f).get(inode)
    except OSError:
        return None
