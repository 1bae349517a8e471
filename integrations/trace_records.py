"""The collective tracer's records: what it knows of a group, of one step, of a group's progress.

Plain data, no torch and no lock: :class:`GroupInfo` (one watched process group and its name on
the wire), :class:`GroupStep` and :class:`TraceStep` (one step's collectives on this rank, what
:meth:`~laggard.integrations.tracer.CollectiveTracer.take_step` returns),
:class:`TracerProgress` (one group's progress as
:meth:`~laggard.integrations.tracer.CollectiveTracer.progress` reads it) and
:func:`union_seconds` (the wall time a set of intervals covers). The tracer
(:mod:`laggard.integrations.tracer`) fills them; the window gather
(:mod:`laggard.integrations.trace_window`), the DDP timing hook and the heartbeat read them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from laggard.wire import CollectiveTiming, GroupProgress, group_desc


@dataclass(frozen=True, slots=True)
class GroupInfo:
    """One watched process group.

    Attributes:
        index: position in the tracer's groups
            (:attr:`~laggard.integrations.tracer.CollectiveTracer.groups`; the same on every
            rank when every rank creates its groups in the same order, as torch.distributed
            requires).
        name: torch's group name (``"0"`` for the default group).
        backend: ``gloo``, ``nccl``... as ``torch.distributed.get_backend`` says.
        ranks: the group's members as global ranks, in group-rank order.
    """

    index: int
    name: str
    backend: str
    ranks: tuple[int, ...]
    desc: str = ""

    @property
    def label(self) -> str:
        """Short label for reports: ``world`` or ``g<index>[r0,r1,...]``."""
        return f"g{self.index}[{','.join(map(str, self.ranks))}]"

    @property
    def key(self) -> str:
        """The group's name on the wire, the same on every member and unique in the job:
        ``DESC:NAME`` (torch's ``group_desc`` and ``group_name``: ``dp:3``,
        ``default_pg:0``), ``pgNAME`` without a description; at most
        :data:`MAX_GROUP_KEY_LEN` characters. ``index`` and ``label`` are not: a rank numbers
        only the groups it is in (ranks 0 and 2 of two TP pairs both call theirs index 1)."""
        desc = "" if self.desc in ("", "undefined") else self.desc
        if not desc:
            return f"pg{self.name}"[:MAX_GROUP_KEY_LEN]
        room = MAX_GROUP_KEY_LEN - len(self.name) - 1
        return f"{desc[:room]}:{self.name}" if room > 0 else self.name[:MAX_GROUP_KEY_LEN]

    @property
    def short_desc(self) -> str:
        """What a person calls the group: its description (``dp``), else ``pgNAME``."""
        return group_desc(self.key)


#: Longest group key (the wire's name limit).
MAX_GROUP_KEY_LEN = 64

#: Ops counted per (group, peer) pair rather than in the group's sequence.
P2P_OPS = frozenset({"send", "recv"})


@dataclass(frozen=True, slots=True, kw_only=True)
class TracerProgress(GroupProgress):
    """The wire's :class:`laggard.wire.GroupProgress` of one group (or P2P pair) as this rank's
    tracer reads it, plus what only this process knows: the heartbeat sends the wire fields
    as they are and keeps the rest for the hang store key.

    The inherited fields: ``group`` is the group's :attr:`GroupInfo.key` (the same on every
    member), ``issued`` / ``completed`` the sequence numbers (``completed <= issued``), ``op``
    the last issued op, ``issued_age_seconds`` / ``completed_age_seconds`` the seconds from the
    last issue / completion to the moment
    :meth:`~laggard.integrations.tracer.CollectiveTracer.progress` was read (None: none yet),
    ``peer`` the other rank of a P2P pair.

    Attributes:
        desc: the group's :attr:`GroupInfo.short_desc`, for messages.
        ranks: its members (global ranks, group-rank order).
        pending_age_seconds: seconds since the issue of the oldest collective not completed
            (``completed + 1``); None when none is pending (or its time was dropped).
    """

    desc: str = ""
    ranks: tuple[int, ...] = ()
    pending_age_seconds: float | None = None


@dataclass(slots=True)
class GroupStep:
    """One group's collectives in one step on this rank.

    Attributes:
        count: collectives completed (P2P ``send`` / ``recv`` included).
        seconds: sum of their issue-to-completion seconds, P2P ops left out
            (:attr:`TraceStep.p2p_seconds` says why; their seconds are in ``by_op``).
        bytes: bytes this rank put on the wire for them (bandwidth-optimal algorithm).
        by_op: op -> [count, seconds, bytes].
    """

    count: int = 0
    seconds: float = 0.0
    bytes: int = 0
    by_op: dict[str, list[float]] = field(default_factory=dict)


@dataclass(slots=True)
class TraceStep:
    """Every traced collective of one step on this rank.

    Attributes:
        groups: group index -> :class:`GroupStep`.
        total_seconds: wall time during which a collective was in flight (union of intervals).
        exposed_seconds: wall time the training thread spent blocked in synchronous collective
            calls (union; FSDP2 on gloo issues its all-gathers synchronously).
        bytes: bytes on the wire, all groups.
        collectives: per op, count merged: op, seconds, bytes.
        p2p_seconds: wall time during which a point-to-point ``send`` / ``recv`` was in flight
            (union). P2P ops are kept out of ``total_seconds`` and of each group's
            ``seconds`` (:class:`GroupStep`): a receive's issue-to-completion time includes
            the sender's lateness, so the arrived-last rule of synchronous collectives does
            not hold for it; they stay in ``by_op``, ``bytes`` and ``collectives``.
        p2p_wait_seconds: exposed P2P wait: wall time the training thread was blocked waiting
            for sends and receives
            (:meth:`~laggard.integrations.tracer.CollectiveTracer.p2p_wait`; the pipeline
            schedules' ``_wait_batch_p2p`` through
            :func:`~laggard.integrations.pipeline_trace.instrument_pipeline`).
        p2p_wait_by_peer: that wait per peer (global rank; None: a work of unknown peer).
    """

    groups: dict[int, GroupStep] = field(default_factory=dict)
    total_seconds: float = 0.0
    exposed_seconds: float = 0.0
    bytes: int = 0
    collectives: list[CollectiveTiming] = field(default_factory=list)
    p2p_seconds: float = 0.0
    p2p_wait_seconds: float = 0.0
    p2p_wait_by_peer: dict[int | None, float] = field(default_factory=dict)

    @property
    def hidden_seconds(self) -> float:
        """Collective time overlapped with the training thread's own work (>= 0)."""
        return max(0.0, self.total_seconds - self.exposed_seconds)

    def op_seconds(self, op: str) -> float:
        """Summed seconds of one op over every group (``allgather``, ``reduce_scatter``,
        ``send``, ``recv``...)."""
        return sum(g.by_op.get(op, [0, 0.0, 0])[1] for g in self.groups.values())

    def summary(self) -> dict[str, float]:
        """The ``comm`` object of a StepRecord."""
        return {"total_seconds": self.total_seconds, "exposed_seconds": self.exposed_seconds,
                "hidden_seconds": self.hidden_seconds, "bytes": float(self.bytes),
                "raw_bytes": float(self.bytes)}


def union_seconds(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of ``(start, end)`` intervals, seconds (overlaps counted once)."""
    if not intervals:
        return 0.0
    ordered = sorted(intervals)
    covered, cur_start, cur_end = 0.0, ordered[0][0], ordered[0][1]
    for start, end in ordered[1:]:
        if start > cur_end:
            covered += cur_end - cur_start
            cur_start, cur_end = start, end
        else:
            cur_end = max(cur_end, end)
    return covered + cur_end - cur_start


__all__ = ["MAX_GROUP_KEY_LEN", "P2P_OPS", "GroupInfo", "GroupStep", "TraceStep",
           "TracerProgress", "union_seconds"]
