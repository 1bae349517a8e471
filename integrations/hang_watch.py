"""Rank 0's hang watch: every rank's store key read at one moment, silent ranks, a job that
stopped, the verdict of :func:`laggard.detectors.hang.classify_hang` and the report.

Pure logic on decoded keys (:mod:`laggard.integrations.heartbeat_key`) and rank 0's clock:
tests feed it plain data; the store thread of
:class:`~laggard.integrations.heartbeat.HeartbeatThreads` feeds it one read per interval while
rank 0's own training thread is quiet.

**What a snapshot of keys may say.** The keys of different ranks are written at different
moments. Each key says for how long its rank has been *quiet* (no phase change, no collective
issued or completed: :attr:`~laggard.integrations.heartbeat_key.RankSnapshot.quiet_seconds`); a
rank is read as hung only when every rank that still writes has been quiet for longer than the
spread of the write times (:meth:`HangWatch.quiet_after`, at least the silence threshold), so
the keys describe one moment of a job in which nothing moved. A rank whose key has not changed
for :attr:`HangWatch.silent_after` seconds of rank 0's clock (3 write intervals and a second) is
*silent*. A job that is level (every rank at the same counts) is slow, not hung: no report.

**Host jobs.** On a gloo job (the default group's backend, read from ``torch.distributed`` when
it is loaded and initialised, or given as ``device=False``) the rules give no device verdict: a
collective a peer completed is still in progress, or waits on a stopped (silent) peer.

**Cleared.** When rank 0 makes progress again after a report
(:meth:`HangWatch.end_episode`), the watch logs one line, ``laggard: hang cleared after N s:
the job moves again``, to the ``laggard.hang`` logger the report went to.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from laggard.detectors import hang as hang_rules
from laggard.detectors.hang import GroupState, HangVerdict, RankState
from laggard.integrations.hang_message import hang_message, hung_step
from laggard.integrations.heartbeat_key import BadKey, RankKey, decode_key
from laggard.log_once import LogOnce
from laggard.wire import group_desc

__all__ = ["HangReport", "HangWatch", "HeartbeatStats"]

# The heartbeat's logger, which the watch's warnings have always gone to (the heartbeat and its
# watch are one component to a reader of the job's log).
log = logging.getLogger("laggard.integrations.heartbeat")
#: The hang report's logger (the heartbeat logs the report there; the cleared line follows it).
hang_log = logging.getLogger("laggard.hang")


def _device_job() -> bool:
    """Whether the job's collectives may run on a device: False only when ``torch.distributed``
    is loaded, initialised, and its default group's backend is ``gloo`` alone (a CPU job);
    True where that cannot be read (no device verdict is then ruled out)."""
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            return str(dist.get_backend()).lower() != "gloo"
    except Exception:  # noqa: BLE001 - an unreadable backend: keep every verdict possible
        return True
    return True


@dataclass(slots=True)
class HeartbeatStats:
    """What the heartbeat threads and rank 0's watch did; counters, never reset (one object,
    shared by the sender threads and the :class:`HangWatch` they feed).

    Attributes:
        sent: heartbeat datagrams handed to the kernel.
        send_dropped: datagrams dropped, the agent's queue full (``EAGAIN``).
        send_errors: datagrams that failed otherwise (no agent: ``ECONNREFUSED``...).
        store_writes: keys written to the store (a leader's node keys, a rank's own keys).
        store_reads: rank 0's reads of every rank's keys.
        keys_to_leader: keys a rank handed to its node's leader over the local socket.
        leader_lost: times a rank found its node's leader gone (no ack for two intervals, or
            no local socket) and began writing its own key.
        own_keys_read: rank 0: ranks' own keys read (ranks no fresh node key speaks for).
        store_errors: store operations that failed (an unreachable store, a timeout); the
            thread backs off, doubling its wait up to a minute.
        bad_keys: keys rank 0 could not use (another run's, another rank's or node's,
            garbled, oversized), or a leader refused from a rank of its node.
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
    keys_to_leader: int = 0
    leader_lost: int = 0
    own_keys_read: int = 0
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
        message: the line logged (without the ``laggard:`` prefix;
            :func:`~laggard.integrations.hang_message.hang_message`).
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


class HangWatch:
    """Rank 0's reading of every rank's key: silent ranks, a job that stopped, the verdict
    (see the module docstring).

    Args:
        run: the training run (another run's key is bad input).
        world_size: ranks in the job.
        interval: seconds between two writes of a rank's key (and between rank 0's reads).
        classify: the hang rules; None: :func:`laggard.detectors.hang.classify_hang`, looked up
            at each call (tests pass a stand-in).
        stats: where to count (a :class:`HeartbeatStats`; None: a new one).
        device: whether the job's collectives run on a device; None: read from
            ``torch.distributed`` at each classification (:func:`_device_job`).

    Attributes:
        silent_after: seconds a key must stay unchanged on rank 0's clock (while it watches)
            for its rank to be silent: 3 intervals and a second.
    """

    def __init__(self, *, run: str, world_size: int, interval: float,
                 classify: Callable[..., HangVerdict] | None = None,
                 stats: HeartbeatStats | None = None, device: bool | None = None) -> None:
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
        self._reported_at: float | None = None  # perf_counter of the episode's report
        self._quiet_at_report = 0.0  # how long rank 0 had been quiet then
        self.device = device
        self._log_once = LogOnce(log)

    def quiet_after(self, hang_after: float) -> float:
        """Seconds every writing rank must have been quiet for its keys to describe one
        moment: half the hang threshold, and at least the silence threshold (the spread of
        the write times of keys that are not silent)."""
        return max(hang_after / 2.0, self.silent_after)

    def end_episode(self, now: float | None = None) -> None:
        """Rank 0 made progress again: the next stop is a new episode (reported anew). After a
        report, logs ``hang cleared after N s`` once (N: since the job last moved, on rank 0's
        clock).

        Args:
            now: rank 0's ``perf_counter``, seconds (None: read now).
        """
        if self._reported and self._reported_at is not None:
            now = time.perf_counter() if now is None else now
            hang_log.warning("laggard: hang cleared after %.0f s: the job moves again",
                             max(0.0, now - self._reported_at + self._quiet_at_report))
        self._reported_at = None
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
            device = self.device if self.device is not None else _device_job()
            extra = {} if device else {"device": False}  # stand-in rules need not know it
            verdict = rules(states, world_size=self.world_size,
                            silent_after_seconds=self.silent_after, **extra)
        except Exception as exc:  # noqa: BLE001 - the rules' failure is no hang
            self.stats.classify_errors += 1
            self._log_once("classify", "laggard: the hang rules failed (%r); no hang report",
                           exc)
            return None
        if not verdict.culprits:
            return None  # level: slow, not hung
        self._reported = True
        self._reported_at, self._quiet_at_report = now, own_quiet
        message = hang_message(verdict, states, own_step)
        return HangReport(verdict=verdict, step=hung_step(verdict, states, own_step),
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
                       desc=group_desc(g.group), members=key.members.get(g.group), peer=g.peer,
                       op=g.op, pending_seconds=None if age is None else age + since)
            for g, age in zip(snap.groups, snap.pending_seconds, strict=True)
            if g.group not in self._restarted)
        return RankState(rank=rank, groups=groups, silent_seconds=silent_seconds,
                         step=snap.step, phase=snap.phase, phase_seconds=snap.phase_seconds)
