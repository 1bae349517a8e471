"""What the agent keeps of each training run: its ranks' state, its WindowReport state, and
what each costs in exposition samples (the series budget's units).

Plain data: :class:`laggard.agent.run_table.RankTable` changes it under its lock,
:class:`laggard.agent.run_metrics.RunMetrics` renders it.
"""

from __future__ import annotations

import statistics
from collections import Counter, deque
from collections.abc import Mapping
from dataclasses import dataclass, field

from laggard.agent.progress import PROGRESS_SAMPLES, RECENT_STEPS, RankProgress
from laggard.collectors.histogram import DURATION_BUCKETS_SECONDS, Histogram

__all__ = ["COMM_KEYS", "HISTOGRAM_SAMPLES", "JOB_SAMPLES", "MEDIAN_PHASES",
           "RANK_DETAIL_SAMPLES", "RANK_SAMPLES", "RUN_BUCKETS_SECONDS", "RUN_COMM_SAMPLES",
           "RUN_HISTOGRAM_SAMPLES", "JobState", "RankState", "RunOwner", "RunState",
           "StepWindow", "TableReading"]

#: ``StepRecord.comm`` keys the table sums per run (and per rank with
#: ``--intake.rank-histograms``), seconds or bytes over steps; each is one counter of
#: :mod:`laggard.agent.run_metrics`, and any other key is ignored.
COMM_KEYS = ("total_seconds", "exposed_seconds", "bytes", "raw_bytes")
#: The phases of each rank's window medians (``laggard_rank_phase_median_seconds{phase}``):
#: ``compute`` is every timed phase but ``data``, ``optimizer`` and the collective wait (the
#: rank's own work before the gradient all-reduce, where a slow GPU shows: the recording rules'
#: forward + backward, and the loop's own names and ``gc``); ``data`` the input pipeline;
#: ``collective_wait`` the exposed collective time (``StepRecord.collective_wait_seconds``),
#: shortest on the straggler (docs/architecture.md).
MEDIAN_PHASES = ("compute", "data", "collective_wait")
#: Timed phases outside ``compute``: the optimizer runs after the all-reduce, alike on every rank.
_NOT_COMPUTE = frozenset({"data", "optimizer", "collective_wait"})
#: Exposition samples one rank costs by default (issue 34's budget: at most 12): info, the
#: window medians of the three phases and of the step, stalled seconds, heartbeat age, and
#: what a stalled rank adds (process state, current phase). Charged against the series budget;
#: group progress (``GROUP_SAMPLES`` per group) on top, exported while the rank is stalled.
RANK_SAMPLES = 1 + len(MEDIAN_PHASES) + 1 + PROGRESS_SAMPLES - 1
#: What ``--intake.rank-histograms`` adds per rank before any phase or op: steps, last step,
#: last seen, four comm counters, the step-time histogram and the stall threshold.
RANK_DETAIL_SAMPLES = 7 + len(DURATION_BUCKETS_SECONDS) + 3 + 1
#: Samples of one duration histogram (buckets, +Inf, sum, count): one phase of one rank.
HISTOGRAM_SAMPLES = len(DURATION_BUCKETS_SECONDS) + 3
#: Upper bounds (seconds) of the per-run histograms of the node's ranks together: decades from
#: 10 ms to 10 s. The mean per step is exact (sum over count) and the ranks' typical times are
#: their window medians; the buckets only tell the tail (phases or collectives past 1 s, 10 s)
#: at 7 samples a phase instead of 18, to keep a node within issue 34's 400 series.
RUN_BUCKETS_SECONDS: tuple[float, ...] = (0.01, 0.1, 1.0, 10.0)
#: Samples of one per-run histogram (buckets, +Inf, sum, count).
RUN_HISTOGRAM_SAMPLES = len(RUN_BUCKETS_SECONDS) + 3
#: Samples of a run's communication counters (one per :data:`COMM_KEYS` key).
RUN_COMM_SAMPLES = len(COMM_KEYS)
#: Samples a run's WindowReport state costs besides its scores and flags: the report timestamp,
#: the job-slowdown gauge and up to 16 detector input counters (the wire's cap on their names).
JOB_SAMPLES = 2 + 16


#: Step records a rank's window holds before its medians are exported: half the window. A
#: rank's first steps are its warm-up (lazy initialisation, DDP's first bucket rebuild, the
#: allocator's growth, autotuning), and a median of one or two of them once named rank 0
#: "3.94x the median rank" (LaggardStragglerRank) in a demo whose other ranks had sent none yet.
MIN_MEDIAN_STEPS = RECENT_STEPS // 2


def _window() -> deque[float]:
    return deque(maxlen=RECENT_STEPS)


@dataclass(slots=True)
class StepWindow:
    """A rank's last :data:`~laggard.agent.progress.RECENT_STEPS` (16) step records: seconds
    of compute, data, collective wait and the whole step, for their medians.

    The median of a short window, not a mean over a rate window: one slow step (a checkpoint,
    a garbage collection) moves it little, and it answers "how long does this rank's compute
    take now" with one series per phase (issue 34).
    """

    compute: deque[float] = field(default_factory=_window)
    data: deque[float] = field(default_factory=_window)
    collective_wait: deque[float] = field(default_factory=_window)
    step: deque[float] = field(default_factory=_window)

    def observe(self, phases: Mapping[str, float], step_seconds: float | None) -> None:
        """One step record: ``phases`` (name -> seconds, the collective wait under
        ``collective_wait``) and the step's wall time, None when not sent."""
        compute = [s for name, s in phases.items() if name not in _NOT_COMPUTE]
        if compute:
            self.compute.append(sum(compute))
        if "data" in phases:
            self.data.append(phases["data"])
        if "collective_wait" in phases:
            self.collective_wait.append(phases["collective_wait"])
        if step_seconds is not None:
            self.step.append(step_seconds)

    def phase_medians(self) -> dict[str, float]:
        """:data:`MEDIAN_PHASES` name -> median seconds, for the phases with at least
        :data:`MIN_MEDIAN_STEPS` steps."""
        return {name: statistics.median(window) for name in MEDIAN_PHASES
                if len(window := getattr(self, name)) >= MIN_MEDIAN_STEPS}

    def step_median(self) -> float | None:
        """Median seconds of the whole step; None before :data:`MIN_MEDIAN_STEPS` records
        gave one."""
        return statistics.median(self.step) if len(self.step) >= MIN_MEDIAN_STEPS else None


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
    window: StepWindow = field(default_factory=StepWindow)
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


@dataclass(frozen=True, slots=True)
class RunOwner:
    """Who owns a run label on this agent: the first sender the kernel named (docs/agent.md,
    "Threat model").

    Attributes:
        uid: the owner's user id (``SCM_CREDENTIALS``).
        cgroup: the owner's workload (:meth:`laggard.agent.sender.SenderIdentity.owner_cgroup`:
            its Slurm job), None where its cgroup names none.
        pid: the process that claimed the run (for the log), None where unknown.
    """

    uid: int
    cgroup: str | None = None
    pid: int | None = None


@dataclass(slots=True)
class RunState:
    """One training run's ranks and WindowReport state, apart from every other run's.

    Attributes:
        ranks: rank -> state; rank 0 of this run is not rank 0 of another.
        job: what this run's WindowReports set, None before the first (or after a reset).
        series: exposition samples this run holds (its share of the budget in use).
        owner: who owns the run label; None for a run first heard over UDP (no identity).
        phases: phase -> its durations over the node's ranks of the run together (the default
            set's phase histogram; a rank's own are behind ``--intake.rank-histograms``).
        collective_seconds: op -> collective durations over the node's ranks together.
        collective_bytes: op -> bytes the node's ranks sent in it.
        comm: :data:`COMM_KEYS` key -> its sum over the node's ranks and steps.
    """

    ranks: dict[int, RankState] = field(default_factory=dict)
    job: JobState | None = None
    series: int = 0
    owner: RunOwner | None = None
    phases: dict[str, Histogram] = field(default_factory=dict)
    collective_seconds: dict[str, Histogram] = field(default_factory=dict)
    collective_bytes: Counter[str] = field(default_factory=Counter)
    comm: Counter[str] = field(default_factory=Counter)


@dataclass(frozen=True, slots=True)
class TableReading:
    """What :meth:`RankTable.reading` hands the metric rendering, under the table's lock.

    Attributes:
        runs: run name -> its state (live: read it inside the ``with`` block only).
        rank_count: ranks tracked over all runs.
        series: exposition samples charged to the budget.
        rank_histograms: ``--intake.rank-histograms``: render each rank's histograms,
            counters and progress detail too, not only the default set.
    """

    runs: Mapping[str, RunState]
    rank_count: int
    series: int
    rank_histograms: bool = False
