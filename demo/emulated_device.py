"""An emulated asynchronous accelerator: a ``torch.cuda``-like module whose "stream" is a thread.

On CUDA the training loop only *launches* work: ``forward()``, ``backward()`` and
``optimizer.step()`` return as soon as their kernels are queued, the device runs them later in
stream order, and the loop waits only at a synchronisation (``loss.item()``). A CPU clock around
a phase then times the launch, and the device's time lands in whichever phase holds the next
synchronisation, as long on the fast ranks (waiting for the slow one in the collectives) as on
the slow one. This module reproduces that on a CPU-only machine so that laggard's device clock
(``TrainingMonitor.Config(phase_clock="device")``) can be run, and its failure mode shown,
without a GPU.

One :class:`EmulatedDevice` per rank. Its :class:`EmulatedStream` owns a thread that runs, in
order, what :meth:`EmulatedDevice.launch` queued (a whole forward, a backward with its DDP hooks
and gloo collectives, an optimizer step) and the markers of events recorded from other threads.
The names are torch's, so code written for ``torch.cuda`` runs on it unchanged:

* ``Event(enable_timing=True)``; ``record(stream=None)``: from a thread other than the stream's
  own (the training loop), a *stream-ordered marker*: it completes, and takes its time, when the
  stream thread reaches it, i.e. after everything launched before it. From the stream thread
  itself (inside a DDP hook or an FSDP2 collective that runs there) it takes its time at once.
  ``query()`` never blocks (True for an event never recorded, as CUDA); ``synchronize()`` waits
  for it; ``elapsed_time(end)`` gives milliseconds and raises ``RuntimeError`` unless both
  events were recorded with timing, have completed, and lie on one stream.
* ``Stream``, ``current_stream()``, ``default_stream()``, ``stream(s)`` (context manager),
  ``Stream.wait_event(e)`` (the stream stalls until ``e`` completes), ``Stream.synchronize()``,
  ``synchronize()``, ``is_available()``, ``device_count()``.
* :meth:`EmulatedDevice.launch` (no torch equivalent: a kernel launch): queue ``fn(*args)`` on
  the stream and return a :class:`DeviceWork` at once; its ``result()`` waits for it (the
  synchronisation a ``.item()`` makes) and re-raises what ``fn`` raised, as CUDA reports an
  asynchronous error at the next synchronisation.

The clock (why ``"busy"``)
--------------------------
A GPU's time for a rank's work does not depend on what other GPUs do, but here the W ranks share
fewer cores than W, so a rank's wall time mostly measures the scheduler. Each stream therefore
keeps a clock of its own that advances only while the stream thread has work and only while it is
*not waiting for a core*:

    device time = wall time while an item runs - the thread's run-queue delay

(``clock="busy"``, the default). The run-queue delay is the kernel's own per-thread account of
time spent runnable but not running (``/proc/thread-self/schedstat``, second field, ns; read on
the stream thread; 30-50 µs a read at load average 10 here), so preemption by the other ranks
(and by anything else on the machine) never stretches it, while time the stream thread spends
*blocked* (a synchronous gloo collective in FSDP2, DDP's wait for its bucket futures at the end
of backward, a ``wait_event`` stall) is counted, in real time, as a GPU stream stalled on NCCL
counts it. A rank's own compute on this clock is therefore its thread CPU time (measured: equal to
``time.thread_time`` within 1% for a pure compute loop at load average 10, while wall time was
20x), and waits for peers stay visible, so "compute = device time minus the stalls" is faithful.
Idle time between items (the stream waiting for the loop's next launch) is not counted: the
emulated device is never launch-bound in its own clock (the monitor keeps the CPU clock beside
it, and ``max(device, cpu)``, for launch-bound ranks). A thread that blocks on Python's GIL
(another thread of the same rank holding it) is counted as a wait too: hence the launch
batching below, and ``clock="thread_cpu"`` for jobs with other Python-busy threads. So is a
stream thread waiting for torch's intra-op (OpenMP) team: run with ``OMP_NUM_THREADS=1`` (the
demo does) or call ``torch.set_num_threads(1)`` on the stream thread (the setting is per
thread).

``clock="thread_cpu"`` (also the fallback where ``schedstat`` cannot be read) uses the stream
thread's CPU time alone: waits then cost nothing on the device clock.

Launch batching
---------------
Launched work and the loop's markers reach the stream thread at the loop's next
synchronisation (``DeviceWork.result``, ``synchronize``, ``Event.synchronize``), at a ``query()``
of work not yet handed over, or after :data:`FLUSH_ITEMS` items, as a GPU driver batches
submissions. Why: Python threads share one interpreter lock, and a loop thread that takes it
while the stream runs (to record a marker, to launch) can be preempted by another rank *holding*
it, which the busy clock would count as the stream's wait. Idle time is not device time, so
handing a step's work over at once changes no device interval; waiters are woken once, by the
item they wait for.

Clocks are per stream; :meth:`EmulatedEvent.elapsed_time` refuses events of two streams (CUDA
does not: one device clock), a deviation that laggard's monitor never meets (it times one stream).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["CLOCKS", "DeviceWork", "EmulatedDevice", "EmulatedEvent", "EmulatedStream",
           "schedstat_available"]

#: ``EmulatedDevice(clock=...)`` choices.
CLOCKS = ("busy", "thread_cpu")
#: Launched items batched before they are handed to the stream thread regardless.
FLUSH_ITEMS = 64
#: Seconds :meth:`EmulatedStream.close` waits for its thread.
CLOSE_TIMEOUT = 10.0
_SCHEDSTAT = "/proc/thread-self/schedstat"


def schedstat_available() -> bool:
    """Whether this kernel gives per-thread run-queue delays (``clock="busy"`` needs them)."""
    try:
        with open(_SCHEDSTAT, "rb") as f:
            int(f.read().split()[1])
        return True
    except (OSError, ValueError, IndexError):
        return False


class _StreamClock:
    """The stream thread's device clock, in seconds; every method runs on the stream thread.

    ``now()`` = the seconds of items run so far (``busy``: wall minus run-queue delay; or
    ``thread_cpu``) plus those of the running item up to now. Starts at 0.
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._fd: int | None = None
        self._base = 0.0
        self._started: float | None = None

    def open(self) -> None:
        """Bind to the calling (stream) thread; falls back to ``thread_cpu`` without schedstat."""
        if self.kind != "busy":
            return
        try:
            # /proc/thread-self resolves when opened: this descriptor stays the stream thread's.
            self._fd = os.open(_SCHEDSTAT, os.O_RDONLY)
            self._raw()
        except (OSError, ValueError, IndexError):
            self.close()
            self.kind = "thread_cpu"

    def close(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None

    def _raw(self) -> float:
        if self._fd is None:
            return time.thread_time()
        try:
            run_delay_ns = int(os.pread(self._fd, 96, 0).split()[1])
        except (OSError, ValueError, IndexError):
            # never seen; the stream thread must not die: the thread's CPU time from here on
            self.close()
            self.kind = "thread_cpu"
            self._started = None if self._started is None else time.thread_time()
            return time.thread_time()
        return time.monotonic() - run_delay_ns * 1e-9

    def begin(self) -> None:
        self._started = self._raw()

    def end(self) -> None:
        if self._started is not None:
            self._base += max(0.0, self._raw() - self._started)
            self._started = None

    def now(self) -> float:
        if self._started is None:
            return self._base
        return self._base + max(0.0, self._raw() - self._started)


class DeviceWork:
    """What :meth:`EmulatedDevice.launch` returns: the pending result of the launched function.

    ``done()`` never blocks; ``result(timeout=None)`` waits for the stream to run it (the
    synchronisation of a ``.item()``) and returns its value or re-raises its exception;
    ``item()`` is ``result().item()`` (for a launched function returning a scalar tensor).
    """

    __slots__ = ("_done", "_exception", "_stream", "_value")

    def __init__(self, stream: EmulatedStream | None = None) -> None:
        self._stream = stream
        self._done = threading.Event()
        self._value: Any = None
        self._exception: BaseException | None = None

    def done(self) -> bool:
        """Whether the stream has run it (never blocks)."""
        return self._done.is_set()

    def result(self, timeout: float | None = None) -> Any:
        """The launched function's return value, once the stream has run it.

        Raises:
            TimeoutError: not run within ``timeout`` seconds.
            Whatever the launched function raised.
        """
        if self._stream is not None and not self._done.is_set():
            self._stream.flush()
        if not self._done.wait(timeout):
            raise TimeoutError("the emulated stream has not run this work yet")
        if self._exception is not None:
            raise self._exception
        return self._value

    def item(self, timeout: float | None = None) -> Any:
        """``result().item()`` read as CUDA reads it: the copy to the host is queued behind
        everything launched on the stream so far (a backward, an optimizer step), so this waits
        for all of it, as ``loss.item()`` after ``optimizer.step()`` does.

        Raises:
            TimeoutError: not run within ``timeout`` seconds.
            What the launched function raised, or the first error of the stream's later work.
        """
        stream = self._stream
        if stream is None or stream.on_stream_thread():
            return self.result(timeout).item()
        return stream.launch(stream._read, self).result(timeout)

    def _finish(self, value: Any, exception: BaseException | None) -> None:
        self._value, self._exception = value, exception
        self._done.set()


_STOP = object()


class EmulatedStream:
    """An in-order queue of work run by one thread, with its own device clock.

    Args:
        device: the :class:`EmulatedDevice` it belongs to.
        priority: accepted for torch's signature; ignored.

    The thread starts with the first item queued and is a daemon; :meth:`close` (or the
    device's) stops it after what was queued.
    """

    def __init__(self, device: EmulatedDevice, priority: int = 0) -> None:
        self.device = device
        self.priority = priority
        self.index = next(device._stream_ids)
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._clock = _StreamClock(device.clock)
        self._pending: list[Any] = []  # launched, not yet handed to the thread (see flush)
        self._waiters: list[tuple[int, threading.Event]] = []
        self._error: BaseException | None = None  # the first error of launched work (sticky)
        self._submitted = 0  # items queued (sequence numbers 1..)
        self._completed = 0  # items run
        self._thread: threading.Thread | None = None
        self._thread_id: int | None = None
        self._lock = threading.Lock()
        self._closed = False
        device._streams.append(self)

    def __repr__(self) -> str:
        return f"<EmulatedStream {self.device.name} #{self.index}>"

    @property
    def clock(self) -> str:
        """The clock this stream's events use: ``busy`` or ``thread_cpu`` (see the module)."""
        return self._clock.kind

    def on_stream_thread(self) -> bool:
        """Whether the caller is this stream's own thread."""
        return threading.get_ident() == self._thread_id

    # -------------------------------------------------------------------------- queueing
    def _put(self, kind: str, payload: Any) -> int:
        """Queue one item (batched until :meth:`flush`); returns its sequence number."""
        with self._lock:
            if self._closed:
                raise RuntimeError(f"{self!r} is closed")
            self._submitted += 1
            seq = self._submitted
            self._pending.append((seq, kind, payload))
            full = len(self._pending) >= FLUSH_ITEMS
        if full:
            self.flush()
        return seq

    def flush(self) -> None:
        """Hand the launched items to the stream thread (done by every synchronisation and
        by ``query()`` of work not yet handed over; see "Launch batching" in the module)."""
        with self._lock:
            items, self._pending = self._pending, []
            if not items:
                return
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, daemon=True,
                    name=f"laggard-emulated-stream-{self.device.name}-{self.index}")
                self._thread.start()
            for item in items:
                self._queue.put(item)

    def _handed_over(self, seq: int) -> bool:
        pending = self._pending  # one read: flush() replaces the list
        return not pending or pending[0][0] > seq

    def launch(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> DeviceWork:
        """Queue ``fn(*args, **kwargs)`` and return at once (from the stream thread itself:
        run it now, as a nested launch would deadlock on a wait).

        Raises:
            RuntimeError: the stream is closed.
        """
        work = DeviceWork(self)
        if self.on_stream_thread():
            try:
                work._finish(fn(*args, **kwargs), None)
            except Exception as exc:  # noqa: BLE001 - reported at the synchronisation
                work._finish(None, exc)
            return work
        self._put("work", (fn, args, kwargs, work))
        return work

    def record_event(self, event: EmulatedEvent | None = None) -> EmulatedEvent:
        """Record ``event`` (a new timing event when None) on this stream; returns it."""
        event = event if event is not None else EmulatedEvent(self.device, enable_timing=True)
        event.record(self)
        return event

    def wait_event(self, event: EmulatedEvent) -> None:
        """Make later work on this stream wait until ``event`` completes (never blocks the
        caller unless the caller is this stream's thread, which then stalls as the stream)."""
        if self.on_stream_thread():
            event.synchronize()
        else:
            self._put("wait", event)

    def wait_stream(self, stream: EmulatedStream) -> None:
        """Make later work on this stream wait for everything queued on ``stream`` so far."""
        self.wait_event(stream.record_event())

    def query(self) -> bool:
        """Whether everything queued so far has run (never blocks)."""
        if self._pending:
            self.flush()
        return self._completed >= self._submitted

    def synchronize(self) -> None:
        """Wait until everything queued so far has run.

        Raises:
            RuntimeError: launched work raised (the first such error, from then on: as CUDA's
                asynchronous errors are sticky and surface at a synchronisation).
        """
        if not self.on_stream_thread():
            self._wait_for(self._submitted)
        if self._error is not None:
            raise RuntimeError(f"emulated stream: launched work failed: {self._error!r}") from (
                self._error)

    def _read(self, work: DeviceWork) -> Any:
        """On the stream thread: the host read of ``work``'s result (see ``DeviceWork.item``)."""
        if self._error is not None:
            raise self._error
        return work.result().item()

    def _wait_for(self, seq: int, timeout: float | None = None) -> bool:
        """Wait until item ``seq`` has run (woken once, by that item: no wake-up per item)."""
        self.flush()
        with self._lock:
            if self._completed >= seq or self._closed:
                return True
            ready = threading.Event()
            self._waiters.append((seq, ready))
        return ready.wait(timeout)

    def close(self, timeout: float = CLOSE_TIMEOUT) -> None:
        """Run what is queued, then stop the thread (waits up to ``timeout`` seconds)."""
        with self._lock:
            if self._closed:
                return
            thread = self._thread
            if thread is not None or self._pending:
                items, self._pending = self._pending, []
                if thread is None:
                    thread = self._thread = threading.Thread(
                        target=self._run, daemon=True,
                        name=f"laggard-emulated-stream-{self.device.name}-{self.index}")
                    thread.start()
                for item in items:
                    self._queue.put(item)
                self._queue.put((None, _STOP, None))
            self._closed = True
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    # ------------------------------------------------------------------------ the thread
    def _run(self) -> None:
        self._thread_id = threading.get_ident()
        self._clock.open()
        try:
            while True:
                seq, kind, payload = self._queue.get()
                if kind is _STOP:
                    break
                if kind == "marker":
                    event, generation = payload
                    event._complete(generation, self._clock.now())
                elif kind == "wait":
                    self._clock.begin()
                    payload.synchronize()
                    self._clock.end()
                else:
                    fn, args, kwargs, work = payload
                    self._clock.begin()
                    try:
                        value, error = fn(*args, **kwargs), None
                    except BaseException as exc:  # noqa: BLE001 - reported at the sync
                        value, error = None, exc
                        if self._error is None:
                            self._error = exc
                    finally:
                        self._clock.end()
                    work._finish(value, error)
                with self._lock:
                    self._completed = seq
                    if self._waiters:
                        self._wake(seq)
        finally:
            self._clock.close()
            with self._lock:
                self._closed = True
                self._wake(self._submitted)
            self._drain()

    def _drain(self) -> None:
        """After the stop: launched work that will never run fails instead of hanging its
        reader (markers stay pending)."""
        while True:
            try:
                _, kind, payload = self._queue.get_nowait()
            except queue.Empty:
                return
            if kind == "work":
                payload[3]._finish(None, RuntimeError(f"{self!r} closed before this work ran"))

    def _wake(self, seq: int) -> None:
        """Set the waiters' events up to ``seq`` (under ``_lock``)."""
        keep = []
        for wanted, ready in self._waiters:
            if wanted <= seq:
                ready.set()
            else:
                keep.append((wanted, ready))
        self._waiters = keep

    def _now(self) -> float:
        """The device clock now (stream thread only)."""
        return self._clock.now()


class EmulatedEvent:
    """``torch.cuda.Event`` on an emulated stream (see the module docstring).

    Args:
        device: its :class:`EmulatedDevice`.
        enable_timing: whether :meth:`elapsed_time` may read it.
        blocking, interprocess: accepted for torch's signature; ignored.
    """

    __slots__ = ("_done", "_generation", "_seconds", "_seq", "_stream", "device",
                 "enable_timing")

    def __init__(self, device: EmulatedDevice, enable_timing: bool = False,
                 blocking: bool = False, interprocess: bool = False) -> None:
        self.device = device
        self.enable_timing = enable_timing
        self._stream: EmulatedStream | None = None
        self._seq = 0
        self._generation = 0
        self._seconds: float | None = None
        self._done = True  # CUDA: an event never recorded queries as complete

    def record(self, stream: EmulatedStream | None = None) -> None:
        """Record on ``stream`` (the caller's current stream when None): a marker behind the
        work queued so far, or, on the stream's own thread, the device clock now.

        Raises:
            RuntimeError: the stream is closed.
        """
        stream = stream if stream is not None else self.device.current_stream()
        self._generation += 1
        self._stream = stream
        if stream.on_stream_thread():
            self._seconds, self._seq, self._done = stream._now(), 0, True
            return
        self._done, self._seconds = False, None
        self._seq = stream._put("marker", (self, self._generation))

    def _complete(self, generation: int, seconds: float) -> None:
        if generation == self._generation:  # not re-recorded since this marker was queued
            self._seconds = seconds
            self._done = True

    def query(self) -> bool:
        """Whether the stream has passed this event; never blocks (hands launched work to the
        stream thread if this marker is still batched)."""
        if not self._done and self._stream is not None and not self._stream._handed_over(
                self._seq):
            self._stream.flush()
        return self._done

    def synchronize(self) -> None:
        """Wait until the event has completed."""
        stream, seq = self._stream, self._seq
        if self._done or stream is None:
            return
        if stream.on_stream_thread():
            raise RuntimeError("an emulated stream cannot wait for its own later marker")
        stream._wait_for(seq)

    def wait(self, stream: EmulatedStream | None = None) -> None:
        """Make ``stream`` (the current one when None) wait for this event."""
        (stream if stream is not None else self.device.current_stream()).wait_event(self)

    def elapsed_time(self, end_event: EmulatedEvent) -> float:
        """Milliseconds of device time from this event to ``end_event``.

        Raises:
            RuntimeError: either event was created without ``enable_timing``, was never
                recorded, has not completed, or the two lie on different streams.
        """
        for event in (self, end_event):
            if not event.enable_timing:
                raise RuntimeError("Both events must be created with argument "
                                   "'enable_timing=True'.")
            if event._stream is None:
                raise RuntimeError("Both events must be recorded before calculating elapsed time.")
            if not event._done or event._seconds is None:
                raise RuntimeError("Both events must be completed before calculating elapsed "
                                   "time.")
        if self._stream is not end_event._stream:
            raise RuntimeError("emulated device: events on different streams have different "
                               "clocks")
        assert self._seconds is not None and end_event._seconds is not None
        return (end_event._seconds - self._seconds) * 1e3


class EmulatedDevice:
    """One rank's emulated asynchronous accelerator, used where code takes ``torch.cuda``.

    Args:
        name: shown in thread names and reprs (e.g. ``"rank2"``).
        clock: ``"busy"`` (default: wall time of the stream's work minus its run-queue delay)
            or ``"thread_cpu"``; see the module docstring.

    Raises:
        ValueError: an unknown ``clock``.

    Attributes:
        Event: ``Event(enable_timing=False)`` makes an :class:`EmulatedEvent` of this device.
        Stream: ``Stream()`` makes an :class:`EmulatedStream` (a thread of its own).
    """

    def __init__(self, name: str = "emulated-async", clock: str = "busy") -> None:
        if clock not in CLOCKS:
            raise ValueError(f"clock must be one of {CLOCKS}, not {clock!r}")
        if clock == "busy" and not schedstat_available():
            clock = "thread_cpu"
        self.name = name
        self.clock = clock
        self._stream_ids = itertools.count()
        self._streams: list[EmulatedStream] = []
        self._local = threading.local()
        self._default = EmulatedStream(self)

    def __repr__(self) -> str:
        return f"<EmulatedDevice {self.name} clock={self.clock}>"

    def __enter__(self) -> EmulatedDevice:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # torch.cuda's capitalised factories, bound to this device
    def Event(self, enable_timing: bool = False, blocking: bool = False,  # noqa: N802
              interprocess: bool = False) -> EmulatedEvent:
        """A new event of this device (``torch.cuda.Event``)."""
        return EmulatedEvent(self, enable_timing, blocking, interprocess)

    def Stream(self, priority: int = 0) -> EmulatedStream:  # noqa: N802
        """A new stream of this device (``torch.cuda.Stream``), with a thread of its own."""
        return EmulatedStream(self, priority)

    @staticmethod
    def is_available() -> bool:
        """Always True: the emulated device needs nothing but threads."""
        return True

    @staticmethod
    def device_count() -> int:
        return 1

    def default_stream(self) -> EmulatedStream:
        return self._default

    def current_stream(self) -> EmulatedStream:
        """The stream of the caller: set by :meth:`stream`, the stream whose thread is calling
        (inside launched work, e.g. a DDP hook), else the default stream."""
        current = getattr(self._local, "stream", None)
        if current is not None:
            return current
        for stream in self._streams:
            if stream.on_stream_thread():
                return stream
        return self._default

    @contextlib.contextmanager
    def stream(self, stream: EmulatedStream | None) -> Iterator[EmulatedStream | None]:
        """Make ``stream`` the caller's current stream inside the block (None: no change)."""
        if stream is None:
            yield None
            return
        previous = getattr(self._local, "stream", None)
        self._local.stream = stream
        try:
            yield stream
        finally:
            self._local.stream = previous

    def launch(self, fn: Callable[..., Any], *args: Any, stream: EmulatedStream | None = None,
               **kwargs: Any) -> DeviceWork:
        """Queue ``fn(*args, **kwargs)`` on ``stream`` (the current one when None) and return a
        :class:`DeviceWork` at once: the emulated kernel launch.

        Raises:
            RuntimeError: the stream is closed.
        """
        return (stream if stream is not None else self.current_stream()).launch(
            fn, *args, **kwargs)

    def synchronize(self) -> None:
        """Wait until every stream of this device has run what was queued on it."""
        for stream in list(self._streams):
            stream.synchronize()

    def close(self, timeout: float = CLOSE_TIMEOUT) -> None:
        """Run what is queued, then stop every stream's thread. Never raises."""
        for stream in list(self._streams):
            with contextlib.suppress(Exception):
                stream.close(timeout)
