"""CollectiveTracer: every collective of the watched process groups, whatever issued it.

A job that shards (FSDP2), splits layers (tensor, pipeline parallel) or runs plain DDP issues its
collectives from different places: FSDP's all-gather and reduce-scatter, DDP's bucket hooks, the
model's own ``async_op=True`` calls. The tracer is the one place they are all recorded, per
process group: op, bytes, issue-to-completion seconds on this rank's clock. The sources that
feed it are chosen per backend at run time (:mod:`laggard.integrations.trace_sources`):

* gloo (CPU tensors): FSDP2's custom all-gather / reduce-scatter (timed around the call), DDP
  communication hooks (:class:`~laggard.integrations.comm_timing.CommTimer` with ``tracer=``),
  and the ``Work`` futures of async collectives (:meth:`CollectiveTracer.track`), on the CPU
  clock: gloo completes a future when the collective is done;
* NCCL, or any collective on CUDA tensors: the same Python-side sources, timed on the *device*.
  An NCCL ``Work``'s future is marked done when the collective is *enqueued* (``get_future``,
  ``torch/csrc/distributed/c10d/init.cpp``: "for GPU work, done() returns true only whether the
  operation has been enqueued"), so a CPU clock would time the launch. Instead a pooled timing
  event is recorded on the current stream at issue and one in the future's ``then()`` callback,
  whose current stream has been made to wait for the NCCL stream; a synchronous call (FSDP2's
  all-gather inside its all-gather stream context) gets events before and after the call on the
  stream it runs on. The events are read with ``query()`` only
  (:mod:`laggard.integrations.device_events`), never blocking, and a step's device-timed
  collectives are handed over by the next :meth:`take_step` (one step late, the same on every
  rank; later when the device is more than a step behind). Sampled:
  ``Config.device_sample_every``;
* NCCL backend-side: ``ProcessGroup._register_on_completion_hook`` (needs
  ``TORCH_NCCL_ENABLE_TIMING=1``, opt-in) or the in-process flight recorder read off the training
  thread (:mod:`laggard.integrations.trace_sources`).

Per rank and per group the tracer keeps each step's summed collective seconds; the
:class:`~laggard.integrations.monitor.TrainingMonitor` gathers them once per window. Who the
others waited for is then read from durations alone, never from timestamps of different hosts:
the members of a synchronous collective finish at about the same moment, so the rank that
*arrived last* is the one whose issue-to-completion time was shortest, that duration is the
collective's own transfer time (nobody was waited for), and every other member's excess over it
is its wait for the last peer (:func:`laggard.integrations.trace_window.group_waits`).

Usage (FSDP2 on any backend)::

    tracer = CollectiveTracer()                 # after init_process_group and every new_group
    trace_sources.instrument_fsdp(model, tracer)
    monitor = TrainingMonitor(config, tracer=tracer)

**Point-to-point** (pipeline parallelism): ``send`` / ``recv`` are timed per peer and kept apart
from the collectives (a receive's time includes its sender's lateness, so the arrived-last rule
does not hold for them). ``trace_sources.instrument_pipeline(tracer)`` tracks every send and
receive of ``torch.distributed.pipelining``'s schedules and times the training thread's block in
their waits as *exposed P2P wait* per peer (:attr:`TraceStep.p2p_wait_seconds`, the window's
``p2p_wait_seconds``, taken out of compute on the wall clock); plain ``isend`` / ``irecv`` go
through :meth:`CollectiveTracer.track` with ``peer=`` and :meth:`CollectiveTracer.wait`.

**Progress per group** (for the heartbeat): issued and completed counts per watched group and
per P2P pair, counted by :mod:`laggard.integrations.trace_progress`; the records the tracer
fills (:class:`GroupInfo`, :class:`TraceStep`, :class:`TracerProgress`) are in
:mod:`laggard.integrations.trace_records`.

Memory is bounded: at most ``Config.max_in_flight`` collectives in flight (a collective that has
not completed after ``Config.stall_seconds`` is dropped and counted in ``never_completed``) and
at most ``Config.max_completed`` completed ones between two :meth:`take_step` calls. Bad input (a
group created after the tracer, a group this rank is not in, an unknown backend) is counted in
:attr:`CollectiveTracer.stats`, logged once, and never raises.

This module is over 600 lines as **one cohesive class**: every path of :class:`CollectiveTracer`
(synchronous calls, ``Work`` futures, futureless P2P works, device events, backend-side
records) begins and ends in the same in-flight table and completed queue under one short lock,
and :meth:`CollectiveTracer.take_step` drains them all at once; split across modules, that
private state and its locking would be handed between them. What is not that state lives
apart: the records (:mod:`laggard.integrations.trace_records`), the progress counters
(:mod:`laggard.integrations.trace_progress`), the device event pool
(:mod:`laggard.integrations.device_events`) and the sources
(:mod:`laggard.integrations.trace_sources`).
"""

from __future__ import annotations

import collections
import itertools
import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from laggard.integrations.trace_progress import IssueHandle, ProgressTable
from laggard.integrations.trace_records import (
    P2P_OPS,
    GroupInfo,
    GroupStep,
    TracerProgress,
    TraceStep,
    union_seconds,
)
from laggard.log_once import LogOnce
from laggard.wire import CollectiveTiming

log = logging.getLogger(__name__)

#: Backends whose collectives a source of this package can time.
KNOWN_BACKENDS = frozenset({"gloo", "nccl", "fake", "cpu:gloo,cuda:nccl"})

#: (group index, op, start, end, bytes, blocking) of one completed collective.
_Done = tuple[int, str, float, float, int, bool]
#: (group index, op, start, bytes, blocking, progress handle) of one collective in flight.
_InFlight = tuple[int, str, float, int, bool, Any]


class CollectiveTracer:
    """Records the collectives of the watched process groups; see the module docstring.

    Args:
        config: :class:`CollectiveTracer.Config`; defaults when None.
        groups: the process groups to watch; None watches every group that exists now
            (``torch.distributed`` must be initialized; with no default group, none).
        device: the module whose timing events time device collectives (``torch.cuda``'s names:
            ``Event``, ``current_stream``); None: ``torch.cuda``, when a collective is on a
            device (a test passes a fake, the demo an emulated device).

    Attributes:
        groups: the watched groups (:class:`GroupInfo`), in creation order.
        stats: counters, never reset: ``recorded``, ``dropped`` (completed but not taken in
            time), ``never_completed``, ``unknown_group`` (created after the tracer, or not a
            process group), ``not_member`` (a group this rank is not in), ``unknown_backend``,
            ``errors`` (the tracer's own failures), ``untimed`` (flight-recorder entries without
            a start time), ``unsampled`` (device collectives not sampled), ``device_unread``
            (device intervals dropped unread: events still pending behind
            ``device_events // 2 - 2`` newer ones, or unreadable), ``p2p_pairs_dropped``
            (P2P ops of a pair beyond
            :data:`~laggard.integrations.trace_progress.MAX_P2P_PAIRS`, not counted in the
            progress),
            ``futureless`` (P2P works without a future, gloo's: completed when waited for or
            seen completed at a later :meth:`take_step`), ``p2p_unmapped`` (pipeline P2P ops
            whose kind or works the pipeline source could not read: issued, not traced).
    """

    @dataclass(kw_only=True, slots=True)
    class Config:
        """Configuration of :class:`CollectiveTracer`."""

        max_in_flight: int = 4096
        """Collectives in flight at once; beyond it the oldest is dropped (never_completed)."""

        max_completed: int = 8192
        """Completed collectives kept between two ``take_step`` calls; older ones dropped."""

        stall_seconds: float = 600.0
        """A collective in flight this long is dropped and counted as never completed (a hang
        is the flight recorder's and the watchdog's business, not a memory leak's)."""

        max_groups: int = 8
        """Groups watched at most (each costs ``window_steps`` float64 in the window gather)."""

        device_sample_every: int = 1
        """On a device (NCCL, CUDA tensors): time every N-th collective of each group with two
        pooled events (about 2.5 µs of CPU each); the others are counted in
        ``stats["unsampled"]`` and not recorded. Every rank samples the same collectives (ranks
        issue a group's collectives in the same order), so the per-group comparison holds."""

        device_events: int = 512
        """Timing events made once, at the first device-timed collective (two per collective in
        flight on the device); an empty pool skips the collective (counted)."""

        def __post_init__(self) -> None:
            if self.max_in_flight < 1 or self.max_completed < 1:
                raise ValueError("max_in_flight and max_completed must be >= 1")
            if not self.stall_seconds > 0:
                raise ValueError("stall_seconds must be > 0")
            if not 1 <= self.max_groups <= 64:
                raise ValueError("max_groups must be in [1, 64]")
            if self.device_sample_every < 1:
                raise ValueError("device_sample_every must be >= 1")
            if self.device_events < 2:
                raise ValueError("device_events must be >= 2")

    def __init__(self, config: CollectiveTracer.Config | None = None, *,
                 groups: list[Any] | None = None, device: Any = None) -> None:
        self.config = config if config is not None else CollectiveTracer.Config()
        self.stats: dict[str, int] = dict.fromkeys(
            ("recorded", "dropped", "never_completed", "unknown_group", "not_member",
             "unknown_backend", "errors", "untimed", "unsampled", "device_unread",
             "p2p_pairs_dropped", "futureless", "p2p_unmapped"), 0)
        self.device = device
        self._device_off = False
        self._pending: Any = None  # PendingIntervals, made at the first device-timed collective
        self._device_seq: dict[int, int] = {}
        # device-timed collectives read, with the step they were issued in (take_step calls
        # so far): handed over by the first take_step after their issue step
        self._device_done: collections.deque[tuple[int, _Done]] = collections.deque()
        self._steps = 0
        self._lock = threading.Lock()
        self._log_once = LogOnce(log)
        self._tokens = itertools.count()
        self._in_flight: collections.OrderedDict[int, _InFlight] = collections.OrderedDict()
        # progress per (group index, peer), mutated under self._lock
        self._progress = ProgressTable(self.stats)
        self._done: collections.deque[_Done] = collections.deque()
        # P2P works without a future (gloo's send / recv): id(work) -> (work, token, group
        # index, peer), completed by p2p_wait() or by a take_step() that sees them completed;
        # the work is kept so its id stays its own. Bounded by max_in_flight.
        self._futureless: collections.OrderedDict[int, tuple[Any, int, int, int | None]] = (
            collections.OrderedDict())
        # exposed P2P wait of the current step: (group index, peer) -> seconds
        self._p2p_wait: dict[tuple[int | None, int | None], float] = {}
        self._by_id: dict[int, GroupInfo] = {}
        self._keep: list[Any] = []  # the group objects: their ids stay theirs
        self.groups: list[GroupInfo] = []
        try:
            self._watch(groups)
        except Exception as exc:  # noqa: BLE001 - a tracer that watches nothing is still safe
            self._count("errors", "discover", "laggard: tracer could not list process groups "
                        "(%r); tracing nothing", exc)

    # ------------------------------------------------------------------ process groups
    def _watch(self, groups: list[Any] | None) -> None:
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            return
        if groups is None:
            from torch.distributed import distributed_c10d as c10d

            groups = list(c10d._world.pg_map)  # creation order (a dict)
        for pg in groups:
            if pg is None:
                pg = dist.group.WORLD
            if pg is dist.GroupMember.NON_GROUP_MEMBER or not isinstance(pg, dist.ProcessGroup):
                self._count("not_member" if pg is dist.GroupMember.NON_GROUP_MEMBER
                            else "unknown_group", "watch",
                            "laggard: tracer asked to watch %r, not a group this rank is in; "
                            "skipped", pg)
                continue
            if id(pg) in self._by_id:
                continue
            if len(self.groups) >= self.config.max_groups:
                self._count("unknown_group", "max_groups", "laggard: tracer watches at most %d "
                            "process groups; the rest are not traced", self.config.max_groups)
                break
            backend = str(dist.get_backend(pg))
            if backend not in KNOWN_BACKENDS:
                self._count("unknown_backend", f"backend:{backend}", "laggard: process group "
                            "backend %r has no timing source; its collectives are timed only "
                            "where laggard issues or wraps them", backend)
            info = GroupInfo(index=len(self.groups), name=str(pg.group_name), backend=backend,
                             ranks=tuple(dist.get_process_group_ranks(pg)),
                             desc=str(getattr(pg, "group_desc", "") or ""))
            self.groups.append(info)
            self._by_id[id(pg)] = info
            self._keep.append(pg)

    def group_info(self, group: Any) -> GroupInfo | None:
        """The watched group for a process group object (None: the default group).

        Returns None, counting ``unknown_group`` (logged once), for a group created after the
        tracer or not watched.
        """
        if group is None:
            try:
                import torch.distributed as dist

                group = dist.group.WORLD
            except Exception:  # noqa: BLE001
                return None
        info = self._by_id.get(id(group))
        if info is None:
            self._count("unknown_group", "unknown_group", "laggard: a collective on a process "
                        "group the tracer does not watch (created after it?) is not traced")
        return info

    # ------------------------------------------------------------------------- sources
    def begin(self, op: str, group: Any, nbytes: int, *, blocking: bool = False,
              peer: int | None = None) -> int | None:
        """A collective was issued now; returns the token for :meth:`end`, or None (not traced).

        Args:
            op: ``allreduce``, ``allgather``, ``reduce_scatter``, ``broadcast``, ``send``,
                ``recv``...
            group: its process group (None: the default group).
            nbytes: bytes this rank puts on the wire (``laggard.integrations.collective_bytes``).
            blocking: the call blocks the training thread until completion (synchronous).
            peer: for ``send`` / ``recv``, the other rank (global): counted in that pair's
                progress; a P2P op without a peer is timed, not counted.
        """
        info = self.group_info(group)
        if info is None:
            return None
        return self._begin(info, op, nbytes, blocking, peer)

    def _begin(self, info: GroupInfo, op: str, nbytes: int, blocking: bool,
               peer: int | None = None) -> int:
        now = time.perf_counter()
        token = next(self._tokens)
        with self._lock:
            issued = self._issue(info, op, peer, now)
            self._in_flight[token] = (info.index, op, now, int(nbytes), blocking, issued)
            if len(self._in_flight) > self.config.max_in_flight:
                _, evicted = self._in_flight.popitem(last=False)
                self._complete(evicted[5], now)  # no longer followed: not pending for ever
                self.stats["never_completed"] += 1
        return token

    # ------------------------------------------------------------------ progress
    def issue(self, op: str, group: Any, *, peer: int | None = None) -> Any:
        """Count a collective issued now whose completion a source records later with
        ``record(..., issued=handle)`` (the DDP hook: issued at launch, recorded at its
        future's completion). Returns the handle, or None (group not watched, op not counted).
        Never raises.

        Args:
            op, group, peer: as for :meth:`begin`.
        """
        info = self.group_info(group)
        if info is None:
            return None
        with self._lock:
            return self._issue(info, op, peer, time.perf_counter())

    def _issue(self, info: GroupInfo, op: str, peer: int | None,
               now: float) -> IssueHandle | None:
        """Count one issue in the group's (or pair's) progress; the handle for
        :meth:`_complete`, None when not counted. Caller holds the lock."""
        return self._progress.issue(info, op, peer, now)

    @staticmethod
    def _complete(issued: IssueHandle | None, now: float) -> None:
        """Count the completion of an issued collective. Caller holds the lock."""
        ProgressTable.complete(issued, now)

    def progress(self, now: float | None = None) -> list[TracerProgress]:
        """This rank's progress per watched group (those with a collective issued so far),
        then per P2P pair, in creation order: a copy of a few integers each, taken under the
        tracer's lock (held by any thread for microseconds only), so any thread may call it
        while the training thread is blocked in a collective. Never raises.

        Args:
            now: the ``time.perf_counter()`` the ages are measured to, seconds (None: now).

        Returns:
            One :class:`TracerProgress` per group and pair (at most ``Config.max_groups +
            trace_progress.MAX_P2P_PAIRS``), its ages at ``now`` (never negative).
        """
        now = time.perf_counter() if now is None else now
        try:
            with self._lock:
                return self._progress.snapshot(now)
        except Exception:  # noqa: BLE001 - a reader on another thread never fails
            return []

    def end(self, token: int | None) -> None:
        """The collective of ``token`` completed now (unknown or expired tokens are ignored)."""
        if token is None:
            return
        self._end_at(token, time.perf_counter())

    def _end_at(self, token: int, now: float) -> None:
        """The collective of ``token`` completed at ``now`` (``perf_counter`` seconds)."""
        with self._lock:
            entry = self._in_flight.pop(token, None)
            if entry is not None:
                index, op, start, nbytes, blocking, issued = entry
                self._complete(issued, now)
                self._append((index, op, start, now, nbytes, blocking))

    def record(self, op: str, group: Any, start: float, end: float, nbytes: int, *,
               blocking: bool = False, index: int | None = None, issued: Any = None) -> None:
        """A collective timed elsewhere (DDP hook, NCCL events): ``perf_counter`` seconds.

        ``issued``: the handle :meth:`issue` returned at its launch, whose completion this is.
        Without one, a group that no source counts at issue (the completion hook, the flight
        recorder) is counted issued and completed now; one that is counted at issue is not
        counted twice.
        """
        info: GroupInfo | None
        if index is None:
            info = self.group_info(group)
            if info is None:
                return
            index = info.index
        else:
            info = self.groups[index] if 0 <= index < len(self.groups) else None
        now = time.perf_counter()
        with self._lock:
            if issued is not None:
                self._complete(issued, now)
            elif info is not None:
                self._progress.completed_unissued(info, op, now)
            self._append((index, op, start, end, int(nbytes), blocking))

    @contextmanager
    def timed(self, op: str, group: Any, nbytes: int, *, tensor: Any = None,
              device: Any = None, peer: int | None = None) -> Iterator[None]:
        """Time a synchronous collective call: ``with tracer.timed("allgather", pg, n): ...``.

        On the CPU clock (blocking: the call held the training thread) unless the collective is
        on a device (``tensor`` is a CUDA tensor, ``device`` is given, or the group is NCCL and
        no tensor says otherwise): then a pooled event is recorded on the current stream before
        the call and one after it, so the time is what the stream spent from the issue point to
        the collective's end (an NCCL call returns at enqueue; a synchronous one has made the
        current stream wait for it). A call that raises is not recorded (and the exception
        passes through); it counts as completed in the group's progress (nothing pending).

        Args:
            op, group, nbytes, peer: as for :meth:`begin`.
            tensor: one of the collective's tensors (its ``is_cuda`` decides the clock).
            device: the device module to time with (overrides the tracer's).
        """
        info = self.group_info(group)
        if info is None:
            yield
            return
        cuda = self._device_module(info, tensor, device)
        if cuda is not None:
            issued, begun = self._device_begin(info, cuda, op, peer)
            try:
                yield
            except BaseException:
                with self._lock:
                    self._complete(issued, time.perf_counter())
                    if begun is not None:
                        begun[0].pool.give_back(begun[1])
                raise
            self._device_end(info, op, nbytes, begun, issued)
            return
        token = self._begin(info, op, nbytes, True, peer)
        try:
            yield
        except BaseException:
            self._drop(token)
            raise
        self.end(token)

    def _drop(self, token: int) -> None:
        """Forget a collective whose call raised: not timed, no longer pending."""
        with self._lock:
            entry = self._in_flight.pop(token, None)
            if entry is not None:
                self._complete(entry[5], time.perf_counter())

    def track(self, work: Any, op: str, group: Any, nbytes: int, *, tensor: Any = None,
              device: Any = None, peer: int | None = None) -> Any:
        """Time an async collective through its ``Work`` (``async_op=True``); returns ``work``.

        On the CPU (gloo, CPU tensors) completion is taken from ``work.get_future()``'s done
        callback (gloo: the backend's thread, right when the collective is done). On a device
        (``tensor`` is a CUDA tensor, ``device`` is given, or the group is NCCL and no tensor
        says otherwise) the future says nothing about the device: an NCCL future is marked done
        at *enqueue* and its callbacks run at once. So a pooled event is recorded on the current
        stream now (the issue point) and another in the future's ``then()`` callback, which runs
        with a current stream that has been made to wait for the collective's stream; both are
        read without blocking at a later :meth:`take_step`. Every
        ``Config.device_sample_every``-th collective of a group is timed so. A work without a
        future is not timed (counted in ``errors``, logged once).

        Point-to-point (pipeline parallelism, plain ``isend`` / ``irecv``)::

            work = tracer.track(dist.isend(t, dst, group=pg), "send", pg, t.nbytes, peer=dst)
            ...
            tracer.wait(work)        # instead of work.wait(): the block is exposed P2P wait

        (``recv`` with ``peer=src``; ``peer`` is the global rank) counts the pair's progress
        (:meth:`progress`) and times the op. gloo's send / recv ``Work`` has no future
        ("Work::getFuture not implemented"): such a work completes when :meth:`wait` (or
        :meth:`p2p_wait`) returns, or at the first :meth:`take_step` that finds it completed
        (``is_completed()``), counted in ``stats["futureless"]``. The pipeline schedules'
        sends and receives are tracked so by
        :func:`~laggard.integrations.trace_sources.instrument_pipeline`.

        Args:
            work: the ``Work`` an ``async_op=True`` call returned (None: nothing to time).
            op, group, nbytes, peer: as for :meth:`begin`.
            tensor: one of the collective's tensors (its ``is_cuda`` decides the clock).
            device: the device module to time with (overrides the tracer's).
        """
        info = self.group_info(group)
        if info is None:
            return work
        cuda = self._device_module(info, tensor, device)
        if cuda is not None:
            if work is not None:
                self._track_on_device(work, info, op, nbytes, cuda, peer)
            return work
        if work is None:
            return work
        token = self._begin(info, op, nbytes, False, peer)
        try:
            future = work.get_future()
        except Exception as exc:  # noqa: BLE001 - gloo's P2P works have no future
            if op in P2P_OPS:
                self._keep_futureless(work, token, info.index, peer)
                return work
            self._drop(token)
            self._count("errors", "track", "laggard: cannot time an async collective (%r)", exc)
            return work
        try:
            future.add_done_callback(lambda _fut: self.end(token))
        except Exception as exc:  # noqa: BLE001
            self._drop(token)
            self._count("errors", "track", "laggard: cannot time an async collective (%r)", exc)
        return work

    # ------------------------------------------------------------- point-to-point waits
    def _keep_futureless(self, work: Any, token: int, index: int, peer: int | None) -> None:
        """Remember a P2P work without a future until it is waited for or seen completed."""
        with self._lock:
            self.stats["futureless"] += 1
            self._futureless[id(work)] = (work, token, index, peer)
            while len(self._futureless) > self.config.max_in_flight:
                self._futureless.popitem(last=False)  # its token expires with stall_seconds

    def wait(self, work: Any, *, peer: int | None = None) -> Any:
        """``work.wait()`` on the training thread, the time blocked recorded as exposed P2P
        wait for the work's peer (:meth:`p2p_wait`); returns what ``wait()`` returned. An
        exception of ``wait()`` passes through (it is the job's); the wait is still recorded.

        Args:
            work: a ``Work`` of ``isend`` / ``irecv`` (tracked with :meth:`track` or not).
            peer: its peer, global rank, for a work not tracked (a tracked one knows its own).
        """
        with self.p2p_wait([work], peer=peer):
            return work.wait()

    @contextmanager
    def p2p_wait(self, works: Any, *, peer: int | None = None) -> Iterator[None]:
        """Time the block around waiting for ``works`` as exposed P2P wait.

        The wall time inside the ``with`` goes to this step's
        :attr:`TraceStep.p2p_wait_seconds`, under the peer of the first tracked work (the
        pipeline schedules wait for one peer's works at a time), else under ``peer``; the
        tracked works without a future complete when it ends. Never raises of its own.

        Args:
            works: the ``Work`` objects waited for (an iterable).
            peer: the peer (global rank) when no work of ``works`` was tracked.
        """
        start = time.perf_counter()
        try:
            yield
        finally:
            self._waited(works, peer, start, time.perf_counter())

    def _waited(self, works: Any, peer: int | None, start: float, end: float) -> None:
        """Record one exposed P2P wait and complete the futureless works waited for (a wait
        for no work at all, as the schedules make for an empty batch, is not one)."""
        try:
            index: int | None = None
            with self._lock:
                entries = [self._futureless.pop(id(w), None) for w in works]
            if not entries:
                return
            for entry in entries:
                if entry is None:
                    continue
                _, token, group_index, work_peer = entry
                if index is None:
                    index, peer = group_index, work_peer
                self._end_at(token, end)
            with self._lock:
                key = (index, peer)
                self._p2p_wait[key] = self._p2p_wait.get(key, 0.0) + max(0.0, end - start)
        except Exception as exc:  # noqa: BLE001 - timing a wait never fails the job's wait
            self._count("errors", "p2p_wait", "laggard: cannot record a P2P wait (%r)", exc)

    def _poll_futureless(self) -> None:
        """Complete the futureless works that are completed now, forget the expired ones
        (``take_step``; ``is_completed()`` never blocks)."""
        with self._lock:
            items = list(self._futureless.items())
        now = time.perf_counter()
        for key, (work, token, _, _) in items:
            try:
                done = bool(work.is_completed())
            except Exception:  # noqa: BLE001 - an unknown work: left to stall_seconds
                done = False
            with self._lock:
                expired = token not in self._in_flight
                if done or expired:
                    self._futureless.pop(key, None)
            if done and not expired:
                self._end_at(token, now)

    # ------------------------------------------------------------------ on a device
    def _device_module(self, info: GroupInfo, tensor: Any, device: Any) -> Any:
        """The device module to time this collective with, or None (the CPU clock)."""
        if device is not None:
            return device
        if self._device_off:
            return None
        if tensor is not None:
            on_device = bool(getattr(tensor, "is_cuda", False))
        else:
            on_device = info.backend == "nccl"
        if not on_device:
            return None
        if self.device is not None:
            return self.device
        try:
            import torch

            return torch.cuda
        except Exception:  # noqa: BLE001 - no torch.cuda: the CPU clock
            return None

    def _device_queue(self, cuda: Any) -> Any:
        """The pending-interval FIFO of ``cuda``'s events (made once; None: device timing off).
        Caller holds the lock."""
        if self._pending is None or self._pending.pool.cuda is not cuda:
            if self._pending is not None:
                return None  # one device module per tracer: a second one is not timed
            from laggard.integrations.device_events import EventPool, PendingIntervals

            size = self.config.device_events
            # fewer pending than the pool holds: one interval that never completes is dropped
            # (its events leave the pool) instead of stopping device timing for good
            self._pending = PendingIntervals(EventPool(cuda, size),
                                             max_pending=max(1, size // 2 - 2))
        return self._pending

    def _device_begin(self, info: GroupInfo, cuda: Any, op: str, peer: int | None = None,
                      ) -> tuple[Any, tuple[Any, Any, float, int] | None]:
        """Count the issue of a device collective and record the issue event of a sampled one:
        ``(progress handle, (queue, event, host issue time, issue step))``, the second None
        when not sampled, no event, device timing off. Never raises."""
        issued: Any = None
        try:
            with self._lock:
                issued = self._issue(info, op, peer, time.perf_counter())
                seq = self._device_seq.get(info.index, 0)
                self._device_seq[info.index] = seq + 1
                if seq % self.config.device_sample_every:
                    self.stats["unsampled"] += 1
                    return issued, None
                queue = self._device_queue(cuda)
                if queue is None:
                    self.stats["errors"] += 1
                    return issued, None
                event = queue.pool.record()
        except Exception as exc:  # noqa: BLE001 - no device: the CPU clock from now on
            self._device_off = True
            self._count("errors", "device_pool", "laggard: cannot make timing events (%r); "
                        "collectives are timed on the CPU clock (launch times on NCCL)", exc)
            return issued, None
        if event is None:  # pool empty or record failed: counted by the pool
            return issued, None
        return issued, (queue, event, time.perf_counter(), self._steps)

    def _device_end(self, info: GroupInfo, op: str, nbytes: int,
                    begun: tuple[Any, Any, float, int] | None, issued: Any = None) -> None:
        """Record the end event on the current stream and queue the interval; its progress
        completes when the end event has (an unsampled collective's at once: at enqueue on
        NCCL). Never raises."""
        if begun is None:
            with self._lock:
                self._complete(issued, time.perf_counter())
            return
        queue, start, issue_time, issue_step = begun
        index = info.index

        def sink(seconds: float) -> None:  # called under the lock (add, harvest)
            self._complete(issued, time.perf_counter())  # expired or read: no longer pending
            if seconds != seconds:  # NaN: expired or unreadable
                self.stats["device_unread"] += 1
                return
            if len(self._device_done) >= self.config.max_completed:
                self._device_done.popleft()
                self.stats["dropped"] += 1
            self._device_done.append((issue_step, (
                index, op, issue_time, issue_time + max(0.0, seconds), int(nbytes), False)))

        try:
            with self._lock:
                queue.add(start, queue.pool.record(), sink)
        except Exception as exc:  # noqa: BLE001
            with self._lock:
                self._complete(issued, time.perf_counter())
            self._count("errors", "device_end", "laggard: cannot time a device collective "
                        "(%r)", exc)

    def _track_on_device(self, work: Any, info: GroupInfo, op: str, nbytes: int,
                         cuda: Any, peer: int | None = None) -> None:
        issued, begun = self._device_begin(info, cuda, op, peer)

        def on_done(_fut: Any) -> None:
            # then(): the current stream here has waited for the collective (CUDA-aware
            # future), so an event recorded now completes when the collective has.
            self._device_end(info, op, nbytes, begun, issued)

        try:
            work.get_future().then(on_done)
        except Exception as exc:  # noqa: BLE001
            with self._lock:
                self._complete(issued, time.perf_counter())
                if begun is not None:
                    begun[0].pool.give_back(begun[1])
            self._count("errors", "track_device", "laggard: cannot time an async collective on "
                        "the device (%r)", exc)

    def harvest(self) -> int:
        """Read the device-timed collectives whose events have completed (``query()`` only,
        never blocking); :meth:`take_step` calls it. Returns the collectives read."""
        if self._pending is None:
            return 0
        try:
            with self._lock:
                return int(self._pending.harvest())
        except Exception as exc:  # noqa: BLE001
            self._count("errors", "harvest", "laggard: reading device events failed (%r)", exc)
            return 0

    @property
    def device_stats(self) -> Any:
        """The device events' counters (:class:`~laggard.integrations.device_events.
        DeviceEventStats`), None before the first device-timed collective."""
        return None if self._pending is None else self._pending.pool.stats

    # ------------------------------------------------------------------------ per step
    def take_step(self) -> TraceStep:
        """Summarise and forget the collectives completed since the previous call.

        CPU-timed collectives are those completed since the previous call. Device-timed ones
        (NCCL, CUDA tensors) are read without blocking (:meth:`harvest`) and handed over by
        the first call *after* the step they were issued in: a step's device collectives
        appear in the next step's summary (later, if the device is more than a step behind),
        the same on every rank, so the per-step comparison of ranks holds. Also drops
        collectives in flight for longer than ``Config.stall_seconds``.
        """
        self.harvest()
        if self._futureless:
            self._poll_futureless()
        now = time.perf_counter()
        with self._lock:
            done = list(self._done)
            self._done.clear()
            waits, self._p2p_wait = self._p2p_wait, {}
            current = self._steps
            self._steps += 1
            if self._device_done:
                keep: collections.deque[tuple[int, _Done]] = collections.deque()
                for issue_step, entry in self._device_done:
                    if issue_step < current:
                        done.append(entry)
                    else:
                        keep.append((issue_step, entry))
                self._device_done = keep
            stale = [t for t, e in self._in_flight.items()
                     if now - e[2] > self.config.stall_seconds]
            for t in stale:
                del self._in_flight[t]
            self.stats["never_completed"] += len(stale)
            self.stats["recorded"] += len(done)
        step = TraceStep()
        for (_, peer), seconds in waits.items():
            step.p2p_wait_seconds += seconds
            step.p2p_wait_by_peer[peer] = step.p2p_wait_by_peer.get(peer, 0.0) + seconds
        if not done:
            return step
        per_op: dict[str, CollectiveTiming] = {}
        for index, op, start, end, nbytes, _ in done:
            g = step.groups.setdefault(index, GroupStep())
            seconds = max(0.0, end - start)
            g.count += 1
            if op not in P2P_OPS:
                g.seconds += seconds
            g.bytes += nbytes
            entry = g.by_op.setdefault(op, [0, 0.0, 0])
            entry[0] += 1
            entry[1] += seconds
            entry[2] += nbytes
            merged = per_op.setdefault(op, CollectiveTiming(op, 0.0, 0))
            merged.seconds += seconds
            merged.bytes += nbytes
        step.collectives = list(per_op.values())
        step.bytes = sum(d[4] for d in done)
        step.total_seconds = union_seconds([(d[2], d[3]) for d in done if d[1] not in P2P_OPS])
        step.exposed_seconds = union_seconds([(d[2], d[3]) for d in done
                                              if d[5] and d[1] not in P2P_OPS])
        step.p2p_seconds = union_seconds([(d[2], d[3]) for d in done if d[1] in P2P_OPS])
        return step

    @property
    def in_flight(self) -> int:
        """Collectives issued and not yet completed (bounded by ``Config.max_in_flight``)."""
        return len(self._in_flight)

    # ------------------------------------------------------------------------- helpers
    def _append(self, entry: _Done) -> None:
        # caller holds the lock
        if len(self._done) >= self.config.max_completed:
            self._done.popleft()
            self.stats["dropped"] += 1
        self._done.append(entry)

    def _count(self, counter: str, key: str, msg: str, *args: object) -> None:
        """Count ``stats[counter]`` and log ``msg % args`` once per ``key`` (the sources of
        this package report their failures through it)."""
        self.stats[counter] += 1
        self._log_once(key, msg, *args)


__all__ = ["KNOWN_BACKENDS", "CollectiveTracer"]
