"""What the agent keeps of each training run: its ranks' state, its WindowReport state, and
what each costs in exposition samples (the series budget's units).

Plain data: :class:`laggard.agent.run_table.RankTable` changes it under its lock,
:class:`laggard.agent.run_metrics.RunMetrics` renders it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

from laggard.agent.progress import PROGRESS_SAMPLES, RankProgress
from laggard.collectors.histogram import DURATION_BUCKETS_SECONDS, Histogram

__all__ = ["COMM_KEYS", "HISTOGRAM_SAMPLES", "JOB_SAMPLES", "RANK_SAMPLES", "JobState",
           "RankState", "RunOwner", "RunState", "TableReading"]

#: ``StepRecord.comm`` keys the table sums per rank (seconds or bytes over steps); each is one
#: counter of :mod:`laggard.agent.run_metrics`, and any other key is ignored.
COMM_KEYS = ("total_seconds", "exposed_seconds", "bytes", "raw_bytes")
#: Exposition samples one rank costs before any phase, op or group: info, steps, last step, last
#: seen, four comm counters, the step-time histogram, and its progress (stalled seconds, stall
#: threshold, process state, heartbeat age, current phase). Charged against the series budget.
RANK_SAMPLES = 8 + len(DURATION_BUCKETS_SECONDS) + 3 + PROGRESS_SAMPLES
#: Samples of one duration histogram (buckets, +Inf, sum, count): one phase of one rank.
HISTOGRAM_SAMPLES = len(DURATION_BUCKETS_SECONDS) + 3
#: Samples a run's WindowReport state costs besides its scores and flags: the report timestamp,
#: the job-slowdown gauge and up to 16 detector input counters (the wire's cap on their names).
JOB_SAMPLES = 2 + 16


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
    """

    ranks: dict[int, RankState] = field(default_factory=dict)
    job: JobState | None = None
    series: int = 0
    owner: RunOwner | None = None


@dataclass(frozen=True, slots=True)
class TableReading:
    """What :meth:`RankTable.reading` hands the metric rendering, under the table's lock.

    Attributes:
        runs: run name -> its state (live: read it inside the ``with`` block only).
        rank_count: ranks tracked over all runs.
        series: exposition samples charged to the budget.
    """

    runs: Mapping[str, RunState]
    rank_count: int
    series: int
