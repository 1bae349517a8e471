"""The in-process flight recorder, read off the training thread, as a source of a
:class:`~laggard.integrations.tracer.CollectiveTracer` (NCCL; on gloo it only counts).

:func:`laggard.integrations.trace_sources.attach` starts a reader when NCCL groups are watched
and ``TORCH_FR_BUFFER_SIZE`` > 0.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from laggard.integrations.trace_ops import op_name, wire_bytes

if TYPE_CHECKING:
    from laggard.integrations.tracer import CollectiveTracer

#: Bytes per element of the flight recorder's dtype names.
_DTYPE_BYTES = {"Float": 4, "Half": 2, "BFloat16": 2, "Double": 8, "Long": 8, "Int": 4,
                "Byte": 1, "Char": 1, "Bool": 1, "Short": 2, "Float8_e4m3fn": 1,
                "Float8_e5m2": 1}


class FlightRecorderReader:
    """Reads the in-process flight recorder incrementally, on its own thread.

    Every ``interval_s`` it dumps the recorder (``_dump_fr_trace_json``; a copy of a ring of
    ``TORCH_FR_BUFFER_SIZE`` entries, no collective is stopped), and hands the tracer each entry
    completed since the last read: op, group, bytes from ``input_sizes`` and ``input_dtypes``,
    and the duration from ``duration_ms`` or completed minus started (NCCL with
    ``TORCH_NCCL_ENABLE_TIMING=1``). Without NCCL timing the recorder writes
    ``time_discovered_started_ns: null`` and no ``duration_ms``: such an entry is counted in
    :attr:`untimed` and sized in :attr:`untimed_bytes` (and ``tracer.stats["untimed"]``, logged
    once), never timed. gloo entries never complete in the recorder: they are counted in
    :attr:`seen` and not timed. An entry left uncompleted for ``stall_seconds`` is given up
    (``never_completed``).

    Args:
        tracer: where the timings go.
        interval_s: seconds between reads.
        dump: returns the recorder's JSON text; defaults to torch's
            ``_dump_fr_trace_json(includeCollectives=True, onlyActive=False)`` (a fake in tests).
    """

    def __init__(self, tracer: CollectiveTracer, *, interval_s: float = 1.0,
                 dump: Callable[[], str] | None = None) -> None:
        self.tracer = tracer
        self.interval_s = interval_s
        self._dump = dump if dump is not None else _torch_fr_dump
        self._next_id = 0  # first record_id not yet handed over
        self.seen = 0
        self.untimed = 0
        self.untimed_bytes = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._by_name = {g.name: g for g in tracer.groups}

    def start(self) -> FlightRecorderReader:
        """Start the reader thread (daemon); returns self."""
        self._thread = threading.Thread(target=self._run, name="laggard-fr", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the thread after one last read."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.poll()
        self.poll()

    def poll(self) -> int:
        """One read; returns the entries handed to the tracer. Never raises."""
        try:
            entries = json.loads(self._dump()).get("entries", [])
        except Exception as exc:  # noqa: BLE001
            self.tracer._count("errors", "fr_dump", "laggard: flight recorder read failed "
                               "(%r)", exc)
            return 0
        handed = 0
        now_ns = time.time_ns()
        stall_ns = int(self.tracer.config.stall_seconds * 1e9)
        for entry in sorted(entries, key=lambda e: e.get("record_id", -1)):
            rid = entry.get("record_id", -1)
            if not isinstance(rid, int) or rid < self._next_id:
                continue
            if entry.get("state") != "completed":
                if now_ns - int(entry.get("time_created_ns", now_ns)) > stall_ns:
                    self.tracer.stats["never_completed"] += 1
                    self._next_id = rid + 1
                    continue
                break  # in order: wait for it (gloo stops here: its entries never complete)
            self._next_id = rid + 1
            handed += self._hand_over(entry)
        self.seen += sum(1 for e in entries if isinstance(e.get("record_id"), int))
        return handed

    def _hand_over(self, entry: dict[str, Any]) -> int:
        group = entry.get("process_group") or ["", ""]
        info = self._by_name.get(str(group[0]))
        if info is None:
            self.tracer._count("unknown_group", "fr_group", "laggard: flight recorder entry of "
                               "an unwatched group %r skipped", group)
            return 0
        op = op_name(str(entry.get("profiling_name", "")))
        seconds = _entry_seconds(entry)
        raw = 0
        for size, dtype in zip(entry.get("input_sizes", []), entry.get("input_dtypes", []),
                               strict=False):
            numel = 1
            for dim in size:
                numel *= int(dim)
            raw += numel * _DTYPE_BYTES.get(str(dtype), 4)
        nbytes = wire_bytes(op, raw, len(info.ranks))
        if seconds is None:
            # NCCL without TORCH_NCCL_ENABLE_TIMING: no start, no duration. Counted and sized,
            # never timed (completed - 0 would be ~1.7e9 s, the epoch).
            self.untimed += 1
            self.untimed_bytes += nbytes
            self.tracer._count("untimed", "fr_untimed", "laggard: flight-recorder entries have "
                               "no start time (TORCH_NCCL_ENABLE_TIMING is off): counted and "
                               "sized, not timed")
            return 0
        end = time.perf_counter()
        self.tracer.record(op, None, end - seconds, end, nbytes, index=info.index)
        return 1


def _entry_seconds(entry: dict[str, Any]) -> float | None:
    """A completed flight-recorder entry's duration, seconds; None when it has none.

    ``duration_ms`` (CUDA-event time, only with ``TORCH_NCCL_ENABLE_TIMING=1``) first, else
    ``time_discovered_completed_ns - time_discovered_started_ns`` when both are set and ordered.
    Without timing the recorder writes ``time_discovered_started_ns: null`` (0 in some builds)
    and no ``duration_ms``: None, never ``completed - 0``.
    """
    duration_ms = entry.get("duration_ms")
    if duration_ms is not None:
        try:
            value = float(duration_ms)
        except (TypeError, ValueError):
            return None
        return value / 1e3 if value >= 0 and value == value else None
    try:
        started = int(entry.get("time_discovered_started_ns") or 0)
        completed = int(entry.get("time_discovered_completed_ns") or 0)
    except (TypeError, ValueError):
        return None
    if started <= 0 or completed < started:
        return None
    return (completed - started) / 1e9


def _torch_fr_dump() -> str:
    import torch

    # private, absent from torch's stubs
    return str(torch._C._distributed_c10d._dump_fr_trace_json(  # type: ignore[attr-defined]
        includeCollectives=True, onlyActive=False))


__all__ = ["FlightRecorderReader"]
