"""The agent's run table: each training run's ranks and WindowReport state, bounded.

What the training ranks of this node send through the agent's socket (a Unix datagram socket,
``agent/unix_intake.py``; UDP on loopback optional, ``agent/udp_intake.py``) is applied here:
StepRecords, WindowReports and Heartbeats. Each training run (``StepRecord.run``) has its own
ranks; at most ``max_runs`` runs, ``max_ranks`` ranks and ``max_series`` exposition samples
(shared fairly between runs) are kept, label values from the wire are capped (phase and op names
per rank) or drawn from a fixed vocabulary (finding detector, kind, severity), and ranks unheard
of for ``rank_ttl_seconds`` are forgotten, unless their process still lives: a rank whose steps
stopped while its heartbeats go on, or its process exists, is *stalled*, not stale, and its
series stay (``laggard.agent.progress``). Every datagram sent ends up in exactly one counter:
accepted, rejected by reason, or dropped by the kernel before the agent read it. Nothing a sender
does can grow the agent's memory or its exposition without bound.

A run belongs to its senders (docs/agent.md, "Threat model"): the first sender the kernel names
(its uid, and its Slurm job where its cgroup names one) owns the run label; records of another
uid for that run, and UDP records (no identity) for a run owned over the socket, are refused
(``foreign_sender``) and logged once per uid with pid and uid, so one datagram of another user
can neither write the run's verdict nor reset its ranks. Root (uid 0) is the node's admin and may
write any run (counted: ``laggard_intake_admin_records_total``). A run none of whose ranks is
alive any more may be claimed by a new owner (``run_owner.py``). Every finding a WindowReport
carries is kept and logged with the ``sender_pid`` and ``sender_uid`` the kernel gave
(None over UDP).

State only (its data in :mod:`laggard.agent.run_state`): the metric families are rendered from
it by :class:`laggard.agent.run_metrics.RunMetrics`, as client_python's ``process_collector.py``
reads and ``exposition.py`` renders; who may write a run is decided in
:mod:`laggard.agent.run_owner`, a rank's liveness in :mod:`laggard.agent.progress`.

Over 600 lines as one cohesive class (issue 30's rule): every method of ``RankTable`` reads or
changes the same run map and series budget under one lock, and an ingest must apply a record,
charge the budget and claim the run in one critical section; what does not need the lock lives
in the modules above.
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from laggard.agent.config import (
    DEFAULT_MAX_RUNS,
    DEFAULT_MAX_SERIES,
    DEFAULT_RANK_TTL_SECONDS,
    DEFAULT_STALL_SECONDS,
    DEFAULT_STALL_STEP_FACTOR,
    MAX_NAMES_PER_RANK,
)
from laggard.agent.context import FindingLog
from laggard.agent.liveness import ProcessWatch
from laggard.agent.progress import (
    GROUP_SAMPLES,
    MAX_GROUPS_PER_RANK,
    RankProgress,
)
from laggard.agent.run_owner import admission, claim, refusal_text, with_sender
from laggard.agent.run_state import (
    COMM_KEYS,
    HISTOGRAM_SAMPLES,
    JOB_SAMPLES,
    RANK_DETAIL_SAMPLES,
    RANK_SAMPLES,
    RUN_BUCKETS_SECONDS,
    RUN_COMM_SAMPLES,
    RUN_HISTOGRAM_SAMPLES,
    JobState,
    RankState,
    RunState,
    TableReading,
)
from laggard.agent.sender import SenderIdentity
from laggard.collectors.histogram import DURATION_BUCKETS_SECONDS, Histogram
from laggard.detectors.finding import JOB_FINDING_KINDS, Severity
from laggard.log_once import LogOnce
from laggard.nvml.library import normalise_bus_id
from laggard.wire import Heartbeat, RecordError, StepRecord, WindowReport, decode_datagram

log = logging.getLogger(__name__)

#: Label value for a finding's detector, kind or severity outside the known vocabulary.
OTHER_LABEL = "other"
_SEVERITIES = frozenset(s.value for s in Severity)
#: ``laggard_intake_rejected_total`` reason of a record for a run another sender owns.
FOREIGN_SENDER = "foreign_sender"

#: ``(uuid, pci_bus_id)`` -> NVML index as a label value, ``""`` for a device NVML does not
#: list, None when NVML is not available. See :class:`laggard.agent.gpu_index.GpuIndex`.
GpuResolver = Callable[[str | None, str | None], str | None]

class RankTable:
    """Thread-safe per-run, per-rank statistics built from StepRecords and WindowReports.

    Runs are kept apart: each record's ``run`` (``""`` from a sender that names none) selects
    its own rank table and WindowReport state, so two jobs on one node never overwrite each
    other, and a world size seen in one run is no restart of another.

    Everything a sender can create is bounded: runs (``max_runs``), ranks over all runs
    (``max_ranks``), names per rank and per run (``max_names`` phases and as many ops), finding
    labels (a fixed vocabulary) and, over all of them, the exposition samples the intake serves
    (``max_series``). The budget is shared fairly: a run may hold at most
    ``max_series // runs tracked`` samples; when the budget is full and a run under its share
    needs room, ranks of the run furthest over its share are forgotten (``budget``), highest
    rank first, so one run cannot starve another. State expires: a rank not heard from for
    ``rank_ttl_seconds`` is forgotten with its series, score and flags, and so is a run's job
    state; a run with nothing left is forgotten. Within a run, a rank whose world size changes
    or whose step goes back is a restart and starts afresh (so does the run's job state). A
    sender whose pid the kernel gave (:class:`SenderIdentity`) and that reports for another run
    or rank moves: its old rank is forgotten (``moved``). The first sender the kernel names owns
    its run (:class:`~laggard.agent.run_state.RunOwner`); another owner's records for it are
    refused (``foreign_sender``), root's accepted and counted (``admin_records``).

    Heartbeats keep a rank that stopped stepping visible (:mod:`laggard.agent.progress`): a rank
    is forgotten for staleness only when nothing (no step, no heartbeat) came for the TTL *and*
    its process is not known to live: a pid seen alive (the kernel's, or the heartbeat's over
    UDP) whose process is the same one (pid, creation time) keeps the rank, stalled, while it
    lives. A rank whose process is gone is forgotten once the TTL has passed since it was
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
        rank_histograms: keep and charge each rank's phase, step and collective histograms,
            its counters and its progress detail (``--intake.rank-histograms``); by default a
            rank costs :data:`~laggard.agent.run_state.RANK_SAMPLES` and the histograms are
            kept per run, for the node's ranks together (issue 34's series budget).
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
                 rank_histograms: bool = False,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if min(max_ranks, max_series, max_names, max_runs) < 1 or rank_ttl_seconds <= 0:
            raise ValueError("intake limits must be positive")
        if stall_seconds <= 0 or stall_step_factor <= 0:
            raise ValueError("stall thresholds must be positive")
        self._stall_seconds = stall_seconds
        self._stall_step_factor = stall_step_factor
        self._processes = ProcessWatch(proc_root, clock=clock)
        self._rank_histograms = rank_histograms
        self._rank_samples = RANK_SAMPLES + (RANK_DETAIL_SAMPLES if rank_histograms else 0)
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
        self._log_once = LogOnce(log, logging.ERROR)
        self._refusal_once = LogOnce(log)
        self.accepted = 0
        self.rejected: Counter[str] = Counter()
        self.dropped: Counter[str] = Counter()
        self.forgotten: Counter[str] = Counter()
        self.job_resets: Counter[str] = Counter()
        self.runs_forgotten: Counter[str] = Counter()
        self.gpu_unresolved: Counter[str] = Counter()
        self.group_resets: Counter[str] = Counter()
        #: records root (uid 0) wrote into a run another uid owns.
        self.admin_records = 0

    @property
    def max_runs(self) -> int:
        """Most runs tracked (``--intake.max-runs``)."""
        return self._max_runs

    @property
    def max_series(self) -> int:
        """Most exposition samples the per-rank families may hold (``--intake.max-series``)."""
        return self._max_series

    @property
    def rank_histograms(self) -> bool:
        """Whether each rank's histograms and detail are kept (``--intake.rank-histograms``)."""
        return self._rank_histograms

    @property
    def rank_samples(self) -> int:
        """Exposition samples one rank is charged before any phase, op or group."""
        return self._rank_samples

    @property
    def stall_seconds(self) -> float:
        """Least seconds without progress after which a rank is stalled."""
        return self._stall_seconds

    @property
    def stall_step_factor(self) -> float:
        """Median step times without progress after which a rank is stalled."""
        return self._stall_step_factor

    def clock(self) -> float:
        """The table's monotonic clock, in seconds."""
        return self._clock()

    @contextmanager
    def reading(self) -> Iterator[TableReading]:
        """Expire stale state, then hold the table's lock while the caller reads it.

        For :class:`laggard.agent.run_metrics.RunMetrics`: what it yields is live state, valid
        inside the ``with`` block only, read-only, like the counters (``accepted``...).
        """
        with self._lock:
            self._expire()
            yield TableReading(runs=self._runs, rank_count=self._rank_count,
                               series=self._series, rank_histograms=self._rank_histograms)

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
                uid (and Slurm job) own a run it is the first to write, and a record of another
                owner's run is refused (``foreign_sender``); its pid detects a rank that moves to
                another run and goes with its uid on the findings it carries; its workload
                labels go on the rank's ``laggard_rank_info``.

        Never raises: whatever the payload, it ends up in ``accepted`` or ``rejected``.
        """
        refusal: tuple[str, tuple[object, ...]] | None = None
        try:
            item = decode_datagram(payload)
            gpu = None
            if isinstance(item, StepRecord) and (item.uuid or item.pci_bus_id) \
                    and self._gpu_resolver is not None:
                # Outside the lock: the resolver may call NVML (cached, but not free).
                gpu = self._gpu_resolver(item.uuid, item.pci_bus_id)
            with self._lock:
                refusal = self._refusal(item, sender)
                if refusal is not None:
                    self.rejected[FOREIGN_SENDER] += 1
                else:
                    if isinstance(item, WindowReport):
                        self._apply_window(with_sender(item, sender))
                    elif isinstance(item, Heartbeat):
                        self._apply_heartbeat(item, sender)
                    else:
                        self._apply_step(item, sender, gpu)
                    claim(self._runs.get(item.run), sender)
                    self.accepted += 1
            if refusal is not None:
                # Outside the lock (a blocked log handler must not stop the intake).
                self._refusal_once(refusal[0], "intake: refused %s for run %r, owned by uid "
                                   "%s%s (pid %s) (counted as "
                                   "laggard_intake_rejected_total{reason=\"foreign_sender\"}; "
                                   "logged once per sender uid)", *refusal[1])
        except RecordError as exc:
            with self._lock:
                self.rejected[exc.reason] += 1
        except Exception:  # noqa: BLE001 - a bug costs one datagram, counted, not the intake
            with self._lock:
                self.rejected["internal_error"] += 1
            # Outside the lock: the traceback names the bug; one is enough.
            self._log_once("internal_error", "intake failed on a datagram (counted as "
                           "internal_error):\n%s", traceback.format_exc())

    def _refusal(self, item: StepRecord | WindowReport | Heartbeat,
                 sender: SenderIdentity | None) -> tuple[str, tuple[object, ...]] | None:
        """Why ``sender`` may not write ``item``'s run (``run_owner.py``): a log key and the log
        line's arguments; None when it may (root's records counted)."""
        run = self._runs.get(item.run)
        verdict = admission(run, sender)
        if verdict == "admin":
            self.admin_records += 1
        if verdict != "foreign" or run is None or run.owner is None:
            return None
        return refusal_text(type(item).__name__, item.run, run.owner, sender)

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
                progress.check_process(self._processes, now)
                heard = max(state.last_seen_monotonic, progress.last_datagram)
                if heard >= deadline or (progress.process == "alive" and not progress.closed):
                    continue  # heard within the TTL, or stalled: its process lives
                exited = progress.process == "exited" and not progress.closed
                gone.append((rank, "exited" if exited else "stale"))
            for rank, reason in gone:
                self._forget_rank(name, rank, reason)
            if run.job is not None and run.job.last_report_monotonic < deadline:
                self._reset_job(run, "stale")
                # a job that died without closing: its verdicts end with its state
                self._findings.end_run(name, reason="no window report for the rank TTL")
            self._drop_if_empty(name, "stale")

    def _note_pid(self, name: str, state: RankState) -> None:
        """Identify the rank's process when its pid is new; the group entries of a process
        that took the rank over from another are dropped (uncharged, counted)."""
        dropped = state.progress.note_pid(state.progress.pid(state.pid), self._processes,
                                          self._clock())
        if dropped:
            self._uncharge(self._runs[name], dropped * GROUP_SAMPLES)
            state.series -= dropped * GROUP_SAMPLES
            self.group_resets["new_process"] += dropped

    def _drop_if_empty(self, name: str, reason: str | None) -> None:
        """Forget run ``name`` if nothing is left of it; count it unless ``reason`` is None
        (a run refused its first record was never one)."""
        run = self._runs.get(name)
        if run is not None and not run.ranks and run.job is None:
            del self._runs[name]
            self._series -= run.series  # its per-run histograms and counters
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
        if not self._charge(name, self._rank_samples):
            self._drop_if_empty(name, None)  # a run refused its first rank is not kept
            raise RecordError("series_limit", f"run {name!r} at its share of "
                              f"{self._max_series} series")
        state = run.ranks[rank] = RankState(world_size=world_size,
                                            node=node or self._default_node,
                                            local_rank=local_rank, series=self._rank_samples,
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
        state.window.observe(phases, record.step_seconds)
        self._apply_run_step(name, run or self._runs[name], record, phases)
        if self._rank_histograms:
            self._apply_rank_histograms(name, state, record, phases)

    def _apply_run_step(self, name: str, run: RunState, record: StepRecord,
                        phases: dict[str, float]) -> None:
        """A step record into its run's histograms and counters (the node's ranks together):
        one histogram per phase, one histogram and bytes counter per op, the comm sums."""
        # A name dropped is counted once: here by default, by the rank's own histograms with
        # --intake.rank-histograms.
        phase_drop, op_drop = (None, None) if self._rank_histograms else ("phase", "op")
        for phase, seconds in phases.items():
            histogram = self._named(name, None, run.phases, phase, RUN_HISTOGRAM_SAMPLES,
                                    phase_drop, RUN_BUCKETS_SECONDS)
            if histogram is not None:
                histogram.observe(seconds)
        for c in record.collectives:
            histogram = self._named(name, None, run.collective_seconds, c.op,
                                    RUN_HISTOGRAM_SAMPLES + 1, op_drop, RUN_BUCKETS_SECONDS)
            if histogram is not None:
                histogram.observe(c.seconds)
                run.collective_bytes[c.op] += c.bytes
        comm = {key: value for key, value in record.comm.items() if key in COMM_KEYS}
        if comm and not run.comm:
            if not self._charge(name, RUN_COMM_SAMPLES):
                self.dropped["comm"] += 1
                return
            run.comm.update(dict.fromkeys(COMM_KEYS, 0.0))
        for key, value in comm.items():
            run.comm[key] += value

    def _apply_rank_histograms(self, name: str, state: RankState, record: StepRecord,
                               phases: dict[str, float]) -> None:
        """``--intake.rank-histograms``: a step record into the rank's own histograms and
        counters."""
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
            if key in COMM_KEYS:
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
            if pid is not None and pid == state.progress.pid(state.pid):
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

    def _named(self, name: str, state: RankState | None, histograms: dict[str, Histogram],
               key: str, samples: int, what: str | None,
               bounds: tuple[float, ...] = DURATION_BUCKETS_SECONDS) -> Histogram | None:
        """The histogram of ``key``, made if the caps allow; None (and counted as ``what``
        unless None) if not. Its samples are charged to run ``name``, and to ``state`` when it
        is a rank's (a run's are given back when the run is forgotten)."""
        histogram = histograms.get(key)
        if histogram is None:
            if len(histograms) >= self._max_names or not self._charge(name, samples):
                if what is not None:
                    self.dropped[what] += 1
                return None
            if state is not None:
                state.series += samples
            histogram = histograms[key] = Histogram(bounds)
        return histogram

    def _apply_window(self, report: WindowReport) -> None:
        """A WindowReport: the run's scores, findings raised or cleared, findings that hold
        (``active``: a level, applied idempotently) or the run's end (``end``)."""
        name = report.run
        if report.end:
            self._end_run(name)
            return
        run = self._run_for(name)
        job = run.job
        if job is not None and (report.world_size != job.world_size
                                or report.step < job.last_step):
            self._reset_job(run, "restart")
            # the old job's clears will never come: its verdicts end (the new one re-raises)
            self._findings.end_run(name, reason="the run restarted")
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
            doc = self._job_finding(name, run, job, doc, cleared=doc.get("cleared") is True)
            self._findings.add(doc, job=name)
        for doc in report.active:
            # Re-sent each window while it holds: the flag set again (a no-op when set), the
            # episode taken up only if this agent has none holding (restarted mid-run).
            doc = self._job_finding(name, run, job, doc, cleared=False)
            self._findings.hold(doc, job=name)

    def _job_finding(self, name: str, run: RunState, job: JobState, doc: dict[str, Any], *,
                     cleared: bool) -> dict[str, Any]:
        """Apply one finding of run ``name`` to its flags; the finding as recorded (labels
        within the vocabulary, the run named)."""
        doc = self._within_vocabulary(doc)
        if name:
            doc = {**doc, "run": name}
        rank = doc.get("rank")
        kind = doc["kind"]
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
        return doc

    def _end_run(self, name: str) -> None:
        """Run ``name`` ended (its monitor closed): its job state (scores, flags: the
        ``laggard_straggler_active`` series) dropped at once (``job_resets{reason="ended"}``),
        its findings that hold ended on ``/findings``. Its ranks stay until their heartbeats'
        goodbye lets them expire."""
        run = self._runs.get(name)
        if run is not None:
            self._reset_job(run, "ended")
            self._drop_if_empty(name, "empty")
        self._findings.end_run(name)

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





def _normalised_bus_id(bus_id: str) -> str:
    """A PCI bus id as ``laggard_gpu_info{pci_bus_id}`` writes it (``0000:9b:00``), or as sent
    when it does not parse."""
    try:
        return normalise_bus_id(bus_id)
    except (ValueError, IndexError):
        return bus_id
