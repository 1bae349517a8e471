"""NCCL Inspector (NCCL's profiler plugin) JSON-lines output: a pure, incremental parser.

Format (NVIDIA/nccl ``plugins/profiler/inspector/README.md`` and ``inspector_json_reader.py``):
each process appends newline-separated JSON objects to ``<NCCL_INSPECTOR_DUMP_DIR>/
<hostname>-pid<pid>.log``.

* v4.0-v4.2: every record carries ``header`` (``id`` of the communicator, ``rank``,
  ``n_ranks``, ``nnodes``, v4.2 ``comm_name``), ``metadata`` (``inspector_output_format_version``,
  ``hostname``, ``pid``, ``dump_timestamp_us``...) and one of ``coll_perf`` / ``p2p_perf``.
* v4.3: a ``dump_stats`` marker carries ``header`` and ``metadata`` once, with the counts of the
  records that follow it (``coll_records + p2p_records + proxy_records``); those records hold only
  their body and inherit the marker's context. Context never crosses files.
* ``coll_perf``: ``coll`` (``AllReduce``...), ``coll_sn`` (counted per collective type),
  ``coll_msg_size_bytes``, ``coll_exec_time_us`` (an int in NCCL's tests, a float in some real
  dumps), ``coll_timing_source``, ``coll_algobw_gbs``, ``coll_busbw_gbs``, v4.2 ``coll_algo`` /
  ``coll_proto``, verbose ``event_trace_*``. ``p2p_perf`` mirrors it with ``p2p_*`` keys and
  ``p2p_peer``. Bandwidths are in GB/s (1e9 bytes/s).
* proxy records: ``{"proxy_trace": {...}}`` whose inner object has ``record_type``
  (``proxy_step``/``proxy_op``); the README shows the inner object bare, which is accepted too.

The live collector is :mod:`laggard.collectors.nccl_inspector`; ``laggard analyze`` reads
whole files with :func:`parse_inspector_lines`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "InspectorRecord", "InspectorStream", "ProxyRecord", "DumpStats", "parse_inspector_lines",
]

#: Longest line accepted; a longer one is skipped as malformed.
MAX_LINE_BYTES = 1024 * 1024


@dataclass(frozen=True, slots=True)
class InspectorRecord:
    """One completed collective or p2p operation.

    Attributes:
        kind: ``"coll"`` or ``"p2p"``.
        op: ``AllReduce``, ``ReduceScatter``, ``Send``...
        sn: sequence number (per op type for collectives).
        msg_size_bytes: message size (for ReduceScatter, per rank: NCCL's convention).
        exec_time_us: execution time in µs (float).
        algbw_gbs / busbw_gbs: algorithm and bus bandwidth, GB/s.
        timing_source: ``kernel_gpu``, ``kernel_cpu``, ``collective_cpu``, or None.
        algo / proto: v4.2+ (``RING``, ``LL``), else None.
        peer: p2p peer rank.
        comm_id, comm_name, rank, n_ranks, nnodes: from the header (own or marker's).
        hostname, pid, version: from the metadata.
        kernel_span_us: verbose output only: first kernel start to last kernel stop over the
            channels (GPU timing, µs), else None.
        cpu_span_us: verbose output only: the collective's start to stop CPU callbacks (µs;
            enqueue time, not execution), else None.
    """

    kind: str
    op: str
    sn: int | None
    msg_size_bytes: int
    exec_time_us: float
    algbw_gbs: float | None
    busbw_gbs: float | None
    timing_source: str | None
    algo: str | None
    proto: str | None
    peer: int | None
    comm_id: str | None
    comm_name: str | None
    rank: int | None
    n_ranks: int | None
    nnodes: int | None
    hostname: str | None
    pid: int | None
    version: str | None
    kernel_span_us: float | None = None
    cpu_span_us: float | None = None


@dataclass(frozen=True, slots=True)
class ProxyRecord:
    """A completed ProxyOp or ProxyStep (network progress of one channel to one peer).

    Attributes:
        record_type: ``proxy_op`` or ``proxy_step``.
        parent_type / parent_sn: the collective (``coll``) or p2p operation it served.
        proxy_op_sn, proxy_step_sn: its numbers within the communicator / ProxyOp.
        rank, peer, channel_id, direction (``send``/``recv``).
        trans_size_bytes: bytes observed (not necessarily all transferred; see the README).
        duration_us: stop minus start of its CPU proxy timestamps (µs), None if not printed;
            not comparable with GPU kernel timing.
        n_steps, n_steps_completed, n_steps_dropped: ProxyOp counters (None on a step).
    """

    record_type: str
    parent_type: str | None
    parent_sn: int | None
    proxy_op_sn: int | None
    proxy_step_sn: int | None
    rank: int | None
    peer: int | None
    channel_id: int | None
    direction: str | None
    trans_size_bytes: int | None
    duration_us: float | None
    n_steps: int | None
    n_steps_completed: int | None
    n_steps_dropped: int | None


def _proxy(body: dict[str, Any]) -> ProxyRecord:
    kind = str(body.get("record_type", ""))
    trace = body.get("event_trace_ts")
    ts: dict[str, Any] = trace if isinstance(trace, dict) else {}
    prefix = "proxy_step" if kind == "proxy_step" else "proxy_op"
    start, stop = _num(ts.get(f"{prefix}_start_ts")), _num(ts.get(f"{prefix}_stop_ts"))
    return ProxyRecord(
        record_type=kind, parent_type=_text(body.get("parent_type")),
        parent_sn=_integer(body.get("parent_sn")), proxy_op_sn=_integer(body.get("proxy_op_sn")),
        proxy_step_sn=_integer(body.get("proxy_step_sn")), rank=_integer(body.get("rank")),
        peer=_integer(body.get("peer")), channel_id=_integer(body.get("channel_id")),
        direction=_text(body.get("direction")),
        trans_size_bytes=_integer(body.get("trans_size_bytes")),
        duration_us=stop - start if start is not None and stop is not None else None,
        n_steps=_integer(body.get("n_steps")),
        n_steps_completed=_integer(body.get("n_steps_completed")),
        n_steps_dropped=_integer(body.get("n_steps_dropped")),
    )


@dataclass(slots=True)
class DumpStats:
    """A v4.3 ``dump_stats`` marker (counts as dumped) with its context."""

    header: dict[str, Any]
    metadata: dict[str, Any]
    stats: dict[str, Any]


def _num(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    return None


def _integer(value: Any) -> int | None:
    number = _num(value)
    return int(number) if number is not None else None


@dataclass(slots=True)
class InspectorStream:
    """Parser state for one Inspector output file (context never crosses files).

    Attributes:
        records, markers, proxy: counts of what was parsed.
        malformed: lines that were not JSON objects or carried no known body.
        orphans: v4.3-style bodies seen with no marker before them (kept, without context).
        count_mismatches: markers whose announced record counts were not met before the next
            marker or the end (a strict validator's complaint; records are kept anyway).
        dropped: sum of ``*_dropped_since_last_dump`` over markers.
    """

    records: int = 0
    markers: int = 0
    proxy: int = 0
    malformed: int = 0
    orphans: int = 0
    count_mismatches: int = 0
    dropped: int = 0
    last_stats: DumpStats | None = None
    _header: dict[str, Any] | None = None
    _metadata: dict[str, Any] | None = None
    _remaining: dict[str, int] = field(default_factory=dict)

    def feed(self, line: str | bytes) -> InspectorRecord | ProxyRecord | DumpStats | None:
        """Parse one line; return the operation record, proxy record or marker it holds."""
        try:
            obj = json.loads(line)
        except (ValueError, UnicodeDecodeError, RecursionError):
            if line.strip():
                self.malformed += 1
            return None
        if not isinstance(obj, dict):
            self.malformed += 1
            return None
        if "dump_stats" in obj:
            return self._marker(obj)
        if "proxy_trace" in obj or "record_type" in obj:
            self.proxy += 1
            self._consume("proxy_trace")
            body = obj.get("proxy_trace", obj)
            return _proxy(body) if isinstance(body, dict) else None
        for kind in ("coll_perf", "p2p_perf"):
            body = obj.get(kind)
            if isinstance(body, dict):
                header, metadata = obj.get("header"), obj.get("metadata")
                if not isinstance(header, dict):
                    if self._header is None:
                        self.orphans += 1
                    else:
                        self._consume(kind)
                    header, metadata = self._header, self._metadata
                record = _record(kind[:-5], body, header or {}, metadata or {})
                if record is None:
                    self.malformed += 1
                else:
                    self.records += 1
                return record
        self.malformed += 1
        return None

    def finish(self) -> None:
        """End of the file: a marker whose records never all came counts as a mismatch."""
        if any(n > 0 for n in self._remaining.values()):
            self.count_mismatches += 1
        self._remaining = {}

    def _marker(self, obj: dict[str, Any]) -> DumpStats:
        self.finish()
        self.markers += 1
        stats = obj["dump_stats"] if isinstance(obj["dump_stats"], dict) else {}
        header: dict[str, Any] = obj["header"] if isinstance(obj.get("header"), dict) else {}
        metadata: dict[str, Any] = (obj["metadata"] if isinstance(obj.get("metadata"), dict)
                                    else {})
        self._header, self._metadata = header, metadata
        self._remaining = {
            "coll_perf": _integer(stats.get("coll_records")) or 0,
            "p2p_perf": _integer(stats.get("p2p_records")) or 0,
            "proxy_trace": _integer(stats.get("proxy_records")) or 0,
        }
        self.dropped += sum(_integer(stats.get(k)) or 0 for k in (
            "coll_dropped_since_last_dump", "p2p_dropped_since_last_dump",
            "proxy_dropped_since_last_dump"))
        self.last_stats = DumpStats(header, metadata, stats)
        return self.last_stats

    def _consume(self, kind: str) -> None:
        if self._header is None:
            return
        left = self._remaining.get(kind, 0)
        if left <= 0:
            self.count_mismatches += 1
            self._remaining = {}  # counted once; the records are still kept
        else:
            self._remaining[kind] = left - 1


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _record(kind: str, body: dict[str, Any], header: dict[str, Any],
            metadata: dict[str, Any]) -> InspectorRecord | None:
    op = body.get(kind)
    size = _integer(body.get(f"{kind}_msg_size_bytes"))
    time_us = _num(body.get(f"{kind}_exec_time_us"))
    if not isinstance(op, str) or size is None or time_us is None or time_us < 0:
        return None
    return InspectorRecord(
        kind=kind, op=op, sn=_integer(body.get(f"{kind}_sn")), msg_size_bytes=size,
        exec_time_us=time_us, algbw_gbs=_num(body.get(f"{kind}_algobw_gbs")),
        busbw_gbs=_num(body.get(f"{kind}_busbw_gbs")),
        timing_source=_text(body.get(f"{kind}_timing_source")),
        algo=_text(body.get(f"{kind}_algo")),
        proto=_text(body.get(f"{kind}_proto")), peer=_integer(body.get("p2p_peer")),
        comm_id=_text(header.get("id")), comm_name=_text(header.get("comm_name")),
        rank=_integer(header.get("rank")), n_ranks=_integer(header.get("n_ranks")),
        nnodes=_integer(header.get("nnodes")), hostname=_text(metadata.get("hostname")),
        pid=_integer(metadata.get("pid")),
        version=_text(metadata.get("inspector_output_format_version")),
        **_spans(kind, body.get("event_trace_ts")),
    )


def _spans(kind: str, trace: Any) -> dict[str, float | None]:
    if not isinstance(trace, dict):
        return {}
    start, stop = _num(trace.get(f"{kind}_start_ts")), _num(trace.get(f"{kind}_stop_ts"))
    kernels = [k for k in trace.get("kernel_events") or () if isinstance(k, dict)]
    starts = [v for k in kernels if (v := _num(k.get("kernel_start_ts"))) is not None]
    stops = [v for k in kernels if (v := _num(k.get("kernel_stop_ts"))) is not None]
    return {
        "kernel_span_us": max(stops) - min(starts) if starts and stops else None,
        "cpu_span_us": stop - start if start is not None and stop is not None else None,
    }


def parse_inspector_lines(lines: Iterable[str | bytes]) -> tuple[list[InspectorRecord],
                                                                  InspectorStream]:
    """Parse a whole file's lines; return its operation records and the stream's counters."""
    stream = InspectorStream()
    records = []
    for line in lines:
        item = stream.feed(line)
        if isinstance(item, InspectorRecord):
            records.append(item)
    stream.finish()
    return records, stream
