"""The heartbeat: where each rank's training thread is, told by a thread that does not need it;
and rank 0 naming, through the job's own store, the ranks that hold a hung job up.

The public entry of the heartbeat (the monitor starts :class:`HeartbeatThreads`); its rooms:

* this module: the sender, two daemon threads per rank (:class:`HeartbeatThreads`), and what
  they read and send (:func:`take_snapshot`, :func:`heartbeat_datagram`);
* :mod:`laggard.integrations.heartbeat_key`: the store key, what one rank says about itself
  (:class:`~laggard.integrations.heartbeat_key.RankSnapshot`) and its codec;
* :mod:`laggard.integrations.hang_watch`: rank 0's reading of every key
  (:class:`~laggard.integrations.hang_watch.HangWatch`), :class:`HangReport`,
  :class:`HeartbeatStats`;
* :mod:`laggard.integrations.hang_message`: the one line logged per hang.

Two daemon threads per rank, started by :class:`~laggard.integrations.monitor.TrainingMonitor`
(``Config.heartbeat_seconds``, ``Config.hang_store_seconds``):

* **The heartbeat** sends a :class:`laggard.wire.Heartbeat` datagram about once a second
  through the monitor's connection to the agent's socket (a Unix datagram socket by default;
  UDP on loopback optional): run, rank, world size, pid, node, the step the training
  thread is in, its phase and for how long (the monitor publishes each phase entry as one
  atomic assignment of a ``(name, perf_counter)`` tuple: ``outside`` between steps, ``step``
  inside a step between phases), the rank's typical step time (the median of its recent steps)
  and per watched group the tracer's progress (:meth:`~laggard.integrations.tracer.
  CollectiveTracer.progress`: issued and completed counts, last op, their ages). It reads a few
  attributes and copies a few integers under the tracer's short lock; it never takes a lock the
  training thread holds for long and never raises. When the training thread holds the GIL in
  native code for good the heartbeat stops too: that silence is the agent's evidence.
* **The hang store exchange** puts every rank's state in the job's ``torch.distributed`` store
  (the default group's, ``distributed_c10d._get_default_store()``, cloned: its own connection
  and its own timeout, never the job's, whose timeout is global), **one key per node**: each
  rank hands its key (:func:`~laggard.integrations.heartbeat_key.encode_key`) every
  ``hang_store_seconds`` to its node's local leader over a local datagram socket, and the
  leader writes one key for its node's ranks under ``laggard/<run>/hb/n/<leader>``
  (:func:`~laggard.integrations.heartbeat_key.encode_node_key`) each interval (more rarely in
  a large job: at most ``Config.hang_store_writes_per_second`` writes reach the store, the
  job's leaders together). A rank whose leader stops acking writes its own key
  ``hb/<rank>`` (:mod:`laggard.integrations.heartbeat_node`). Rank 0, once its own training
  thread has made no progress for one interval, reads the round each interval
  (:class:`~laggard.integrations.hang_read.RoundReader`: node keys, and the own keys of ranks
  no fresh node key speaks for, ``check`` first so a missing key never blocks, then
  ``multi_get`` in batches) and hands it to a
  :class:`~laggard.integrations.hang_watch.HangWatch`, which reports a hang when the job has
  made no progress for longer than ``Config.hang_seconds`` (default ``max(10 s, 5 x`` the
  typical step)) and :func:`laggard.detectors.hang.classify_hang` names culprits. It is its own
  thread because a store operation can block (an unreachable store: up to the clone's timeout),
  and a blocked heartbeat would read as a silent rank.

One line per hang episode in rank 0's log (logger ``laggard.hang``, WARNING), e.g.::

    laggard: hung since step 4,812 in allreduce #20,537 of group dp: ranks 12 and 14 never
    issued it (last in phase data for 95 s)

and ``Config.on_hang(report)`` called once with a :class:`HangReport`. A job that is level
(every rank at the same counts, e.g. every rank in a long checkpoint-save step) is slow, not
hung: no report. Bad input (a key of another run, sequence numbers going backwards, an
unreachable store, a dead rank) is counted in :class:`HeartbeatStats`, never raised, never
reported as a hang by itself.

**Store traffic** (``benchmarks/hang_round.py``): per node one ``set`` of about 230 bytes a
rank (8 ranks: 1.9 KB) every interval; rank 0 reads only while its own training thread is
stopped. The write budget (500 a second) stretches the interval to ``nodes / 500`` s: 4.1 s at
2,048 nodes of 8 (16,384 ranks), 16.4 s at 8,192 (65,536 ranks), where one key per rank took
33 s and 131 s; a real ``TCPStore`` takes such writes at tens of thousands a second, so the
budget, not the store, sets the pace, and leaves the job's own store traffic room.
"""

from __future__ import annotations

import atexit
import dataclasses
import datetime
import logging
import math
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from laggard.detectors.hang import HangVerdict
from laggard.integrations.hang_read import RoundReader, node_key_name, rank_key_name
from laggard.integrations.hang_watch import HangReport, HangWatch, HeartbeatStats
from laggard.integrations.heartbeat_key import RankSnapshot, encode_key, encode_node_key
from laggard.integrations.heartbeat_node import ACK, NodeCollector, NodeLayout, NodeLink, job_tag
from laggard.log_once import LogOnce
from laggard.wire import (
    CLOSED_PHASE,
    MAX_HEARTBEAT_GROUPS,
    GroupProgress,
    Heartbeat,
    round_age,
)

log = logging.getLogger(__name__)
#: The logger of the hang report (one WARNING line per hang episode, on rank 0).
hang_log = logging.getLogger("laggard.hang")

#: Timeout of the cloned store's operations, seconds (the job's own store is left as it is).
STORE_TIMEOUT_SECONDS = 10.0
#: Longest back-off between store attempts after errors, seconds.
_MAX_BACKOFF_SECONDS = 60.0
#: Phase the monitor publishes between steps, and inside a step between phases.
OUTSIDE, IN_STEP = "outside", "step"


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
        for p in tracer.progress(now):
            for age in (p.issued_age_seconds, p.completed_age_seconds):
                if age is not None:
                    quiet = min(quiet, age)
            groups.append(p)
            pending.append(p.pending_age_seconds)
            members.setdefault(p.group, p.ranks)
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
        phase_seconds=round_age(snapshot.phase_seconds),
        step_seconds=None if snapshot.step_seconds is None else round(snapshot.step_seconds, 6),
        groups=[g.rounded() for g in groups],
    ).encode()


# ----------------------------------------------------------------------------- the threads
class HeartbeatThreads:
    """The heartbeat thread and the hang store thread of one rank; see the module docstring.

    Args:
        source: the monitor (or a stand-in with its attributes: :func:`take_snapshot`).
        rank, world_size, run, node: this rank's identity.
        send: sends one datagram to the agent's socket (the monitor's
            :class:`~laggard.integrations.agent_socket.AgentSocket` ``send``); None: none.
            May raise ``BlockingIOError`` / ``OSError`` (counted).
        heartbeat_seconds: seconds between datagrams; 0: none.
        store: the job's store (None: the default group's, when there is one); store_seconds:
            the interval of the key writes (0: no store exchange); writes_per_second: the
            job's write budget (stretches the interval to ``nodes / writes_per_second``).
        local_rank, local_world_size: this rank's place on its node (None:
            ``$LOCAL_RANK``, ``$LOCAL_WORLD_SIZE``; :class:`~laggard.integrations.
            heartbeat_node.NodeLayout`); link_job: the name of the job's node sockets (None:
            :func:`~laggard.integrations.heartbeat_node.job_tag` of the run).
        hang_seconds: the hang threshold; None: ``max(10 s, 5 x`` rank 0's typical step).
        on_hang: called with each :class:`HangReport` (rank 0, the store thread).
        classify: the hang rules; None: :func:`laggard.detectors.hang.classify_hang`.

    Attributes:
        stats: :class:`HeartbeatStats`.
        reports: the hang reports rank 0 made (at most 16 kept).
        layout: the rank's node (:class:`~laggard.integrations.heartbeat_node.NodeLayout`).
        interval: seconds between two node key writes (and rank 0's reads):
            ``max(store_seconds, nodes / writes_per_second)``.
        rank_interval: seconds between two writes of a rank's own key where it has no node
            socket: ``max(store_seconds, world_size / writes_per_second)``.
        fallback_after: seconds without the leader's ack after which a member writes its own
            key: two intervals and one ``store_seconds``.
    """

    def __init__(self, source: Any, *, rank: int, world_size: int, run: str = "",
                 node: str | None = None, send: Callable[[bytes], Any] | None = None,
                 heartbeat_seconds: float = 1.0, store: Any = None,
                 store_seconds: float = 2.0, writes_per_second: float = 500.0,
                 hang_seconds: float | None = None,
                 on_hang: Callable[[HangReport], Any] | None = None,
                 classify: Callable[..., HangVerdict] | None = None,
                 local_rank: int | None = None, local_world_size: int | None = None,
                 link_job: str | None = None) -> None:
        self.source = source
        self.rank = rank
        self.world_size = world_size
        self.run = run
        self.node = node
        self.pid = os.getpid()
        self._send = send
        self.heartbeat_seconds = heartbeat_seconds
        self.layout = (NodeLayout.from_env(rank, world_size, local_rank)
                       if local_world_size is None else
                       NodeLayout.of(rank, world_size, local_rank, local_world_size))
        self.store_seconds = store_seconds
        self.interval = max(store_seconds, self.layout.nodes / writes_per_second) if (
            store_seconds > 0) else 0.0
        self.rank_interval = max(store_seconds, world_size / writes_per_second)
        self.fallback_after = 2.0 * self.interval + store_seconds
        self.link_job = link_job if link_job is not None else job_tag(run)
        self.hang_seconds = hang_seconds
        self.on_hang = on_hang
        self.stats = HeartbeatStats()
        self.reports: list[HangReport] = []
        self._store = store
        self._classify = classify
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._log_once = LogOnce(log)
        self._beat = 0
        #: rank 0's reader of rounds
        self.reader = RoundReader(run=run, layout=self.layout, interval=self.interval,
                                  stats=self.stats)

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
        link = self._open_link()
        try:
            if self.layout.is_leader:
                self._lead(store, link)
            else:
                self._follow(store, link)
        finally:
            if link is not None:
                link.close()

    def _lead(self, store: Any, link: NodeLink | None) -> None:
        """A node's leader (every rank of a one-rank node, rank 0 too): each interval, read
        its members' keys off the local socket and ack them, and write the node key; rank 0
        also reads the round every ``store_seconds`` (not every interval: the hang is then
        named up to two intervals sooner, and reads cost the store no writes). After store
        errors both back off (doubling up to a minute); the acks go on each interval, so the
        members never take a slow store for a lost leader."""
        watch = HangWatch(run=self.run, world_size=self.world_size, interval=self.interval,
                          classify=self._classify, stats=self.stats,
                          # a device clock (CUDA, the demo's emulated device): device verdicts
                          # hold even on gloo; else the watch reads the backend
                          device=True if getattr(self.source, "device_clock", None) is not None
                          else None) if self.rank == 0 else None
        collector = NodeCollector(self.run, self.layout.members)
        # first key at once: it exists before rank 0 reads it
        next_write = next_read = time.perf_counter()
        failures = 0
        while not self._stop.wait(max(0.0, min(next_write, next_read if watch is not None
                                                else math.inf) - time.perf_counter())):
            now = time.perf_counter()
            try:
                self._collect(link, collector)
                ok = True
                if now >= next_write:
                    next_write = now + self.interval
                    ok = self._write_node(store, take_snapshot(self.source), collector)
                if ok and watch is not None and now >= next_read:
                    next_read = now + self.store_seconds
                    ok = self._watch(store, watch, take_snapshot(self.source))
            except Exception as exc:  # noqa: BLE001
                self._error("store", exc)
                ok = False
            failures = 0 if ok else failures + 1
            if failures:
                backoff = min(_MAX_BACKOFF_SECONDS, self.interval * 2 ** min(failures, 6))
                # the acks still go each interval; the store is left alone for the back-off
                next_write = next_read = now + backoff
                self._wait_acking(link, collector, backoff)
        try:
            self._collect(link, collector)
            self._write_node(store, take_snapshot(self.source), collector, closed=True)
        except Exception as exc:  # noqa: BLE001
            self._error("store", exc)

    def _wait_acking(self, link: NodeLink | None, collector: NodeCollector,
                     seconds: float) -> None:
        """Wait ``seconds`` (or until closed), acking the members each interval."""
        end = time.perf_counter() + seconds
        while not self._stop.wait(max(0.0, min(self.interval, end - time.perf_counter()))):
            if time.perf_counter() >= end:
                return
            self._collect(link, collector)

    def _follow(self, store: Any, link: NodeLink | None) -> None:
        """A member of a node: each ``store_seconds``, hand its key to the leader; while the
        leader has not acked for :attr:`fallback_after` seconds (or there is no local socket),
        write its own key ``hb/<rank>`` to the store: each interval when the leader had
        answered before (a leader that hung: few ranks write), each per-rank interval when it
        never has (no socket, another network namespace, a launcher whose node ranks are not
        ``rank - local_rank`` onwards: every rank may write, as every rank did before node
        keys, within the job's write budget)."""
        started = last_ack = time.perf_counter()  # the leader's grace at start
        last_own = next_store = -math.inf
        own_interval = self.rank_interval
        failures = 0
        lost = False
        wait = 0.0
        while not self._stop.wait(wait):
            wait = self.store_seconds
            try:
                payload = self._key(take_snapshot(self.source))
                if link is not None:
                    last_ack = self._hand_over(link, payload, last_ack)
                now = time.perf_counter()
                own_interval = self.interval if last_ack > started else self.rank_interval
                lost = self._lost(link is None or now - last_ack > self.fallback_after, lost)
                if not lost or now - last_own < own_interval or now < next_store:
                    continue
                last_own = now
                ok = self._set(store, rank_key_name(self.rank), payload)
            except Exception as exc:  # noqa: BLE001
                self._error("store", exc)
                ok = False
            failures = 0 if ok else failures + 1
            next_store = time.perf_counter() + (
                min(_MAX_BACKOFF_SECONDS, own_interval * 2 ** min(failures, 6)) if failures
                else 0.0)
        try:  # the goodbye: through the leader, and the store itself when the leader is lost
            payload = self._key(take_snapshot(self.source), closed=True)
            if link is not None:
                self._hand_over(link, payload, last_ack)
            if lost:
                self._set(store, rank_key_name(self.rank), payload)
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

    def _open_link(self) -> NodeLink | None:
        """This rank's node socket; None for a one-rank node, or when it cannot be made
        (logged once; a member then writes its own key)."""
        if self.layout.size == 1:
            return None
        try:
            return NodeLink(self.link_job, self.rank)
        except OSError as exc:
            self._log_once("link", "laggard: no node socket for the hang exchange (%r); this "
                           "rank writes its own key to the store", exc)
            return None

    def _key(self, snapshot: RankSnapshot, closed: bool = False) -> bytes:
        """This rank's key value, its write counter advanced."""
        self._beat += 1
        return encode_key(snapshot, rank=self.rank, run=self.run, pid=self.pid,
                          beat=self._beat, closed=closed)

    def _collect(self, link: NodeLink | None, collector: NodeCollector) -> None:
        """Leader: take the members' keys off the socket, ack each sender at once."""
        if link is None:
            return
        bad = collector.bad
        for rank in collector.take(link.drain()):
            try:
                link.send(rank, ACK)
            except OSError:
                pass  # the member is gone; its key stays as it was
        self.stats.bad_keys += collector.bad - bad

    def _hand_over(self, link: NodeLink, payload: bytes, last_ack: float) -> float:
        """Member: send the key to the leader; returns when the leader last acked."""
        try:
            self.stats.keys_to_leader += link.send(self.layout.leader, payload)
        except OSError:
            pass  # no leader socket (not up yet, or its process is gone): the ack tells
        if ACK in link.drain():
            return time.perf_counter()
        return last_ack

    def _lost(self, lost: bool, was: bool) -> bool:
        if lost and not was:
            self.stats.leader_lost += 1
            self._log_once("lost", "laggard: rank %d's node leader (rank %d) answers no more; "
                           "this rank writes its own hang key until it does", self.rank,
                           self.layout.leader)
        return lost

    def _write_node(self, store: Any, snapshot: RankSnapshot, collector: NodeCollector,
                    closed: bool = False) -> bool:
        keys = collector.keys()
        keys[self.rank] = self._key(snapshot, closed=closed)
        return self._set(store, node_key_name(self.rank),
                         encode_node_key(keys, leader=self.rank, run=self.run, beat=self._beat))

    def _write(self, store: Any, snapshot: RankSnapshot, closed: bool = False) -> bool:
        """Write this rank's own key (a rank without a leader to hand it to)."""
        return self._set(store, rank_key_name(self.rank), self._key(snapshot, closed=closed))

    def _set(self, store: Any, name: str, payload: bytes) -> bool:
        try:
            store.set(name, payload)
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
        """One round of every rank's key (:class:`~laggard.integrations.hang_read.
        RoundReader`)."""
        return self.reader.read(store, time.perf_counter())

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


def _short(text: str) -> str:
    """A name as the wire takes it: at most 64 characters, ``?`` for an empty one."""
    return text[:64] or "?"


# HangReport and HeartbeatStats are the types of this entry's API (``Config.on_hang``'s
# argument, ``monitor.stats.heartbeat``); the rest lives in the modules named above.
__all__ = ["HangReport", "HeartbeatStats", "HeartbeatThreads", "heartbeat_datagram",
           "take_snapshot"]
