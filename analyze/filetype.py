"""Tell what an incident artifact is from its content, not its name.

:func:`detect` reads the first (and, when needed, the last) :data:`PROBE_BYTES` of a file,
gunzipping ``.gz`` transparently, and returns one of :data:`KINDS`, or None with a reason. The
markers are the fixed strings each producer prints (see each parser's module docstring):

==================== ===================================================================
kind                 marker
==================== ===================================================================
flight_recorder      pickle protocol 2-5 header; or JSON/printed dict with ``"pg_config"``
                     and ``"entries"``
fr_trace_report      torchfrtrace's ``Not all ranks joining collective``
nccl_inspector       JSON lines with ``coll_perf``/``p2p_perf``/``dump_stats``/``proxy_trace``
nccl_inspector_prom  exposition lines named ``nccl_*``
dcgm                 exposition lines named ``DCGM_FI_*``
nvidia_smi_q         ``NVSMI LOG`` or a ``Clocks Event/Throttle Reasons`` section
nvidia_smi_csv       a CSV header of ``--query-gpu`` names (``pci.bus_id``, ``clocks.sm``...)
nccl_tests           ``# Avg bus bandwidth`` or the ``size count type redop`` header
proc_net_dev         ``Inter-|`` and ``face |bytes`` header lines
infiniband_listing   ``.../infiniband/<dev>/ports/<n>/...:value`` lines
ibstat               ``CA '<dev>'`` followed by ``Port N:``
perfquery            ``# Port counters: Lid``
kernel_log           ``NVRM:`` or an ``SXid``/``Xid`` line
nccl_log             ``ProcessGroupNCCL``, ``WorkNCCL``, ``NCCL INFO``/``NCCL WARN``,
                     ``NCCL error in:``, ``ncclUniqueId``, the store's ``clients joined``
mixed_log            both kernel and NCCL markers (both parsers run)
==================== ===================================================================
"""

from __future__ import annotations

import gzip
import io
import json
import os
import re
import zlib
from collections.abc import Iterator
from typing import IO

__all__ = ["KINDS", "PROBE_BYTES", "detect", "open_text", "FileKindError"]

KINDS = (
    "flight_recorder", "fr_trace_report", "nccl_inspector", "nccl_inspector_prom", "dcgm",
    "nvidia_smi_q", "nvidia_smi_csv", "nccl_tests", "proc_net_dev", "infiniband_listing",
    "ibstat", "perfquery", "kernel_log", "nccl_log", "mixed_log",
)
#: Bytes read from each end of a file to decide its kind.
PROBE_BYTES = 64 * 1024

_GZIP_MAGIC = b"\x1f\x8b"
_PICKLE = re.compile(rb"^\x80[\x02-\x05]")
_EXPOSITION = re.compile(r"^(?P<name>[A-Za-z_:][\w:]*)(?:\{[^}]*\})?\s+[-+0-9.eEnaNInf]+\s*$",
                         re.MULTILINE)
_CSV_QUERY = re.compile(r"^\s*(?:index|name|uuid|pci\.bus_id|timestamp)?[\w.]*(?: \[[^\]]+\])?"
                        r"(?:\s*,\s*[\w.]+(?: \[[^\]]+\])?)+\s*$")
_QUERY_FIELD = re.compile(r"\b(?:pci\.bus_id|clocks_(?:event|throttle)_reasons\.\w+|clocks\.\w+|"
                          r"temperature\.gpu|power\.draw|utilization\.gpu|memory\.used)\b")
_IB_PATH = re.compile(r"infiniband/[^/\s]+/ports/\d+/[\w/]+(?::|\s)")
_XID = re.compile(r"\bS?Xid\b.*\d|NVRM:")
_NCCL = re.compile(r"ProcessGroupNCCL|WorkNCCL|NCCL (?:INFO|WARN|ABORT)|NCCL error in:|"
                   r"Watchdog caught collective|mismatch between collectives|ncclUniqueId|"
                   r"clients joined|watchdog got stuck|Heartbeat monitor timed out")


class FileKindError(ValueError):
    """The file cannot be classified (binary, empty, or no known marker)."""


def _open_binary(path: str) -> IO[bytes]:
    f = open(path, "rb")
    if f.read(2) == _GZIP_MAGIC:
        f.close()
        return gzip.open(path, "rb")  # type: ignore[return-value]
    f.seek(0)
    return f


def open_text(path: str) -> IO[str]:
    """Open a (possibly gzipped) file as text, replacing undecodable bytes."""
    return io.TextIOWrapper(_open_binary(path), encoding="utf-8", errors="replace")


def iter_lines(path: str) -> Iterator[str]:
    """Stream a file's lines (constant memory for any size)."""
    with open_text(path) as f:
        yield from f


def _looks_binary(head: bytes) -> bool:
    if not head:
        return False
    if b"\x00" in head:
        return True
    sample = head[:4096]
    controls = sum(1 for b in sample if b < 9 or 13 < b < 32)
    return controls > len(sample) * 0.1


def _classify(text: str) -> str | None:
    stripped = text.lstrip()
    if stripped.startswith(("{", "[")) and '"pg_config"' in text and '"entries"' in text:
        return "flight_recorder"
    if "Not all ranks joining collective" in text or "torchfrtrace" in text:
        return "fr_trace_report"
    if stripped.startswith("{") and _inspector_json(text):
        return "nccl_inspector"
    names = {m.group("name") for m in _EXPOSITION.finditer(text)}
    if any(n.startswith("DCGM_FI_") for n in names):
        return "dcgm"
    if any(n.startswith("nccl_") for n in names):
        return "nccl_inspector_prom"
    if "NVSMI LOG" in text or re.search(r"^\s*Clocks (?:Event|Throttle) Reasons\s*$", text,
                                        re.MULTILINE):
        return "nvidia_smi_q"
    first = next((line for line in text.splitlines() if line.strip()), "")
    if _CSV_QUERY.match(first) and _QUERY_FIELD.search(first):
        return "nvidia_smi_csv"
    if "Avg bus bandwidth" in text or re.search(r"#\s+size\s+count\s+type\s+redop", text):
        return "nccl_tests"
    if "Inter-|" in text and "face |bytes" in text:
        return "proc_net_dev"
    if _IB_PATH.search(text):
        return "infiniband_listing"
    if re.search(r"^CA '[^']+'", text, re.MULTILINE) and re.search(r"^\s+Port \d+:", text,
                                                                   re.MULTILINE):
        return "ibstat"
    if re.search(r"#\s*Port (?:extended )?counters:\s*Lid", text):
        return "perfquery"
    kernel, nccl = bool(_XID.search(text)), bool(_NCCL.search(text))
    if kernel and nccl:
        return "mixed_log"
    if kernel:
        return "kernel_log"
    if nccl:
        return "nccl_log"
    return None


def _inspector_json(text: str) -> bool:
    for line in text.splitlines()[:20]:
        line = line.strip()
        if not line:
            continue
        try:
            obj = json.loads(line)
        except (ValueError, RecursionError):  # a few thousand "[" exhaust json's recursion
            return False
        return isinstance(obj, dict) and any(
            k in obj for k in ("coll_perf", "p2p_perf", "dump_stats", "proxy_trace",
                               "record_type"))
    return False


def detect(path: str) -> str:
    """Return the kind of the file at ``path`` (one of :data:`KINDS`).

    Raises:
        FileKindError: empty, binary, a truncated or corrupt gzip file, or no known marker in
            its first or last 64 KiB.
        OSError: it cannot be opened or read.
    """
    with _open_binary(path) as f:
        try:
            head = f.read(PROBE_BYTES)
        except (EOFError, zlib.error) as exc:  # gzip.BadGzipFile is an OSError already
            raise FileKindError(f"truncated or corrupt gzip file: {exc}") from None
        if not head:
            raise FileKindError("empty file")
        if _PICKLE.match(head):
            return "flight_recorder"
        if _looks_binary(head):
            raise FileKindError("binary data that is not a flight-recorder pickle")
        kind = _classify(head.decode("utf-8", errors="replace"))
        if kind is not None:
            return kind
        tail = b""
        if isinstance(f, io.BufferedReader) and os.path.getsize(path) > 2 * PROBE_BYTES:
            f.seek(-PROBE_BYTES, os.SEEK_END)
            tail = f.read(PROBE_BYTES)
        if tail and not _looks_binary(tail):
            kind = _classify(tail.decode("utf-8", errors="replace").split("\n", 1)[-1])
            if kind in ("kernel_log", "nccl_log", "mixed_log"):
                return kind
    raise FileKindError("no known marker (not a kernel log, NCCL log, nccl-tests output, "
                        "flight-recorder dump, nvidia-smi, dcgm, /proc/net/dev or IB output)")
