"""A rank's progress and liveness from its steps and heartbeats: stalled, not stale (issue 24).

When a job hangs its ranks stop sending step records. Before heartbeats the agent forgot them
after ``--intake.rank-ttl``, so their series vanished just when they mattered. Now each rank
keeps, besides its step statistics (:mod:`laggard.agent.run_table`), what its heartbeats
(:class:`laggard.wire.Heartbeat`, about one a second from a thread of the training process)
said last, on the agent's monotonic clock:

* when it last made **progress**: a step record, a heartbeat whose step moved on, or a
  collective completed in any group. A rank without progress for longer than its stall
  threshold (``max(--intake.stall-seconds, --intake.stall-step-factor x its median step
  seconds)``) is **stalled**: ``laggard_rank_stalled_seconds`` counts the seconds since its last
  progress, 0 while it progresses;
* when its last **heartbeat** came, its step, phase and how long it had been in that phase;
* per process group (and per P2P pair: ``peer`` set) how far it has **issued** and
  **completed** collectives, the last op and how long ago it was issued: the evidence the hang
  rules (``dashboards/rules``) compare across ranks;
* its **process**: the pid, and the process it named when first seen
  (:class:`laggard.agent.liveness.ProcessWatch`), checked again while the rank is silent.

A heartbeat whose ``phase`` is :data:`CLOSED_PHASE` says goodbye (the monitor closed): the rank
is then neither stalled nor kept alive by its process, and expires after the TTL like a rank of
a sender without heartbeats.

Bookkeeping with plain data (the process checks go through the :class:`ProcessWatch` passed
in); the table (:class:`laggard.agent.run_table.RankTable`) holds the lock and charges the
series budget, :class:`laggard.agent.run_metrics.RunMetrics` builds the families.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from laggard.agent.liveness import ProcessIdentity, ProcessState, ProcessWatch
from laggard.wire import CLOSED_PHASE, Heartbeat

__all__ = ["CLOSED_PHASE", "GROUP_SAMPLES", "GroupSeen", "MAX_GROUPS_PER_RANK",
           "PROGRESS_SAMPLES", "RankProgress"]

#: Most group entries (collective groups and P2P pairs together) kept per rank; a heartbeat's
#: entry past it is dropped and counted (``laggard_intake_dropped_total{what="group"}``).
MAX_GROUPS_PER_RANK = 32
#: Exposition samples one group entry costs: issued, completed, in flight.
GROUP_SAMPLES = 3
#: Exposition samples of a rank's progress besides its groups: stalled seconds, stall
#: threshold, process state, heartbeat age, current phase.
PROGRESS_SAMPLES = 5
#: Step times remembered per rank for its median (seconds; the newest win).
RECENT_STEPS = 16
#: A datagram younger than this (seconds) shows its process alive without reading /proc.
RECENT_DATAGRAM_SECONDS = 2.0
#: Seconds between two /proc checks of one rank's process.
LIVENESS_CHECK_SECONDS = 1.0


@dataclass(slots=True)
class GroupSeen:
    """A rank's progress in one group (or P2P pair) as its last heartbeat reported it.

    Attributes:
        issued: sequence number of the last collective issued (0: none).
        completed: collectives ``1..completed`` all completed.
        op: the last issued op, None when the sender did not say.
        issued_age_seconds: seconds since that collective was issued, on the sender's clock, at
            the time the heartbeat was received; None when none was.
        received: the agent's monotonic time (seconds) of the heartbeat that carried this.
    """

    issued: int
    completed: int
    op: str | None
    issued_age_seconds: float | None
    received: float

    def inflight_seconds(self, now: float) -> float | None:
        """Seconds since the last collective was issued while some are in flight, else None:
        the heartbeat's age of it plus the time since the heartbeat came (it keeps growing
        once heartbeats stop)."""
        if self.issued <= self.completed:
            return None
        return (self.issued_age_seconds or 0.0) + max(0.0, now - self.received)


#: A group entry's key: the group's label, and the peer rank for a P2P pair (None otherwise).
GroupKey = tuple[str, int | None]


@dataclass(slots=True)
class RankProgress:
    """What the agent knows of one rank's progress and process (see the module docstring).

    Attributes:
        last_progress: monotonic time (seconds) of the rank's last progress.
        last_heartbeat: monotonic time of its last heartbeat; None before the first.
        heartbeat_step: the step its last heartbeat named (-1 before the first).
        phase: the phase its last heartbeat named, if any.
        phase_seconds: seconds it had been in ``phase`` when that heartbeat was sent.
        sender_step_seconds: its median step seconds as the heartbeat gave it.
        recent_step_seconds: the ``step_seconds`` of its last step records.
        groups: (group, peer) -> progress; at most :data:`MAX_GROUPS_PER_RANK`.
        closed: its last heartbeat said goodbye (:data:`CLOSED_PHASE`).
        claimed_pid: the pid its heartbeats name (used where the kernel names none: UDP).
        via_socket: it reached the agent over the Unix socket (the kernel's pid is the one to
            check; a pid claimed in a datagram from another pid namespace names another
            process here).
        identity: the process the checked pid named when first seen; None: unknown.
        checked_pid: the pid ``identity`` belongs to.
        process: the process state found last.
        process_checked: monotonic time of that check.
        last_datagram: monotonic time of the last step record or heartbeat.
    """

    last_progress: float
    last_heartbeat: float | None = None
    heartbeat_step: int = -1
    phase: str | None = None
    phase_seconds: float | None = None
    sender_step_seconds: float | None = None
    recent_step_seconds: deque[float] = field(default_factory=lambda: deque(maxlen=RECENT_STEPS))
    groups: dict[GroupKey, GroupSeen] = field(default_factory=dict)
    closed: bool = False
    claimed_pid: int | None = None
    via_socket: bool = False
    identity: ProcessIdentity | None = None
    checked_pid: int | None = None
    process: ProcessState = "unknown"
    process_checked: float = float("-inf")
    last_datagram: float = 0.0

    def note_step(self, now: float, step_seconds: float | None) -> None:
        """A step record arrived at ``now``: progress, and one more step time for the median."""
        self.last_progress = now
        self.last_datagram = now
        self.closed = False
        if step_seconds is not None:
            self.recent_step_seconds.append(step_seconds)

    def note_heartbeat(self, beat: Heartbeat, now: float,
                       admit_group: Callable[[], bool]) -> tuple[int, int]:
        """Apply a heartbeat received at ``now``.

        Args:
            beat: the decoded heartbeat.
            now: the agent's monotonic time, seconds.
            admit_group: called once per group entry not seen before; True when the per-rank
                cap and the series budget allow it (the caller charges it).

        Returns:
            ``(resets, dropped)``: group entries whose sequence numbers went backwards (a
            restarted group: started afresh), and new entries refused.
        """
        self.last_heartbeat = now
        self.last_datagram = now
        self.closed = beat.phase == CLOSED_PHASE
        if beat.step != self.heartbeat_step:
            # A step further (or back: a new start of the loop) is progress; never a hang.
            if self.heartbeat_step >= 0:
                self.last_progress = now
            self.heartbeat_step = beat.step
        self.phase, self.phase_seconds = beat.phase, beat.phase_seconds
        if beat.step_seconds is not None:
            self.sender_step_seconds = beat.step_seconds
        if beat.pid is not None:
            self.claimed_pid = beat.pid
        resets = dropped = 0
        for entry in beat.groups:
            key = (entry.group, entry.peer)
            seen = self.groups.get(key)
            if seen is None:
                if not admit_group():
                    dropped += 1
                    continue
            elif entry.issued < seen.issued or entry.completed < seen.completed:
                resets += 1
            elif entry.completed > seen.completed:
                self.last_progress = now
            self.groups[key] = GroupSeen(entry.issued, entry.completed, entry.op,
                                         entry.issued_age_seconds, now)
        return resets, dropped

    def median_step_seconds(self) -> float | None:
        """The rank's typical step time in seconds: the sender's own median when its
        heartbeats give one, else the median of its last step records; None before either."""
        if self.sender_step_seconds is not None:
            return self.sender_step_seconds
        if self.recent_step_seconds:
            return statistics.median(self.recent_step_seconds)
        return None

    def stall_threshold(self, minimum: float, factor: float) -> float:
        """Seconds without progress after which the rank is stalled:
        ``max(minimum, factor x median step seconds)``."""
        median = self.median_step_seconds()
        return minimum if median is None else max(minimum, factor * median)

    def stalled_seconds(self, now: float, minimum: float, factor: float) -> float:
        """Seconds since the rank's last progress once past its threshold, else 0; 0 for a
        rank that said goodbye or whose process exited (it is not hung, it is gone)."""
        if self.closed or self.process == "exited":
            return 0.0
        idle = now - self.last_progress
        return idle if idle > self.stall_threshold(minimum, factor) else 0.0

    def heartbeat_age(self, now: float) -> float | None:
        """Seconds since the last heartbeat; None before the first."""
        return None if self.last_heartbeat is None else max(0.0, now - self.last_heartbeat)

    def current_phase_seconds(self, now: float) -> float | None:
        """Seconds the training thread has been in :attr:`phase`: what the last heartbeat
        said plus the time since (growing when heartbeats stop); None without a phase."""
        if self.phase is None or self.last_heartbeat is None:
            return None
        return (self.phase_seconds or 0.0) + max(0.0, now - self.last_heartbeat)

    def pid(self, socket_pid: int | None) -> int | None:
        """The pid to look the rank's process up by: the kernel's (``socket_pid``) for a sender
        on the agent's socket (a pid its datagrams claim may be of another pid namespace), the
        heartbeat's over UDP (pid 1 never: from a container's own namespace it would name the
        host's init)."""
        if self.via_socket:
            return socket_pid
        claimed = self.claimed_pid
        return claimed if claimed is not None and claimed > 1 else None

    def note_pid(self, pid: int | None, watch: ProcessWatch, now: float) -> int:
        """Identify the rank's process when ``pid`` is new (or its last process was found gone:
        a datagram under that pid now comes from a process that reused it).

        Returns:
            Group entries dropped: another process took the rank over, and its counters start
            anew (the caller uncharges ``GROUP_SAMPLES`` each and counts them).
        """
        if pid == self.checked_pid and self.process != "exited":
            return 0
        dropped = 0
        if self.checked_pid is not None and pid is not None and self.groups:
            dropped = self.reset_groups()
        self.checked_pid = pid
        self.identity = None if pid is None else watch.identify(pid)
        self.process = "unknown" if self.identity is None else "alive"
        self.process_checked = now
        return dropped

    def check_process(self, watch: ProcessWatch, now: float) -> None:
        """Refresh :attr:`process`: alive without a look while datagrams keep coming, else a
        procfs look at most once per :data:`LIVENESS_CHECK_SECONDS`."""
        if self.identity is None:
            self.process = "unknown"
            return
        if now - self.last_datagram < RECENT_DATAGRAM_SECONDS and self.process != "exited":
            self.process = "alive"
            return
        if now - self.process_checked < LIVENESS_CHECK_SECONDS:
            return
        self.process = watch.state(self.checked_pid, self.identity)
        self.process_checked = now

    def reset_groups(self) -> int:
        """Forget every group entry (a new process took the rank over); how many there were."""
        count = len(self.groups)
        self.groups.clear()
        self.heartbeat_step = -1
        return count
