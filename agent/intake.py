"""The UDP intake: StepRecords and WindowReports from the training ranks of this node.

Fire and forget on the sending side (``integrations/monitor.py``), bounded here: at most
``max_ranks`` ranks are tracked, and every datagram that is garbage, oversized, of an unknown
version, or from one rank too many is counted in ``laggard_intake_rejected_total{reason}`` and
dropped. Nothing a sender does can grow the agent's memory without bound.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)
from prometheus_client.metrics_core import Metric

from laggard.agent.context import FindingLog
from laggard.collectors.histogram import Histogram
from laggard.wire import (
    MAX_DATAGRAM_BYTES,
    RecordError,
    StepRecord,
    WindowReport,
    decode_datagram,
    parse_address,
)

log = logging.getLogger(__name__)

#: Distinct phase / op names tracked per rank; more are rejected (a sender bug, not a workload).
_MAX_NAMES_PER_RANK = 16
#: ``StepRecord.comm`` key -> exported counter (seconds or bytes summed over steps).
_COMM_COUNTERS = {
    "total_seconds": ("laggard_comm_collective_seconds_total",
                      "Collective time summed over steps, launch to completion of each bucket."),
    "exposed_seconds": ("laggard_comm_exposed_seconds_total",
                        "Collective time not hidden under backward (on the critical path)."),
    "bytes": ("laggard_comm_bytes_total", "Bytes this rank put on the wire for gradients."),
    "raw_bytes": ("laggard_comm_uncompressed_bytes_total",
                  "Bytes an uncompressed fp32 ring all-reduce would have sent for the same "
                  "gradients (the compression ratio is raw_bytes / bytes)."),
}


@dataclass(slots=True)
class RankState:
    """What the agent keeps per rank (bounded by the name caps)."""

    world_size: int
    node: str
    local_rank: int | None
    steps: int = 0
    last_step: int = -1
    last_seen: float = 0.0
    phases: dict[str, Histogram] = field(default_factory=dict)
    step_seconds: Histogram = field(default_factory=Histogram)
    collective_seconds: dict[str, Histogram] = field(default_factory=dict)
    collective_bytes: Counter[str] = field(default_factory=Counter)
    comm: Counter[str] = field(default_factory=Counter)


class RankTable:
    """Thread-safe per-rank statistics built from StepRecords and WindowReports.

    Args:
        max_ranks: most ranks tracked; records of further ranks are rejected (``rank_limit``).
        findings: where findings carried by WindowReports go.
        default_node: node label for records that do not name one.
    """

    def __init__(self, max_ranks: int, findings: FindingLog, default_node: str) -> None:
        self._max_ranks = max_ranks
        self._findings = findings
        self._default_node = default_node
        self._lock = threading.Lock()
        self._ranks: dict[int, RankState] = {}
        self._scores: dict[int, float] = {}
        self._flagged: dict[tuple[int, str], float] = {}
        self._job_slowdown: float | None = None
        self._detector_stats: dict[str, int] = {}
        self.accepted = 0
        self.rejected: Counter[str] = Counter()

    def ingest(self, payload: bytes) -> None:
        """Decode one datagram and apply it; a bad one is counted in ``rejected`` and dropped."""
        try:
            item = decode_datagram(payload)
            with self._lock:
                if isinstance(item, WindowReport):
                    self._apply_window(item)
                else:
                    self._apply_step(item)
                self.accepted += 1
        except RecordError as exc:
            with self._lock:
                self.rejected[exc.reason] += 1

    def reject(self, reason: str) -> None:
        """Count a datagram dropped before decoding (e.g. ``oversized``)."""
        with self._lock:
            self.rejected[reason] += 1

    def _apply_step(self, record: StepRecord) -> None:
        state = self._ranks.get(record.rank)
        if state is None:
            if len(self._ranks) >= self._max_ranks:
                raise RecordError("rank_limit", f"more than {self._max_ranks} ranks")
            state = self._ranks[record.rank] = RankState(
                world_size=record.world_size,
                node=record.node or self._default_node,
                local_rank=record.local_rank,
            )
        names = set(record.phases) | {c.op for c in record.collectives}
        if len(set(state.phases) | set(state.collective_seconds) | names) > 2 * _MAX_NAMES_PER_RANK:
            raise RecordError("schema", "too many distinct phase or op names")
        state.world_size = record.world_size
        if record.node:
            state.node = record.node
        if record.local_rank is not None:
            state.local_rank = record.local_rank
        state.steps += 1
        state.last_step = record.step
        state.last_seen = time.time()
        phases = dict(record.phases)
        if record.collective_wait_seconds is not None:
            phases["collective_wait"] = record.collective_wait_seconds
        for phase, seconds in phases.items():
            state.phases.setdefault(phase, Histogram()).observe(seconds)
        if record.step_seconds is not None:
            state.step_seconds.observe(record.step_seconds)
        for c in record.collectives:
            state.collective_seconds.setdefault(c.op, Histogram()).observe(c.seconds)
            state.collective_bytes[c.op] += c.bytes
        for key, value in record.comm.items():
            if key in _COMM_COUNTERS:
                state.comm[key] += value

    def _apply_window(self, report: WindowReport) -> None:
        if report.detector_stats:
            self._detector_stats = dict(report.detector_stats)
        for rank, score in report.scores.items():
            if rank in self._scores or len(self._scores) < self._max_ranks:
                self._scores[rank] = score
        for doc in report.findings:
            rank = doc.get("rank")
            kind = str(doc.get("kind"))
            evidence = doc.get("evidence")
            cleared = bool(doc.get("cleared") or (isinstance(evidence, dict)
                                                   and evidence.get("cleared")))
            if doc.get("detector") == "straggler":
                if kind == "job_slowdown":
                    self._job_slowdown = 0.0 if cleared else 1.0
                elif isinstance(rank, int):
                    if cleared:
                        self._flagged.pop((rank, kind), None)
                    elif len(self._flagged) < self._max_ranks:
                        self._flagged[(rank, kind)] = 1.0
            self._findings.add(doc)

    def collect(self) -> Iterator[Metric]:
        """Build this table's metric families (called on every scrape; fast, no I/O)."""
        with self._lock:
            yield from self._families()

    def _families(self) -> Iterator[Metric]:
        accepted = CounterMetricFamily("laggard_intake_datagrams_total",
                                       "Datagrams accepted by the UDP intake.")
        accepted.add_metric([], self.accepted)
        yield accepted
        rejected = CounterMetricFamily(
            "laggard_intake_rejected_total",
            "Datagrams dropped by the UDP intake, by reason.", labels=["reason"])
        for reason in ("oversized", "not_json", "version", "schema", "rank_limit"):
            rejected.add_metric([reason], self.rejected.get(reason, 0))
        yield rejected
        yield GaugeMetricFamily("laggard_intake_ranks", "Ranks tracked by the intake.",
                                value=len(self._ranks))
        info = GaugeMetricFamily("laggard_rank_info", "Identity of a training rank (value 1).",
                                 labels=["rank", "node", "local_rank", "world_size"])
        steps = CounterMetricFamily("laggard_steps_total", "Training steps reported by a rank.",
                                    labels=["rank"])
        last_step = GaugeMetricFamily("laggard_rank_last_step", "Last step a rank reported.",
                                      labels=["rank"])
        last_seen = GaugeMetricFamily("laggard_rank_last_seen_timestamp_seconds",
                                      "Unix time of the last record from a rank.",
                                      labels=["rank"])
        phase = HistogramMetricFamily(
            "laggard_step_phase_seconds",
            "Duration of each phase of a training step (collective_wait: time waiting for "
            "collectives after the rank's own work).", labels=["rank", "phase"])
        step_seconds = HistogramMetricFamily("laggard_step_seconds",
                                             "Wall time of a whole training step.",
                                             labels=["rank"])
        coll = HistogramMetricFamily("laggard_collective_seconds",
                                     "Collective time from launch to completion.",
                                     labels=["rank", "op"])
        coll_bytes = CounterMetricFamily("laggard_collective_bytes_total",
                                         "Bytes this rank sent in collectives.",
                                         labels=["rank", "op"])
        comm = {key: CounterMetricFamily(name, help_, labels=["rank"])
                for key, (name, help_) in _COMM_COUNTERS.items()}
        for rank, s in sorted(self._ranks.items()):
            r = str(rank)
            info.add_metric([r, s.node, "" if s.local_rank is None else str(s.local_rank),
                             str(s.world_size)], 1)
            steps.add_metric([r], s.steps)
            last_step.add_metric([r], s.last_step)
            last_seen.add_metric([r], s.last_seen)
            for name, h in sorted(s.phases.items()):
                phase.add_metric([r, name], h.cumulative_buckets(), h.sum)
            if s.step_seconds.count:
                step_seconds.add_metric([r], s.step_seconds.cumulative_buckets(),
                                        s.step_seconds.sum)
            for op, h in sorted(s.collective_seconds.items()):
                coll.add_metric([r, op], h.cumulative_buckets(), h.sum)
                coll_bytes.add_metric([r, op], s.collective_bytes[op])
            for key, value in s.comm.items():
                comm[key].add_metric([r], value)
        yield from (info, steps, last_step, last_seen, phase, step_seconds, coll, coll_bytes)
        yield from comm.values()
        score = GaugeMetricFamily(
            "laggard_straggler_score",
            "Straggler score per rank from the in-job detector (0 typical, larger slower).",
            labels=["rank"])
        for rank, score_value in sorted(self._scores.items()):
            score.add_metric([str(rank)], score_value)
        yield score
        flagged = GaugeMetricFamily(
            "laggard_straggler_active",
            "1 while the in-job detector flags a rank as a straggler, by cause.",
            labels=["rank", "kind"])
        for (rank, kind), flag in sorted(self._flagged.items()):
            flagged.add_metric([str(rank), kind], flag)
        yield flagged
        if self._detector_stats:
            inputs = CounterMetricFamily(
                "laggard_straggler_detector_inputs_total",
                "The in-job detector's windows and the bad input it counted and skipped "
                "(missing_rank_reports, invalid_durations, world_size_changes...), by kind.",
                labels=["kind"])
            for kind, count in sorted(self._detector_stats.items()):
                inputs.add_metric([kind], count)
            yield inputs
        if self._job_slowdown is not None:
            yield GaugeMetricFamily(
                "laggard_job_slowdown_active",
                "1 while the in-job detector finds the whole job slower than its best (no single "
                "rank to blame: shared storage, the fabric, a job-wide change).",
                value=self._job_slowdown)


class UdpIntake:
    """Receives datagrams on a UDP socket in a daemon thread and feeds a :class:`RankTable`.

    Args:
        address: ``host:port`` to bind (port 0 picks a free one; see :attr:`port`).
        table: where decoded records go.

    Raises:
        OSError: the address cannot be bound (in use, not local).
    """

    def __init__(self, address: str, table: RankTable) -> None:
        host, port = parse_address(address)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._sock = socket.socket(family, socket.SOCK_DGRAM)
        self._sock.bind((host, port))
        self._sock.settimeout(0.2)
        self.port: int = self._sock.getsockname()[1]
        self._table = table
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="laggard-intake", daemon=True)

    def start(self) -> None:
        """Start receiving."""
        self._thread.start()

    def _run(self) -> None:
        # One byte more than the limit tells an oversized datagram from one that just fits.
        bufsize = MAX_DATAGRAM_BYTES + 1
        while not self._stop.is_set():
            try:
                payload = self._sock.recv(bufsize)
            except TimeoutError:
                continue
            except OSError as exc:
                if self._stop.is_set():
                    return
                log.warning("intake receive failed: %s", exc)
                time.sleep(0.1)
                continue
            if len(payload) > MAX_DATAGRAM_BYTES:
                self._table.reject("oversized")
                continue
            self._table.ingest(payload)

    def stop(self) -> None:
        """Stop the thread and close the socket."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2)
        self._sock.close()
