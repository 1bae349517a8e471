"""The hang store key: what one rank says about itself (:class:`RankSnapshot`) and its encoding
as the value of ``laggard/<run>/hb/<rank>`` in the job's ``torch.distributed`` store.

Every rank's store thread (:class:`~laggard.integrations.heartbeat.HeartbeatThreads`) writes
its key with :func:`encode_key`; rank 0's :class:`~laggard.integrations.hang_watch.HangWatch`
reads them back with :func:`decode_key`, which refuses another run's or rank's key and anything
garbled (:class:`BadKey`). Pure functions of plain data: no store, no torch.

**Format** (version :data:`KEY_VERSION`): compact JSON, about 150 bytes plus 40 per group::

    {"v":1,"r":RUN,"k":RANK,"p":PID,"b":BEAT,"c":0|1,"w":WALL,"s":STEP,"ph":PHASE,
     "pa":PHASE_AGE,"q":QUIET,"t":TYPICAL_STEP,"g":[[GROUP,ISSUED,COMPLETED,OP,PEER,MEMBERS,
     PENDING_AGE],...]}

with ages in seconds to the millisecond (:func:`laggard.wire.round_age`), WALL the writer's
``time.time()``, MEMBERS a list of ``[start, count, stride]`` runs of global ranks (a TP, PP or
DP group is one run), or null for a P2P pair or a group needing more than
:data:`MAX_MEMBER_RUNS`.

**The node key** (version :data:`NODE_KEY_VERSION`), the value of ``laggard/<run>/hb/n/<LEADER>``
that a node's local leader writes for its ranks (:mod:`laggard.integrations.heartbeat_node`):
one header line, then the ranks' own keys as they sent them, one per line, unchanged (compact
JSON never holds a raw newline)::

    {"v":1,"r":RUN,"l":LEADER,"b":BEAT,"k":[RANK,...]}\n KEY_OF_RANK\n KEY_OF_RANK ...

so rank 0 decodes each rank's key with :func:`decode_key` exactly as when the rank wrote it
itself (:func:`encode_node_key`, :func:`decode_node_key`).
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeGuard

from laggard.wire import MAX_HEARTBEAT_GROUPS, GroupProgress, check_run, round_age

__all__ = ["KEY_VERSION", "MAX_KEY_BYTES", "MAX_MEMBER_RUNS", "MAX_NODE_RANKS",
           "NODE_KEY_VERSION", "BadKey", "NodeKey", "RankKey", "RankSnapshot", "decode_key",
           "decode_node_key", "encode_key", "encode_node_key"]

#: Version of the store key's format (:func:`encode_key`).
KEY_VERSION = 1
#: Largest store key value accepted (bytes); a larger one is counted as bad input.
MAX_KEY_BYTES = 8192
#: Version of the node key's format (:func:`encode_node_key`).
NODE_KEY_VERSION = 1
#: Ranks one node key carries at most (a node of 8 GPUs carries 8; 64 leaves room for CPU ranks).
MAX_NODE_RANKS = 64
#: Member runs (``[start, count, stride]``) a key lists per group; a group needing more is sent
#: without its members.
MAX_MEMBER_RUNS = 4


@dataclass(frozen=True, slots=True)
class RankSnapshot:
    """What one rank says about itself at one moment (a heartbeat's and a key's content).

    Attributes:
        step: the step its training thread is in.
        phase: where its training thread is (``data``... ``outside``, ``step``).
        phase_seconds: for how long, seconds.
        step_seconds: its typical step time (median of recent steps), seconds; None before
            the first.
        quiet_seconds: seconds since its training thread last made progress: the least of
            ``phase_seconds`` and the ages of its groups' last issue and completion.
        groups: progress per group and P2P pair, ages in seconds.
        members: group key -> its members (global ranks), where known.
        pending_seconds: per entry of ``groups``, seconds since its oldest pending collective
            was issued (None: none pending, or unknown).
        wall: ``time.time()`` when the snapshot was taken (rank 0 ages the pending times of
            a key by it: the ranks' wall clocks are taken to agree to well under a second).
    """

    step: int
    phase: str
    phase_seconds: float
    step_seconds: float | None
    quiet_seconds: float
    groups: tuple[GroupProgress, ...] = ()
    members: Mapping[str, tuple[int, ...]] | None = None
    pending_seconds: tuple[float | None, ...] = ()
    wall: float = 0.0


@dataclass(frozen=True, slots=True)
class RankKey:
    """One rank's store key, decoded (:func:`decode_key`).

    Attributes:
        rank, run, pid: who wrote it.
        beat: the writer's write counter (rank 0 tells a live writer by it changing).
        closed: the writer's monitor was closed (the rank has left the training loop).
        snapshot: its state when written.
        members: group key -> its members, where the key lists them.
    """

    rank: int
    run: str
    pid: int
    beat: int
    closed: bool
    snapshot: RankSnapshot
    members: Mapping[str, tuple[int, ...]]


class BadKey(ValueError):
    """A store key rank 0 cannot use (another run's, another rank's, garbled)."""


def encode_key(snapshot: RankSnapshot, *, rank: int, run: str, pid: int, beat: int,
               closed: bool = False) -> bytes:
    """One rank's store key value (the format in the module docstring).

    Args:
        snapshot: the rank's state now (:func:`~laggard.integrations.heartbeat.take_snapshot`).
        rank, run, pid: the writer.
        beat: the writer's write counter, incremented per write.
        closed: the writer's monitor is closing (its last write).

    Returns:
        Compact JSON, UTF-8: about 150 bytes plus 40 per group.
    """
    members = snapshot.members or {}
    ages = snapshot.pending_seconds or (None,) * len(snapshot.groups)
    groups = [[g.group, g.issued, g.completed, g.op, g.peer,
               _runs(members.get(g.group)) if g.peer is None else None, round_age(age)]
              for g, age in zip(snapshot.groups, ages, strict=True)]
    doc = {"v": KEY_VERSION, "r": run, "k": rank, "p": pid, "b": beat, "c": int(closed),
           "w": round_age(snapshot.wall), "s": snapshot.step, "ph": snapshot.phase,
           "pa": round_age(snapshot.phase_seconds), "q": round_age(snapshot.quiet_seconds),
           "t": round_age(snapshot.step_seconds), "g": groups}
    return json.dumps(doc, separators=(",", ":")).encode()


def decode_key(payload: bytes, *, run: str, rank: int) -> RankKey:
    """Validate one rank's store key.

    Args:
        payload: the value read from the store.
        run: the run rank 0 belongs to; rank: the rank whose key this is.

    Raises:
        BadKey: another run's or rank's key, a key of another version, garbled JSON, a field
            of the wrong type or out of range (``completed > issued``, a negative age).
    """
    if len(payload) > MAX_KEY_BYTES:
        raise BadKey(f"{len(payload)} bytes > {MAX_KEY_BYTES}")
    try:
        doc = json.loads(payload)
    except (UnicodeDecodeError, ValueError) as exc:
        raise BadKey(f"not JSON: {exc}"[:80]) from None
    if not isinstance(doc, dict) or doc.get("v") != KEY_VERSION:
        raise BadKey("not a laggard hang key of this version")
    try:
        key_run = check_run(doc.get("r"))
    except Exception:  # noqa: BLE001 - RecordError: a bad run id
        raise BadKey("bad run id") from None
    if key_run != run:
        raise BadKey(f"a key of run {key_run!r}, not {run!r}")
    if doc.get("k") != rank:
        raise BadKey(f"rank {doc.get('k')!r}'s key under rank {rank}'s name")
    groups: list[GroupProgress] = []
    pending: list[float | None] = []
    members: dict[str, tuple[int, ...]] = {}
    raw_groups = doc.get("g")
    if not isinstance(raw_groups, list) or len(raw_groups) > 2 * MAX_HEARTBEAT_GROUPS:
        raise BadKey("groups must be a short list")
    for entry in raw_groups:
        if not isinstance(entry, list) or len(entry) != 7:
            raise BadKey("a group entry must be [group, issued, completed, op, peer, members, "
                         "pending age]")
        name, issued, completed, op, peer, runs, age = entry
        if not isinstance(name, str) or not name or len(name) > 64:
            raise BadKey("bad group name")
        if not (_count(issued) and _count(completed) and completed <= issued):
            raise BadKey("bad counters")
        if op is not None and not (isinstance(op, str) and 0 < len(op) <= 64):
            raise BadKey("bad op")
        if peer is not None and not _count(peer):
            raise BadKey("bad peer")
        if age is not None and not _age(age):
            raise BadKey("bad pending age")
        groups.append(GroupProgress(group=name, issued=issued, completed=completed, op=op,
                                    peer=peer))
        pending.append(None if age is None else float(age))
        if peer is None and runs is not None:
            ranks = _unruns(runs)
            if ranks is None:
                raise BadKey("bad members")
            members[name] = ranks
    step, pid, beat = doc.get("s"), doc.get("p"), doc.get("b")
    phase = doc.get("ph")
    phase_age, quiet, wall = doc.get("pa"), doc.get("q"), doc.get("w")
    typical = doc.get("t")
    if not (_count(step) and _count(pid) and _count(beat)):
        raise BadKey("bad step, pid or beat")
    if not isinstance(phase, str) or not 0 < len(phase) <= 64:
        raise BadKey("bad phase")
    if not (_age(phase_age) and _age(quiet) and _age(wall)) or not (
            typical is None or _age(typical)):
        raise BadKey("bad ages")
    snapshot = RankSnapshot(step=step, phase=phase, phase_seconds=float(phase_age),
                            step_seconds=None if typical is None else float(typical),
                            quiet_seconds=float(quiet), groups=tuple(groups),
                            members=members, pending_seconds=tuple(pending), wall=float(wall))
    return RankKey(rank=rank, run=key_run, pid=pid, beat=beat, closed=bool(doc.get("c")),
                   snapshot=snapshot, members=members)


@dataclass(frozen=True, slots=True)
class NodeKey:
    """One node key, decoded (:func:`decode_node_key`).

    Attributes:
        leader: the rank that wrote it (its node's local rank 0).
        beat: the leader's write counter (rank 0 tells a live leader by it changing).
        keys: rank -> that rank's own key value (:func:`decode_key` reads it), as the rank sent
            it to its leader.
    """

    leader: int
    beat: int
    keys: Mapping[int, bytes]


def encode_node_key(keys: Mapping[int, bytes], *, leader: int, run: str, beat: int) -> bytes:
    """The node key value: a header line and the ranks' keys (the format in the module
    docstring).

    Args:
        keys: rank -> its key value (:func:`encode_key`), at most :data:`MAX_NODE_RANKS`.
        leader, run: the writer (its node's local leader) and the run.
        beat: the leader's write counter.

    Returns:
        UTF-8 bytes: about 50 bytes plus 6 per rank, plus the ranks' keys and one newline each.

    Raises:
        ValueError: more than :data:`MAX_NODE_RANKS` keys, or a key holding a newline.
    """
    if len(keys) > MAX_NODE_RANKS:
        raise ValueError(f"{len(keys)} ranks > {MAX_NODE_RANKS} in one node key")
    ranks = sorted(keys)
    if any(b"\n" in keys[r] for r in ranks):
        raise ValueError("a rank's key holds a newline")
    header = json.dumps({"v": NODE_KEY_VERSION, "r": run, "l": leader, "b": beat, "k": ranks},
                        separators=(",", ":")).encode()
    return b"\n".join([header, *(keys[r] for r in ranks)])


def decode_node_key(payload: bytes, *, run: str, leader: int) -> NodeKey:
    """Split one node key into its ranks' keys (each still to be read with :func:`decode_key`,
    which checks it is the rank's own).

    Args:
        payload: the value read from the store under ``hb/n/<leader>``.
        run: the run rank 0 belongs to; leader: the leader whose key this is.

    Raises:
        BadKey: oversized, a header that is not JSON of this version, another run's or
            leader's key, a rank list that is not distinct counters matching the lines.
    """
    if len(payload) > MAX_NODE_RANKS * (MAX_KEY_BYTES + 1) + 4096:
        raise BadKey(f"a node key of {len(payload)} bytes")
    lines = payload.split(b"\n")
    try:
        head = json.loads(lines[0])
    except (UnicodeDecodeError, ValueError) as exc:
        raise BadKey(f"node key header not JSON: {exc}"[:80]) from None
    if not isinstance(head, dict) or head.get("v") != NODE_KEY_VERSION:
        raise BadKey("not a laggard node key of this version")
    if head.get("r") != run:
        raise BadKey(f"a node key of run {head.get('r')!r}, not {run!r}")
    if head.get("l") != leader:
        raise BadKey(f"leader {head.get('l')!r}'s node key under leader {leader}'s name")
    ranks, beat = head.get("k"), head.get("b")
    if not _count(beat):
        raise BadKey("bad node beat")
    if (not isinstance(ranks, list) or len(ranks) > MAX_NODE_RANKS
            or len(ranks) != len(lines) - 1 or not all(_count(r) for r in ranks)
            or len(set(ranks)) != len(ranks)):
        raise BadKey("the node key's ranks do not match its lines")
    return NodeKey(leader=leader, beat=beat, keys=dict(zip(ranks, lines[1:], strict=True)))


def _count(value: Any) -> TypeGuard[int]:
    """A counter: a non-negative int (not a bool) exact as a float."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 53


def _age(value: Any) -> TypeGuard[float]:
    """An age: a finite non-negative number (not a bool)."""
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value) and value >= 0)


def _runs(ranks: Sequence[int] | None) -> list[list[int]] | None:
    """Ranks as ``[start, count, stride]`` runs (a TP, PP or DP group is one); None when
    more than :data:`MAX_MEMBER_RUNS` are needed."""
    if not ranks:
        return None
    runs: list[list[int]] = []
    i = 0
    while i < len(ranks):
        start = ranks[i]
        stride = ranks[i + 1] - start if i + 1 < len(ranks) else 1
        count = 1
        while i + count < len(ranks) and ranks[i + count] - ranks[i + count - 1] == stride:
            count += 1
        runs.append([start, count, stride])
        i += count
        if len(runs) > MAX_MEMBER_RUNS:
            return None
    return runs


def _unruns(runs: Any) -> tuple[int, ...] | None:
    """The ranks of ``[start, count, stride]`` runs; None for anything else (too many runs, a
    malformed run, a count beyond 2**24). Every rank of a group lists the same runs, so the
    ranks are built once per distinct runs (:func:`_ranks_of`) and shared: rank 0 decodes a
    round of R keys in O(R + group sizes), not O(R x group size)."""
    if not isinstance(runs, list) or len(runs) > MAX_MEMBER_RUNS:
        return None
    if not all(isinstance(run, list) and len(run) == 3 and all(type(v) is int for v in run)
               for run in runs):
        return None  # plain ints only (a bool would hash as 1 and share a valid run's entry)
    return _ranks_of(tuple(tuple(run) for run in runs))


@functools.lru_cache(maxsize=4096)
def _ranks_of(runs: tuple[tuple[int, int, int], ...]) -> tuple[int, ...] | None:
    """:func:`_unruns` of runs already checked to be int triples."""
    out: list[int] = []
    for start, count, stride in runs:
        if not (_count(start) and _count(count) and 0 < count <= 1 << 24):
            return None
        out.extend(start + k * stride for k in range(count))
    return tuple(out)
