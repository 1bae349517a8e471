"""Progress per watched group: what the collective tracer counts for the heartbeat.

Per watched group (:mod:`laggard.integrations.heartbeat` reads it): a sequence number of the
collectives this rank issued, the completed count in issue order (the highest ``n`` such that
``1..n`` completed), the last op, and the monotonic (``time.perf_counter``) times of the last
issue and completion, read as ages (:class:`~laggard.integrations.trace_records.TracerProgress`:
the wire's :class:`laggard.wire.GroupProgress` and the group's members); point-to-point
``send`` / ``recv`` (``track(..., peer=R)``) counted per (group, peer) pair, never in the
group's own count, since P2P sequence numbers count per pair and their completion is not a
watermark (``../shared/ENVIRONMENT.md``, flight-recorder format facts).
:meth:`~laggard.integrations.tracer.CollectiveTracer.progress` copies these few integers under
the tracer's short lock, from any thread. Python-side sources count at issue (``begin``,
``timed``, ``track``, :meth:`~laggard.integrations.tracer.CollectiveTracer.issue` from the DDP
hook); the backend-side ones (completion hook, flight recorder) only see completions, and a
group they alone feed is counted issued and completed at once.

Nothing here locks: the tracer (:mod:`laggard.integrations.tracer`) holds its own lock around
every call.
"""

from __future__ import annotations

from laggard.integrations.trace_records import P2P_OPS, GroupInfo, TracerProgress

#: P2P pairs (group, peer) whose progress is kept; beyond it new pairs are not counted.
MAX_P2P_PAIRS = 16
#: Completions ahead of the issue-order watermark remembered per group (out-of-order
#: completions, async work); beyond it the oldest gap is given up as completed.
_MAX_AHEAD = 1024


class ProgressCounter:
    """One group's (or pair's) progress: sequence numbers issued and completed in issue
    order, the last op, ``perf_counter`` times. Mutated under the tracer's lock only."""

    __slots__ = ("ahead", "completed", "completed_at", "issued", "issued_at", "op", "times")

    def __init__(self) -> None:
        self.issued = 0
        self.completed = 0
        self.op: str | None = None
        self.issued_at: float | None = None
        self.completed_at: float | None = None
        self.ahead: set[int] = set()
        self.times: dict[int, float] = {}  # seq -> issue time, for the collectives pending

    def issue(self, op: str, now: float) -> int:
        self.issued += 1
        self.op = op
        self.issued_at = now
        self.times[self.issued] = now
        if len(self.times) > 2 * _MAX_AHEAD:
            del self.times[min(self.times)]  # bounded: the oldest pending's age is then unknown
        return self.issued

    @property
    def pending_at(self) -> float | None:
        return self.times.get(self.completed + 1) if self.issued > self.completed else None

    def complete(self, seq: int, now: float) -> None:
        if seq <= self.completed or seq > self.issued:
            return  # already counted, or issued before a reset
        self.completed_at = now
        self.ahead.add(seq)
        if len(self.ahead) > _MAX_AHEAD:
            # a completion never reported (lost for good): give the oldest gap up, bounded
            self.completed = min(self.ahead) - 1
        while self.completed + 1 in self.ahead:
            self.completed += 1
            self.ahead.discard(self.completed)
            self.times.pop(self.completed, None)
        if len(self.times) > self.issued - self.completed:
            self.times = {s: t for s, t in self.times.items() if s > self.completed}


#: What :meth:`ProgressTable.issue` returns for one counted issue: its counter and sequence number.
IssueHandle = tuple[ProgressCounter, int]


class ProgressTable:
    """The progress counters of one tracer, per (group index, peer): peer None for the group's
    own collectives, a global rank for a P2P pair. Bounded: ``max_groups`` groups (the tracer
    watches no more) and :data:`MAX_P2P_PAIRS` pairs. Caller holds the tracer's lock.

    Args:
        stats: the tracer's counters; ``stats["p2p_pairs_dropped"]`` counts the P2P ops of a
            pair beyond :data:`MAX_P2P_PAIRS`.

    Attributes:
        counters: (group index, peer) -> (its :class:`GroupInfo`, its :class:`ProgressCounter`),
            in creation order.
    """

    def __init__(self, stats: dict[str, int]) -> None:
        self.counters: dict[tuple[int, int | None], tuple[GroupInfo, ProgressCounter]] = {}
        self._stats = stats
        self._issue_sourced: set[int] = set()  # groups counted at issue, not by record()

    def issue(self, info: GroupInfo, op: str, peer: int | None, now: float) -> IssueHandle | None:
        """Count one issue in the group's (or pair's) progress; the handle for
        :meth:`complete`, None when not counted."""
        if op in P2P_OPS:
            if peer is None:
                return None  # a pair without its peer cannot be compared with anyone
            key: tuple[int, int | None] = (info.index, int(peer))
        else:
            key = (info.index, None)
        entry = self.counters.get(key)
        if entry is None:
            if key[1] is not None and sum(k[1] is not None for k in self.counters) >= (
                    MAX_P2P_PAIRS):
                self._stats["p2p_pairs_dropped"] += 1
                return None
            entry = self.counters[key] = (info, ProgressCounter())
        self._issue_sourced.add(info.index)
        counter = entry[1]
        return counter, counter.issue(op, now)

    @staticmethod
    def complete(issued: IssueHandle | None, now: float) -> None:
        """Count the completion of an issued collective (None: not counted, nothing to do)."""
        if issued is not None:
            issued[0].complete(issued[1], now)

    def completed_unissued(self, info: GroupInfo, op: str, now: float) -> None:
        """A collective seen only at completion (the completion hook, the flight recorder): a
        group no source counts at issue is counted issued and completed now; one that is
        counted at issue, or a P2P op, is not counted twice."""
        if op in P2P_OPS or info.index in self._issue_sourced:
            return
        counter = self.counters.setdefault((info.index, None), (info, ProgressCounter()))[1]
        counter.complete(counter.issue(op, now), now)

    def snapshot(self, now: float) -> list[TracerProgress]:
        """One :class:`TracerProgress` per group and pair, in creation order, ages at ``now``
        (``perf_counter`` seconds, never negative)."""
        return [TracerProgress(
            group=info.key, issued=c.issued, completed=c.completed, op=c.op,
            issued_age_seconds=age_at(now, c.issued_at),
            completed_age_seconds=age_at(now, c.completed_at), peer=peer,
            desc=info.short_desc, ranks=info.ranks,
            pending_age_seconds=age_at(now, c.pending_at))
            for (_, peer), (info, c) in self.counters.items()]


def age_at(now: float, at: float | None) -> float | None:
    """Seconds from ``at`` to ``now`` (``perf_counter``), never negative; None for None."""
    return None if at is None else max(0.0, now - at)


__all__ = ["MAX_P2P_PAIRS", "IssueHandle", "ProgressCounter", "ProgressTable", "age_at"]
