"""``--collector.nccl_inspector``: tails NCCL Inspector output.

The format and its parser are :mod:`laggard.parsers.nccl_inspector`.

The collector tails every ``*.log``/``*.jsonl`` file of the directory from where it left off
(complete lines only; a file that shrinks was rewritten and is read again from the start) and
exports, per collective or p2p op:

* ``laggard_nccl_collective_seconds{op}``: histogram of execution time,
* ``laggard_nccl_collective_bytes_total{op}``: message bytes,
* ``laggard_nccl_bus_bandwidth_bytes_per_second{op}``: bus bandwidth of the latest record,
* ``laggard_nccl_inspector_dropped_records_total``: records NCCL overwrote before dumping
  (``*_dropped_since_last_dump`` summed over markers),
* ``laggard_nccl_inspector_malformed_lines_total``: lines skipped as not JSON or not a record.
"""

from __future__ import annotations

import glob
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)
from prometheus_client.metrics_core import Metric

from laggard.collectors.base import AgentSettings, CollectorSpec, Flag, NoDataError
from laggard.collectors.histogram import Histogram
from laggard.collectors.tailer import FileTailer
from laggard.parsers.nccl_inspector import (
    MAX_LINE_BYTES,
    InspectorRecord,
    InspectorStream,
)

__all__ = ["COLLECTIVE_BUCKETS_SECONDS", "COLLECTOR", "DUMP_DIR", "NcclInspectorCollector",
           "from_config"]

#: Histogram bounds (s): 10 µs (a small all-reduce inside a node) to 60 s (a stalled collective).
COLLECTIVE_BUCKETS_SECONDS: tuple[float, ...] = (
    1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25,
    0.5, 1.0, 2.5, 5.0, 10.0, 60.0,
)
#: Most bytes read from one file per collection; the rest waits for the next round.
MAX_READ_BYTES_PER_ROUND = 64 * 1024 * 1024
#: Most distinct op label values (``AllReduce``, ``Send``...; NCCL has about ten).
MAX_OPS = 64
#: Most files tracked at once in the dump directory (one per process).
MAX_FILES = 4096

#: The collector's one flag (``NCCL_INSPECTOR_DUMP_DIR`` of the jobs on this node); giving it
#: turns the collector on (unless --no-collector.nccl_inspector).
DUMP_DIR = Flag("collector.nccl_inspector.dir", "", metavar="DIR",
                help="NCCL Inspector output directory (JSON lines) that the nccl_inspector "
                     "collector tails")


@dataclass(slots=True)
class _OpSeries:
    histogram: Histogram
    bytes_total: int = 0
    busbw_bytes_per_second: float | None = None


@dataclass(slots=True)
class _TailedFile:
    tailer: FileTailer
    stream: InspectorStream = field(default_factory=InspectorStream)


class NcclInspectorCollector:
    """Tails an NCCL Inspector dump directory and exports collective timings.

    Args:
        dump_dir: the ``NCCL_INSPECTOR_DUMP_DIR`` of the jobs on this node.
    """

    name = "nccl_inspector"

    def __init__(self, dump_dir: str) -> None:
        self._dir = dump_dir
        self._files: dict[str, _TailedFile] = {}
        self._ops: dict[str, _OpSeries] = {}
        self._dropped = 0
        self._malformed = 0
        self._lock = threading.Lock()

    def collect(self) -> Iterator[Metric]:
        """Read what was appended since the last call and yield the metric families.

        Raises:
            NoDataError: no directory configured, or it does not exist.
        """
        if not self._dir:
            raise NoDataError("no NCCL Inspector directory: give it with "
                              "--collector.nccl_inspector.dir DIR (NCCL_INSPECTOR_DUMP_DIR of "
                              "the jobs)")
        if not os.path.isdir(self._dir):
            raise NoDataError(f"--collector.nccl_inspector.dir {self._dir}: no such directory")
        with self._lock:
            paths = sorted(glob.glob(os.path.join(self._dir, "*.log"))
                           + glob.glob(os.path.join(self._dir, "*.jsonl")))[:MAX_FILES]
            for path in paths:
                self._tail(path)
            for gone in set(self._files) - set(paths):
                self._files.pop(gone).tailer.close()
            yield from self._families()

    def _tail(self, path: str) -> None:
        tailed = self._files.get(path)
        if tailed is None:
            tailed = self._files[path] = _TailedFile(FileTailer(
                path, start_at_end=False, max_read_bytes=MAX_READ_BYTES_PER_ROUND,
                max_line_bytes=MAX_LINE_BYTES, keep_open=False))
        oversized = tailed.tailer.oversized_lines
        try:
            lines = tailed.tailer.read_lines()
        except OSError:
            return
        if tailed.tailer.restarted:  # rewritten: its context starts afresh
            tailed.stream = InspectorStream()
        self._malformed += tailed.tailer.oversized_lines - oversized
        stream = tailed.stream
        before_malformed, before_dropped = stream.malformed, stream.dropped
        for line in lines:
            item = stream.feed(line)
            if isinstance(item, InspectorRecord):
                self._observe(item)
        self._malformed += stream.malformed - before_malformed
        self._dropped += stream.dropped - before_dropped

    def _observe(self, record: InspectorRecord) -> None:
        series = self._ops.get(record.op)
        if series is None:
            if len(self._ops) >= MAX_OPS:
                self._malformed += 1
                return
            series = self._ops[record.op] = _OpSeries(Histogram(COLLECTIVE_BUCKETS_SECONDS))
        series.histogram.observe(record.exec_time_us * 1e-6)  # µs -> s
        series.bytes_total += record.msg_size_bytes
        if record.busbw_gbs is not None:
            series.busbw_bytes_per_second = record.busbw_gbs * 1e9  # GB/s -> bytes/s

    def _families(self) -> Iterator[Metric]:
        seconds = HistogramMetricFamily(
            "laggard_nccl_collective_seconds",
            "Execution time of NCCL collectives and p2p operations, in seconds (NCCL "
            "Inspector).",
            labels=["op"])
        nbytes = CounterMetricFamily(
            "laggard_nccl_collective_bytes",
            "Message bytes of NCCL operations recorded by NCCL Inspector.", labels=["op"])
        busbw = GaugeMetricFamily(
            "laggard_nccl_bus_bandwidth_bytes_per_second",
            "Bus bandwidth of the latest NCCL operation of this type, in bytes per second "
            "(NCCL Inspector).",
            labels=["op"])
        for op, series in sorted(self._ops.items()):
            h = series.histogram
            seconds.add_metric([op], h.cumulative_buckets(), h.sum)
            nbytes.add_metric([op], series.bytes_total)
            if series.busbw_bytes_per_second is not None:
                busbw.add_metric([op], series.busbw_bytes_per_second)
        yield seconds
        yield nbytes
        yield busbw
        yield CounterMetricFamily(
            "laggard_nccl_inspector_dropped_records",
            "Records NCCL Inspector overwrote before dumping them (dump_stats).",
            value=self._dropped)
        yield CounterMetricFamily(
            "laggard_nccl_inspector_malformed_lines",
            "Inspector output lines skipped as not JSON or not a known record.",
            value=self._malformed)


def from_config(settings: AgentSettings, context: object) -> NcclInspectorCollector:
    """Registry factory: tails ``--collector.nccl_inspector.dir``."""
    return NcclInspectorCollector(settings.flag(DUMP_DIR) or "")


COLLECTOR = CollectorSpec(
    name="nccl_inspector", build=from_config, default=False, flags=(DUMP_DIR,),
    enabled_by=DUMP_DIR,
    help="NCCL collective timings tailed from NCCL Inspector's JSONL directory "
         "(--collector.nccl_inspector.dir)")
