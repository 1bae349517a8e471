"""``/proc/net/dev``: per-interface counters, a pure parser.

Format (Linux ``net/core/net-procfs.c``, ``dev_seq_show``): two header lines, then one line per
interface, ``%6s:`` followed by 8 receive and 8 transmit counters. The column names are read from
the second header line rather than assumed, so a kernel that adds columns still parses.
"""

from __future__ import annotations

_DEFAULT_COLUMNS = (
    [f"receive_{c}" for c in ("bytes", "packets", "errs", "drop", "fifo", "frame", "compressed",
                              "multicast")]
    + [f"transmit_{c}" for c in ("bytes", "packets", "errs", "drop", "fifo", "colls", "carrier",
                                 "compressed")]
)


def parse_proc_net_dev(text: str) -> dict[str, dict[str, int]]:
    """Parse the text of ``/proc/net/dev``.

    Lines that are neither the header nor an ``iface: counters`` row (an echoed command, a date
    printed beside a copy of the file) are ignored, and so is a row whose counter count does not
    match the header.

    Args:
        text: the file's content.

    Returns:
        interface name -> {``receive_bytes``, ``receive_packets``, ... ``transmit_compressed``}
        -> counter value (int).
    """
    columns = list(_DEFAULT_COLUMNS)
    devices: dict[str, dict[str, int]] = {}
    for line in text.splitlines():
        if "|" in line:
            parts = line.split("|")
            # "  face |bytes    packets errs drop ...|bytes    packets errs ..."
            if len(parts) == 3 and "bytes" in parts[1] and "bytes" in parts[2]:
                columns = [f"receive_{c}" for c in parts[1].split()] + [
                    f"transmit_{c}" for c in parts[2].split()
                ]
            continue
        name, sep, rest = line.partition(":")
        name = name.strip()
        if not sep or not name or " " in name:
            continue
        fields = rest.split()
        if len(fields) != len(columns) or not all(f.isdigit() for f in fields):
            continue
        devices[name] = dict(zip(columns, map(int, fields), strict=True))
    return devices
