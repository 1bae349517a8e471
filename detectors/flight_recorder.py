"""Cross-rank analysis of flight-recorder dumps: who holds each process group up, and how.

The dumps are turned into the per-rank, per-group state of :mod:`laggard.detectors.hang`
(:func:`hang_states`) and read by its rules (:func:`~laggard.detectors.hang.classify_hang`),
the same rules that read live heartbeats; :func:`analyze_dumps` then describes each culprit's
group in the terms ``laggard analyze`` reports (the collective it never issued, the one it never
completed, the P2P pair it stalls) and keeps the desync check (ranks at the same
(group, ``collective_seq_id``) with different ops, shapes or dtypes: PyTorch ``fr_trace``'s
``Op.match``; all-to-all sizes may differ).

How a dump becomes state (``../shared/ENVIRONMENT.md``, "Flight-recorder dumps of multi-group
jobs"; PyTorch ``torch/csrc/distributed/c10d/FlightRecorder.cpp``):

* ``pg_status`` is keyed by the rank's local PG uid, ``pg_config`` by PG name; an entry's
  ``pg_id`` and ``process_group`` (name, desc) tie them. A rank with no entries in a group has no
  such tie: its uids and its ``pg_config`` names are both handed out in group-creation order, so
  they are paired in sorted order when their counts agree and every tie the entries give
  agrees; otherwise the status is left out and counted (:attr:`FrAnalysis.unmapped_status`).
* A dump whose ring buffer starts at ``record_id`` 0 holds the whole history (gloo jobs, small
  jobs): issued and completed are counted from its entries (gloo leaves ``state`` at
  ``scheduled`` and marks ``retired``; its ``pg_status`` counts P2P sends too). Otherwise (NCCL
  dumps of pending work only, a wrapped buffer) they are ``last_enqueued_collective`` and
  ``last_completed_collective`` (-1: none, read as 0), and the pending work is the listed
  entries past ``last_completed``.
* A group with P2P entries on any rank, or described as a pipeline group, is P2P-counted: its
  ``pg_status`` counts ``p2p_seq_id``, so it is not compared across members; its collectives are
  compared only from whole-history dumps. P2P entries (``send a->b`` / ``recv a<-b``,
  group-local ranks mapped to global through ``pg_config`` ranks) form one state per (rank, peer)
  pair; a pending P2P entry with a later finished entry of the same pair, or (pending-only
  dumps) a ``p2p_seq_id`` below the group's ``last_completed``, is not pending (completion is not
  a watermark). From pending-only dumps a pair is counted relative to what is listed: issued =
  listed pending operations, completed = 0, on both sides alike.
* Wait ages come from ``time_created_ns``, relative to the newest entry of the set.
* A whole-history dump gives the rank's issue order across groups
  (:attr:`~laggard.detectors.hang.RankState.history`), so the rank of a wait cycle that skipped
  a collective is told from the one that waits for it.
* gloo records no send/recv (``../shared/ENVIRONMENT.md``, "Flight-recorder dumps from real
  gloo hangs"), but its ``op_id`` and ``pg_status`` count them: a group whose ``op_id`` runs
  past its ``collective_seq_id`` carries unrecorded operations. A rank with no listed pending
  work that has such a group may be blocked in a receive or send nobody recorded: it is
  *undetermined* (:attr:`~laggard.detectors.hang.RankState.unrecorded`), never named missing,
  and the peer it waits on is not named either (the dumps cannot tell it).
* A job whose entries are all gloo's runs its collectives on the host: no device verdict
  (``classify_hang(device=False)``); an entry not yet retired on a rank whose peers retired it
  is a collective in progress, and a set where nobody is behind is no hang.

Members of a group come from ``pg_config``; where it does not name them (gloo dumps of torch 2.13
key it by an empty name with no ranks) they are the ranks whose dumps know the group, and every
dumped rank for the default group. A member without a dump is silent.

The dumps are read by :mod:`laggard.parsers.flight_recorder`.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from laggard.detectors.hang import (
    GroupState,
    HangCulprit,
    HangVerdict,
    PendingWork,
    RankState,
    classify_hang,
)
from laggard.parsers.flight_recorder import (
    VARIABLE_SIZE_OPS,
    FlightRecorderDump,
    FrEntry,
    PgStatus,
)

__all__ = ["FrAnalysis", "GroupCollective", "LaggingCollective", "P2PStall", "SizeMismatch",
           "StuckCollective", "analyze_dumps", "hang_states"]

_P2P_OP = re.compile(r"^(?P<kind>send|recv) (?P<me>\d+)(?:->|<-)(?P<peer>\d+)$")
_DEFAULT_GROUP_DESCS = ("default_pg", "")
_PIPELINE_DESC = re.compile(r"pipeline|^pp$", re.IGNORECASE)


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
        skipped: the ``not_enqueued`` ranks that wait in a later collective of another group:
            they went past this one without issuing it.
    """

    present: tuple[int, ...]
    not_enqueued: tuple[int, ...]
    no_dump: tuple[int, ...]
    unknown: tuple[int, ...]
    status: dict[int, tuple[int, int]]
    time_created_ns: int | None
    hung_cpu: tuple[int, ...] = ()
    trailing: tuple[int, ...] = ()
    skipped: tuple[int, ...] = ()

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
        verdict: the culprits by :func:`~laggard.detectors.hang.classify_hang` (kinds: missing,
            device, silent); ``lagging``, ``stuck`` and ``p2p`` describe their groups only.
        unmapped_status: ``pg_status`` records that could not be tied to a group (left out).
        device: whether the job's collectives ran on a device (False: every entry is gloo's).
    """

    lagging: list[LaggingCollective] = field(default_factory=list)
    stuck: list[StuckCollective] = field(default_factory=list)
    p2p: list[P2PStall] = field(default_factory=list)
    mismatches: list[SizeMismatch] = field(default_factory=list)
    stragglers: tuple[int, ...] = ()
    lag_count: dict[int, int] = field(default_factory=dict)
    ranks: tuple[int, ...] = ()
    verdict: HangVerdict = field(default_factory=HangVerdict)
    unmapped_status: int = 0
    device: bool = True


@dataclass(slots=True)
class _Group:
    desc: str
    members: tuple[int, ...]
    entries: dict[int, dict[int, list[FrEntry]]]  # seq -> rank -> entries (coalesced: several)
    status: dict[int, PgStatus]


def analyze_dumps(dumps: Iterable[FlightRecorderDump], *,
                  absent_dumps_lag: bool = True) -> FrAnalysis:
    """Name the ranks that hold the job's groups up, and describe how (see module doc).

    Dumps without a rank are ignored (nothing to compare them with).

    Args:
        dumps: one per rank.
        absent_dumps_lag: name a member rank without a dump silent (right for a job's complete
            dump set; the node agent, which sees only its node's ranks, passes False).

    Returns:
        The :class:`FrAnalysis`: the verdict and, per culprit group, the collective
        never issued (``lagging``), never completed (``stuck``) or the stalled P2P pair.
    """
    by_rank = {d.rank: d for d in dumps if d.rank is not None}
    groups = _groups(by_rank)
    result = FrAnalysis(ranks=tuple(sorted(by_rank)))
    for pg, group in sorted(groups.items()):
        mismatch = next((m for seq in sorted(group.entries)
                         if (m := _mismatch(pg, group.desc, seq, group.entries[seq]))), None)
        if mismatch is not None:
            result.mismatches.append(mismatch)
    states, result.unmapped_status = _hang_states(by_rank, groups)
    result.device = not _host_only(by_rank)
    result.verdict = classify_hang(states, absent_are_silent=absent_dumps_lag,
                                   device=result.device)
    lookup = _EntryLookup(by_rank)
    result.lagging = _lagging_groups(result.verdict, states, groups, lookup)
    result.stuck = _stuck_groups(result.verdict, states, groups, lookup)
    result.p2p = _p2p_groups(result.verdict, states, groups)
    counts = Counter(c.rank for c in result.verdict.culprits if c.group)
    result.lag_count = dict(counts)
    result.stragglers = result.verdict.ranks
    return result


def hang_states(dumps: Iterable[FlightRecorderDump]) -> dict[int, RankState]:
    """The dumps as :class:`~laggard.detectors.hang.RankState` per rank (see module doc).

    Args:
        dumps: one per rank; dumps without a rank are ignored.

    Returns:
        rank -> its groups' and P2P pairs' issued/completed counters and pending work.
    """
    by_rank = {d.rank: d for d in dumps if d.rank is not None}
    return _hang_states(by_rank, _groups(by_rank))[0]


def _hang_states(by_rank: dict[int, FlightRecorderDump],
                 groups: dict[str, _Group]) -> tuple[dict[int, RankState], int]:
    p2p_pgs = {e.pg for d in by_rank.values() for e in d.entries if _p2p_match(e)} | {
        name for name, g in groups.items() if _PIPELINE_DESC.search(g.desc)}
    newest = max((e.time_created_ns or 0 for d in by_rank.values() for e in d.entries),
                 default=0)
    history = {r: _whole_history(d) for r, d in by_rank.items()}
    host = _host_only(by_rank)  # gloo: send/recv counted and not recorded (ENVIRONMENT.md)
    unmapped = 0
    states = {}
    for rank, dump in sorted(by_rank.items()):
        status, lost = _status_by_name(dump)
        unmapped += 0 if history[rank] else lost  # whole-history dumps count from entries
        collective = [_collective_state(pg, groups, dump, status.get(pg), history[rank],
                                        newest)
                      for pg in sorted(_pgs_of(dump, status, groups, rank))
                      if pg not in p2p_pgs or history[rank]]
        kept = tuple(g for g in collective if g)
        states[rank] = RankState(
            rank=rank, groups=kept,
            unrecorded=_unrecorded(dump, kept, status, p2p_pgs)
            if history[rank] and host else (),
            history=tuple(e.pg for e in dump.entries if not _p2p_match(e) and e.seq > 0)
            if history[rank] else ())
    pairs = _pair_states(by_rank, groups, history, newest)
    for rank, extra in pairs.items():
        if rank in states:
            states[rank] = replace(states[rank], groups=states[rank].groups + tuple(extra))
    return states, unmapped


def _host_only(by_rank: dict[int, FlightRecorderDump]) -> bool:
    """Whether every entry of the set that names its backend is gloo's (a CPU job)."""
    backends = {e.backend for d in by_rank.values() for e in d.entries if e.backend}
    return backends == {"gloo"}


def _unrecorded(dump: FlightRecorderDump, groups: tuple[GroupState, ...],
                status: dict[str, PgStatus], p2p_pgs: set[str]) -> tuple[str, ...]:
    """Groups in which the rank may be blocked in an operation its dump does not list: it has
    no listed pending work at all, and the group's operation count (``op_id``, ``pg_status``'s
    enqueued) runs past its collectives (send/recv that gloo counts and does not record)."""
    if any(g.pending for g in groups):
        return ()  # it waits in a recorded collective: that is where it is blocked
    out = []
    for g in groups:
        if g.group in p2p_pgs:
            continue  # its P2P entries are listed: the pairs tell who waits on whom
        ops = [e.op_id for e in dump.entries if e.pg == g.group and e.op_id is not None]
        st = status.get(g.group)
        counted = max(ops + ([st.last_enqueued] if st is not None else []), default=0)
        if counted > g.issued:
            out.append(g.group)
    return tuple(out)


def _whole_history(dump: FlightRecorderDump) -> bool:
    """Whether the ring buffer still holds every entry since the recorder started."""
    return bool(dump.entries) and dump.entries[0].record_id == 0


def _sort_key(name: str) -> tuple[int, str]:
    return (int(name), "") if name.isdigit() else (1 << 62, name)


def _status_by_name(dump: FlightRecorderDump) -> tuple[dict[str, PgStatus], int]:
    """``pg_status`` by group name: tied through entries, else paired in creation order."""
    known = dict(dump.status)
    tied = {e.pg_id: e.pg for e in dump.entries if e.pg_id is not None}
    loose = [uid for uid in dump.status_by_id if uid not in tied]
    if not loose:
        return known, 0
    names = sorted((n for n in dump.groups if n), key=_sort_key)
    uids = sorted(dump.status_by_id, key=_sort_key)
    paired = dict(zip(uids, names, strict=False))
    if len(names) != len(uids) or any(paired.get(u) != n for u, n in tied.items()):
        return known, len(loose)
    for uid in loose:
        known[paired[uid]] = dump.status_by_id[uid]
    return known, 0


def _pgs_of(dump: FlightRecorderDump, status: dict[str, PgStatus], groups: dict[str, _Group],
            rank: int) -> set[str]:
    names = {e.pg for e in dump.entries if not _p2p_match(e)} | set(status)
    return {n for n in names if n in groups and (not groups[n].members
                                                  or rank in groups[n].members)}


def _age(entry: FrEntry, newest: int) -> float | None:
    if not entry.time_created_ns or not newest:
        return None
    return max(0.0, (newest - entry.time_created_ns) / 1e9)


def _work(entry: FrEntry, seq: int, newest: int) -> PendingWork:
    return PendingWork(seq=seq, op=entry.op, input_sizes=entry.input_sizes,
                       input_dtypes=entry.input_dtypes, state=entry.state,
                       age_seconds=_age(entry, newest))


def _collective_state(pg: str, groups: dict[str, _Group], dump: FlightRecorderDump,
                      status: PgStatus | None, history: bool,
                      newest: int) -> GroupState | None:
    entries = [e for e in dump.entries if e.pg == pg and not _p2p_match(e) and e.seq > 0]
    if history:
        issued = max((e.seq for e in entries), default=0)
        completed = 0
    elif status is not None:
        issued, completed = _counter(status.last_enqueued), _counter(status.last_completed)
    else:
        return None
    if issued < 0 or completed < 0:  # impossible counters: passed on, counted by the rules
        return GroupState(group=pg, issued=issued, completed=completed, desc=groups[pg].desc)
    finished = {e.seq for e in entries if e.finished}
    while completed + 1 in finished:  # gloo retires an entry before its counter moves
        completed += 1
    issued = max(issued, completed)
    pending = tuple(_work(e, e.seq, newest) for e in entries
                    if completed < e.seq <= issued and not e.finished)
    group = groups[pg]
    return GroupState(group=pg, issued=issued, completed=completed, desc=group.desc,
                      members=group.members or None, pending=pending,
                      pending_seconds=pending[0].age_seconds if pending else None,
                      op=entries[-1].op if entries else None)


def _counter(value: int) -> int:
    """A ``pg_status`` counter: -1 (none yet) is 0; anything below is passed on (counted)."""
    return 0 if value == -1 else value


def _p2p_match(entry: FrEntry) -> re.Match[str] | None:
    if not (entry.is_p2p or " " in entry.op):
        return None
    return _P2P_OP.match(entry.op)


def _pair_states(by_rank: dict[int, FlightRecorderDump], groups: dict[str, _Group],
                 history: dict[int, bool], newest: int) -> dict[int, list[GroupState]]:
    # (pg, rank, peer) -> that rank's entries of the pair, in ring-buffer order
    sides: dict[tuple[str, int, int], list[FrEntry]] = defaultdict(list)
    for rank, dump in by_rank.items():
        for e in dump.entries:
            m = _p2p_match(e)
            if m is None:
                continue
            members = groups[e.pg].members if e.pg in groups else ()
            peer = int(m["peer"])
            sides[(e.pg, rank, members[peer] if peer < len(members) else peer)].append(e)
    out: dict[int, list[GroupState]] = defaultdict(list)
    for (pg, rank, peer), entries in sorted(sides.items()):
        whole = history[rank] and history.get(peer, False)
        out[rank].append(_pair_state(pg, groups, rank, peer, entries, whole,
                                     by_rank[rank].status.get(pg), newest))
    return out


def _pair_state(pg: str, groups: dict[str, _Group], rank: int, peer: int,
                entries: list[FrEntry], whole: bool, status: PgStatus | None,
                newest: int) -> GroupState:
    live = []
    for i, e in enumerate(entries):
        later_done = any(x.finished for x in entries[i + 1:])
        done_after = not whole and status is not None and e.p2p_seq <= status.last_completed
        if not e.finished and not later_done and not done_after:
            live.append((i + 1, e))
    if whole:
        issued, completed = len(entries), len(entries) - len(live)
    else:  # pending-only: counted relative to what is listed, on both sides alike
        issued, completed = len(live), 0
    pending = tuple(_work(e, seq if whole else n + 1, newest)
                    for n, (seq, e) in enumerate(live))
    group = groups.get(pg)
    return GroupState(group=pg, issued=issued, completed=completed,
                      desc=group.desc if group else "", peer=peer, pending=pending,
                      members=group.members or None if group else None,
                      pending_seconds=pending[0].age_seconds if pending else None,
                      op=entries[-1].op)


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
    # gloo (torch 2.13) keys pg_config by an empty name; a rank without subgroups lists the
    # world's ranks there, so a rank that left no dump (stopped, dead) is still a member
    # (and ranks run 0..W-1: a gap below the highest dumped rank is a rank without a dump)
    world = set(range(max(by_rank) + 1)) if by_rank else set()
    world |= {m for d in by_rank.values() for m in d.groups.get("", ("", ()))[1]}
    for name, group in groups.items():
        if not group.members and (seen_in[name] or name == "0"):
            # pg_config did not name the members: the ranks that know the group, and the
            # world (every dumped rank, and the ranks an unnamed pg_config lists) for the
            # default group
            default = name == "0" and group.desc in _DEFAULT_GROUP_DESCS
            group.members = tuple(sorted(world if default else seen_in[name]))
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


class _EntryLookup:
    """The entries of every dump by (rank, group, collective_seq_id), for what findings show."""

    def __init__(self, by_rank: dict[int, FlightRecorderDump]) -> None:
        self._entries: dict[tuple[int, str, int], FrEntry] = {}
        for rank, dump in by_rank.items():
            for e in dump.entries:
                if _p2p_match(e) is None:
                    self._entries.setdefault((rank, e.pg, e.seq), e)

    def first(self, ranks: Iterable[int], pg: str, seq: int) -> list[FrEntry]:
        return [e for r in ranks if (e := self._entries.get((r, pg, seq))) is not None]


def _status(states: dict[int, RankState], pg: str) -> dict[int, tuple[int, int]]:
    return {r: (g.issued, g.completed) for r, st in states.items() for g in st.groups
            if g.group == pg and g.peer is None}


def _collective_culprits(verdict: HangVerdict) -> dict[str, list[HangCulprit]]:
    by_group: dict[str, list[HangCulprit]] = defaultdict(list)
    for c in verdict.culprits:
        if c.group and c.peer is None:
            by_group[c.group].append(c)
    return by_group


def _lagging_groups(verdict: HangVerdict, states: dict[int, RankState],
                    groups: dict[str, _Group], lookup: _EntryLookup) -> list[LaggingCollective]:
    """Per group a culprit holds up: the first collective a culprit never issued."""
    out = []
    for pg, culprits in sorted(_collective_culprits(verdict).items()):
        status = _status(states, pg)
        top = max((enq for enq, _ in status.values()), default=0)
        behind = {c.rank: status[c.rank][0] if c.rank in status else None for c in culprits
                  if c.rank not in status or status[c.rank][0] < top}
        if not behind:
            continue
        seq = min((enq for enq in behind.values() if enq is not None), default=top - 1) + 1
        present = tuple(sorted(r for r, (enq, _) in status.items() if enq >= seq))
        issued = lookup.first(present, pg, seq)
        created = [e.time_created_ns for e in issued if e.time_created_ns]
        sample = issued[0] if issued else None
        not_enqueued = tuple(sorted(r for r, enq in behind.items() if enq is not None))
        waits_elsewhere = {r for r in not_enqueued if r in states
                           and any(g.pending or g.issued > g.completed for g in states[r].groups)}
        out.append(LaggingCollective(
            pg=pg, pg_desc=groups[pg].desc if pg in groups else "",
            members=groups[pg].members if pg in groups else (), seq=seq,
            op=sample.op if sample else "?", input_sizes=sample.input_sizes if sample else (),
            input_dtypes=sample.input_dtypes if sample else (),
            state=tuple(sorted({e.state for e in issued})), present=present,
            not_enqueued=not_enqueued,
            no_dump=tuple(sorted(r for r, enq in behind.items() if enq is None)), unknown=(),
            status=status, time_created_ns=min(created) if created else None,
            hung_cpu=tuple(c.rank for c in culprits if c.kind == "missing"
                           and c.rank in not_enqueued and c.rank not in waits_elsewhere),
            skipped=tuple(c.rank for c in culprits if c.kind == "missing"
                          and c.rank in waits_elsewhere)))
    # Earliest-created first; groups whose entries for that collective were evicted from every
    # ring buffer (known from pg_status only) come last: their time is unknown.
    out.sort(key=lambda lag: (lag.time_created_ns is None, lag.time_created_ns or 0, lag.pg))
    return out


def _stuck_groups(verdict: HangVerdict, states: dict[int, RankState],
                  groups: dict[str, _Group], lookup: _EntryLookup) -> list[StuckCollective]:
    """Per group, the device culprits and the first collective they did not complete."""
    out = []
    for pg, culprits in sorted(_collective_culprits(verdict).items()):
        status = _status(states, pg)
        device = [c for c in culprits if c.kind == "device" and c.seq is not None
                  and c.rank in status and status[c.rank][1] < c.seq <= status[c.rank][0]]
        if not device:
            continue  # a group a device culprit holds up by never issuing: in ``lagging``
        seq = min(c.seq for c in device if c.seq is not None)
        stuck = tuple(sorted(c.rank for c in device if c.seq == seq))
        own = lookup.first(stuck, pg, seq)
        sample = own[0] if own else None
        out.append(StuckCollective(
            pg=pg, pg_desc=groups[pg].desc if pg in groups else "",
            members=groups[pg].members if pg in groups else (), seq=seq,
            op=sample.op if sample else "?", input_sizes=sample.input_sizes if sample else (),
            input_dtypes=sample.input_dtypes if sample else (),
            state=tuple(sorted({e.state for e in own})), stuck=stuck,
            completed_by=tuple(sorted(r for r, (_, comp) in status.items() if comp >= seq)),
            status=status))
    return out


def _p2p_groups(verdict: HangVerdict, states: dict[int, RankState],
                groups: dict[str, _Group]) -> list[P2PStall]:
    """Per stalled P2P pair: who waits, in which op, for the culprit's side."""
    out = []
    for c in verdict.culprits:
        if c.peer is None:
            continue
        waiter = c.peer
        mine = _pair_of(states, c.rank, c.group, waiter)
        theirs = _pair_of(states, waiter, c.group, c.rank)
        op = (theirs.pending[0].op if theirs and theirs.pending else c.op) or "?"
        sender, receiver = (waiter, c.rank) if op.startswith("send") else (c.rank, waiter)
        work = theirs.pending[0] if theirs and theirs.pending else None
        sends_recvs = (theirs.issued if theirs else 0, mine.issued if mine else 0)
        sends, recvs = sends_recvs if sender == waiter else sends_recvs[::-1]
        out.append(P2PStall(
            pg=c.group, pg_desc=groups[c.group].desc if c.group in groups else c.desc,
            sender=sender, receiver=receiver, sends=sends, recvs=recvs, waiting=waiter,
            stalled=c.rank, op=op, input_sizes=work.input_sizes if work else (),
            input_dtypes=work.input_dtypes if work else ()))
    return out


def _pair_of(states: dict[int, RankState], rank: int, pg: str,
             peer: int) -> GroupState | None:
    state = states.get(rank)
    return next((g for g in state.groups if g.group == pg and g.peer == peer),
                None) if state else None
