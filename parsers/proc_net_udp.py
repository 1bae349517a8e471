"""``/proc/net/udp`` and ``/proc/net/udp6``: per-socket drop counts.

Each line after the header is one socket, 13 columns (the header's ``tx_queue rx_queue`` and
``tr tm->when`` are one column each)::

    sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode
       ref pointer drops
    0: 0100007F:2506 00000000:0000 07 00000000:00000000 00:00000000 00000000 0 0 41372
       2 0000000000000000 17

``drops`` counts datagrams the kernel discarded for that socket, mostly because its receive
buffer was full (``sk_drops``, linux/net/ipv4/udp.c ``udp4_format_sock``).
"""

from __future__ import annotations

from collections.abc import Iterable


def parse_udp_drops(lines: Iterable[str]) -> dict[int, int]:
    """``{socket inode: drops}`` from the lines of ``/proc/net/udp`` or ``/proc/net/udp6``.

    Lines without the kernel's 13 columns and numeric inode and drops are skipped (the header,
    a truncated last line).

    Args:
        lines: the file's lines, header included.

    Returns:
        Cumulative drop count (datagrams) per socket inode.
    """
    drops: dict[int, int] = {}
    for line in lines:
        fields = line.split()
        if len(fields) >= 13 and fields[9].isdigit() and fields[12].isdigit():
            drops[int(fields[9])] = int(fields[12])
    return drops
