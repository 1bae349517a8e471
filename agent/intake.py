"""The UDP intake: StepRecords, WindowReports and Heartbeats from the training ranks of this node.

Fire and forget on the sending side (``integrations/monitor.py``), bounded here: each training
run (``StepRecord.run``) has its own ranks, at most ``max_runs`` runs, ``max_ranks`` ranks and
``max_series`` exposition samples (shared fairly between runs) are kept, label values from the wire
are capped (phase and op names per rank) or drawn from a fixed vocabulary (finding detector, kind,
severity), and ranks unheard of for ``rank_ttl_seconds`` are forgotten, unless their process
still lives: a rank whose steps stopped while its heartbeats go on, or its process exists, is
*stalled*, not stale, and its series stay (``laggard.agent.progress``). Every datagram sent ends
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
    DEFAULT_MAX_RUNS,
    DEFAULT_MAX_SERIES,
    DEFAULT_RANK_TTL_SECONDS,
    DEFAULT_STALL_SECONDS,
    DEFAULT_STALL_STEP_FACTOR,
    MAX_NAMES_PER_RANK,
)
from laggard.agent.context import FindingLog
from laggard.agent.datagram_intake import DatagramIntake
from laggard.agent.liveness import ProcessWatch
from laggard.agent.progress import (
    GROUP_SAMPLES,
    LIVENESS_CHECK_SECONDS,
    MAX_GROUPS_PER_RANK,
    PROGRESS_SAMPLES,
    RECENT_DATAGRAM_SECONDS,
    RankProgress,
)
from laggard.agent.sender import SenderIdentity
from laggard.agent.socket_drops import socket_drops
from laggard.collectors.histogram import DURATION_BUCKETS_SECONDS, Histogram
from laggard.detectors.finding import JOB_FINDING_KINDS, Severity
from laggard.nvml.library import normalise_bus_id
from laggard.wire import (
    Heartbeat,
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
                      "Collective time summed over steps, launch to completion of each bucket, in "
                      "seconds."),
    "exposed_seconds": ("laggard_comm_exposed_seconds_total",
                        "Collective time not hidden under backward (on the critical path), in "
                        "seconds."),
    "bytes": ("laggard_comm_bytes_total", "Bytes this rank put on the wire for gradients."),
    "raw_bytes": ("laggard_comm_uncompressed_bytes_total",
                  "Bytes an uncompressed fp32 ring all-reduce would have sent for the same "
                  "gradients (this over laggard_comm_bytes_total is the compression ratio)."),
}


#: Exposition samples one rank costs before any phase, op or group: info, steps, last step, last
#: seen, four comm counters, the step-time histogram, and its progress (stalled seconds, stall
#: threshold, process state, heartbeat age, current phase). Charged against the series budget.
RANK_SAMPLES = 8 + len(DURATION_BUCKETS_SECONDS) + 3 + PROGRESS_SAMPLES
#: Samples of one duration histogram (buckets, +Inf, sum, count): one phase of one rank.
HISTOGRAM_SAMPLES = len(DURATION_BUCKETS_SECONDS) + 3
#: Samples a run's WindowReport state costs besides its scores and flags: the report timestamp,
#: the job-slowdown gauge and up to 16 detector input counters (the wire's cap on their names).
JOB_SAMPLES = 2 + 16
#: What the intake counts in ``laggard_intake_rejected_total{reason}`` (whole datagrams).
REJECT_REASONS = ("oversized", "too_deep", "not_json", "version", "schema", "range",
                  "run_length", "run_charset", "decoder_error", "rank_limit", "run_limit",
                  "series_limit", "internal_error", "sender_not_allowed", "heartbeat_conflict")
#: What ``laggard_intake_dropped_total{what}`` counts: parts of accepted datagrams not exported
#: (``group``: a heartbeat's group or P2P pair past the per-rank cap or the budget).
DROP_WHATS = ("phase", "op", "score", "flag", "finding_label", "group")
#: Why a rank was forgotten (``laggard_intake_ranks_forgotten_total{reason}``): no record for the
#: TTL (and no live process), its process exited without a goodbye heartbeat and nothing came
#: for the TTL, a restart of its run, its sender now reports for another run or rank, or its
#: run was over its fair share of the series budget when another run needed room.
FORGET_REASONS = ("stale", "exited", "restart", "moved", "budget")
#: Why a rank's group progress started afresh (``laggard_intake_group_resets_total{reason}``):
#: a group's sequence numbers went backwards (a restarted process group), or another process
#: took the rank over (every group of the old one is dropped).
GROUP_RESET_REASONS = ("backwards", "new_process")
#: Why a run was forgotten (``laggard_intake_runs_forgotten_total{reason}``): nothing heard for
#: the TTL, or its last rank moved to another run.
RUN_FORGET_REASONS = ("stale", "empty")
#: Why a rank's GPU could not be named (``laggard_intake_gpu_unresolved_total{reason}``): no
#: NVML on this agent, or a UUID / PCI bus id NVML does not list.
GPU_UNRESOLVED_REASONS = ("no_nvml", "unknown_device")

#: ``(uuid, pci_bus_id)`` -> NVML index as a label value, ``""`` for a device NVML does not
#: list, None when NVML is not available. See :class:`laggard.agent.gpu_index.GpuIndex`.
GpuResolver = Callable[[str | None, str | None], str | None]


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
    uuid: str = ""
    pci_bus_id: str = ""
    gpu: str = ""
    pid: int | None = None
    labels: dict[str, str] = field(default_factory=dict)
    progress: RankProgress = field(default_factory=lambda: RankProgress(last_progress=0.0))


@dataclass(slots=True)
class JobState:
    """What the WindowReports of one run set (bounded like ranks)."""

    world_size: int
    last_step: int = -1
    last_report: float = 0.0
    last_report_monotonic: float = 0.0
    scores: dict[int, float] = field(default_factory=dict)
    flagged: dict[tuple[int, str], float] = field(default_factory=dict)
    job_slowdown: float | None = None
    detector_stats: dict[str, int] = field(default_factory=dict)


@dataclass(slots=True)
class RunState:
    """One training run's ranks and WindowReport state, apart from every other run's.

    Attributes:
        ranks: rank -> state; rank 0 of this run is not rank 0 of another.
        job: what this run's WindowReports set, None before the first (or after a reset).
        series: exposition samples this run holds (its share of the budget in use).
    """

    ranks: dict[int, RankState] = field(default_factory=dict)
    job: JobState | None = None
    series: int = 0


class RankTable:
    """Thread-safe per-run, per-rank statistics built from StepRecords and WindowReports.

    Runs are kept apart: each record's ``run`` (``""`` from a sender that names none) selects
    its own rank table and WindowReport state, so two jobs on one node never overwrite each
    other, and a world size seen in one run is no restart of another.

    Everything a sender can create is bounded: runs (``max_runs``), ranks over all runs
    (``max_ranks``), names per rank (``max_names`` phases and as many ops), finding labels (a
    fixed vocabulary) and, over all of them, the exposition samples the intake serves
    (``max_series``). The budget is shared fairly: a run may hold at most
    ``max_series // runs tracked`` samples; when the budget is full and a run under its share
    needs room, ranks of the run furthest over its share are forgotten (``budget``), highest
    rank first, so one run cannot starve another. State expires: a rank not heard from for
    ``rank_ttl_seconds`` is forgotten with its series, score and flags, and so is a run's job
    state; a run with nothing left is forgotten. Within a run, a rank whose world size changes
    or whose step goes back is a restart and starts afresh (so does the run's job state). A
    sender whose pid the kernel gave (:class:`SenderIdentity`) and that reports for another run
    or rank moves: its old rank is forgotten (``moved``).

    Heartbeats keep a rank that stopped stepping visible (:mod:`laggard.agent.progress`): a rank
    is forgotten for staleness only when nothing (no step, no heartbeat) came for the TTL *and*
    its process is not known to live: a pid seen alive (the kernel's, or the heartbeat's over
    UDP) whose process exists with the same start time keeps the rank, stalled, for as long as
    it lives. A rank whose process is gone is forgotten once the TTL has passed since it was
    last heard (``exited``, or ``stale`` after a goodbye heartbeat).

    Args:
        max_ranks: most ranks tracked over all runs; records of further ranks are rejected
            (``rank_limit``).
        findings: where findings carried by WindowReports go.
        default_node: node label for records that do not name one.
        max_series: most exposition samples the intake's per-rank families may hold; a new rank
            that does not fit is rejected (``series_limit``), a new phase, op, score or flag is
            dropped and counted.
        rank_ttl_seconds: seconds after its last record at which a rank is forgotten.
        max_names: most distinct phase names, and most op names, per rank.
        max_runs: most runs tracked; records of a further run are rejected (``run_limit``)
            until one expires.
        gpu_resolver: names a rank's GPU (NVML index) from its device UUID and PCI bus id;
            None: the ``gpu`` label stays empty.
        stall_seconds: least seconds without progress after which a rank is stalled.
        stall_step_factor: a rank is stalled after this many of its median step times without
            progress, when that is longer than ``stall_seconds``.
        proc_root: procfs mount point where rank processes are looked up.
        clock: monotonic clock in seconds (tests pass a fake one).

    Raises:
        ValueError: a limit below 1, a TTL or stall threshold not positive.
    """

    def __init__(self, max_ranks: int, findings: FindingLog, default_node: str, *,
                 max_series: int = DEFAULT_MAX_SERIES,
                 rank_ttl_seconds: float = DEFAULT_RANK_TTL_SECONDS,
                 max_names: int = MAX_NAMES_PER_RANK,
                 max_runs: int = DEFAULT_MAX_RUNS,
                 gpu_resolver: GpuResolver | None = None,
                 stall_seconds: float = DEFAULT_STALL_SECONDS,
                 stall_step_factor: float = DEFAULT_STALL_STEP_FACTOR,
                 proc_root: str = "/proc",
                 clock: Callable[[], float] = time.monotonic) -> None:
        if min(max_ranks, max_series, max_names, max_runs) < 1 or rank_ttl_seconds <= 0:
            raise ValueError("intake limits must be positive")
        if stall_seconds <= 0 or stall_step_factor <= 0:
            raise ValueError("stall thresholds must be positive")
        self._stall_seconds = stall_seconds
        self._stall_step_factor = stall_step_factor
        self._processes = ProcessWatch(proc_root, clock=clock)
        self._max_ranks = max_ranks
        self._max_series = max_series
        self._max_runs = max_runs
        self._ttl = rank_ttl_seconds
        self._max_names = max_names
        self._gpu_resolver = gpu_resolver
        self._clock = clock
        self._findings = findings
        self._default_node = default_node
        self._lock = threading.Lock()
        self._runs: dict[str, RunState] = {}
        #: sender pid -> (run, rank) it last reported as; at most one entry per tracked rank.
        self._senders: dict[int, tuple[str, int]] = {}
        self._rank_count = 0
        self._series = 0
        self._logged_internal_error = False
        self.accepted = 0
        self.rejected: Counter[str] = Counter()
        self.dropped: Counter[str] = Counter()
        self.forgotten: Counter[str] = Counter()
        self.job_resets: Counter[str] = Counter()
        self.runs_forgotten: Counter[str] = Counter()
        self.gpu_unresolved: Counter[str] = Counter()
        self.group_resets: Counter[str] = Counter()

    @property
    def series(self) -> int:
        """Exposition samples charged to the budget now (ranks, phases, ops, scores, flags)."""
        with self._lock:
            return self._series

    def run_series(self) -> dict[str, int]:
        """Run -> exposition samples it holds now (its use of the shared budget)."""
        with self._lock:
            return {run: state.series for run, state in self._runs.items()}

    def ingest(self, payload: bytes, sender: SenderIdentity | None = None) -> None:
        """Decode one datagram and apply it; a bad one is counted in ``rejected`` and dropped.

        Args:
            payload: one datagram's bytes.
            sender: who sent it, as the kernel says (Unix-socket intake); None over UDP. Its
                pid detects a rank that moves to another run; its workload labels go on the
                rank's ``laggard_rank_info``.

        Never raises: whatever the payload, it ends up in ``accepted`` or ``rejected``.
        """
        try:
            item = decode_datagram(payload)
            gpu = None
            if isinstance(item, StepRecord) and (item.uuid or item.pci_bus_id) \
                    and self._gpu_resolver is not None:
                # Outside the lock: the resolver may call NVML (cached, but not free).
                gpu = self._gpu_resolver(item.uuid, item.pci_bus_id)
            with self._lock:
                if isinstance(item, WindowReport):
                    self._apply_window(item)
                elif isinstance(item, Heartbeat):
                    self._apply_heartbeat(item, sender)
                else:
                    self._apply_step(item, sender, gpu)
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
        """Check the rank processes, then forget ranks, job state and runs not heard from for
        ``rank_ttl_seconds`` (a rank whose process is alive stays)."""
        with self._lock:
            self._expire()

    def _expire(self) -> None:
        now = self._clock()
        deadline = now - self._ttl
        for name, run in list(self._runs.items()):
            gone = []
            for rank, state in run.ranks.items():
                progress = state.progress
                self._check_process(state, now)
                heard = max(state.last_seen_monotonic, progress.last_datagram)
                if heard >= deadline or (progress.process == "alive" and not progress.closed):
                    continue  # heard within the TTL, or stalled: its process lives
                exited = progress.process == "exited" and not progress.closed
                gone.append((rank, "exited" if exited else "stale"))
            for rank, reason in gone:
                self._forget_rank(name, rank, reason)
            if run.job is not None and run.job.last_report_monotonic < deadline:
                self._reset_job(run, "stale")
            self._drop_if_empty(name, "stale")

    def _rank_pid(self, state: RankState) -> int | None:
        """The pid to look the rank's process up by: the kernel's for a Unix-socket sender
        (a pid its datagrams claim may be of another pid namespace), the heartbeat's over UDP
        (pid 1 never: from a container's own namespace it would name the host's init)."""
        progress = state.progress
        if progress.via_socket:
            return state.pid
        claimed = progress.claimed_pid
        return claimed if claimed is not None and claimed > 1 else None

    def _note_pid(self, name: str, state: RankState) -> None:
        """Read the start time of the rank's pid when it is new (or its last process was found
        gone: a datagram under that pid now comes from a process that reused it). When another
        process takes the rank over, the old one's group entries go (counted)."""
        progress = state.progress
        pid = self._rank_pid(state)
        if pid == progress.checked_pid and progress.process != "exited":
            return
        if progress.checked_pid is not None and pid is not None and progress.groups:
            dropped = progress.reset_groups()  # another process: its counters start anew
            self._uncharge(self._runs[name], dropped * GROUP_SAMPLES)
            state.series -= dropped * GROUP_SAMPLES
            self.group_resets["new_process"] += dropped
        progress.checked_pid = pid
        progress.pid_start = None if pid is None else self._processes.start_ticks(pid)
        progress.process = "unknown" if progress.pid_start is None else "alive"
        progress.process_checked = self._clock()

    def _check_process(self, state: RankState, now: float) -> None:
        """Refresh the rank's process state: alive without a look while its datagrams keep
        coming, else ``/proc`` at most once a second per rank."""
        progress = state.progress
        if progress.pid_start is None:
            progress.process = "unknown"
            return
        if now - progress.last_datagram < RECENT_DATAGRAM_SECONDS and \
                progress.process != "exited":
            progress.process = "alive"
            return
        if now - progress.process_checked < LIVENESS_CHECK_SECONDS:
            return
        progress.process = self._processes.state(progress.checked_pid, progress.pid_start)
        progress.process_checked = now

    def _drop_if_empty(self, name: str, reason: str | None) -> None:
        """Forget run ``name`` if nothing is left of it; count it unless ``reason`` is None
        (a run refused its first record was never one)."""
        run = self._runs.get(name)
        if run is not None and not run.ranks and run.job is None:
            del self._runs[name]
            self._series -= run.series  # 0 unless a bug left samples charged
            if reason is not None:
                self.runs_forgotten[reason] += 1

    def _forget_rank(self, name: str, rank: int, reason: str) -> None:
        run = self._runs[name]
        state = run.ranks.pop(rank)
        self._rank_count -= 1
        self._uncharge(run, state.series)
        self.forgotten[reason] += 1
        if state.pid is not None and self._senders.get(state.pid) == (name, rank):
            del self._senders[state.pid]
        job = run.job
        if job is not None:
            if job.scores.pop(rank, None) is not None:
                self._uncharge(run, 1)
            for key in [k for k in job.flagged if k[0] == rank]:
                del job.flagged[key]
                self._uncharge(run, 1)

    def _reset_job(self, run: RunState, reason: str) -> None:
        job, run.job = run.job, None
        if job is not None:
            self._uncharge(run, JOB_SAMPLES + len(job.scores) + len(job.flagged))
            self.job_resets[reason] += 1

    def _uncharge(self, run: RunState, samples: int) -> None:
        run.series -= samples
        self._series -= samples

    def _charge(self, name: str, samples: int) -> bool:
        """Charge ``samples`` to run ``name`` if its fair share and the budget allow.

        A run's share is ``max_series // runs tracked``. When the budget as a whole is full, runs
        over their share give ranks back (highest rank first) until this run fits.
        """
        run = self._runs[name]
        share = self._max_series // len(self._runs)
        if run.series + samples > share:
            return False
        while self._series + samples > self._max_series:
            if not self._reclaim(share, but=name):
                return False
        run.series += samples
        self._series += samples
        return True

    def _reclaim(self, share: int, but: str) -> bool:
        """Forget one rank (or the job state) of the run furthest over ``share``; False if none
        is over it."""
        over = [(run.series - share, name) for name, run in self._runs.items()
                if name != but and run.series > share]
        if not over:
            return False
        _, name = max(over)
        run = self._runs[name]
        if run.ranks:
            self._forget_rank(name, max(run.ranks), "budget")
        else:
            self._reset_job(run, "budget")
        self._drop_if_empty(name, "empty")
        return True

    def _run_for(self, name: str) -> RunState:
        """The state of run ``name``, made when the run limit allows.

        Raises:
            RecordError: ``run_limit`` when ``max_runs`` runs are tracked (after expiry).
        """
        run = self._runs.get(name)
        if run is None:
            if len(self._runs) >= self._max_runs:
                self._expire()
                if len(self._runs) >= self._max_runs:
                    raise RecordError("run_limit", f"more than {self._max_runs} runs")
            run = self._runs[name] = RunState()
        return run

    def _new_rank(self, name: str, rank: int, world_size: int, node: str | None,
                  local_rank: int | None, now: float) -> RankState:
        """A rank's state, made when the rank limit, the run limit and the run's share allow.

        Raises:
            RecordError: ``rank_limit``, ``run_limit`` or ``series_limit``.
        """
        if self._rank_count >= self._max_ranks:
            self._expire()
            if self._rank_count >= self._max_ranks:
                raise RecordError("rank_limit", f"more than {self._max_ranks} ranks")
        run = self._run_for(name)
        if not self._charge(name, RANK_SAMPLES):
            self._drop_if_empty(name, None)  # a run refused its first rank is not kept
            raise RecordError("series_limit", f"run {name!r} at its share of "
                              f"{self._max_series} series")
        state = run.ranks[rank] = RankState(world_size=world_size,
                                            node=node or self._default_node,
                                            local_rank=local_rank,
                                            progress=RankProgress(last_progress=now))
        self._rank_count += 1
        return state

    def _apply_step(self, record: StepRecord, sender: SenderIdentity | None = None,
                    gpu: str | None = None) -> None:
        now = self._clock()
        name = record.run
        run = self._runs.get(name)
        state = run.ranks.get(record.rank) if run is not None else None
        if run is not None and state is not None and (record.world_size != state.world_size
                                                      or record.step < state.last_step):
            # A restarted run (other world size, from a checkpoint, or step 0).
            self._forget_rank(name, record.rank, "restart")
            state = None
        if state is None:
            state = self._new_rank(name, record.rank, record.world_size, record.node,
                                   record.local_rank, now)
        if sender is not None:
            self._note_sender(name, record.rank, state, sender)
        state.progress.note_step(now, record.step_seconds)
        self._note_pid(name, state)
        if record.uuid or record.pci_bus_id:
            self._note_device(state, record, gpu)
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
            histogram = self._named(name, state, state.phases, phase, HISTOGRAM_SAMPLES, "phase")
            if histogram is not None:
                histogram.observe(seconds)
        if record.step_seconds is not None:
            state.step_seconds.observe(record.step_seconds)
        for c in record.collectives:
            # One histogram and one bytes counter per op.
            histogram = self._named(name, state, state.collective_seconds, c.op,
                                    HISTOGRAM_SAMPLES + 1, "op")
            if histogram is not None:
                histogram.observe(c.seconds)
                state.collective_bytes[c.op] += c.bytes
        for key, value in record.comm.items():
            if key in _COMM_COUNTERS:
                state.comm[key] += value

    def _apply_heartbeat(self, beat: Heartbeat, sender: SenderIdentity | None) -> None:
        """A rank's heartbeat: liveness, step, phase and group progress.

        A heartbeat can make a rank (one hung in its first step sent no step record). One whose
        world size differs from the rank's restarts it, unless the same process sends both
        (a process does not change its world size: a forged or garbled datagram, refused).

        Raises:
            RecordError: ``heartbeat_conflict``, or what making the rank raises.
        """
        now = self._clock()
        name = beat.run
        run = self._runs.get(name)
        state = run.ranks.get(beat.rank) if run is not None else None
        if run is not None and state is not None and beat.world_size != state.world_size:
            pid = sender.pid if sender is not None else beat.pid
            if pid is not None and pid == self._rank_pid(state):
                raise RecordError("heartbeat_conflict",
                                  f"pid {pid} sent world size {beat.world_size} for a rank of "
                                  f"world size {state.world_size}")
            self._forget_rank(name, beat.rank, "restart")
            state = None
        if state is None:
            state = self._new_rank(name, beat.rank, beat.world_size, beat.node, None, now)
        if sender is not None:
            self._note_sender(name, beat.rank, state, sender)
        if beat.node:
            state.node = beat.node
        progress = state.progress
        if beat.pid is not None:
            progress.claimed_pid = beat.pid
        self._note_pid(name, state)

        def admit_group() -> bool:
            if len(progress.groups) >= MAX_GROUPS_PER_RANK or \
                    not self._charge(name, GROUP_SAMPLES):
                return False
            state.series += GROUP_SAMPLES
            return True

        resets, dropped = progress.note_heartbeat(beat, now, admit_group)
        if resets:
            self.group_resets["backwards"] += resets
        if dropped:
            self.dropped["group"] += dropped

    def _note_sender(self, name: str, rank: int, state: RankState,
                     sender: SenderIdentity) -> None:
        """Workload labels from the sender; a pid last seen as another run's (or rank's) rank
        moves here, and its old rank is forgotten (``moved``)."""
        state.progress.via_socket = True
        state.labels = sender.workload_labels()
        if sender.pid is None:
            return
        previous = self._senders.get(sender.pid)
        if previous is not None and previous != (name, rank):
            old_run, old_rank = previous
            old = self._runs.get(old_run)
            if old is not None and old_rank in old.ranks:
                self._forget_rank(old_run, old_rank, "moved")
                self._drop_if_empty(old_run, "empty")
        if state.pid is not None and state.pid != sender.pid:
            self._senders.pop(state.pid, None)  # a new process took this rank over
        state.pid = sender.pid
        self._senders[sender.pid] = (name, rank)

    def _note_device(self, state: RankState, record: StepRecord, gpu: str | None) -> None:
        """The rank's device identity and, through NVML, its GPU index (counted when unknown)."""
        uuid = record.uuid or ""
        pci = _normalised_bus_id(record.pci_bus_id) if record.pci_bus_id else ""
        changed = (uuid, pci) != (state.uuid, state.pci_bus_id)
        state.uuid, state.pci_bus_id = uuid, pci
        if self._gpu_resolver is None:
            return
        if not gpu and (changed or state.gpu):
            self.gpu_unresolved["no_nvml" if gpu is None else "unknown_device"] += 1
        state.gpu = gpu or ""

    def _named(self, name: str, state: RankState, histograms: dict[str, Histogram], key: str,
               samples: int, what: str) -> Histogram | None:
        """The histogram of ``key``, made if the caps allow; None (and counted) if not."""
        histogram = histograms.get(key)
        if histogram is None:
            if len(histograms) >= self._max_names or not self._charge(name, samples):
                self.dropped[what] += 1
                return None
            state.series += samples
            histogram = histograms[key] = Histogram()
        return histogram

    def _apply_window(self, report: WindowReport) -> None:
        name = report.run
        run = self._run_for(name)
        job = run.job
        if job is not None and (report.world_size != job.world_size
                                or report.step < job.last_step):
            self._reset_job(run, "restart")
            job = None
        if job is None:
            if not self._charge(name, JOB_SAMPLES):
                self._drop_if_empty(name, None)
                raise RecordError("series_limit", f"run {name!r} at its share of "
                                  f"{self._max_series} series")
            job = run.job = JobState(world_size=report.world_size)
        job.last_step = report.step
        job.last_report = time.time()
        job.last_report_monotonic = self._clock()
        if report.detector_stats:
            job.detector_stats = dict(report.detector_stats)
        for rank, score in report.scores.items():
            if rank in job.scores or self._charge(name, 1):
                job.scores[rank] = score
            else:
                self.dropped["score"] += 1
        for doc in report.findings:
            doc = self._within_vocabulary(doc)
            if name:
                doc = {**doc, "run": name}
            rank = doc.get("rank")
            kind = doc["kind"]
            cleared = doc.get("cleared") is True
            # A rank's straggler and link findings are the per-rank laggard_straggler_active
            # series (kind tells them apart); the run's slowdown is its own gauge.
            if doc["detector"] in ("straggler", "link") and kind != OTHER_LABEL:
                if kind == "job_slowdown":
                    job.job_slowdown = 0.0 if cleared else 1.0
                elif isinstance(rank, int):
                    if cleared:
                        if job.flagged.pop((rank, kind), None) is not None:
                            self._uncharge(run, 1)
                    elif (rank, kind) in job.flagged or self._charge(name, 1):
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
        yield from self._progress_families()
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
            "Ranks forgotten with all their series, score and flags: stale (no record nor "
            "heartbeat for the rank TTL, no live process), exited (its process exited without "
            "a goodbye heartbeat, and the TTL passed), restart (new world size, or the step "
            "went back, in the same run), moved (its sender now reports for another run or "
            "rank), budget (its run was over its fair share of the series budget when another "
            "run needed room).",
            "reason", FORGET_REASONS, self.forgotten)
        yield _counter_by(
            "laggard_intake_group_resets_total",
            "Group progress entries of ranks started afresh: backwards (a heartbeat's issued "
            "or completed sequence number went back: a restarted process group), new_process "
            "(another process took the rank over; its old groups dropped).",
            "reason", GROUP_RESET_REASONS, self.group_resets)
        yield _counter_by(
            "laggard_intake_job_resets_total",
            "Times a run's state from WindowReports (scores, flags) was dropped: stale (no "
            "report for the rank TTL), restart (new world size, or the step went back), budget.",
            "reason", ("stale", "restart", "budget"), self.job_resets)
        yield _counter_by(
            "laggard_intake_runs_forgotten_total",
            "Runs forgotten: stale (no record for the rank TTL), empty (their last rank moved "
            "or was reclaimed).", "reason", RUN_FORGET_REASONS, self.runs_forgotten)
        yield _counter_by(
            "laggard_intake_gpu_unresolved_total",
            "Rank device identities (UUID, PCI bus id) this agent could not map to a GPU "
            "index: no_nvml (NVML not available), unknown_device (not a GPU NVML lists); the "
            "rank's gpu label is then empty.", "reason", GPU_UNRESOLVED_REASONS,
            self.gpu_unresolved)
        yield GaugeMetricFamily("laggard_intake_ranks", "Ranks tracked by the intake.",
                                value=self._rank_count)
        yield GaugeMetricFamily("laggard_intake_runs", "Training runs tracked by the intake.",
                                value=len(self._runs))
        yield GaugeMetricFamily("laggard_intake_runs_limit",
                                "Most training runs the intake tracks (--intake.max-runs).",
                                value=self._max_runs)
        yield GaugeMetricFamily(
            "laggard_intake_series",
            "Exposition samples the intake's per-rank families hold, against the budget "
            "laggard_intake_series_limit.", value=self._series)
        yield GaugeMetricFamily("laggard_intake_series_limit",
                                "Most exposition samples the intake's families may hold "
                                "(--intake.max-series).", value=self._max_series)
        run_series = GaugeMetricFamily(
            "laggard_intake_run_series",
            "Exposition samples one run's series hold; each run may hold at most "
            "laggard_intake_series_limit / laggard_intake_runs.", labels=["run"])
        for name, run in sorted(self._runs.items()):
            run_series.add_metric([name], run.series)
        yield run_series

    def _rank_families(self) -> Iterator[Metric]:
        """Per-rank series from StepRecords: identity, steps, phase and collective timings."""
        info = GaugeMetricFamily(
            "laggard_rank_info",
            "Identity of a training rank and its GPU (value 1): join on (run, rank) to the "
            "rank's series and on (instance, gpu) to its GPU's; the sender's workload labels "
            "(pod_uid, container_id, slurm_job_id...) appear here only.",
            labels=list(_RANK_INFO_LABELS))
        steps = CounterMetricFamily("laggard_steps_total", "Training steps reported by a rank.",
                                    labels=["run", "rank"])
        last_step = GaugeMetricFamily("laggard_rank_last_step", "Last step a rank reported.",
                                      labels=["run", "rank"])
        last_seen = GaugeMetricFamily("laggard_rank_last_seen_timestamp_seconds",
                                      "Unix time of the last record from a rank, in seconds.",
                                      labels=["run", "rank"])
        phase = HistogramMetricFamily(
            "laggard_step_phase_seconds",
            "Duration of each phase of a training step, in seconds (collective_wait: time "
            "waiting for collectives after the rank's own work).", labels=["run", "rank", "phase"])
        step_seconds = HistogramMetricFamily("laggard_step_seconds",
                                             "Wall time of a whole training step, in seconds.",
                                             labels=["run", "rank"])
        coll = HistogramMetricFamily("laggard_collective_seconds",
                                     "Collective time from launch to completion, in seconds.",
                                     labels=["run", "rank", "op"])
        coll_bytes = CounterMetricFamily("laggard_collective_bytes_total",
                                         "Bytes this rank sent in collectives.",
                                         labels=["run", "rank", "op"])
        comm = {key: CounterMetricFamily(name, help_, labels=["run", "rank"])
                for key, (name, help_) in _COMM_COUNTERS.items()}
        for name, run in sorted(self._runs.items()):
            for rank, s in sorted(run.ranks.items()):
                r = str(rank)
                labels = {"run": name, "rank": r, "node": s.node,
                          "local_rank": "" if s.local_rank is None else str(s.local_rank),
                          "world_size": str(s.world_size), "gpu": s.gpu, "uuid": s.uuid,
                          "pci_bus_id": s.pci_bus_id}
                # Workload labels vary by sender (Kubernetes, Slurm, none): added per sample.
                info.add_sample("laggard_rank_info", {**s.labels, **labels}, 1)
                steps.add_metric([name, r], s.steps)
                last_step.add_metric([name, r], s.last_step)
                if s.steps:  # a rank known from heartbeats alone has sent no step record
                    last_seen.add_metric([name, r], s.last_seen)
                for phase_name, h in sorted(s.phases.items()):
                    phase.add_metric([name, r, phase_name], h.cumulative_buckets(), h.sum)
                if s.step_seconds.count:
                    step_seconds.add_metric([name, r], s.step_seconds.cumulative_buckets(),
                                            s.step_seconds.sum)
                for op, h in sorted(s.collective_seconds.items()):
                    coll.add_metric([name, r, op], h.cumulative_buckets(), h.sum)
                    coll_bytes.add_metric([name, r, op], s.collective_bytes[op])
                for key, value in s.comm.items():
                    comm[key].add_metric([name, r], value)
        yield from (info, steps, last_step, last_seen, phase, step_seconds, coll, coll_bytes)
        yield from comm.values()

    def _progress_families(self) -> Iterator[Metric]:
        """Per-rank liveness and collective progress from steps and heartbeats (issue 24)."""
        now = self._clock()
        rank_labels = ["run", "rank"]
        stalled = GaugeMetricFamily(
            "laggard_rank_stalled_seconds",
            "Seconds since the rank last made progress (a step, a heartbeat's step moving on, a "
            "collective completed), once past its stall threshold; 0 while it progresses, "
            "after a goodbye heartbeat, or once its process exited.", labels=rank_labels)
        threshold = GaugeMetricFamily(
            "laggard_rank_stall_threshold_seconds",
            "Seconds without progress after which the rank counts as stalled: "
            "max(--intake.stall-seconds, --intake.stall-step-factor x its median step time).",
            labels=rank_labels)
        process = GaugeMetricFamily(
            "laggard_rank_process_state",
            "The rank's process as the agent sees it (value 1, one series per rank): alive "
            "(its pid exists with the start time it had when first seen), exited (gone, or its "
            "pid reused), unknown (no pid, or no procfs).", labels=[*rank_labels, "state"])
        age = GaugeMetricFamily(
            "laggard_rank_heartbeat_age_seconds",
            "Seconds since the rank's last heartbeat reached the agent (ranks that sent one).",
            labels=rank_labels)
        phase = GaugeMetricFamily(
            "laggard_rank_current_phase_seconds",
            "Seconds the rank's training thread has been in its current phase (label phase), "
            "as its last heartbeat said, plus the time since that heartbeat.",
            labels=[*rank_labels, "phase"])
        group_labels = [*rank_labels, "group"]
        issued = GaugeMetricFamily(
            "laggard_rank_collective_issued",
            "Sequence number of the last collective the rank issued in the process group "
            "(from its heartbeats; equal on every member that issued the same collectives).",
            labels=group_labels)
        completed = GaugeMetricFamily(
            "laggard_rank_collective_completed",
            "Collectives of the process group completed on the rank, in issue order (the "
            "highest n such that 1..n completed), from its heartbeats.", labels=group_labels)
        inflight = GaugeMetricFamily(
            "laggard_rank_collective_inflight_seconds",
            "Seconds since the rank issued its last collective (label op) in the group, while "
            "some of the group's collectives are in flight on it (issued, not completed).",
            labels=[*group_labels, "op"])
        pair_labels = [*group_labels, "peer"]
        p2p_issued = GaugeMetricFamily(
            "laggard_rank_p2p_issued",
            "Sequence number of the last point-to-point op (send, recv) the rank issued with "
            "rank peer in the group: counted per pair, never comparable across the group.",
            labels=pair_labels)
        p2p_completed = GaugeMetricFamily(
            "laggard_rank_p2p_completed",
            "Point-to-point ops with rank peer in the group completed on the rank, in issue "
            "order (the highest n such that 1..n completed).", labels=pair_labels)
        p2p_inflight = GaugeMetricFamily(
            "laggard_rank_p2p_inflight_seconds",
            "Seconds since the rank issued its last point-to-point op (label op) with rank peer, "
            "while some of the pair's ops are in flight on it.", labels=[*pair_labels, "op"])
        minimum, factor = self._stall_seconds, self._stall_step_factor
        for name, run in sorted(self._runs.items()):
            for rank, s in sorted(run.ranks.items()):
                r, p = str(rank), s.progress
                stalled.add_metric([name, r], p.stalled_seconds(now, minimum, factor))
                threshold.add_metric([name, r], p.stall_threshold(minimum, factor))
                process.add_metric([name, r, p.process], 1)
                heartbeat_age = p.heartbeat_age(now)
                if heartbeat_age is not None:
                    age.add_metric([name, r], heartbeat_age)
                phase_seconds = p.current_phase_seconds(now)
                if phase_seconds is not None and p.phase is not None:
                    phase.add_metric([name, r, p.phase], phase_seconds)
                for (group, peer), seen in sorted(
                        p.groups.items(),
                        key=lambda kv: (kv[0][0], -1 if kv[0][1] is None else kv[0][1])):
                    seconds = seen.inflight_seconds(now)
                    op = seen.op or ""
                    if peer is None:
                        issued.add_metric([name, r, group], seen.issued)
                        completed.add_metric([name, r, group], seen.completed)
                        if seconds is not None:
                            inflight.add_metric([name, r, group, op], seconds)
                    else:
                        labels = [name, r, group, str(peer)]
                        p2p_issued.add_metric(labels, seen.issued)
                        p2p_completed.add_metric(labels, seen.completed)
                        if seconds is not None:
                            p2p_inflight.add_metric([*labels, op], seconds)
        yield from (stalled, threshold, process, age, phase, issued, completed, inflight,
                    p2p_issued, p2p_completed, p2p_inflight)

    def _job_families(self) -> Iterator[Metric]:
        """The in-job detector's verdicts from each run's WindowReports: scores, flags,
        slowdown."""
        score = GaugeMetricFamily(
            "laggard_straggler_score",
            "Straggler score per rank from the in-job detector (0 typical, larger slower).",
            labels=["run", "rank"])
        flagged = GaugeMetricFamily(
            "laggard_straggler_active",
            "1 while the in-job detector flags a rank as a straggler, by cause.",
            labels=["run", "rank", "kind"])
        report = GaugeMetricFamily(
            "laggard_straggler_report_timestamp_seconds",
            "Unix time, in seconds, of the last WindowReport from the run's in-job detector "
            "(alert rules ignore flags older than a few windows).", labels=["run"])
        inputs = CounterMetricFamily(
            "laggard_straggler_detector_inputs_total",
            "The in-job detector's windows and the bad input it counted and skipped "
            "(missing_rank_reports, invalid_durations, world_size_changes...), by kind.",
            labels=["run", "kind"])
        slowdown = GaugeMetricFamily(
            "laggard_job_slowdown_active",
            "1 while the in-job detector finds the whole run slower than its best (no single "
            "rank to blame: shared storage, the fabric, a job-wide change).", labels=["run"])
        any_report = any_stats = any_slowdown = False
        for name, run in sorted(self._runs.items()):
            job = run.job
            if job is None:
                continue
            for rank, score_value in sorted(job.scores.items()):
                score.add_metric([name, str(rank)], score_value)
            for (rank, kind), flag in sorted(job.flagged.items()):
                flagged.add_metric([name, str(rank), kind], flag)
            report.add_metric([name], job.last_report)
            any_report = True
            for kind, count in sorted(job.detector_stats.items()):
                inputs.add_metric([name, kind], count)
                any_stats = True
            if job.job_slowdown is not None:
                slowdown.add_metric([name], job.job_slowdown)
                any_slowdown = True
        yield score
        yield flagged
        # Families without a sample stay out, as before runs (the metric reference lists
        # them from an agent that has had reports).
        if any_report:
            yield report
        if any_stats:
            yield inputs
        if any_slowdown:
            yield slowdown


#: Labels every ``laggard_rank_info`` sample has (workload labels come on top, per sender).
_RANK_INFO_LABELS = ("run", "rank", "local_rank", "node", "gpu", "uuid", "pci_bus_id",
                     "world_size")


def _normalised_bus_id(bus_id: str) -> str:
    """A PCI bus id as ``laggard_gpu_info{pci_bus_id}`` writes it (``0000:9b:00``), or as sent
    when it does not parse."""
    try:
        return normalise_bus_id(bus_id)
    except (ValueError, IndexError):
        return bus_id


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
