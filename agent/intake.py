"""The UDP intake: StepRecords and WindowReports from the training ranks of this node.

Fire and forget on the sending side (``integrations/monitor.py``), bounded here: at most
``max_ranks`` ranks and ``max_series`` exposition samples are kept, label values from the wire
are capped (phase and op names per rank) or drawn from a fixed vocabulary (finding detector, kind,
severity), and ranks unheard of for ``rank_ttl_seconds`` are forgotten. Every datagram sent ends
up in exactly one counter: accepted, rejected by reason, or dropped by the kernel before the agent
read it. Nothing a sender does can grow the agent's memory or its exposition without bound.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)
from prometheus_client.metrics_core import Metric

from laggard.agent.config import (
    DEFAULT_MAX_SERIES,
    DEFAULT_RANK_TTL_SECONDS,
    MAX_NAMES_PER_RANK,
)
from laggard.agent.context import FindingLog
from laggard.agent.datagram_intake import DatagramIntake
from laggard.agent.sender import SenderIdentity
from laggard.agent.socket_drops import socket_drops
from laggard.collectors.histogram import DURATION_BUCKETS_SECONDS, Histogram
from laggard.detectors.finding import JOB_FINDING_KINDS, Severity
from laggard.wire import (
    RecordError,
    StepRecord,
    WindowReport,
    decode_datagram,
    parse_address,
)

log = logging.getLogger(__name__)

#: Label value for a finding's detector, kind or severity outside the known vocabulary.
OTHER_LABEL = "other"
_SEVERITIES = frozenset(s.value for s in Severity)
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


#: Exposition samples one rank costs before any phase or op: info, steps, last step, last seen,
#: four comm counters and the step-time histogram. Charged against the series budget.
RANK_SAMPLES = 8 + len(DURATION_BUCKETS_SECONDS) + 3
#: Samples of one duration histogram (buckets, +Inf, sum, count): one phase of one rank.
HISTOGRAM_SAMPLES = len(DURATION_BUCKETS_SECONDS) + 3
#: What the intake counts in ``laggard_intake_rejected_total{reason}`` (whole datagrams).
REJECT_REASONS = ("oversized", "too_deep", "not_json", "version", "schema", "range",
                  "decoder_error", "rank_limit", "series_limit", "internal_error",
                  "sender_not_allowed")
#: What ``laggard_intake_dropped_total{what}`` counts: parts of accepted datagrams not exported.
DROP_WHATS = ("phase", "op", "score", "flag", "finding_label")


@dataclass(slots=True)
class RankState:
    """What the agent keeps per rank (bounded by the name caps and the series budget)."""

    world_size: int
    node: str
    local_rank: int | None
    steps: int = 0
    last_step: int = -1
    last_seen: float = 0.0
    last_seen_monotonic: float = 0.0
    series: int = RANK_SAMPLES
    phases: dict[str, Histogram] = field(default_factory=dict)
    step_seconds: Histogram = field(default_factory=Histogram)
    collective_seconds: dict[str, Histogram] = field(default_factory=dict)
    collective_bytes: Counter[str] = field(default_factory=Counter)
    comm: Counter[str] = field(default_factory=Counter)


@dataclass(slots=True)
class JobState:
    """What the WindowReports of the job reporting to this agent set (bounded like ranks)."""

    world_size: int
    last_step: int = -1
    last_report: float = 0.0
    last_report_monotonic: float = 0.0
    scores: dict[int, float] = field(default_factory=dict)
    flagged: dict[tuple[int, str], float] = field(default_factory=dict)
    job_slowdown: float | None = None
    detector_stats: dict[str, int] = field(default_factory=dict)


class RankTable:
    """Thread-safe per-rank statistics built from StepRecords and WindowReports.

    Everything a sender can create is bounded: ranks (``max_ranks``), names per rank
    (``max_names`` phases and as many ops), finding labels (a fixed vocabulary) and, over all of
    them, the exposition samples the intake serves (``max_series``). State expires: a rank not
    heard from for ``rank_ttl_seconds`` is forgotten with its series, score and flags, and so is
    the job state of WindowReports; a rank whose world size changes or whose step goes back is a
    restarted job, and starts afresh (so does the job state).

    Args:
        max_ranks: most ranks tracked; records of further ranks are rejected (``rank_limit``).
        findings: where findings carried by WindowReports go.
        default_node: node label for records that do not name one.
        max_series: most exposition samples the intake's per-rank families may hold; a new rank
            that does not fit is rejected (``series_limit``), a new phase, op, score or flag is
            dropped and counted.
        rank_ttl_seconds: seconds after its last record at which a rank is forgotten.
        max_names: most distinct phase names, and most op names, per rank.
        clock: monotonic clock in seconds (tests pass a fake one).

    Raises:
        ValueError: a limit below 1.
    """

    def __init__(self, max_ranks: int, findings: FindingLog, default_node: str, *,
                 max_series: int = DEFAULT_MAX_SERIES,
                 rank_ttl_seconds: float = DEFAULT_RANK_TTL_SECONDS,
                 max_names: int = MAX_NAMES_PER_RANK,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if min(max_ranks, max_series, max_names) < 1 or rank_ttl_seconds <= 0:
            raise ValueError("intake limits must be positive")
        self._max_ranks = max_ranks
        self._max_series = max_series
        self._ttl = rank_ttl_seconds
        self._max_names = max_names
        self._clock = clock
        self._findings = findings
        self._default_node = default_node
        self._lock = threading.Lock()
        self._ranks: dict[int, RankState] = {}
        self._job: JobState | None = None
        self._series = 0
        self._logged_internal_error = False
        self.accepted = 0
        self.rejected: Counter[str] = Counter()
        self.dropped: Counter[str] = Counter()
        self.forgotten: Counter[str] = Counter()
        self.job_resets: Counter[str] = Counter()

    @property
    def series(self) -> int:
        """Exposition samples charged to the budget now (ranks, phases, ops, scores, flags)."""
        with self._lock:
            return self._series

    def ingest(self, payload: bytes, sender: SenderIdentity | None = None) -> None:
        """Decode one datagram and apply it; a bad one is counted in ``rejected`` and dropped.

        Args:
            payload: one datagram's bytes.
            sender: who sent it, as the kernel says (Unix-socket intake); None over UDP.

        Never raises: whatever the payload, it ends up in ``accepted`` or ``rejected``.
        """
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
        except Exception:  # noqa: BLE001 - a bug costs one datagram, counted, not the intake
            with self._lock:
                self.rejected["internal_error"] += 1
                if not self._logged_internal_error:
                    self._logged_internal_error = True
                    log.exception("intake failed on a datagram (counted as internal_error)")

    def reject(self, reason: str) -> None:
        """Count a datagram dropped before decoding (e.g. ``oversized``)."""
        with self._lock:
            self.rejected[reason] += 1

    def expire(self) -> None:
        """Forget ranks and job state not heard from for ``rank_ttl_seconds``."""
        with self._lock:
            self._expire()

    def _expire(self) -> None:
        deadline = self._clock() - self._ttl
        for rank in [r for r, s in self._ranks.items() if s.last_seen_monotonic < deadline]:
            self._forget_rank(rank, "stale")
        if self._job is not None and self._job.last_report_monotonic < deadline:
            self._reset_job("stale")

    def _forget_rank(self, rank: int, reason: str) -> None:
        state = self._ranks.pop(rank)
        self._series -= state.series
        self.forgotten[reason] += 1
        job = self._job
        if job is not None:
            if job.scores.pop(rank, None) is not None:
                self._series -= 1
            for key in [k for k in job.flagged if k[0] == rank]:
                del job.flagged[key]
                self._series -= 1

    def _reset_job(self, reason: str) -> None:
        job, self._job = self._job, None
        if job is not None:
            self._series -= len(job.scores) + len(job.flagged)
            self.job_resets[reason] += 1

    def _charge(self, samples: int) -> bool:
        if self._series + samples > self._max_series:
            return False
        self._series += samples
        return True

    def _apply_step(self, record: StepRecord) -> None:
        now = self._clock()
        state = self._ranks.get(record.rank)
        if state is not None and (record.world_size != state.world_size
                                  or record.step < state.last_step):
            # A new job (other world size) or a restarted one (from a checkpoint, or step 0).
            self._forget_rank(record.rank, "restart")
            state = None
        if state is None:
            if len(self._ranks) >= self._max_ranks:
                self._expire()
                if len(self._ranks) >= self._max_ranks:
                    raise RecordError("rank_limit", f"more than {self._max_ranks} ranks")
            if not self._charge(RANK_SAMPLES):
                raise RecordError("series_limit", f"more than {self._max_series} series")
            state = self._ranks[record.rank] = RankState(
                world_size=record.world_size,
                node=record.node or self._default_node,
                local_rank=record.local_rank,
            )
        if record.node:
            state.node = record.node
        if record.local_rank is not None:
            state.local_rank = record.local_rank
        state.steps += 1
        state.last_step = record.step
        state.last_seen = time.time()
        state.last_seen_monotonic = now
        phases = dict(record.phases)
        if record.collective_wait_seconds is not None:
            phases["collective_wait"] = record.collective_wait_seconds
        for phase, seconds in phases.items():
            histogram = self._named(state, state.phases, phase, HISTOGRAM_SAMPLES, "phase")
            if histogram is not None:
                histogram.observe(seconds)
        if record.step_seconds is not None:
            state.step_seconds.observe(record.step_seconds)
        for c in record.collectives:
            # One histogram and one bytes counter per op.
            histogram = self._named(state, state.collective_seconds, c.op,
                                    HISTOGRAM_SAMPLES + 1, "op")
            if histogram is not None:
                histogram.observe(c.seconds)
                state.collective_bytes[c.op] += c.bytes
        for key, value in record.comm.items():
            if key in _COMM_COUNTERS:
                state.comm[key] += value

    def _named(self, state: RankState, histograms: dict[str, Histogram], name: str,
               samples: int, what: str) -> Histogram | None:
        """The histogram of ``name``, made if the caps allow; None (and counted) if not."""
        histogram = histograms.get(name)
        if histogram is None:
            if len(histograms) >= self._max_names or not self._charge(samples):
                self.dropped[what] += 1
                return None
            state.series += samples
            histogram = histograms[name] = Histogram()
        return histogram

    def _apply_window(self, report: WindowReport) -> None:
        job = self._job
        if job is not None and (report.world_size != job.world_size
                                or report.step < job.last_step):
            self._reset_job("restart")
            job = None
        if job is None:
            job = self._job = JobState(world_size=report.world_size)
        job.last_step = report.step
        job.last_report = time.time()
        job.last_report_monotonic = self._clock()
        if report.detector_stats:
            job.detector_stats = dict(report.detector_stats)
        for rank, score in report.scores.items():
            if rank in job.scores or self._charge(1):
                job.scores[rank] = score
            else:
                self.dropped["score"] += 1
        for doc in report.findings:
            doc = self._within_vocabulary(doc)
            rank = doc.get("rank")
            kind = doc["kind"]
            cleared = doc.get("cleared") is True
            # A rank's straggler and link findings are the per-rank laggard_straggler_active
            # series (kind tells them apart); the job's slowdown is its own gauge.
            if doc["detector"] in ("straggler", "link") and kind != OTHER_LABEL:
                if kind == "job_slowdown":
                    job.job_slowdown = 0.0 if cleared else 1.0
                elif isinstance(rank, int):
                    if cleared:
                        if job.flagged.pop((rank, kind), None) is not None:
                            self._series -= 1
                    elif (rank, kind) in job.flagged or self._charge(1):
                        job.flagged[(rank, kind)] = 1.0
                    else:
                        self.dropped["flag"] += 1
            self._findings.add(doc)

    def _within_vocabulary(self, doc: dict[str, Any]) -> dict[str, Any]:
        """``doc`` with a detector, kind or severity outside the known ones replaced by other."""
        detector, kind, severity = doc["detector"], doc["kind"], doc["severity"]
        kinds = JOB_FINDING_KINDS.get(detector)
        labels = (detector if kinds is not None else OTHER_LABEL,
                  kind if kinds is not None and kind in kinds else OTHER_LABEL,
                  severity if severity in _SEVERITIES else OTHER_LABEL)
        if labels == (detector, kind, severity):
            return doc
        self.dropped["finding_label"] += 1
        return {**doc, "detector": labels[0], "kind": labels[1], "severity": labels[2],
                "labels_as_sent": [str(detector), str(kind), str(severity)]}

    def collect(self) -> Iterator[Metric]:
        """Build this table's metric families (called on every scrape; fast, no I/O)."""
        with self._lock:
            self._expire()
            families = list(self._families())
        yield from families

    def _families(self) -> Iterator[Metric]:
        yield from self._intake_families()
        yield from self._rank_families()
        yield from self._job_families()

    def _intake_families(self) -> Iterator[Metric]:
        """The intake's own counters: accepted, rejected, dropped, forgotten, the budget."""
        accepted = CounterMetricFamily("laggard_intake_datagrams_total",
                                       "Datagrams accepted by the UDP intake.")
        accepted.add_metric([], self.accepted)
        yield accepted
        yield _counter_by("laggard_intake_rejected_total",
                          "Datagrams dropped by the UDP intake, by reason.",
                          "reason", REJECT_REASONS, self.rejected)
        yield _counter_by(
            "laggard_intake_dropped_total",
            "Parts of accepted datagrams not exported as series of their own: phase and op "
            "names past the per-rank cap or the series budget, scores and straggler flags past "
            "the budget (dropped), findings labelled outside the known vocabulary (exported as "
            "other).", "what", DROP_WHATS, self.dropped)
        yield _counter_by(
            "laggard_intake_ranks_forgotten_total",
            "Ranks forgotten with all their series, score and flags: stale (no record for the "
            "rank TTL) or restart (new world size, or the step went back).",
            "reason", ("stale", "restart"), self.forgotten)
        yield _counter_by(
            "laggard_intake_job_resets_total",
            "Times the job state from WindowReports (scores, flags) was dropped: stale (no "
            "report for the rank TTL) or restart (new world size, or the step went back).",
            "reason", ("stale", "restart"), self.job_resets)
        yield GaugeMetricFamily("laggard_intake_ranks", "Ranks tracked by the intake.",
                                value=len(self._ranks))
        yield GaugeMetricFamily(
            "laggard_intake_series",
            "Exposition samples the intake's per-rank families hold, against the budget "
            "laggard_intake_series_limit.", value=self._series)
        yield GaugeMetricFamily("laggard_intake_series_limit",
                                "Most exposition samples the intake's families may hold "
                                "(--intake.max-series).", value=self._max_series)

    def _rank_families(self) -> Iterator[Metric]:
        """Per-rank series from StepRecords: identity, steps, phase and collective timings."""
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

    def _job_families(self) -> Iterator[Metric]:
        """The in-job detector's verdicts from WindowReports: scores, flags, job slowdown."""
        job = self._job or JobState(world_size=0)
        score = GaugeMetricFamily(
            "laggard_straggler_score",
            "Straggler score per rank from the in-job detector (0 typical, larger slower).",
            labels=["rank"])
        for rank, score_value in sorted(job.scores.items()):
            score.add_metric([str(rank)], score_value)
        yield score
        flagged = GaugeMetricFamily(
            "laggard_straggler_active",
            "1 while the in-job detector flags a rank as a straggler, by cause.",
            labels=["rank", "kind"])
        for (rank, kind), flag in sorted(job.flagged.items()):
            flagged.add_metric([str(rank), kind], flag)
        yield flagged
        if self._job is not None:
            yield GaugeMetricFamily(
                "laggard_straggler_report_timestamp_seconds",
                "Unix time of the last WindowReport from the job's in-job detector (alert rules "
                "ignore flags older than a few windows).", value=job.last_report)
        if job.detector_stats:
            inputs = CounterMetricFamily(
                "laggard_straggler_detector_inputs_total",
                "The in-job detector's windows and the bad input it counted and skipped "
                "(missing_rank_reports, invalid_durations, world_size_changes...), by kind.",
                labels=["kind"])
            for kind, count in sorted(job.detector_stats.items()):
                inputs.add_metric([kind], count)
            yield inputs
        if job.job_slowdown is not None:
            yield GaugeMetricFamily(
                "laggard_job_slowdown_active",
                "1 while the in-job detector finds the whole job slower than its best (no single "
                "rank to blame: shared storage, the fabric, a job-wide change).",
                value=job.job_slowdown)


def _counter_by(name: str, documentation: str, label: str, values: tuple[str, ...],
                counts: Counter[str]) -> CounterMetricFamily:
    """A counter family with one series per value of ``label`` (0 for those not counted yet)."""
    family = CounterMetricFamily(name, documentation, labels=[label])
    for value in values:
        family.add_metric([value], counts.get(value, 0))
    return family


class UdpIntake(DatagramIntake):
    """Receives datagrams on a UDP socket in a daemon thread and feeds a :class:`RankTable`.

    The receive loop (:class:`~laggard.agent.datagram_intake.DatagramIntake`, shared with the
    Unix-socket intake) survives anything a datagram or the table does (caught, counted, logged
    once); its thread is a ``RestartableThread`` for the supervisor to restart if it still
    dies. Datagrams the kernel dropped because the loop fell behind are read from /proc on each
    scrape (``laggard_intake_kernel_drops_total``). UDP carries no sender identity: datagrams
    are ingested with ``sender=None``.

    Args:
        address: ``host:port`` to bind (port 0 picks a free one; see :attr:`port`).
        table: where decoded records go.
        receive_buffer_bytes: ``SO_RCVBUF`` to ask for (the kernel caps it at
            ``net.core.rmem_max``); 0 keeps the system default.

    Raises:
        OSError: the address cannot be bound (in use, not local).
    """

    def __init__(self, address: str, table: RankTable, receive_buffer_bytes: int = 1 << 20
                 ) -> None:
        host, port = parse_address(address)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_DGRAM)
        if receive_buffer_bytes:
            # A few thousand step records of headroom while the loop is busy (a scrape holds
            # the table's lock); beyond that the kernel drops, and we count what it dropped.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer_bytes)
        try:
            sock.bind((host, port))
        except OSError:
            sock.close()
            raise
        sock.settimeout(0.2)
        self.port: int = sock.getsockname()[1]
        super().__init__(sock, table, "laggard-intake")

    def kernel_drops(self) -> int | None:
        """Datagrams the kernel dropped for this socket (receive buffer full), or None."""
        return socket_drops(self._sock)

    def collect(self) -> Iterator[Metric]:
        """``laggard_intake_kernel_drops_total`` (where /proc shows it)."""
        drops = self.kernel_drops()
        if drops is not None:
            family = CounterMetricFamily(
                "laggard_intake_kernel_drops_total",
                "Datagrams for the intake the kernel dropped before the agent read them "
                "(receive buffer full; /proc/net/udp drops).")
            family.add_metric([], drops)
            yield family
