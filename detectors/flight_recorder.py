"""Cross-rank analysis of flight-recorder dumps: who holds each process group up, and how.

Every dump carries, per process group, the rank's ``pg_status`` (sequence numbers of the last
collective enqueued, started and completed) besides its ring buffer of entries. Compared across
the group's members these counters name the rank that holds the group up even when its own
entries show nothing pending, which entries alone cannot (PyTorch's ``fr_trace`` matches entries
only). For each group, with ``E`` the highest ``last_enqueued`` of its members and ``C`` the
highest ``last_completed``:

* **missing** (never issued): a member with ``last_enqueued < E`` has not issued collective
  ``last_enqueued + 1``, which the others have. It is **hung on the CPU** when it also has no
  pending work in that group (``last_enqueued == last_completed``): nothing is running on its
  device for the group, its host side stopped issuing (a Python thread holding the GIL, a data
  loader stall, a rank stuck outside collectives). A member without a dump is missing too.
* **stuck on the device**: a member that issued as far as the others (``last_enqueued == E``) but
  whose ``last_completed < C``: its peers finished collective ``last_completed + 1`` and it did
  not (its own entry for it is not retired): its GPU or its NCCL kernel is stuck.
* **desync**: ranks at the same (group, ``collective_seq_id``) with different ops, shapes or
  dtypes (PyTorch ``fr_trace``'s ``Op.match``; all-to-all sizes may differ).
* **point-to-point stalls**, per (sender, receiver) pair, never across the whole group (a pipeline
  stage talks to two neighbours, so the group's p2p counters differ by design): ``send a->b``
  entries on ``a`` and ``recv b<-a`` on ``b`` are counted, and the side that issued fewer, while
  the other's next one waits, is the stalled one.

Dumps without ``pg_status`` fall back to matching entries by (group, sequence number), as
``fr_trace`` does. There is no cap that stops the analysis: every group is classified.

Members of a group come from ``pg_config``; where it does not name them (gloo dumps of torch 2.13
key it by an empty name with no ranks) they are the ranks whose dumps know the group, and every
dumped rank for the default group.

The dumps are read by :mod:`laggard.parsers.flight_recorder`.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from laggard.parsers.flight_recorder import (
    VARIABLE_SIZE_OPS,
    FlightRecorderDump,
    FrEntry,
    PgStatus,
)

__all__ = ["FrAnalysis", "GroupCollective", "LaggingCollective", "P2PStall", "SizeMismatch",
           "StuckCollective", "analyze_dumps"]

_P2P_OP = re.compile(r"^(?P<kind>send|recv) (?P<me>\d+)(?:->|<-)(?P<peer>\d+)$")
_DEFAULT_GROUP_DESCS = ("default_pg", "")


@dataclass(frozen=True, slots=True)
class GroupCollective:
    """One collective of one process group, as the ranks' entries recorded it.

    Attributes:
        pg, pg_desc: the group's name and description; ``members``: its ranks.
        seq: the collective's sequence number in the group; ``op``, ``input_sizes``,
            ``input_dtypes``, ``state``: from the entries of the ranks the finding is about.
    """

    pg: str
    pg_desc: str
    members: tuple[int, ...]
    seq: int
    op: str
    input_sizes: tuple[tuple[int, ...], ...]
    input_dtypes: tuple[str, ...]
    state: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class LaggingCollective(GroupCollective):
    """The first collective of a group that some member ranks never issued.

    Attributes:
        pg, pg_desc: the group; ``members``: its ranks.
        seq: the collective's sequence number; ``op``, ``input_sizes``, ``input_dtypes``: as
            recorded by the ranks that issued it (``op`` is ``"?"`` when no dump kept it);
            ``state``: their states.
        present: ranks that issued it; ``not_enqueued``: members whose ``last_enqueued < seq``;
            ``no_dump``: members without a dump; ``unknown``: members with a dump but no status.
        status: rank -> (last_enqueued, last_completed) for members whose status is known.
        time_created_ns: earliest creation time among the ranks that issued it.
        hung_cpu: the ``not_enqueued`` ranks with no pending work in the group
            (``last_enqueued == last_completed``): their host side stopped issuing.
        trailing: members behind the others too, but past ``seq`` (they issued it).
    """

    present: tuple[int, ...]
    not_enqueued: tuple[int, ...]
    no_dump: tuple[int, ...]
    unknown: tuple[int, ...]
    status: dict[int, tuple[int, int]]
    time_created_ns: int | None
    hung_cpu: tuple[int, ...] = ()
    trailing: tuple[int, ...] = ()

    @property
    def missing(self) -> tuple[int, ...]:
        """Members known not to have issued it: behind, or without a dump."""
        return tuple(sorted(set(self.not_enqueued) | set(self.no_dump)))


@dataclass(frozen=True, slots=True)
class StuckCollective(GroupCollective):
    """Members that issued a collective their peers completed, and did not complete it.

    Attributes:
        pg, pg_desc, members: the group.
        seq: the collective (``last_completed + 1`` of the stuck ranks); ``op``,
            ``input_sizes``, ``input_dtypes``, ``state``: from the stuck ranks' own entries.
        stuck: the stuck ranks; ``completed_by``: members that completed it.
        status: rank -> (last_enqueued, last_completed) of every member with a status.
    """

    stuck: tuple[int, ...]
    completed_by: tuple[int, ...]
    status: dict[int, tuple[int, int]]


@dataclass(frozen=True, slots=True)
class P2PStall:
    """One (sender, receiver) pair whose sends and receives do not pair up.

    Attributes:
        pg, pg_desc: the group; ``sender``, ``receiver``: global ranks.
        sends, recvs: operations recorded on each side for this pair.
        waiting: the rank whose next operation is pending; ``stalled``: the rank that did not
            issue its side (the culprit for this pair).
        op: the waiting side's pending op (``send 1->2``); ``input_sizes``, ``input_dtypes``.
    """

    pg: str
    pg_desc: str
    sender: int
    receiver: int
    sends: int
    recvs: int
    waiting: int
    stalled: int
    op: str
    input_sizes: tuple[tuple[int, ...], ...]
    input_dtypes: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class SizeMismatch:
    """Ranks at the same (group, seq) with different ops, shapes or dtypes (a desync)."""

    pg: str
    pg_desc: str
    seq: int
    signatures: dict[tuple, tuple[int, ...]]


@dataclass(slots=True)
class FrAnalysis:
    """Result of :func:`analyze_dumps`.

    Attributes:
        lagging: first lagging collective per group, earliest-created first.
        stuck: collectives some members are stuck in on the device, per group.
        p2p: point-to-point pairs that stall.
        mismatches: desyncs found.
        stragglers: ranks at fault in the most groups and pairs (empty when none is).
        lag_count: rank -> number of groups (and pairs) it holds up.
        ranks: ranks with a dump.
    """

    lagging: list[LaggingCollective] = field(default_factory=list)
    stuck: list[StuckCollective] = field(default_factory=list)
    p2p: list[P2PStall] = field(default_factory=list)
    mismatches: list[SizeMismatch] = field(default_factory=list)
    stragglers: tuple[int, ...] = ()
    lag_count: dict[int, int] = field(default_factory=dict)
    ranks: tuple[int, ...] = ()


@dataclass(slots=True)
class _Group:
    desc: str
    members: tuple[int, ...]
    entries: dict[int, dict[int, list[FrEntry]]]  # seq -> rank -> entries (coalesced: several)
    status: dict[int, PgStatus]


def analyze_dumps(dumps: Iterable[FlightRecorderDump], *,
                  absent_dumps_lag: bool = True) -> FrAnalysis:
    """Classify, for every process group, the ranks that hold it up (see module doc).

    Dumps without a rank are ignored (nothing to compare them with).

    Args:
        dumps: one per rank.
        absent_dumps_lag: count a member rank without a dump as missing (right for a job's
            complete dump set; the node agent, which sees only its node's ranks, passes False).

    Returns:
        The :class:`FrAnalysis`.
    """
    by_rank = {d.rank: d for d in dumps if d.rank is not None}
    groups = _groups(by_rank)
    result = FrAnalysis(ranks=tuple(sorted(by_rank)))
    for pg, group in sorted(groups.items()):
        mismatch = next((m for seq in sorted(group.entries)
                         if (m := _mismatch(pg, group.desc, seq, group.entries[seq]))), None)
        if mismatch is not None:
            result.mismatches.append(mismatch)
        if not group.members:
            continue
        lag = (_lagging_from_status(pg, group, by_rank, absent_dumps_lag)
               or _lagging_from_entries(pg, group, by_rank, absent_dumps_lag))
        if lag is not None and lag.missing:
            result.lagging.append(lag)
        stuck = _stuck(pg, group)
        if stuck is not None:
            result.stuck.append(stuck)
    # Earliest-created first; groups whose entries for that collective were evicted from every
    # ring buffer (known from pg_status only) come last: their time is unknown.
    result.lagging.sort(key=lambda lag: (lag.time_created_ns is None,
                                         lag.time_created_ns or 0, lag.pg))
    result.p2p = _p2p_stalls(by_rank, groups)
    counts: Counter[int] = Counter()
    for lag in result.lagging:
        counts.update(lag.missing)
    for st in result.stuck:
        counts.update(st.stuck)
    for stall in result.p2p:
        counts[stall.stalled] += 1
    result.lag_count = dict(counts)
    if counts:
        top = max(counts.values())
        result.stragglers = tuple(sorted(r for r, n in counts.items() if n == top))
    return result


def _groups(by_rank: dict[int, FlightRecorderDump]) -> dict[str, _Group]:
    groups: dict[str, _Group] = {}
    seen_in: dict[str, set[int]] = defaultdict(set)
    for rank, d in by_rank.items():
        for name, (desc, members) in d.groups.items():
            group = groups.setdefault(name, _Group(desc, members, defaultdict(dict), {}))
            if members and not group.members:
                group.members, group.desc = members, desc or group.desc
        for e in d.entries:
            group = groups.setdefault(e.pg, _Group(e.pg_desc, (), defaultdict(dict), {}))
            group.desc = group.desc or e.pg_desc
            seen_in[e.pg].add(rank)
            if not e.is_p2p and e.seq > 0:
                group.entries[e.seq].setdefault(rank, []).append(e)
        for name, st in d.status.items():
            groups.setdefault(name, _Group("", (), defaultdict(dict), {})).status[rank] = st
            seen_in[name].add(rank)
    for name, group in groups.items():
        if not group.members and (seen_in[name] or name == "0"):
            # pg_config did not name the members: the ranks that know the group, and every
            # dumped rank for the default group
            default = name == "0" and group.desc in _DEFAULT_GROUP_DESCS
            group.members = tuple(sorted(set(by_rank) if default else seen_in[name]))
    return {name: g for name, g in groups.items() if name}


def _mismatch(pg: str, desc: str, seq: int,
              per_rank: dict[int, list[FrEntry]]) -> SizeMismatch | None:
    signatures: dict[tuple, list[int]] = defaultdict(list)
    for rank, entries in per_rank.items():
        ops = tuple(sorted(e.op for e in entries))
        if all(e.op in VARIABLE_SIZE_OPS for e in entries):
            sig: tuple = (ops,)
        else:
            sig = tuple(sorted(e.signature for e in entries))
        signatures[sig].append(rank)
    if len(signatures) < 2:
        return None
    return SizeMismatch(pg, desc, seq, {s: tuple(sorted(r)) for s, r in signatures.items()})


def _known_status(group: _Group) -> dict[int, tuple[int, int]]:
    return {r: (st.last_enqueued, st.last_completed) for r, st in group.status.items()
            if r in group.members}


def _lagging_from_status(pg: str, group: _Group, by_rank: dict[int, FlightRecorderDump],
                         absent_dumps_lag: bool) -> LaggingCollective | None:
    status = _known_status(group)
    if not status:
        return None
    top = max(enq for enq, _ in status.values())
    behind = {r: enq for r, (enq, _) in status.items() if enq < top}
    if not behind:
        return None  # only ranks without a dump, if any: the entries tell where they stopped
    seq = min(behind.values()) + 1
    not_enqueued = tuple(sorted(r for r, enq in behind.items() if enq < seq))
    no_dump = tuple(r for r in group.members if r not in by_rank) if absent_dumps_lag else ()
    unknown = tuple(r for r in group.members if r in by_rank and r not in status)
    if not absent_dumps_lag:
        unknown += tuple(r for r in group.members if r not in by_rank)
    return _lagging(pg, group, seq, not_enqueued, no_dump, unknown, status,
                    trailing=tuple(sorted(r for r in behind if r not in not_enqueued)))


def _lagging_from_entries(pg: str, group: _Group, by_rank: dict[int, FlightRecorderDump],
                          absent_dumps_lag: bool) -> LaggingCollective | None:
    # No status tells who is behind: the first collective some member has no entry for.
    status = _known_status(group)
    for seq in sorted(group.entries):
        per_rank = group.entries[seq]
        not_enqueued: list[int] = []
        no_dump: list[int] = []
        unknown: list[int] = []
        for rank in group.members:
            if rank in per_rank:
                continue
            if rank not in by_rank:
                (no_dump if absent_dumps_lag else unknown).append(rank)
            elif rank not in status:
                unknown.append(rank)
            elif status[rank][0] < seq:
                not_enqueued.append(rank)
        if not_enqueued or no_dump:
            return _lagging(pg, group, seq, tuple(not_enqueued), tuple(no_dump),
                            tuple(unknown), status)
    return None


def _lagging(pg: str, group: _Group, seq: int, not_enqueued: tuple[int, ...],
             no_dump: tuple[int, ...], unknown: tuple[int, ...],
             status: dict[int, tuple[int, int]],
             trailing: tuple[int, ...] = ()) -> LaggingCollective:
    per_rank = group.entries.get(seq, {})
    issued = [e for entries in per_rank.values() for e in entries]
    created = [e.time_created_ns for e in issued if e.time_created_ns]
    sample = issued[0] if issued else None
    return LaggingCollective(
        pg=pg, pg_desc=group.desc, members=group.members, seq=seq,
        op=sample.op if sample else "?",
        input_sizes=sample.input_sizes if sample else (),
        input_dtypes=sample.input_dtypes if sample else (),
        state=tuple(sorted({e.state for e in issued})), present=tuple(sorted(per_rank)),
        not_enqueued=not_enqueued, no_dump=no_dump, unknown=unknown, status=status,
        time_created_ns=min(created) if created else None,
        hung_cpu=tuple(r for r in not_enqueued if r in status and status[r][0] == status[r][1]),
        trailing=trailing,
    )


def _stuck(pg: str, group: _Group) -> StuckCollective | None:
    status = _known_status(group)
    if len(status) < 2:
        return None
    top_enq = max(enq for enq, _ in status.values())
    top_comp = max(comp for _, comp in status.values())
    stuck = []
    for rank, (enq, comp) in status.items():
        if enq < top_enq or comp >= top_comp:
            continue
        own = group.entries.get(comp + 1, {}).get(rank, [])
        if own and all(e.finished for e in own):
            continue  # its counter lags its entries (gloo retires before it counts)
        stuck.append(rank)
    if not stuck:
        return None
    seq = min(status[r][1] for r in stuck) + 1
    stuck = [r for r in stuck if status[r][1] + 1 == seq]
    own = [e for r in stuck for e in group.entries.get(seq, {}).get(r, [])]
    sample = own[0] if own else None
    return StuckCollective(
        pg=pg, pg_desc=group.desc, members=group.members, seq=seq,
        op=sample.op if sample else "?", input_sizes=sample.input_sizes if sample else (),
        input_dtypes=sample.input_dtypes if sample else (),
        state=tuple(sorted({e.state for e in own})), stuck=tuple(sorted(stuck)),
        completed_by=tuple(sorted(r for r, (_, comp) in status.items() if comp >= seq)),
        status=status)


def _p2p_stalls(by_rank: dict[int, FlightRecorderDump],
                groups: dict[str, _Group]) -> list[P2PStall]:
    # (pg, sender, receiver) -> side -> entries, in ring-buffer order; group-local ranks in the
    # op names ("send 1->2" on local rank 1) are mapped to global ranks through the members.
    pairs: dict[tuple[str, int, int], dict[str, list[FrEntry]]] = defaultdict(
        lambda: {"send": [], "recv": []})
    wrapped: set[int] = set()
    for rank, d in by_rank.items():
        if d.entries and (d.entries[0].record_id or 0) > 0:
            wrapped.add(rank)  # its ring buffer dropped old entries: counts would mislead
        for e in d.entries:
            m = _P2P_OP.match(e.op) if e.is_p2p or " " in e.op else None
            if m is None:
                continue
            members = groups[e.pg].members if e.pg in groups else ()
            peer = int(m["peer"])
            peer = members[peer] if peer < len(members) else peer
            if m["kind"] == "send":
                pairs[(e.pg, rank, peer)]["send"].append(e)
            else:
                pairs[(e.pg, peer, rank)]["recv"].append(e)
    out = []
    for (pg, sender, receiver), sides in sorted(pairs.items()):
        if sender in wrapped or receiver in wrapped or not (
                sender in by_rank and receiver in by_rank):
            continue
        sends, recvs = sides["send"], sides["recv"]
        if len(sends) == len(recvs):
            continue
        ahead, waiting, stalled = ((sends, sender, receiver) if len(sends) > len(recvs)
                                   else (recvs, receiver, sender))
        pending = ahead[min(len(sends), len(recvs))]
        if pending.finished:
            continue  # the other side's entries were lost, not a stall
        group = groups.get(pg)
        out.append(P2PStall(
            pg=pg, pg_desc=group.desc if group else "", sender=sender, receiver=receiver,
            sends=len(sends), recvs=len(recvs), waiting=waiting, stalled=stalled,
            op=pending.op, input_sizes=pending.input_sizes, input_dtypes=pending.input_dtypes))
    # A stage that did not send because it is itself waiting to receive is a victim down the
    # pipeline, not a culprit: keep the stalls whose stalled rank waits on nobody.
    blocked = {(stall.pg, stall.waiting) for stall in out}
    return [stall for stall in out if (stall.pg, stall.stalled) not in blocked]
