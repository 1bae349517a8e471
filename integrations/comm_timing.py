"""Timing of a DDP job's gradient collectives: per bucket, launch to completion, and per step.

A DDP communication hook is called once per gradient bucket, at the moment the bucket's last
gradient is ready, and returns a future that DDP waits on at the end of ``backward()``. Wrapping
that future gives each collective's launch-to-completion time on this rank, and the step's
*exposed* communication time: from the last hook call (the last bucket became ready, so this
rank's backward work is done) to the last completion. Exposed time is what this rank spent in
``backward()`` doing nothing but waiting for the network and for the other ranks; the rest of the
communication was *hidden* behind backward compute (the overlap DDP buckets exist for; Li et al.,
"PyTorch Distributed: Experiences on Accelerating Data Parallel Training", VLDB 2020, §3.2.3).

Usage with the plain timing all-reduce::

    timer = CommTimer()
    ddp.register_comm_hook(timer, allreduce_timing_hook)
    ...  # forward, loss.backward()
    step = timer.take_step()   # CommStep: collectives, total/exposed/hidden seconds, bytes

A hook of its own (compression, say) records its collectives with :meth:`CommTimer.track`::

    def my_hook(state, bucket):
        timer = state.timer
        payload = compress(bucket.buffer())
        fut = dist.all_reduce(payload, async_op=True).get_future()
        world = dist.get_world_size()
        return timer.track(fut, nbytes=ring_allreduce_bytes(tensor_bytes(payload), world),
                           raw_bytes=ring_allreduce_bytes(tensor_bytes(bucket.buffer()), world),
                           result=lambda value: decompress(value[0]))

Bytes follow one convention everywhere: what this rank puts on the wire under the collective's
bandwidth-optimal algorithm (``laggard.integrations.collective_bytes``: a ring all-reduce of
``n`` bytes sends ``2 (W-1)/W * n``), so hooks and the interface counters of a real link agree.

A hook with two collectives per bucket calls :meth:`CommTimer.bucket_ready` on entry and passes
``bucket_ready=False`` to both ``track`` calls, so the exposed time starts when the bucket was
ready, not when its second stage launched.

**What the CPU times mean on NCCL.** An NCCL ``Work``'s future is marked done when the collective
is *enqueued* on its stream (``get_future`` docstring, ``torch/csrc/distributed/c10d/init.cpp``:
"for GPU work, done() returns true only whether the operation has been enqueued"; CUDA-aware
futures, pytorch#48305), and ``then()`` callbacks run at once. On NCCL the launch-to-completion
times above are therefore *launch latencies*, and the CPU exposed time is not the wait. On gloo
the future completes when the collective has (they are true durations there).

**On the device clock** (the monitor's ``phase_clock="device"``, which calls
:meth:`CommTimer.attach_device_clock`): each bucket's readiness also records an event on the
current stream (one event per step, re-recorded per bucket, so the step keeps the last: "this
rank's backward compute is done" on the device timeline); the monitor's event after
``backward()`` returns minus it is the exposed communication on the device
(:mod:`laggard.integrations.phases`). Every ``device_sample_every``-th step the collectives are
also timed on the device: an event at launch and one recorded in the future's ``then()``
callback, which on NCCL runs with a current stream that has been made to wait for the NCCL
work, so its completion on the device is the collective's end (:attr:`CommStep.
device_collectives`; the interval includes time queued behind the previous bucket on the NCCL
stream). Sampling keeps the per-bucket events cheap (2 records of ~2.5 µs per bucket on the
sampled steps only).
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from laggard.integrations.collective_bytes import ring_allreduce_bytes, tensor_bytes
from laggard.integrations.device_events import PendingIntervals
from laggard.integrations.trace_records import union_seconds
from laggard.wire import CollectiveTiming

if TYPE_CHECKING:
    import torch
    import torch.distributed as dist

    from laggard.integrations.tracer import CollectiveTracer

T = TypeVar("T")

#: Most completed collectives kept between two ``take_step`` calls; older ones are dropped and
#: counted, so a job that never calls ``take_step`` keeps bounded memory.
MAX_PENDING_COLLECTIVES = 4096


@dataclass(slots=True)
class CommStep:
    """Communication of one training step on this rank.

    Attributes:
        collectives: each completed collective: op, launch-to-completion seconds, bytes sent.
        total_seconds: wall time during which at least one collective was in flight (the union
            of the launch-to-completion intervals; overlapping buckets are not double-counted).
        exposed_seconds: last completion minus the last time a bucket became ready (0 when no
            collective ran): the communication time not hidden behind backward compute.
        bytes: bytes this rank put on the wire for its collectives, under each collective's
            algorithm (a ring all-reduce of ``n`` bytes sends ``2 (W-1)/W * n``).
        raw_bytes: bytes an uncompressed fp32 ring all-reduce of the same buckets would have
            sent (equal to ``bytes`` without compression).
        exposed_interval: ``(start, end)`` of the exposed time in ``time.perf_counter()``
            seconds, or None; lets a caller subtract it from the phase it fell in.
        device_collectives: on the device clock, the sampled collectives whose events were
            read since the previous step (op, device seconds launch to completion on the
            stream, bytes); they may belong to an earlier step. Empty otherwise.
    """

    collectives: list[CollectiveTiming] = field(default_factory=list)
    total_seconds: float = 0.0
    exposed_seconds: float = 0.0
    bytes: int = 0
    raw_bytes: int = 0
    exposed_interval: tuple[float, float] | None = None
    device_collectives: list[CollectiveTiming] = field(default_factory=list)

    @property
    def hidden_seconds(self) -> float:
        """Communication time overlapped with backward compute: total minus exposed (>= 0)."""
        return max(0.0, self.total_seconds - self.exposed_seconds)

    def summary(self) -> dict[str, float]:
        """The ``comm`` object of a StepRecord: seconds and bytes as floats."""
        return {
            "total_seconds": self.total_seconds,
            "exposed_seconds": self.exposed_seconds,
            "hidden_seconds": self.hidden_seconds,
            "bytes": float(self.bytes),
            "raw_bytes": float(self.raw_bytes),
        }


class CommTimer:
    """Records the collectives that DDP communication hooks launch, and summarises each step.

    Thread-safe: hooks run on the autograd thread and completions on the backend's threads.
    Every method is cheap (a ``perf_counter`` call and a list append under a lock) and never
    raises.

    Args:
        process_group: group the timing hooks reduce over; None means the default group.
        tracer: a :class:`~laggard.integrations.tracer.CollectiveTracer` that also gets every
            collective (op, group, launch and completion), so DDP is one of its sources.
        device_sample_every: on the device clock, time the collectives of every N-th step
            with events (0: never); bucket-ready events are recorded every step regardless.

    Raises:
        ValueError: ``device_sample_every`` < 0.

    Attributes:
        process_group: as given.
        dropped: collectives dropped because ``take_step`` was not called for
            :data:`MAX_PENDING_COLLECTIVES` of them.
    """

    def __init__(self, process_group: dist.ProcessGroup | None = None, *,
                 tracer: CollectiveTracer | None = None, device_sample_every: int = 16) -> None:
        if device_sample_every < 0:
            raise ValueError("device_sample_every must be >= 0")
        self.process_group = process_group
        self.tracer = tracer
        self.device_sample_every = device_sample_every
        self.dropped = 0
        self._lock = threading.Lock()
        self._done: collections.deque[tuple[str, float, float, int, int]] = collections.deque()
        self._last_ready: float | None = None
        self._device: Any = None
        self._device_pending: PendingIntervals | None = None
        self._device_done: list[CollectiveTiming] = []
        self._steps_taken = 0
        self._sample = False

    def attach_device_clock(self, clock: Any) -> None:
        """Record bucket-ready (and sampled collective) events on ``clock``'s device.

        The monitor calls it with its :class:`~laggard.integrations.device_clock.DeviceClock`;
        call it yourself for the timers of further DDP models of the same job
        (``timer2.attach_device_clock(monitor.device_clock)``).
        """
        self._device = clock
        self._device_pending = PendingIntervals(clock.pool, max_pending=1024)
        self._sample = self.device_sample_every > 0

    def watch_buffers(self, ddp: Any) -> None:
        """On the device clock, mark the end of DDP's broadcast of module buffers at forward
        start (``broadcast_buffers=True``): a forward pre-hook on ``ddp.module`` runs once
        DDP's ``_pre_forward`` has broadcast them, so the device time from the forward phase's
        start to this mark is a wait for rank 0's buffers (a peer late to its forward), not
        compute. Steps that do not broadcast (``no_sync()``, no buffers) mark nothing.

        Args:
            ddp: the ``DistributedDataParallel`` module whose hooks this timer serves.
        """
        from laggard.integrations.phases import SYNC_END

        def buffers_synced(module: Any, args: Any) -> None:
            device = self._device
            if device is not None and ddp.will_sync_module_buffers():
                device.mark(SYNC_END)

        self._buffers_hook = ddp.module.register_forward_pre_hook(buffers_synced)

    def bucket_ready(self) -> None:
        """Mark now as the time a gradient bucket became ready (call at hook entry); on the
        device clock, also on the current stream."""
        now = time.perf_counter()
        with self._lock:
            self._last_ready = now
        if self._device is not None:
            self._device.bucket_ready(id(self))

    def track(
        self,
        fut: torch.futures.Future[T],
        nbytes: int,
        op: str = "allreduce",
        *,
        raw_bytes: int | None = None,
        bucket_ready: bool = True,
        result: Callable[[T], Any] | None = None,
    ) -> torch.futures.Future[Any]:
        """Time a collective launched just now; return a future with the same value.

        Args:
            fut: the collective's future (``work.get_future()``).
            nbytes: bytes this rank puts on the wire in it, under the collective's algorithm
                (``laggard.integrations.collective_bytes``).
            op: collective name for the ``op`` label (``allreduce``, ``allgather``...).
            raw_bytes: uncompressed bytes this collective stands for; defaults to ``nbytes``.
            bucket_ready: count the launch as the moment the bucket became ready; pass False
                when :meth:`bucket_ready` was called at hook entry.
            result: applied to ``fut``'s value in the same callback (saves a second ``then``),
                e.g. ``lambda v: v[0]`` to unwrap an all-reduce's one-tensor list.

        Returns:
            A future completing, once completion has been recorded, with ``fut``'s value (or
            ``result`` of it); return it (or a ``then`` of it) from the hook.
        """
        launched = time.perf_counter()
        if bucket_ready:
            with self._lock:
                self._last_ready = launched
        device = self._device
        if device is not None and bucket_ready:
            device.bucket_ready(id(self))
        start_event = device.pool.record() if device is not None and self._sample else None
        raw = nbytes if raw_bytes is None else raw_bytes
        # counted issued now, completed below: the heartbeat's per-group progress
        issued = self.tracer.issue(op, self.process_group) if self.tracer is not None else None

        def completed(done: torch.futures.Future[T]) -> Any:
            if start_event is not None:
                # on NCCL this callback runs at enqueue with a current stream made to wait for
                # the NCCL work: this event completes on the device when the collective has
                self._track_device(start_event, op, nbytes)
            with self._lock:
                if len(self._done) >= MAX_PENDING_COLLECTIVES:
                    self._done.popleft()
                    self.dropped += 1
                end = time.perf_counter()
                self._done.append((op, launched, end, nbytes, raw))
            if self.tracer is not None:
                self.tracer.record(op, self.process_group, launched, end, nbytes,
                                   issued=issued)
            value = done.value()  # re-raises the collective's error to DDP, as it should
            return value if result is None else result(value)

        return fut.then(completed)

    def _track_device(self, start_event: Any, op: str, nbytes: int) -> None:
        """Queue a sampled collective's device interval (end event recorded now)."""
        pending = self._device_pending
        if pending is None:
            return
        try:
            end_event = pending.pool.record()

            def read(seconds: float) -> None:
                if seconds == seconds:  # NaN: expired or unreadable, already counted
                    self._device_done.append(CollectiveTiming(op, seconds, nbytes))

            with self._lock:
                pending.add(start_event, end_event, read)
        except Exception:  # noqa: BLE001 - a failed device timing never fails the collective
            pending.pool.stats.errors += 1

    def take_step(self) -> CommStep:
        """Summarise and forget the collectives completed since the previous call.

        Call after ``backward()`` has returned (DDP has then waited on every bucket's future).
        Collectives still in flight are left for the next call. On the device clock it also
        reads, without blocking, the sampled collectives' events that have completed
        (:attr:`CommStep.device_collectives`) and decides whether the next step is sampled.

        Returns:
            The step's :class:`CommStep`; an empty one when nothing completed.
        """
        with self._lock:
            done = list(self._done)
            self._done.clear()
            last_ready = self._last_ready
            self._last_ready = None
            device_done: list[CollectiveTiming] = []
            if self._device_pending is not None:
                self._device_pending.harvest()
                device_done, self._device_done = self._device_done, []
                self._steps_taken += 1
                every = self.device_sample_every
                self._sample = every > 0 and self._steps_taken % every == 0
        step = CommStep(device_collectives=device_done)
        if not done:
            return step
        intervals = [(start, end) for _, start, end, _, _ in done]
        covered = union_seconds(intervals)
        last_completion = max(end for _, end in intervals)
        step.collectives = [
            CollectiveTiming(op, end - start, nbytes) for op, start, end, nbytes, _ in done
        ]
        step.total_seconds = covered
        step.bytes = sum(entry[3] for entry in done)
        step.raw_bytes = sum(entry[4] for entry in done)
        if last_ready is not None and last_completion > last_ready:
            step.exposed_seconds = last_completion - last_ready
            step.exposed_interval = (last_ready, last_completion)
        return step


# ``bucket`` and the return value are left unannotated on purpose: DDP's register_comm_hook
# compares the annotations with ``dist.GradBucket`` and ``Future[Tensor]`` by identity, and under
# ``from __future__ import annotations`` they would be strings and rejected.
def allreduce_timing_hook(state: CommTimer, bucket):  # type: ignore[no-untyped-def]
    """DDP communication hook: the default averaging all-reduce, timed by a :class:`CommTimer`.

    Same result as DDP without a hook (``torch.distributed.algorithms.ddp_comm_hooks.
    default_hooks.allreduce_hook``: divide by the world size, then sum-all-reduce).

    Args:
        state: the CommTimer; its ``process_group`` is reduced over.
        bucket: DDP's gradient bucket; its flat ``buffer()`` (1-D, the gradients' dtype) is
            reduced in place.

    Returns:
        A future holding the averaged bucket buffer.
    """
    import torch.distributed as dist

    group = state.process_group if state.process_group is not None else dist.group.WORLD
    buffer = bucket.buffer()
    buffer.div_(group.size())
    fut = dist.all_reduce(buffer, group=group, async_op=True).get_future()
    nbytes = ring_allreduce_bytes(tensor_bytes(buffer), group.size())
    return state.track(fut, nbytes, result=first_tensor)


def first_tensor(done: Any) -> torch.Tensor:
    """The one tensor a collective's future holds, from the future or from its value.

    ``all_reduce``'s future holds a list of the one reduced tensor, a hook's own future the
    tensor itself; every hook that takes a result apart calls this, as ``fut.then(first_tensor)``
    (given the future) or as :meth:`CommTimer.track`'s ``result`` (given the value).
    """
    # duck-typed: this module does not import torch (a Tensor has no ``value``)
    value = done.value() if callable(getattr(done, "value", None)) else done
    return value[0] if isinstance(value, list) else value
