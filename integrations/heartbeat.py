"""The heartbeat: where each rank's training thread is, told by a thread that does not need it;
and rank 0 naming, through the job's own store, the ranks that hold a hung job up.

Two daemon threads per rank, started by :class:`~laggard.integrations.monitor.TrainingMonitor`
(``Config.heartbeat_seconds``, ``Config.hang_store_seconds``):

* **The heartbeat** sends a :class:`laggard.wire.Heartbeat` datagram about once a second
  through the monitor's agent socket: run, rank, world size, pid, node, the step the training
  thread is in, its phase and for how long (the monitor publishes each phase entry as one
  atomic assignment of a ``(name, perf_counter)`` tuple: ``outside`` between steps, ``step``
  inside a step between phases), the rank's typical step time (the median of its recent steps)
  and per watched group the tracer's progress (:meth:`~laggard.integrations.tracer.
  CollectiveTracer.progress`: issued and completed counts, last op, their ages). It reads a few
  attributes and copies a few integers under the tracer's short lock; it never takes a lock the
  training thread holds for long and never raises. When the training thread holds the GIL in
  native code for good the heartbeat stops too: that silence is the agent's evidence.
* **The hang store exchange** writes one small key per rank, every ``hang_store_seconds``
  (more rarely in a large job: at most ``Config.hang_store_writes_per_second`` writes reach the
  store, the job's ranks together), to the job's ``torch.distributed`` store (the default
  group's, ``distributed_c10d._get_default_store()``, cloned: its own connection and its own
  timeout, never the job's, whose timeout is global), under ``laggard/<run>/hb/<rank>``: its
  state (:func:`encode_key`). Rank 0, once its own training thread has made no progress for one
  interval, reads every rank's key each interval (``check`` first, so a missing key never
  blocks; then one ``multi_get``) and hands them to a :class:`HangWatch`, which reports a hang
  when the job has made no progress for longer than ``Config.hang_seconds`` (default
  ``max(10 s, 5 x`` the typical step)) and :func:`laggard.detectors.hang.classify_hang` names
  culprits. It is its own thread because a store operation can block (an unreachable store: up
  to the clone's timeout), and a blocked heartbeat would read as a silent rank.

One line per hang episode in rank 0's log (logger ``laggard.hang``, WARNING), e.g.::

    laggard: hung since step 4,812 in allreduce #20,537 of group dp: ranks 12 and 14 never
    issued it (last in phase data for 95 s)

and ``Config.on_hang(report)`` called once with a :class:`HangReport`. A job that is level
(every rank at the same counts, e.g. every rank in a long checkpoint-save step) is slow, not
hung: no report. Bad input (a key of another run, sequence numbers going backwards, an
unreachable store, a dead rank) is counted in :class:`HeartbeatStats`, never raised, never
reported as a hang by itself.

**What a snapshot of keys may say.** The keys of different ranks are written at different
moments. Each key says for how long its rank has been *quiet* (no phase change, no collective
issued or completed: :attr:`RankSnapshot.quiet_seconds`); a rank is read as hung only when every
rank that still writes has been quiet for longer than the spread of the write times
(:attr:`HangWatch.quiet_after`, at least the silence threshold), so the keys describe one
moment of a job in which nothing moved. A rank whose key has not changed for
:attr:`HangWatch.silent_after` seconds of rank 0's clock (3 write intervals and a second) is
*silent*.

**Store traffic** (``benchmarks/RESULTS.md``, Issue 24): per rank one ``set`` of a key of about
150 bytes plus 40 per group every interval (2 s: 30 writes, about 7 KB a minute with two
groups); rank 0 reads only while its own training thread is stopped. At 16,384 ranks the 2 s
interval would be 8,192 writes a second into the one store server, and each of rank 0's reads 3
MB; the write budget (500 a second) stretches the interval to 33 s there, which bounds the
store's load and makes in-job attribution take minutes: at that scale the agent's heartbeats and
Prometheus are the path.
"""

from __future__ import annotations

import atexit
import dataclasses
import datetime
import json
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from laggard.detectors import hang as hang_rules
from laggard.detectors.hang import GroupState, HangCulprit, HangVerdict, RankState
from laggard.wire import (
    CLOSED_PHASE,
    MAX_HEARTBEAT_GROUPS,
    GroupProgress,
    Heartbeat,
    check_run,
)

log = logging.getLogger(__name__)
#: The logger of the hang report (one WARNING line per hang episode, on rank 0).
hang_log = logging.getLogger("laggard.hang")

#: Version of the store key's format (:func:`encode_key`).
KEY_VERSION = 1
#: Largest store key value accepted (bytes); a larger one is counted as bad input.
MAX_KEY_BYTES = 8192
#: Keys whose existence rank 0 checks one by one in one read, at most (a key seen once stays).
MAX_CHECKS_PER_READ = 256
#: Member runs (``[start, count, stride]``) a key lists per group; a group needing more is sent
#: without its members.
_MAX_MEMBER_RUNS = 4
#: Timeout of the cloned store's operations, seconds (the job's own store is left as it is).
STORE_TIMEOUT_SECONDS = 10.0
#: Longest back-off between store attempts after errors, seconds.
_MAX_BACKOFF_SECONDS = 60.0
#: Phase the monitor publishes between steps, and inside a step between phases.
OUTSIDE, IN_STEP = "outside", "step"


@dataclass(slots=True)
class HeartbeatStats:
    """What the heartbeat threads did; counters, never reset.

    Attributes:
        sent: heartbeat datagrams handed to the kernel.
        send_dropped: datagrams dropped, the agent's queue full (``EAGAIN``).
        send_errors: datagrams that failed otherwise (no agent: ``ECONNREFUSED``...).
        store_writes: keys written to the store.
        store_reads: rank 0's reads of every rank's keys.
        store_errors: store operations that failed (an unreachable store, a timeout); the
            thread backs off, doubling its wait up to a minute.
        bad_keys: keys rank 0 could not use: another run's, another rank's, garbled,
            oversized.
        seq_backwards: a rank's sequence numbers for a group went backwards (a restarted
            group): that group is left out of the episode's classification.
        silent_ranks: ranks found silent at a classification (summed over classifications).
        classifications: times rank 0 handed a quiet job to the hang rules.
        classify_errors: times the hang rules raised (logged once; no report).
        hangs_reported: hang episodes reported (one log line, one ``on_hang`` call each).
        callback_errors: ``on_hang`` callbacks that raised (logged once).
        errors: the threads' own failures (a bug; logged once, the thread goes on).
    """

    sent: int = 0
    send_dropped: int = 0
    send_errors: int = 0
    store_writes: int = 0
    store_reads: int = 0
    store_errors: int = 0
    bad_keys: int = 0
    seq_backwards: int = 0
    silent_ranks: int = 0
    classifications: int = 0
    classify_errors: int = 0
    hangs_reported: int = 0
    callback_errors: int = 0
    errors: int = 0


@dataclass(frozen=True, slots=True)
class HangReport:
    """One hang episode, as rank 0 reports it (the argument of ``Config.on_hang``).

    Attributes:
        verdict: what :func:`~laggard.detectors.hang.classify_hang` found (its ``culprits``
            name rank, kind, group, sequence number and op).
        step: the step the job hung in (the culprits' lowest; rank 0's when they have none).
        seconds_since_progress: seconds since rank 0's training thread last made progress
            (a phase change, a collective issued or completed), on rank 0's clock.
        message: the line logged (without the ``laggard:`` prefix).
        run: the training run.
        states: the rank states the verdict was read from, by rank.
    """

    verdict: HangVerdict
    step: int
    seconds_since_progress: float
    message: str
    run: str = ""
    states: Mapping[int, RankState] | None = None

    @property
    def ranks(self) -> tuple[int, ...]:
        """The culprit ranks, sorted."""
        return self.verdict.ranks


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


def take_snapshot(source: Any, now: float | None = None) -> RankSnapshot:
    """Read the training thread's position off another thread (a few attribute reads and the
    tracer's copy of its counters).

    Args:
        source: the monitor, or anything with its attributes: ``where`` (``(phase,
            perf_counter at entry)``), ``step_index`` (int), ``typical_step_seconds()`` (float
            or None), ``tracer`` (a :class:`~laggard.integrations.tracer.CollectiveTracer` or
            None).
        now: ``time.perf_counter()`` (tests pass their own).

    Returns:
        The snapshot; raises only on a source without those attributes.
    """
    now = time.perf_counter() if now is None else now
    wall = time.time()
    phase, since = source.where
    phase_seconds = max(0.0, now - since)
    quiet = phase_seconds
    groups: list[GroupProgress] = []
    pending: list[float | None] = []
    members: dict[str, tuple[int, ...]] = {}
    tracer = source.tracer
    if tracer is not None:
        if getattr(tracer, "_pending", None) is not None:
            tracer.harvest()  # device events: query() only; keeps completions current
        for p in tracer.progress():
            issued_age = None if p.issued_at is None else max(0.0, now - p.issued_at)
            completed_age = None if p.completed_at is None else max(0.0, now - p.completed_at)
            for age in (issued_age, completed_age):
                if age is not None:
                    quiet = min(quiet, age)
            groups.append(GroupProgress(group=p.key, issued=p.issued, completed=p.completed,
                                        op=p.op, issued_age_seconds=issued_age,
                                        completed_age_seconds=completed_age, peer=p.peer))
            pending.append(None if p.pending_at is None else max(0.0, now - p.pending_at))
            members.setdefault(p.key, p.ranks)
    typical = source.typical_step_seconds()
    return RankSnapshot(step=int(source.step_index), phase=_short(str(phase)),
                        phase_seconds=phase_seconds, step_seconds=typical, quiet_seconds=quiet,
                        groups=tuple(groups), members=members, pending_seconds=tuple(pending),
                        wall=wall)


def heartbeat_datagram(snapshot: RankSnapshot, *, rank: int, world_size: int, run: str,
                       pid: int | None, node: str | None) -> bytes:
    """The :class:`laggard.wire.Heartbeat` datagram of one snapshot (at most
    :data:`~laggard.wire.MAX_HEARTBEAT_GROUPS` groups: the collective groups first)."""
    groups = sorted(snapshot.groups, key=lambda g: g.peer is not None)[:MAX_HEARTBEAT_GROUPS]
    return Heartbeat(
        rank=rank, world_size=world_size, step=snapshot.step, run=run, pid=pid,
        node=_short(node) if node else None, phase=snapshot.phase,
        phase_seconds=round(snapshot.phase_seconds, 3),
        step_seconds=None if snapshot.step_seconds is None else round(snapshot.step_seconds, 6),
        groups=[GroupProgress(group=g.group, issued=g.issued, completed=g.completed, op=g.op,
                              issued_age_seconds=_round(g.issued_age_seconds),
                              completed_age_seconds=_round(g.completed_age_seconds),
                              peer=g.peer) for g in groups],
    ).encode()


# ----------------------------------------------------------------------------- store keys
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
    """One rank's store key value: compact JSON, about 150 bytes plus 40 per group.

    ``{"v":1,"r":RUN,"k":RANK,"p":PID,"b":BEAT,"c":0|1,"w":WALL,"s":STEP,"ph":PHASE,
    "pa":PHASE_AGE,"q":QUIET,"t":TYPICAL_STEP,"g":[[GROUP,ISSUED,COMPLETED,OP,PEER,MEMBERS,
    PENDING_AGE],...]}`` with ages in seconds, WALL the writer's ``time.time()``, MEMBERS a
    list of ``[start, count, stride]`` runs of global ranks (or null).
    """
    members = snapshot.members or {}
    ages = snapshot.pending_seconds or (None,) * len(snapshot.groups)
    groups = [[g.group, g.issued, g.completed, g.op, g.peer,
               _runs(members.get(g.group)) if g.peer is None else None, _round(age)]
              for g, age in zip(snapshot.groups, ages, strict=True)]
    doc = {"v": KEY_VERSION, "r": run, "k": rank, "p": pid, "b": beat, "c": int(closed),
           "w": round(snapshot.wall, 3), "s": snapshot.step, "ph": snapshot.phase,
           "pa": round(snapshot.phase_seconds, 3), "q": round(snapshot.quiet_seconds, 3),
           "t": _round(snapshot.step_seconds), "g": groups}
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
    ages = [doc.get(k) for k in ("pa", "q")]
    typical = doc.get("t")
    if not (_count(step) and _count(pid) and _count(beat)):
        raise BadKey("bad step, pid or beat")
    if not isinstance(phase, str) or not 0 < len(phase) <= 64:
        raise BadKey("bad phase")
    wall = doc.get("w")
    if not all(_age(a) for a in (*ages, wall)) or not (typical is None or _age(typical)):
        raise BadKey("bad ages")
    snapshot = RankSnapshot(step=step, phase=phase, phase_seconds=float(ages[0]),
                            step_seconds=None if typical is None else float(typical),
                            quiet_seconds=float(ages[1]), groups=tuple(groups),
                            members=members, pending_seconds=tuple(pending), wall=float(wall))
    return RankKey(rank=rank, run=key_run, pid=pid, beat=beat, closed=bool(doc.get("c")),
                   snapshot=snapshot, members=members)


# ----------------------------------------------------------------------------- rank 0
class HangWatch:
    """Rank 0's reading of every rank's key: silent ranks, a job that stopped, the verdict.

    Pure logic on decoded keys and rank 0's clock (tests feed it plain data); the store thread
    feeds it one read per interval while rank 0's own training thread is quiet.

    Args:
        run: the training run (another run's key is bad input).
        world_size: ranks in the job.
        interval: seconds between two writes of a rank's key (and between rank 0's reads).
        classify: the hang rules; None: :func:`laggard.detectors.hang.classify_hang`, looked up
            at each call (tests pass a stand-in).
        stats: where to count (a :class:`HeartbeatStats`).

    Attributes:
        silent_after: seconds a key must stay unchanged on rank 0's clock (while it watches)
            for its rank to be silent: 3 intervals and a second.
    """

    def __init__(self, *, run: str, world_size: int, interval: float,
                 classify: Callable[..., HangVerdict] | None = None,
                 stats: HeartbeatStats | None = None) -> None:
        self.run = run
        self.world_size = world_size
        self.interval = interval
        self.classify = classify
        self.stats = stats if stats is not None else HeartbeatStats()
        self.silent_after = 3.0 * interval + 1.0
        # rank -> (pid, beat, rank 0's clock when that beat was first seen)
        self._seen: dict[int, tuple[int, int, float]] = {}
        # (rank, group, peer) -> the highest issued count seen from that writer (pid)
        self._issued: dict[tuple[int, str, int | None], tuple[int, int]] = {}
        self._restarted: set[str] = set()  # groups whose counters went back this episode
        self._watch_since: float | None = None
        self._reported = False
        self._logged: set[str] = set()

    def quiet_after(self, hang_after: float) -> float:
        """Seconds every writing rank must have been quiet for its keys to describe one
        moment: half the hang threshold, and at least the silence threshold (the spread of
        the write times of keys that are not silent)."""
        return max(hang_after / 2.0, self.silent_after)

    def end_episode(self) -> None:
        """Rank 0 made progress again: the next stop is a new episode (reported anew)."""
        self._watch_since = None
        self._reported = False
        self._restarted.clear()

    def observe(self, now: float, payloads: Mapping[int, bytes | None], *, own_quiet: float,
                hang_after: float, own_step: int, wall: float | None = None,
                ) -> HangReport | None:
        """Read one round of keys; the report when this round shows a hang to report.

        Args:
            now: rank 0's ``perf_counter``, seconds.
            payloads: rank -> its key's value, None where it has none (never written, or not
                read this round).
            own_quiet: seconds since rank 0's training thread last made progress.
            hang_after: the hang threshold, seconds.
            own_step: rank 0's step (the report's step when the culprits name none).
            wall: rank 0's ``time.time()`` (None: now), to age the keys' pending times.

        Returns:
            A :class:`HangReport` the first time in an episode that the job is quiet past the
            threshold and the rules name culprits; else None. Never raises on bad keys.
        """
        wall = time.time() if wall is None else wall
        if self._watch_since is None:
            self._watch_since = now
        watched = now - self._watch_since
        keys: dict[int, RankKey] = {}
        for rank in range(self.world_size):
            payload = payloads.get(rank)
            if payload is None:
                continue
            try:
                key = decode_key(payload, run=self.run, rank=rank)
            except BadKey as exc:
                self.stats.bad_keys += 1
                self._log_once("bad", "laggard: a hang-store key for rank %d is not usable "
                               "(%s); counted, the rank is read as without a key", rank, exc)
                continue
            keys[rank] = key
            seen = self._seen.get(rank)
            if seen is None or seen[:2] != (key.pid, key.beat):
                self._seen[rank] = (key.pid, key.beat, now)
            self._check_backwards(key)
        if self._reported or own_quiet < hang_after:
            return None
        if any(k.closed for k in keys.values()):
            return None  # a rank has left the loop: the job is ending, not hung
        states: dict[int, RankState] = {}
        silent = 0
        quiet_after = self.quiet_after(hang_after)
        for rank in range(self.world_size):
            key = keys.get(rank)
            since = self._seen[rank][2] if key is not None else self._watch_since
            unchanged = min(now - since, watched)
            if unchanged >= self.silent_after:
                silent += 1
                states[rank] = self._state(rank, key, wall, silent_seconds=unchanged)
            elif key is None:
                return None  # no key yet, not yet silent: wait for it
            elif key.snapshot.quiet_seconds < quiet_after:
                return None  # this rank moved recently: slow, or not yet a consistent moment
            else:
                states[rank] = self._state(rank, key, wall)
        self.stats.classifications += 1
        self.stats.silent_ranks += silent
        try:
            rules = self.classify or hang_rules.classify_hang
            verdict = rules(states, world_size=self.world_size,
                            silent_after_seconds=self.silent_after)
        except Exception as exc:  # noqa: BLE001 - the rules' failure is no hang
            self.stats.classify_errors += 1
            self._log_once("classify", "laggard: the hang rules failed (%r); no hang report",
                           exc)
            return None
        if not verdict.culprits:
            return None  # level: slow, not hung
        self._reported = True
        message = hang_message(verdict, states, own_step)
        return HangReport(verdict=verdict, step=_hung_step(verdict, states, own_step),
                          seconds_since_progress=own_quiet, message=message, run=self.run,
                          states=states)

    def _check_backwards(self, key: RankKey) -> None:
        for g in key.snapshot.groups:
            where = (key.rank, g.group, g.peer)
            before = self._issued.get(where)
            if before is not None and before[0] == key.pid and g.issued < before[1]:
                self.stats.seq_backwards += 1
                self._restarted.add(g.group)
                self._log_once("backwards", "laggard: rank %d's sequence numbers in group %s "
                               "went back from %d to %d (a restarted group); counted, the group "
                               "is left out of hang attribution until rank 0 progresses",
                               key.rank, g.group, before[1], g.issued)
            self._issued[where] = (key.pid, g.issued)

    def _state(self, rank: int, key: RankKey | None, wall: float,
               silent_seconds: float | None = None) -> RankState:
        if key is None:
            return RankState(rank=rank, silent_seconds=silent_seconds)
        snap = key.snapshot
        since = max(0.0, wall - snap.wall)  # the key's age on the wall clocks
        groups = tuple(
            GroupState(group=g.group, issued=g.issued, completed=g.completed,
                       desc=_desc(g.group), members=key.members.get(g.group), peer=g.peer,
                       op=g.op, pending_seconds=None if age is None else age + since)
            for g, age in zip(snap.groups, snap.pending_seconds, strict=True)
            if g.group not in self._restarted)
        return RankState(rank=rank, groups=groups, silent_seconds=silent_seconds,
                         step=snap.step, phase=snap.phase, phase_seconds=snap.phase_seconds)

    def _log_once(self, key: str, msg: str, *args: object) -> None:
        if key not in self._logged:
            self._logged.add(key)
            log.warning(msg, *args)


def hang_message(verdict: HangVerdict, states: Mapping[int, RankState], own_step: int) -> str:
    """The one line that says who holds the job up, e.g. ``hung since step 4,812 in allreduce
    #20,537 of group dp: ranks 12 and 14 never issued it (last in phase data for 95 s)``;
    clauses of several groups or kinds joined by ``; ``."""
    clauses: dict[tuple[Any, ...], list[HangCulprit]] = {}
    for c in verdict.culprits:
        clauses.setdefault((c.kind, c.group, c.seq, c.op, c.peer), []).append(c)
    parts = []
    for (kind, group, seq, op, peer), culprits in clauses.items():
        ranks = sorted({c.rank for c in culprits})
        who = _ranks_text(ranks)
        desc = culprits[0].desc or _desc(group)
        where = ""
        if seq is not None:
            where = f"{op or 'collective'} #{seq:,} of group {desc}"
            if peer is not None:
                where += f" (with rank {peer})"
        if kind == "missing":
            text = f"{who} never issued it" if where else f"{who} never issued the next"
        elif kind == "device":
            text = f"{who} issued it and never completed it (stuck on the device)"
        else:
            seconds = max((states[r].silent_seconds or 0.0) for r in ranks if r in states)
            text = (f"{who} stopped reporting {seconds:.0f} s ago (holding the GIL, stuck in "
                    "native code, or gone)")
        text += _phase_text(ranks, states)
        parts.append(f"in {where}: {text}" if where else text)
    sep = " " if parts and parts[0].startswith("in ") else ": "
    return f"hung since step {_hung_step(verdict, states, own_step):,}{sep}" + "; ".join(parts)


def _hung_step(verdict: HangVerdict, states: Mapping[int, RankState], own_step: int) -> int:
    """The step the job stopped in: the lowest step of the culprits that still report, else of
    every rank that still reports (a silent rank's last key may be from long before it froze:
    its store thread could not run), else rank 0's own."""
    def fresh_steps(ranks: Iterable[int]) -> list[int]:
        return [s.step for r in ranks if (s := states.get(r)) is not None
                and s.step is not None and s.silent_seconds is None]
    steps = fresh_steps(verdict.ranks) or fresh_steps(states)
    return min(steps) if steps else own_step


def _phase_text(ranks: Sequence[int], states: Mapping[int, RankState]) -> str:
    """`` (last in phase data for 95 s)`` for culprits sharing a phase, per rank otherwise;
    for silent ranks `` (last heard at step 29, in phase backward)``: their last key is from
    before they froze, so its phase age says nothing of now."""
    known = [(r, s) for r in ranks if (s := states.get(r)) is not None and s.phase is not None]
    if not known:
        return ""
    if any(s.silent_seconds is not None for _, s in known):
        shown = ", ".join(f"rank {r} at step {s.step}, in phase {s.phase}" if len(known) > 1
                          else f"at step {s.step}, in phase {s.phase}" for r, s in known[:4])
        return f" (last heard {shown}{', ...' if len(known) > 4 else ''})"
    phases = {s.phase for _, s in known}
    if len(phases) == 1:
        seconds = max(s.phase_seconds or 0.0 for _, s in known)
        return f" (last in phase {known[0][1].phase} for {seconds:.0f} s)"
    shown = ", ".join(f"rank {r} in {s.phase} for {s.phase_seconds or 0.0:.0f} s"
                      for r, s in known[:4])
    return f" (last {shown}{', ...' if len(known) > 4 else ''})"


def _ranks_text(ranks: Sequence[int]) -> str:
    """``rank 3``, ``ranks 12 and 14``, ``ranks 1, 2 and 5``; beyond 8, ``... and N more``."""
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    if len(ranks) > 8:
        return f"ranks {', '.join(map(str, ranks[:6]))} and {len(ranks) - 6} more"
    return f"ranks {', '.join(map(str, ranks[:-1]))} and {ranks[-1]}"


# ----------------------------------------------------------------------------- the threads
class HeartbeatThreads:
    """The heartbeat thread and the hang store thread of one rank; see the module docstring.

    Args:
        source: the monitor (or a stand-in with its attributes: :func:`take_snapshot`).
        rank, world_size, run, node: this rank's identity.
        send: sends one datagram (the monitor's agent socket's ``send``); None: no datagrams.
            May raise ``BlockingIOError`` / ``OSError`` (counted).
        heartbeat_seconds: seconds between datagrams; 0: none.
        store: the job's store (None: the default group's, when there is one); store_seconds:
            the interval of the key writes (0: no store exchange); writes_per_second: the
            job's write budget (stretches the interval to ``world_size / writes_per_second``).
        hang_seconds: the hang threshold; None: ``max(10 s, 5 x`` rank 0's typical step).
        on_hang: called with each :class:`HangReport` (rank 0, the store thread).
        classify: the hang rules; None: :func:`laggard.detectors.hang.classify_hang`.

    Attributes:
        stats: :class:`HeartbeatStats`.
        reports: the hang reports rank 0 made (at most 16 kept).
        interval: seconds between two key writes.
    """

    def __init__(self, source: Any, *, rank: int, world_size: int, run: str = "",
                 node: str | None = None, send: Callable[[bytes], Any] | None = None,
                 heartbeat_seconds: float = 1.0, store: Any = None,
                 store_seconds: float = 2.0, writes_per_second: float = 500.0,
                 hang_seconds: float | None = None,
                 on_hang: Callable[[HangReport], Any] | None = None,
                 classify: Callable[..., HangVerdict] | None = None) -> None:
        self.source = source
        self.rank = rank
        self.world_size = world_size
        self.run = run
        self.node = node
        self.pid = os.getpid()
        self._send = send
        self.heartbeat_seconds = heartbeat_seconds
        self.interval = max(store_seconds, world_size / writes_per_second) if (
            store_seconds > 0) else 0.0
        self.hang_seconds = hang_seconds
        self.on_hang = on_hang
        self.stats = HeartbeatStats()
        self.reports: list[HangReport] = []
        self._store = store
        self._classify = classify
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._logged: set[str] = set()
        self._beat = 0
        self._known: set[int] = set()  # ranks whose key is known to exist

    def start(self) -> HeartbeatThreads:
        """Start the threads. They are daemon threads, and :meth:`close` is also registered
        with ``atexit``: a job that never closes its monitor exits anyway, its threads joined
        before the interpreter finalizes (none is left inside a store call) and its key marked
        closed (rank 0 reads a rank that finished as gone, not silent)."""
        if self._send is not None and self.heartbeat_seconds > 0:
            self._threads.append(threading.Thread(target=self._beat_loop, daemon=True,
                                                  name="laggard-heartbeat"))
        if self.interval > 0 and self.world_size > 1:
            self._threads.append(threading.Thread(target=self._store_loop, daemon=True,
                                                  name="laggard-hang-store"))
        for thread in self._threads:
            thread.start()
        if self._threads:
            atexit.register(self.close)
        return self

    def close(self, timeout: float = 2.0) -> None:
        """Stop both threads (the store thread writes its key once more, marked closed, so
        rank 0 reads this rank as gone, not silent). Waits at most ``timeout`` seconds per
        thread; never raises."""
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout)
        self._threads = []
        atexit.unregister(self.close)

    def hang_after(self) -> float:
        """The hang threshold now: ``hang_seconds``, else ``max(10 s, 5 x`` the typical
        step)."""
        if self.hang_seconds is not None:
            return self.hang_seconds
        typical = None
        try:
            typical = self.source.typical_step_seconds()
        except Exception:  # noqa: BLE001
            pass
        return max(10.0, 5.0 * typical) if typical else 10.0

    # ----------------------------------------------------------------------- heartbeat
    def _beat_loop(self) -> None:
        while True:
            stopping = self._stop.wait(self.heartbeat_seconds)
            try:
                snapshot = take_snapshot(self.source)
                if stopping:  # the goodbye: the agent lets the rank expire, not stall
                    snapshot = dataclasses.replace(snapshot, phase=CLOSED_PHASE)
                payload = heartbeat_datagram(snapshot, rank=self.rank,
                                             world_size=self.world_size, run=self.run,
                                             pid=self.pid, node=self.node)
            except Exception as exc:  # noqa: BLE001 - never fail, never stop beating
                self._error("beat", exc)
                if stopping:
                    return
                continue
            self._send_beat(payload)
            if stopping:
                return

    def _send_beat(self, payload: bytes) -> None:
        try:
            self._send(payload)  # type: ignore[misc]
        except OSError as exc:  # EAGAIN: the agent's queue is full; else no agent
            full = isinstance(exc, BlockingIOError)
            self.stats.send_dropped += full
            self.stats.send_errors += not full
            if not full:
                self._log_once("send", "laggard: cannot send heartbeats (%s); counting, "
                               "not retrying", exc)
        except Exception as exc:  # noqa: BLE001
            self._error("send", exc)
        else:
            self.stats.sent += 1

    # ----------------------------------------------------------------------- the store
    def _store_loop(self) -> None:
        store = self._open_store()
        if store is None:
            return
        watch = HangWatch(run=self.run, world_size=self.world_size, interval=self.interval,
                          classify=self._classify, stats=self.stats) if self.rank == 0 else None
        wait = 0.0  # first key at once: it exists before rank 0 reads it
        failures = 0
        while not self._stop.wait(wait):
            ok = True
            try:
                snapshot = take_snapshot(self.source)
                ok = self._write(store, snapshot)
                if ok and watch is not None:
                    ok = self._watch(store, watch, snapshot)
            except Exception as exc:  # noqa: BLE001
                self._error("store", exc)
            failures = 0 if ok else failures + 1
            wait = min(_MAX_BACKOFF_SECONDS, self.interval * 2 ** min(failures, 6))
        try:
            self._write(store, take_snapshot(self.source), closed=True)
        except Exception as exc:  # noqa: BLE001
            self._error("store", exc)

    def _open_store(self) -> Any:
        """A clone of the job's store (its own connection and timeout) under this run's
        prefix; None when there is no store (counted, logged once)."""
        try:
            import torch.distributed as dist

            store = self._store
            if store is None:
                from torch.distributed import distributed_c10d

                store = distributed_c10d._get_default_store()
            try:
                store = store.clone()
                store.set_timeout(datetime.timedelta(seconds=STORE_TIMEOUT_SECONDS))
            except Exception as exc:  # noqa: BLE001 - a store that cannot clone: used as is
                self._log_once("clone", "laggard: the job's store cannot be cloned (%r); the "
                               "hang exchange uses it with the job's own timeout", exc)
            return dist.PrefixStore(f"laggard/{self.run}/", store)
        except Exception as exc:  # noqa: BLE001
            self.stats.store_errors += 1
            self._log_once("store", "laggard: no torch.distributed store (%r); no in-job hang "
                           "attribution (the agent's heartbeats still go)", exc)
            return None

    def _write(self, store: Any, snapshot: RankSnapshot, closed: bool = False) -> bool:
        self._beat += 1
        payload = encode_key(snapshot, rank=self.rank, run=self.run, pid=self.pid,
                             beat=self._beat, closed=closed)
        try:
            store.set(f"hb/{self.rank}", payload)
        except Exception as exc:  # noqa: BLE001 - an unreachable store: counted, backed off
            self._store_error(exc)
            return False
        self.stats.store_writes += 1
        return True

    def _watch(self, store: Any, watch: HangWatch, snapshot: RankSnapshot) -> bool:
        """Rank 0: read every key while its own training thread is quiet, and report."""
        quiet = snapshot.quiet_seconds
        if quiet < self.interval:
            watch.end_episode()
            return True
        try:
            payloads = self._read(store)
        except Exception as exc:  # noqa: BLE001
            self._store_error(exc)
            return False
        self.stats.store_reads += 1
        report = watch.observe(time.perf_counter(), payloads, own_quiet=quiet,
                               hang_after=self.hang_after(), own_step=snapshot.step)
        if report is not None:
            self._report(report)
        return True

    def _read(self, store: Any) -> dict[int, bytes | None]:
        """Every rank's key; ``check`` first for keys not yet seen, so a missing key never
        blocks; at most :data:`MAX_CHECKS_PER_READ` such checks per read."""
        unknown = [r for r in range(self.world_size) if r not in self._known]
        if unknown:
            names = [f"hb/{r}" for r in unknown]
            if store.check(names):
                self._known.update(unknown)
            else:
                for r in unknown[:MAX_CHECKS_PER_READ]:
                    if store.check([f"hb/{r}"]):
                        self._known.add(r)
        ranks = sorted(self._known)
        values = store.multi_get([f"hb/{r}" for r in ranks]) if ranks else []
        out: dict[int, bytes | None] = dict.fromkeys(range(self.world_size))
        for r, value in zip(ranks, values, strict=True):
            out[r] = bytes(value)
        return out

    def _report(self, report: HangReport) -> None:
        self.stats.hangs_reported += 1
        self.reports.append(report)
        del self.reports[:-16]
        hang_log.warning("laggard: %s", report.message)
        if self.on_hang is not None:
            try:
                self.on_hang(report)
            except Exception as exc:  # noqa: BLE001 - the user's callback never kills us
                self.stats.callback_errors += 1
                self._log_once("on_hang", "laggard: on_hang raised %r (ignored)", exc)

    # ----------------------------------------------------------------------- helpers
    def _store_error(self, exc: BaseException) -> None:
        self.stats.store_errors += 1
        self._log_once("store_op", "laggard: the job's store failed a hang-exchange operation "
                       "(%r); counted, retried with back-off; no hang is reported without it",
                       exc)

    def _error(self, where: str, exc: BaseException) -> None:
        self.stats.errors += 1
        self._log_once(f"error:{where}", "laggard: heartbeat error in %s: %r (ignored)", where,
                       exc)

    def _log_once(self, key: str, msg: str, *args: object) -> None:
        if key not in self._logged:
            self._logged.add(key)
            log.warning(msg, *args)


# ----------------------------------------------------------------------------- helpers
def _short(text: str) -> str:
    return text[:64] or "?"


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 53


def _age(value: Any) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value) and value >= 0)


def _desc(group: str) -> str:
    """A group key's description (``dp:3`` -> ``dp``)."""
    return group.rsplit(":", 1)[0] if ":" in group else group


def _runs(ranks: Sequence[int] | None) -> list[list[int]] | None:
    """Ranks as ``[start, count, stride]`` runs (a TP, PP or DP group is one); None when
    more than :data:`_MAX_MEMBER_RUNS` are needed."""
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
        if len(runs) > _MAX_MEMBER_RUNS:
            return None
    return runs


def _unruns(runs: Any) -> tuple[int, ...] | None:
    if not isinstance(runs, list) or len(runs) > _MAX_MEMBER_RUNS:
        return None
    out: list[int] = []
    for run in runs:
        if (not isinstance(run, list) or len(run) != 3 or not all(_count(v) for v in run[:2])
                or not isinstance(run[2], int) or not 0 < run[1] <= 1 << 24):
            return None
        start, count, stride = run
        out.extend(start + k * stride for k in range(count))
    return tuple(out)


__all__ = ["HangReport", "HangWatch", "HeartbeatStats", "HeartbeatThreads", "RankKey",
           "RankSnapshot", "decode_key", "encode_key", "hang_message", "heartbeat_datagram",
           "take_snapshot"]
