"""Who holds a hung job up: one set of rules for flight-recorder dumps and live heartbeats.

A synchronous job that stops is held up by a few ranks; every other rank waits for them in a
collective. Both views laggard has of a job, a flight-recorder dump per rank after the fact
(:mod:`laggard.detectors.flight_recorder`) and a heartbeat per rank while it hangs
(:class:`laggard.wire.Heartbeat`), reduce to the same state: per rank and per process group, how
far the rank has *issued* and *completed* the group's collectives, and what it has pending.
:func:`classify_hang` reads that state by the format's semantics (``../shared/ENVIRONMENT.md``,
"Flight-recorder dumps of multi-group jobs"), per group, never by the shape of one dump set.

Per collective group, with ``C`` the highest ``completed`` among its members:

* a member **waits** in the group when its oldest pending collective ``s = completed + 1`` was
  completed by no member (``s > C``); it waits *on* the members that never issued ``s``
  (``issued < s``): a wait-for edge. (PyTorch ``fr_trace`` matches the same collective across
  ranks; NVRx's attribution names the ranks that did not enqueue it.)
* a member is **stuck on the device** when it issued ``s`` and did not complete it while another
  member did (``issued >= s`` and ``C >= s``): a collective cannot complete at the peers without
  every member's part, so its part ran and its completion never came (ENVIRONMENT.md: "enqueued
  and never completed while its peers completed"; NVRx's ``gpu_error`` sets). Only where the
  collectives run on a device: on the host (gloo, ``device=False``) a collective completes at
  some members before others (its ring's last exchanges), so the member is **in progress**; it
  waits on the members that stopped reporting (silent) without completing it, and is a victim,
  never a culprit (:attr:`HangVerdict.in_progress` when no such member is known).
* a rank that lists no pending work but whose source counts operations it does not list (gloo
  records no send/recv: :attr:`RankState.unrecorded`) may be blocked in one: it is
  **undetermined** (:attr:`HangVerdict.undetermined`), never named, and the ranks waiting on it
  name nobody through it: which peer did not post its side cannot be told.

P2P traffic is compared per (sender, receiver) pair only, never across the group (P2P sequence
numbers count per pair and their completion is not a watermark: ENVIRONMENT.md): a side with
pending operations of the pair waits on the other side when the other issued fewer operations of
the pair; when both sides posted, the transfer is in flight and nobody is blamed. P2P completions
never make a device culprit, and an old listed P2P entry whose later ones completed is not
pending (the dump reader drops it).

Root cause, not consequence: in a multi-group job the ranks that wait for a culprit in group A
never issue group B's next collective, so they are behind in B too. A rank that *waits* anywhere
is a victim of whom it waits on; the culprits are

1. **silent**: a rank that reported nothing (no dump, no heartbeat), whose heartbeat is older than
   ``silent_after_seconds``, or whose process is gone (its counters are stale: no device verdict
   is read from them);
2. **device**: a rank stuck on the device in some group (its pending work is what its peers
   completed), whatever else it waits on;
3. **missing**: a rank others wait on that waits on nothing itself: it has no pending work that
   is not completed elsewhere, in any group or pair, and a lower issued count than its peers
   (ENVIRONMENT.md: a rank hung on the CPU has no pending work and is behind).
4. A **wait cycle** with none of the above (a rank that skipped a collective and went on to wait
   in the next one, while its peers wait for the skipped one): where the ranks' issue orders are
   known (:attr:`RankState.history`, from whole-history dumps), the rank of the cycle that left
   the order the job kept until then (a step no earlier step took) is named (missing);
   otherwise the oldest wait *of the cycle* is where the hang began, so the ranks it waits on
   are named (waits of ranks outside the cycle, its victims, say nothing of where it began);
   without wait ages every rank the cycle's waits point at is named. :attr:`HangVerdict.cycle`
   says so. A rank blocked in one group is never named missing from another.

Bad input never raises: a state with negative counters or ``completed > issued`` is dropped and
counted (:attr:`HangVerdict.bad_states`); a rank of another world size is left out and listed
(:attr:`HangVerdict.foreign_ranks`); a group whose counters went backwards since ``previous`` (a
restarted group) or whose members are in different :attr:`GroupState.generation` s is not
compared this time and is listed in :attr:`HangVerdict.restarted`.

A snapshot of a job that is still moving reads whoever is behind at that instant: call this on a
job whose counters stopped (the caller's stall threshold), not on every heartbeat.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

__all__ = ["CULPRIT_KINDS", "GroupState", "HangCulprit", "HangVerdict", "PendingWork",
           "RankState", "classify_hang"]

#: What held a group up, per rank: never issued, stuck on the device, stopped reporting.
CULPRIT_KINDS = ("missing", "device", "silent")
CulpritKind = Literal["missing", "device", "silent"]


@dataclass(frozen=True, slots=True)
class PendingWork:
    """One collective a rank issued and has not completed.

    Attributes:
        seq: its sequence number in the group (per pair for P2P).
        op: the op (``allreduce``, ``all_to_all``, ``send``...).
        input_sizes, input_dtypes: what the flight recorder lists for it (empty from heartbeats).
        state: ``scheduled`` or ``started`` (flight recorder); ``issued`` from heartbeats.
        age_seconds: how long before the report it was issued (flight recorder: from
            ``time_created_ns``, relative to the newest entry of the dump set); None: unknown.
    """

    seq: int
    op: str
    input_sizes: tuple[tuple[int, ...], ...] = ()
    input_dtypes: tuple[str, ...] = ()
    state: str = "issued"
    age_seconds: float | None = None


@dataclass(frozen=True, slots=True)
class GroupState:
    """One rank's progress in one process group, or in one P2P pair of it.

    Attributes:
        group: the group's key, the same on every member (a PG name, a tracer label).
        issued: sequence number of the last collective the rank issued (0: none). For a P2P
            pair: operations of the pair the rank issued (sends to and receives from ``peer``),
            comparable with the peer's count of the same pair.
        completed: highest ``n`` such that collectives ``1..n`` completed on the rank (for a
            pair: operations of the pair completed).
        desc: the group's description (``dp``, ``tp``, ``default_pg``...), for messages.
        members: the group's ranks, when the source names them (global ranks).
        pending: the issued, not completed collectives the source lists.
        peer: for a P2P pair, the other rank; None for a collective group.
        op: the last issued op, when ``pending`` does not say.
        pending_seconds: seconds since the oldest pending collective was issued (heartbeats:
            ``issued_age_seconds`` of a group with one pending); None: unknown or none pending.
        generation: incarnation of the group on this rank (raised when the group is re-created
            and its sequence restarts); members of different generations are not compared.
    """

    group: str
    issued: int
    completed: int
    desc: str = ""
    members: tuple[int, ...] | None = None
    pending: tuple[PendingWork, ...] = ()
    peer: int | None = None
    op: str | None = None
    pending_seconds: float | None = None
    generation: int = 0


@dataclass(frozen=True, slots=True)
class RankState:
    """What one rank reported: its groups, and for heartbeats its liveness and phase.

    Attributes:
        rank: global rank.
        groups: its progress per group and P2P pair.
        silent_seconds: seconds since its last heartbeat (None: a dump, or a fresh heartbeat).
        alive: whether its process exists (None: unknown).
        step: the step its training thread is in; ``phase`` and ``phase_seconds``: where and for
            how long (heartbeats only).
        world_size: the world size the rank reported (None: unknown); a rank of another world
            size than the job's is left out.
        unrecorded: groups in which the rank has pending operations its source does not list
            (gloo's dumps record no send/recv, but their ``pg_status`` counts them): the rank is
            blocked there on a peer the source cannot name.
        history: the groups of its collectives in the order it issued them (whole-history
            dumps; empty: unknown), to tell which rank of a wait cycle left the job's order.
    """

    rank: int
    groups: tuple[GroupState, ...] = ()
    silent_seconds: float | None = None
    alive: bool | None = None
    step: int | None = None
    phase: str | None = None
    phase_seconds: float | None = None
    world_size: int | None = None
    unrecorded: tuple[str, ...] = ()
    history: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class HangCulprit:
    """One rank that holds a group up, and how.

    Attributes:
        rank: the rank; ``kind``: one of :data:`CULPRIT_KINDS`.
        group, desc: the group it holds up; ``seq`` and ``op``: the collective it never issued
            (missing) or never completed (device); None for a silent rank with no group state.
        peer: for a P2P pair, the rank waiting on it.
        waiting: the ranks of the group that issued (or completed) what this one did not.
        issued, completed: the culprit's own counters in the group (None: no state).
        group_issued, group_completed: the highest counters among the group's members.
        input_sizes, input_dtypes: of the collective ``seq``, where an entry lists it.
        waited_seconds: how long the longest-waiting of ``waiting`` has waited (None: unknown).
    """

    rank: int
    kind: CulpritKind
    group: str = ""
    desc: str = ""
    seq: int | None = None
    op: str | None = None
    peer: int | None = None
    waiting: tuple[int, ...] = ()
    issued: int | None = None
    completed: int | None = None
    group_issued: int | None = None
    group_completed: int | None = None
    input_sizes: tuple[tuple[int, ...], ...] = ()
    input_dtypes: tuple[str, ...] = ()
    waited_seconds: float | None = None


@dataclass(slots=True)
class HangVerdict:
    """Every culprit found, by rank and group; empty when nothing holds a group up.

    Attributes:
        culprits: one entry per (rank, group) held up, ordered by rank then group.
        groups_checked: groups (and P2P pairs) read.
        waiting: ranks that wait on someone (the victims), sorted.
        cycle: culprits were found by breaking a wait cycle (rule 4 of the module doc).
        bad_states: group states dropped for impossible counters (negative,
            ``completed > issued``).
        foreign_ranks: ranks left out for another world size (or a rank outside it).
        restarted: (rank, group) pairs not compared: counters gone backwards since the previous
            snapshot, or an older generation than the group's other members.
        undetermined: ranks blocked in an operation their source does not record (gloo's
            send/recv): whom they wait on cannot be told, so neither they nor the ranks waiting
            on them name a culprit through them.
        in_progress: ranks in a collective that a peer completed, on a job whose collectives run
            on the host (``device=False``): the collective is still in progress or a peer
            stopped; never a device verdict.
    """

    culprits: list[HangCulprit] = field(default_factory=list)
    groups_checked: int = 0
    waiting: tuple[int, ...] = ()
    cycle: bool = False
    bad_states: int = 0
    foreign_ranks: tuple[int, ...] = ()
    restarted: list[tuple[int, str]] = field(default_factory=list)
    undetermined: tuple[int, ...] = ()
    in_progress: tuple[int, ...] = ()

    @property
    def ranks(self) -> tuple[int, ...]:
        """The culprit ranks, each once, sorted."""
        return tuple(sorted({c.rank for c in self.culprits}))

    def kind_of(self, rank: int) -> CulpritKind | None:
        """The kind a culprit rank is named with; None for a rank that is not one."""
        return next((c.kind for c in self.culprits if c.rank == rank), None)


#: A group view's key: (group, None) for a collective group, (group, (a, b)) for a P2P pair.
_Key = tuple[str, tuple[int, int] | None]


@dataclass(frozen=True, slots=True)
class _Wait:
    """``waiter`` waits in ``key`` for collective ``seq``, on ``targets`` (who never issued it)."""

    waiter: int
    key: _Key
    seq: int
    targets: tuple[int, ...]
    age: float | None
    work: PendingWork | None


@dataclass(frozen=True, slots=True)
class _Stuck:
    """``rank`` issued ``seq`` of ``key`` and did not complete it; ``completed_by`` did."""

    rank: int
    key: _Key
    seq: int
    completed_by: tuple[int, ...]
    work: PendingWork | None


@dataclass(slots=True)
class _Views:
    """Every group's members' states, after dropping what cannot be compared."""

    groups: dict[_Key, dict[int, GroupState]] = field(default_factory=dict)
    desc: dict[str, str] = field(default_factory=dict)
    absent: dict[_Key, tuple[int, ...]] = field(default_factory=dict)
    unknown: set[int] = field(default_factory=set)


def classify_hang(ranks: Mapping[int, RankState], *,
                  world_size: int | None = None,
                  previous: Mapping[int, RankState] | None = None,
                  silent_after_seconds: float = 10.0,
                  absent_are_silent: bool = True, device: bool = True) -> HangVerdict:
    """Name the ranks that hold the job's groups up (rules in the module doc).

    Args:
        ranks: rank -> its state; a rank of the world missing from the mapping reported nothing
            (no dump, no heartbeat ever).
        world_size: ranks in the job, when known (a rank below it and absent from ``ranks`` is
            named silent); None: the world size most ranks report, if any.
        previous: the states of the snapshot before, for heartbeats: a group whose counters
            went backwards since is a restarted group, not compared this time.
        silent_after_seconds: a heartbeat older than this makes its rank silent.
        absent_are_silent: name absent ranks silent; False where the caller sees only part of
            the job (the node agent reads its node's dumps only).
        device: whether the job's collectives run on a device (NCCL); False for a CPU/gloo
            job, where a collective a peer completed and this rank did not is still in progress
            (or waits on a stopped peer): no rank is named stuck on the device, the rank waits
            on the silent members that did not complete it (:attr:`HangVerdict.in_progress`).

    Returns:
        The verdict; empty for a job where every member of every group is level. Never raises
        on bad counters (counted in the verdict).
    """
    verdict = HangVerdict()
    world = world_size if world_size is not None else _majority_world(ranks.values())
    reporting = _job_ranks(ranks, world, verdict)
    views = _views(reporting, previous, verdict)
    silent = _silent_ranks(reporting, views, world, silent_after_seconds, absent_are_silent)
    if not absent_are_silent:  # an absent member's progress is unknown: nobody waits on it
        views.absent = {}
        views.unknown = set(range(world or 0)) - set(reporting) | {
            m for key in views.groups for m in key[1] or () if m not in reporting}
    in_progress: set[int] = set()
    waits, stuck = _read_views(views, silent, device, in_progress)
    verdict.groups_checked = len(views.groups)
    undetermined = {r for r, st in reporting.items() if st.unrecorded} - silent
    verdict.undetermined = tuple(sorted(undetermined))
    histories = {r: st.history for r, st in reporting.items() if st.history}
    # a rank in a collective still in progress is blocked there, like one in an unrecorded op:
    # never named missing from another group, and nobody is named through it
    kinds = _kinds(waits, stuck, silent, undetermined | in_progress, histories, verdict)
    verdict.culprits = _culprits(kinds, waits, stuck, views)
    verdict.waiting = tuple(sorted({w.waiter for w in waits} - set(kinds)))
    verdict.in_progress = tuple(sorted(in_progress - set(kinds) - set(verdict.waiting)))
    return verdict


def _kinds(waits: list[_Wait], stuck: list[_Stuck], silent: set[int], undetermined: set[int],
           histories: Mapping[int, tuple[str, ...]],
           verdict: HangVerdict) -> dict[int, CulpritKind]:
    """Rules 1-4 of the module doc: each culprit rank and its kind."""
    blocked = {w.waiter for w in waits} | undetermined
    device = {s.rank for s in stuck} - silent
    free_targets = {t for w in waits for t in w.targets
                    if t not in blocked and t not in device and t not in silent}
    kinds: dict[int, CulpritKind] = {r: "silent" for r in silent}
    kinds.update({r: "device" for r in device})
    kinds.update({r: "missing" for r in free_targets})
    cycle_roots = _break_cycles(waits, set(kinds) | undetermined, histories)
    verdict.cycle = bool(cycle_roots)
    kinds.update({r: "missing" for r in cycle_roots if r not in kinds})
    return kinds


def _majority_world(states: Iterable[RankState]) -> int | None:
    sizes = Counter(s.world_size for s in states if s.world_size is not None)
    return sizes.most_common(1)[0][0] if sizes else None


def _job_ranks(ranks: Mapping[int, RankState], world: int | None,
               verdict: HangVerdict) -> dict[int, RankState]:
    """The ranks of this job: another world size, or a rank outside it, is left out."""
    kept, foreign = {}, []
    for rank, state in ranks.items():
        outside = rank < 0 or (world is not None and rank >= world)
        other = world is not None and state.world_size not in (None, world)
        if outside or other:
            foreign.append(rank)
        else:
            kept[rank] = state
    verdict.foreign_ranks = tuple(sorted(foreign))
    return kept


def _key(state: GroupState, rank: int) -> _Key:
    if state.peer is None:
        return (state.group, None)
    low, high = sorted((rank, state.peer))
    return (state.group, (low, high))


def _valid(state: GroupState) -> bool:
    return 0 <= state.completed <= state.issued and all(w.seq >= 0 for w in state.pending)


def _views(ranks: Mapping[int, RankState], previous: Mapping[int, RankState] | None,
           verdict: HangVerdict) -> _Views:
    views = _Views()
    earlier = {(r, _key(g, r)): g for r, st in (previous or {}).items() for g in st.groups}
    went_back: set[_Key] = set()
    for rank, state in ranks.items():
        for group in state.groups:
            if not _valid(group):
                verdict.bad_states += 1
                continue
            key = _key(group, rank)
            views.groups.setdefault(key, {})[rank] = group
            views.desc.setdefault(group.group, group.desc)
            before = earlier.get((rank, key))
            if before is not None and (group.issued < before.issued
                                       or group.completed < before.completed):
                went_back.add(key)
    for key in went_back:
        verdict.restarted += [(rank, key[0]) for rank in sorted(views.groups.pop(key))]
    for key, members in views.groups.items():
        newest = max(g.generation for g in members.values())
        for rank in [r for r, g in members.items() if g.generation < newest]:
            verdict.restarted.append((rank, key[0]))
            del members[rank]
        # every member lists the same ranks (one shared tuple when decoded from keys): union
        # each distinct list once, not |group| times
        lists = {id(g.members): g.members for g in members.values() if g.members}
        declared = {m for listed in lists.values() for m in listed}
        if key[1] is not None:
            declared = set(key[1])
        views.absent[key] = tuple(sorted(m for m in declared if m not in ranks))
    verdict.restarted.sort()
    return views


def _silent_ranks(ranks: Mapping[int, RankState], views: _Views, world: int | None,
                  silent_after_seconds: float, absent_are_silent: bool) -> set[int]:
    silent = {r for r, st in ranks.items()
              if st.alive is False or (st.silent_seconds is not None
                                       and st.silent_seconds >= silent_after_seconds)}
    if absent_are_silent:
        silent |= {r for absent in views.absent.values() for r in absent}
        if world is not None:
            silent |= {r for r in range(world) if r not in ranks}
    return silent


def _read_views(views: _Views, silent: set[int], device: bool,
                in_progress: set[int]) -> tuple[list[_Wait], list[_Stuck]]:
    waits: list[_Wait] = []
    stuck: list[_Stuck] = []
    for key, members in sorted(views.groups.items(), key=lambda kv: (kv[0][0], kv[0][1] or ())):
        absent = views.absent.get(key, ())
        if key[1] is None:
            _read_collective(key, members, absent, silent, waits, stuck, device, in_progress)
        else:
            _read_pair(key, members, absent, silent, views.unknown, waits)
    return waits, stuck


def _listed(state: GroupState, seq: int) -> PendingWork | None:
    return next((w for w in state.pending if w.seq == seq), None)


def _oldest_age(state: GroupState, seq: int) -> float | None:
    work = _listed(state, seq)
    if work is not None and work.age_seconds is not None:
        return work.age_seconds
    return state.pending_seconds


def _read_collective(key: _Key, members: dict[int, GroupState], absent: tuple[int, ...],
                     silent: set[int], waits: list[_Wait], stuck: list[_Stuck], device: bool,
                     in_progress: set[int]) -> None:
    top_completed = max(g.completed for g in members.values())
    # the ranks a waiting rank's sequence number points at depend on the number alone (a
    # waiting rank is never silent, so never among the stopped): one scan per number, not
    # one per waiting rank (a DP group of 8,192 ranks waiting on one: 8,192 scans, not 67 M)
    by_seq: dict[tuple[str, int], tuple[int, ...]] = {}

    def ranks_at(kind: str, seq: int) -> tuple[int, ...]:
        found = by_seq.get((kind, seq))
        if found is None:
            if kind == "stopped":
                found = tuple(sorted([r for r, g in members.items() if r in silent
                                      and g.completed < seq] + list(absent)))
            elif kind == "done":
                found = tuple(sorted(r for r, g in members.items() if g.completed >= seq))
            else:
                found = tuple(sorted([r for r, g in members.items() if g.issued < seq]
                                     + list(absent)))
            by_seq[(kind, seq)] = found
        return found

    for rank, state in sorted(members.items()):
        if rank in silent or state.issued <= state.completed:
            continue
        seq = state.completed + 1
        if top_completed >= seq and not device:
            # on the host a collective completes at a peer before every part of it ran
            # everywhere (gloo's rings): still in progress, or a peer stopped mid-way; the
            # members it may wait on are the silent ones that did not complete it
            stopped = ranks_at("stopped", seq)
            if stopped:
                waits.append(_Wait(rank, key, seq, stopped, _oldest_age(state, seq),
                                   _listed(state, seq)))
            else:
                in_progress.add(rank)
            continue
        if top_completed >= seq:
            stuck.append(_Stuck(rank, key, seq, ranks_at("done", seq), _listed(state, seq)))
            continue
        waits.append(_Wait(rank, key, seq, ranks_at("targets", seq), _oldest_age(state, seq),
                           _listed(state, seq)))


def _read_pair(key: _Key, members: dict[int, GroupState], absent: tuple[int, ...],
               silent: set[int], unknown: set[int], waits: list[_Wait]) -> None:
    assert key[1] is not None
    for rank, state in sorted(members.items()):
        if rank in silent or state.issued <= state.completed:
            continue
        peer = key[1][1] if key[1][0] == rank else key[1][0]
        if peer in unknown:
            continue  # a peer outside what the caller sees: its side is unknown
        other = members.get(peer)
        # a peer that reported no state for the pair issued none of its operations
        behind = peer in absent or (other.issued if other else 0) < state.issued
        seq = (other.issued if other else 0) + 1
        work = state.pending[0] if state.pending else None
        waits.append(_Wait(rank, key, seq, (peer,) if behind else (), state.pending_seconds
                           if work is None or work.age_seconds is None else work.age_seconds,
                           work))


def _reaches(start: int, edges: dict[int, set[int]], roots: set[int]) -> bool:
    seen, todo = {start}, [start]
    while todo:
        node = todo.pop()
        if node in roots:
            return True
        for nxt in edges.get(node, ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return False


def _left_order(rank: tuple[str, ...], other: tuple[str, ...]) -> bool:
    """Whether ``rank``'s issue order left ``other``'s where they part: both projected on the
    groups they share, agree up to a point, and there ``rank`` went to a group no earlier step
    of the shared order went to from the same place, while ``other`` followed a step the shared
    order made before (a skipped collective: the job's order repeats, the skip breaks it)."""
    shared = set(rank) & set(other)
    mine = [g for g in rank if g in shared]
    theirs = [g for g in other if g in shared]
    p = 0
    while p < len(mine) and p < len(theirs) and mine[p] == theirs[p]:
        p += 1
    if p >= len(mine) or p >= len(theirs):
        return False  # one is a prefix of the other: behind, not out of order
    seen = {(theirs[i - 1] if i else None, theirs[i]) for i in range(p)}
    before = theirs[p - 1] if p else None
    return (before, mine[p]) not in seen and (before, theirs[p]) in seen


def _break_cycles(waits: list[_Wait], roots: set[int],
                  histories: Mapping[int, tuple[str, ...]]) -> set[int]:
    """Culprits of wait cycles that lead to no root: the rank of a cycle that left the job's
    issue order (:func:`_left_order`, where histories are known), else where the oldest wait
    of the cycle points (waits outside the cycle, its victims', say nothing of its start)."""
    edges: dict[int, set[int]] = defaultdict(set)
    for w in waits:
        edges[w.waiter].update(w.targets)
    found: set[int] = set()
    for _ in range(len(edges) + 1):  # each round names at least one rank, or stops
        known = roots | found
        open_waits = [w for w in waits if w.targets and not _reaches(w.waiter, edges, known)]
        if not open_waits:
            break
        in_cycle = [w for w in open_waits
                    if any(_reaches(t, edges, {w.waiter}) for t in w.targets)]
        open_waits = in_cycle or open_waits
        left = {t for w in open_waits for t in w.targets
                if t in histories and w.waiter in histories
                and _left_order(histories[t], histories[w.waiter])}
        if left:
            found |= left
            continue
        aged = [w for w in open_waits if w.age is not None]
        if aged:
            oldest = max(w.age for w in aged if w.age is not None)
            found |= {t for w in aged if w.age == oldest for t in w.targets}
        else:
            found |= {t for w in open_waits for t in w.targets}
    return found


def _culprits(kinds: dict[int, CulpritKind], waits: list[_Wait], stuck: list[_Stuck],
              views: _Views) -> list[HangCulprit]:
    out: list[HangCulprit] = []
    for rank, kind in kinds.items():
        held: dict[_Key, HangCulprit] = {}
        on = _waits_on(rank, waits)
        if kind == "device":
            for s in stuck:
                if s.rank == rank and s.key not in held:
                    held[s.key] = _culprit(rank, kind, s.key, s.seq, s.work, s.completed_by,
                                           _max_age(on.get(s.key, [])), views)
        for key, on_it in on.items():
            if key in held:
                continue
            state = views.groups.get(key, {}).get(rank)
            seq = min(w.seq for w in on_it)  # what its waiters wait for
            if key[1] is None and state is not None and state.issued < seq:
                seq = state.issued + 1  # the first collective it never issued
            sample = next((w.work for w in on_it if w.work is not None and w.work.seq == seq),
                          next((w.work for w in on_it if w.work is not None), None))
            held[key] = _culprit(rank, kind, key, seq, sample,
                                 tuple(sorted({w.waiter for w in on_it})), _max_age(on_it),
                                 views)
        out += held.values() or [HangCulprit(rank=rank, kind=kind)]
    return sorted(out, key=lambda c: (c.rank, c.group, c.peer if c.peer is not None else -1))


def _max_age(waits: list[_Wait]) -> float | None:
    ages = [w.age for w in waits if w.age is not None]
    return max(ages) if ages else None


def _waits_on(rank: int, waits: list[_Wait]) -> dict[_Key, list[_Wait]]:
    on: dict[_Key, list[_Wait]] = defaultdict(list)
    for w in waits:
        if rank in w.targets:
            on[w.key].append(w)
    return on


def _culprit(rank: int, kind: CulpritKind, key: _Key, seq: int, work: PendingWork | None,
             waiting: tuple[int, ...], waited: float | None, views: _Views) -> HangCulprit:
    members = views.groups.get(key, {})
    own = members.get(rank)
    peer = None if key[1] is None else (key[1][1] if key[1][0] == rank else key[1][0])
    fallback_op = next((g.op for r, g in members.items() if r != rank and g.op), None)
    return HangCulprit(
        rank=rank, kind=kind, group=key[0], desc=views.desc.get(key[0], ""), seq=seq,
        op=work.op if work is not None else fallback_op, peer=peer, waiting=waiting,
        issued=own.issued if own else None, completed=own.completed if own else None,
        group_issued=max((g.issued for g in members.values()), default=None),
        group_completed=max((g.completed for g in members.values()), default=None),
        input_sizes=work.input_sizes if work is not None else (),
        input_dtypes=work.input_dtypes if work is not None else (), waited_seconds=waited)
