"""``--collector.flight_recorder``: this node's PyTorch flight-recorder dumps, read as they appear.

Loading is :mod:`laggard.parsers.flight_recorder`, the cross-rank matching
:mod:`laggard.detectors.flight_recorder`; this module only watches files and exports.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import GaugeMetricFamily

from laggard.collectors.base import AgentSettings, CollectorSpec, Flag, NoDataError
from laggard.detectors.finding import Finding, Severity
from laggard.detectors.flight_recorder import FrAnalysis, analyze_dumps
from laggard.parsers.flight_recorder import DumpError, FlightRecorderDump, load_dump

#: Most dump files read per round, newest first (a node runs at most a few dozen ranks).
MAX_DUMP_FILES = 64
#: Findings already raised that are remembered, so a dump set is reported once.
MAX_REPORTED = 4096

#: The collector's one flag; giving it turns the collector on (unless --no-collector.NAME).
PATH = Flag("collector.flight_recorder.path", "", metavar="PATH",
            help="directory or TORCH_FR_DUMP_TEMP_FILE prefix of PyTorch flight-recorder dumps "
                 "for the flight_recorder collector")


class FlightRecorderCollector:
    """Watches this node's flight-recorder dumps and names the ranks that fell behind.

    PyTorch writes a dump per rank when a collective times out (``TORCH_NCCL_DUMP_ON_TIMEOUT``,
    file ``TORCH_FR_DUMP_TEMP_FILE`` + rank, default ``/tmp/nccl_trace_rank_<rank>``). Each round
    the collector reloads the files that changed (restricted unpickler), matches the node's
    ranks with :func:`analyze_dumps` (ranks of other nodes are not counted as missing), adds a
    finding per newly lagging process group to the agent's finding log, and exports:

    * ``laggard_flight_recorder_dumps``: dumps read; ``..._unreadable_dumps``: files that were
      not (still being written, truncated, refused);
    * ``laggard_collective_lagging_groups{rank}``: process groups in which the rank never issued
      a collective that its peers on this node issued.

    Args:
        path: a directory of dumps, or the ``TORCH_FR_DUMP_TEMP_FILE`` prefix.
        findings: the agent's finding log (``add(Finding)``), or None.
        node: this node's name, put on findings.
    """

    name = "flight_recorder"

    def __init__(self, path: str, findings: Any = None, node: str | None = None) -> None:
        self._path = path
        self._findings = findings
        self._node = node
        self._cache: dict[str, tuple[tuple[int, float], FlightRecorderDump | None]] = {}
        self._analysis = FrAnalysis()
        self._reported: set[tuple] = set()

    def _files(self) -> list[str]:
        directory, prefix = ((self._path, "") if os.path.isdir(self._path) else
                             (os.path.dirname(self._path) or ".", os.path.basename(self._path)))
        if not self._path or not os.path.isdir(directory):
            raise NoDataError(f"no flight-recorder dump directory at {self._path!r}")
        files = []
        for name in os.listdir(directory):
            full = os.path.join(directory, name)
            if name.startswith(prefix) and not name.startswith(".") and os.path.isfile(full):
                files.append(full)
        files.sort(key=lambda p: os.path.getmtime(p) if os.path.exists(p) else 0, reverse=True)
        return files[:MAX_DUMP_FILES]

    def collect(self) -> Iterator[Any]:
        """Reload changed dumps, report new laggards, yield the metric families.

        Raises:
            NoDataError: no path configured, or its directory does not exist.
        """
        files = self._files()
        changed = False
        for path in files:
            try:
                st = os.stat(path)
            except OSError:
                continue
            key = (st.st_size, st.st_mtime)
            cached = self._cache.get(path)
            if cached is not None and cached[0] == key:
                continue
            changed = True
            try:
                dump: FlightRecorderDump | None = load_dump(path)
            except (DumpError, OSError):
                dump = None  # most often still being written: retried when it changes
            self._cache[path] = (key, dump)
        for gone in set(self._cache) - set(files):
            del self._cache[gone]
            changed = True
        if changed:
            dumps = [d for _, d in self._cache.values() if d is not None]
            self._analysis = analyze_dumps(dumps, absent_dumps_lag=False)
            self._report()
        readable = sum(1 for _, d in self._cache.values() if d is not None)
        yield GaugeMetricFamily("laggard_flight_recorder_dumps",
                                "Flight-recorder dumps read on this node.", value=readable)
        yield GaugeMetricFamily("laggard_flight_recorder_unreadable_dumps",
                                "Dump files that could not be read (partial, corrupt, refused).",
                                value=len(self._cache) - readable)
        lagging = GaugeMetricFamily(
            "laggard_collective_lagging_groups",
            "Process groups in which this rank never issued a collective its peers issued "
            "(flight-recorder dumps).", labels=["rank"])
        for rank in self._analysis.ranks:
            lagging.add_metric([str(rank)], self._analysis.lag_count.get(rank, 0))
        yield lagging

    def _report(self) -> None:
        if self._findings is None:
            return
        if len(self._reported) > MAX_REPORTED:
            self._reported.clear()
        for i, lag in enumerate(self._analysis.lagging):
            key = (lag.pg, lag.seq, lag.missing)
            if key in self._reported:
                continue
            self._reported.add(key)
            ranks = ", ".join(map(str, lag.missing))
            self._findings.add(Finding(
                detector="flight_recorder", kind="collective_timeout",
                severity=Severity.CRITICAL if i == 0 else Severity.WARNING,
                rank=lag.missing[0], node=self._node,
                message=f"ranks {ranks} never issued {lag.op} #{lag.seq} of process group "
                        f"{lag.pg} ({lag.pg_desc}) that ranks "
                        f"{', '.join(map(str, lag.present))} issued: they are behind",
                evidence={"pg": lag.pg, "seq": lag.seq, "op": lag.op,
                          "missing_ranks": list(lag.missing), "present": list(lag.present),
                          "likely_stragglers": list(self._analysis.stragglers)}))


def from_config(settings: AgentSettings, context: Any) -> FlightRecorderCollector:
    """Registry factory: the dumps at ``--collector.flight_recorder.path``."""
    return FlightRecorderCollector(settings.flag(PATH) or "",
                                   getattr(context, "findings", None),
                                   getattr(context, "node", None))


COLLECTOR = CollectorSpec(
    name="flight_recorder", build=from_config, default=False, flags=(PATH,), enabled_by=PATH,
    help="ranks behind in PyTorch flight-recorder dumps (--collector.flight_recorder.path)")
