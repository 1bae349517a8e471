"""Datagrams the kernel dropped for one UDP socket (receive buffer full), from /proc/net/udp.

A flood the intake thread cannot keep up with is dropped by the kernel before the agent sees it;
those drops are in the ``drops`` column of ``/proc/net/udp`` (``udp6`` for IPv6 sockets), on the
line whose ``inode`` is the socket's. Read on each scrape: always current, no per-packet cost.
"""

from __future__ import annotations

import os
import socket


def parse_udp_drops(text: str) -> dict[int, int]:
    """Parse ``/proc/net/udp`` or ``/proc/net/udp6`` into ``{socket inode: drops}``.

    Lines that do not have the kernel's 13 columns are skipped (a header, a truncated read).

    Args:
        text: the file's content.

    Returns:
        Cumulative drop count (datagrams) per socket inode.
    """
    drops: dict[int, int] = {}
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) >= 13 and fields[9].isdigit() and fields[12].isdigit():
            drops[int(fields[9])] = int(fields[12])
    return drops


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
            return parse_udp_drops(f.read()).get(inode)
    except OSError:
        return None
