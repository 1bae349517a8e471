"""Kernel-level compute time from CUPTI's Activity API (optional: ``pip install 'laggard[cupti]'``).

Timing events bracket a phase on one stream; CUPTI sees every kernel the device ran, on every
stream, with its own device start and end (ns). NVIDIA's nvidia-resiliency-ext scores a rank's
compute this way and leaves out NCCL's kernels (names starting with ``ncclDev`` or
``ncclKernel``): a kernel that waits for a peer is communication, not this rank's compute. This
module does the same, per sampled step, with NVIDIA's ``cupti-python`` bindings
(``from cupti import cupti``): ``activity_register_callbacks(requested, completed)``,
``activity_enable(ActivityKind.CONCURRENT_KERNEL)``, kernel records with ``name``, ``start``,
``end`` (ns), ``correlation_id``; ``activity_push_external_correlation_id`` /
``activity_pop_external_correlation_id`` tag the launches of a step, and
``ActivityKind.EXTERNAL_CORRELATION`` records (written for each runtime/driver API record, so
``RUNTIME`` and ``DRIVER`` are enabled during a sampled step too) map each launch's
``correlation_id`` to that tag (``external_id``), as the PyTorch profiler (Kineto) attributes
kernels to ranges. A kernel runs after the CPU has moved on, so a step's kernel time is known
only once CUPTI hands its buffer back (at a flush or when a buffer fills):
:meth:`KernelTimer.take` is called at the window gather and returns the steps fully delivered,
one window late, like the device clock.

Off by default. Before CUDA 13.5 (driver r610) CUPTI has one subscriber per process, which the
PyTorch profiler also wants (and Nsight Systems, and DCGM's profiling module):
:meth:`KernelTimer.start` subscribes first and refuses clearly (one log line, ``refused`` set,
nothing raised) when CUPTI is taken or the profiler is on; while laggard holds CUPTI the
PyTorch profiler's CUDA activity is unavailable until :meth:`KernelTimer.stop`. A sampled step
during which a PyTorch profiler is recording is skipped (counted). The timing events of the
device clock stay the fallback: nothing here is needed for a finding.

The accounting (:class:`KernelAccumulator`) is pure Python on plain records, tested without a
GPU; the CUPTI glue takes the module as a parameter, so tests pass a fake with cupti-python's
names.
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable, Iterable
from typing import Any

from laggard.detectors.window import WindowColumn
from laggard.integrations.participants import MonitorContext, WindowParticipant

log = logging.getLogger(__name__)

#: Kernel-name prefixes of NCCL's kernels (NVRx's filter): communication, not compute.
NCCL_KERNEL_PREFIXES = ("ncclDev", "ncclKernel")
#: The external-correlation kind laggard tags its steps with (``CUpti_ExternalCorrelationKind``
#: ``CUSTOM1``; the PyTorch profiler uses ``CUSTOM0``).
EXTERNAL_KIND_NAME = "CUSTOM1"
#: Bytes of each activity buffer CUPTI asks for.
BUFFER_BYTES = 8 << 20


def is_nccl_kernel(name: str) -> bool:
    """True for NCCL's own kernels (``ncclDevKernel_AllReduce_...``, ``ncclKernel_...``)."""
    return name.startswith(NCCL_KERNEL_PREFIXES)


class KernelAccumulator:
    """Sums non-NCCL kernel time per step from activity records; pure logic, thread-safe.

    Feed it what CUPTI delivers, in any order and any split across buffers: kernel records
    ``(correlation_id, name, start_ns, end_ns)`` and external-correlation records
    ``(correlation_id, step)``. A kernel counts once both halves are seen.

    Args:
        max_unmatched: kernels (or correlations) kept waiting for their other half at most;
            the oldest beyond it is dropped (counted in ``stats["unmatched"]``).

    Attributes:
        stats: ``kernels`` (counted into a step), ``nccl_kernels`` (left out), ``unmatched``
            (dropped waiting for their other half), ``bad_records`` (no name, end before start).
    """

    def __init__(self, max_unmatched: int = 65536) -> None:
        self.max_unmatched = max_unmatched
        self.stats = dict.fromkeys(("kernels", "nccl_kernels", "unmatched", "bad_records"), 0)
        self._lock = threading.Lock()
        self._step_of: collections.OrderedDict[int, int] = collections.OrderedDict()
        self._waiting: collections.OrderedDict[int, list[float]] = collections.OrderedDict()
        self._seconds: dict[int, float] = {}
        self._kernels: dict[int, int] = {}

    def add_kernel(self, correlation_id: int, name: str, start_ns: int, end_ns: int) -> None:
        """One kernel record (``start_ns`` / ``end_ns``: CUPTI device timestamps)."""
        if not isinstance(name, str) or end_ns < start_ns:
            with self._lock:
                self.stats["bad_records"] += 1
            return
        with self._lock:
            if is_nccl_kernel(name):
                self.stats["nccl_kernels"] += 1
                return
            seconds = (end_ns - start_ns) / 1e9
            step = self._step_of.get(correlation_id)
            if step is None:
                self._waiting.setdefault(correlation_id, []).append(seconds)
                self._bound(self._waiting)
                return
            self._count(step, seconds)

    def add_correlation(self, correlation_id: int, step: int) -> None:
        """One external-correlation record: the launch ``correlation_id`` belongs to ``step``."""
        with self._lock:
            self._step_of[correlation_id] = step
            self._bound(self._step_of)
            for seconds in self._waiting.pop(correlation_id, ()):
                self._count(step, seconds)

    def take(self, before_step: int) -> dict[int, tuple[float, int]]:
        """Steps older than ``before_step``: ``{step: (kernel seconds, kernels)}``, forgotten.

        Call at the window gather with the first step of the window being gathered's successor:
        a step's kernels are delivered after it ends, so only steps a window old are complete.
        """
        with self._lock:
            done = {s: (self._seconds.pop(s), self._kernels.pop(s))
                    for s in sorted(self._seconds) if s < before_step}
            stale = [c for c, s in self._step_of.items() if s < before_step]
            for c in stale[:-1]:  # keep the newest: a kernel record may still follow it
                del self._step_of[c]
        return done

    def feed(self, records: Iterable[Any], kernel_kinds: frozenset[int],
             correlation_kind: int | None) -> None:
        """Feed activity records as cupti-python delivers them (objects with ``kind`` and the
        record's fields); other kinds are ignored."""
        for record in records:
            try:
                kind = int(record.kind)
                if kind in kernel_kinds:
                    self.add_kernel(int(record.correlation_id), record.name, int(record.start),
                                    int(record.end))
                elif correlation_kind is not None and kind == correlation_kind:
                    self.add_correlation(int(record.correlation_id), int(record.external_id))
            except Exception:  # noqa: BLE001 - a malformed record is counted, the rest go on
                with self._lock:
                    self.stats["bad_records"] += 1

    def _count(self, step: int, seconds: float) -> None:
        self._seconds[step] = self._seconds.get(step, 0.0) + seconds
        self._kernels[step] = self._kernels.get(step, 0) + 1
        self.stats["kernels"] += 1

    def _bound(self, table: collections.OrderedDict[int, Any]) -> None:
        while len(table) > self.max_unmatched:
            table.popitem(last=False)
            self.stats["unmatched"] += 1


def load_cupti() -> Any:
    """cupti-python's ``cupti.cupti`` module, or None when it is not installed."""
    try:
        from cupti import cupti  # type: ignore[import-not-found]
    except Exception:  # noqa: BLE001 - not installed, or no CUDA libraries under it
        return None
    return cupti


def _profiler_on() -> bool:
    """Whether a PyTorch (autograd/Kineto) profiler is recording now."""
    try:
        import torch

        return bool(torch.autograd.profiler._is_profiler_enabled)
    except Exception:  # noqa: BLE001
        return False


class KernelTimer:
    """Per sampled step, the sum of this rank's non-NCCL kernel time (CUPTI Activity API).

    Usage (the monitor's step boundaries, or your own)::

        timer = KernelTimer(sample_every=10)
        if timer.start():                       # False: refused, logged once, events stay
            ...
            timer.begin_step(step); ...; timer.end_step()
            per_step = timer.take(before_step=first_step_of_this_window)

    Args:
        sample_every: time every N-th step (steps ``step % N == 0``); the activity is enabled
            only during sampled steps.
        cupti: the ``cupti.cupti`` module (None: import cupti-python; a fake in tests).
        profiler_on: returns whether a PyTorch profiler is recording (default: torch's flag).

    Attributes:
        refused: why the timer is off (None while it runs or before :meth:`start`).
        accumulator: the :class:`KernelAccumulator` (its ``stats``).
        stats: ``sampled`` steps, ``skipped_profiler`` (a profiler was on), ``errors``.

    Raises:
        ValueError: ``sample_every`` < 1.
    """

    def __init__(self, sample_every: int = 10, *, cupti: Any = None,
                 profiler_on: Callable[[], bool] | None = None) -> None:
        if sample_every < 1:
            raise ValueError("sample_every must be >= 1")
        self.sample_every = sample_every
        self._cupti = cupti
        self._profiler_on = profiler_on if profiler_on is not None else _profiler_on
        self.refused: str | None = None
        self.accumulator = KernelAccumulator()
        self.stats = dict.fromkeys(("sampled", "skipped_profiler", "errors"), 0)
        self._subscriber: Any = None
        self._running = False
        self._in_step: int | None = None
        self._kernel_kinds: frozenset[int] = frozenset()
        self._api_kinds: tuple[int, ...] = ()
        self._correlation_kind: int | None = None
        self._external_kind: Any = None

    @property
    def running(self) -> bool:
        """Whether CUPTI is held and kernels are being timed."""
        return self._running

    def start(self) -> bool:
        """Take CUPTI: subscribe, register the buffer callbacks. Never raises.

        Returns:
            True when running; False when refused (``refused`` says why; logged once): the
            package is missing, a PyTorch profiler is on, CUPTI is taken by another subscriber
            (``cuptiError``: one subscriber before CUDA 13.5 / driver r610), or CUPTI failed.
        """
        if self._running:
            return True
        if self.refused is not None:
            return False
        cupti = self._cupti if self._cupti is not None else load_cupti()
        if cupti is None:
            return self._refuse("cupti-python is not installed (pip install 'laggard[cupti]'); "
                                "compute is timed by events only")
        self._cupti = cupti
        if self._profiler_on():
            return self._refuse("a PyTorch profiler is recording and CUPTI takes one subscriber "
                                "before CUDA 13.5; kernel timing off, events stay")
        try:
            kind = cupti.ActivityKind
            self._kernel_kinds = frozenset(int(getattr(kind, k)) for k in
                                           ("CONCURRENT_KERNEL", "KERNEL") if hasattr(kind, k))
            # an external-correlation record is written for each runtime/driver API record made
            # inside the pushed range: those kinds must be on during a sampled step too
            self._api_kinds = tuple(int(getattr(kind, k)) for k in ("RUNTIME", "DRIVER")
                                    if hasattr(kind, k))
            self._correlation_kind = int(kind.EXTERNAL_CORRELATION)
            self._external_kind = getattr(cupti.ExternalCorrelationKind, EXTERNAL_KIND_NAME)
            self._subscriber = cupti.subscribe(lambda *args: None, None)
        except Exception as exc:  # noqa: BLE001 - cuptiError(MULTIPLE_SUBSCRIBERS...) and more
            return self._refuse(f"CUPTI is taken or unusable ({exc!r}): another subscriber (the "
                                "PyTorch profiler, Nsight Systems, DCGM profiling) holds it "
                                "before CUDA 13.5; kernel timing off, events stay")
        try:
            cupti.activity_register_callbacks(self._buffer_requested, self._buffer_completed)
            cupti.activity_enable(self._correlation_kind)
        except Exception as exc:  # noqa: BLE001
            self._release()
            return self._refuse(f"CUPTI refused the activity callbacks ({exc!r}); kernel "
                                "timing off, events stay")
        self._running = True
        return True

    def begin_step(self, step: int) -> None:
        """Mark the start of ``step`` (on the training thread, before its first launch).

        A sampled step enables kernel activity and tags its launches with ``step``; the others
        cost one modulo. Never raises.
        """
        if not self._running or step % self.sample_every or self._in_step is not None:
            return
        if self._profiler_on():
            self.stats["skipped_profiler"] += 1
            return
        cupti = self._cupti
        try:
            for kind in (*self._kernel_kinds, *self._api_kinds):
                cupti.activity_enable(kind)
            cupti.activity_push_external_correlation_id(self._external_kind, step)
            self._in_step = step
            self.stats["sampled"] += 1
        except Exception as exc:  # noqa: BLE001
            self._fail("begin_step", exc)

    def end_step(self) -> None:
        """Mark the end of the step begun (after its last launch). Never raises."""
        if self._in_step is None:
            return
        self._in_step = None
        cupti = self._cupti
        try:
            cupti.activity_pop_external_correlation_id(self._external_kind)
            for kind in (*self._kernel_kinds, *self._api_kinds):
                cupti.activity_disable(kind)
        except Exception as exc:  # noqa: BLE001
            self._fail("end_step", exc)

    def take(self, before_step: int, *, flush: bool = True) -> dict[int, tuple[float, int]]:
        """The sampled steps older than ``before_step``: ``{step: (kernel seconds, kernels)}``.

        Args:
            before_step: the first step whose kernels may still be running (the current
                window's first step: the result is one window late).
            flush: ask CUPTI for the records completed so far (``activity_flush_all(0)``: not
                forced, it hands back finished buffers and does not wait for the device).

        Never raises; {} when not running.
        """
        if self._running and flush:
            try:
                self._cupti.activity_flush_all(0)
            except Exception as exc:  # noqa: BLE001
                self._fail("flush", exc)
        return self.accumulator.take(before_step)

    def stop(self) -> None:
        """Flush, disable, release CUPTI (the PyTorch profiler can take it again). Never
        raises."""
        if not self._running:
            return
        self.end_step()
        cupti = self._cupti
        try:
            cupti.activity_flush_all(1)
            cupti.activity_disable(self._correlation_kind)
        except Exception as exc:  # noqa: BLE001
            self._fail("stop", exc)
        self._release()
        self._running = False

    # ------------------------------------------------------------------ CUPTI's callbacks
    def _buffer_requested(self) -> tuple[int, int]:
        return BUFFER_BYTES, 0  # bytes, max records (0: as many as fit)

    def _buffer_completed(self, activities: list[Any]) -> None:
        # on CUPTI's thread: never raise into it
        try:
            self.accumulator.feed(activities, self._kernel_kinds, self._correlation_kind)
        except Exception as exc:  # noqa: BLE001
            self._fail("buffer", exc)

    # ----------------------------------------------------------------------- helpers
    def _release(self) -> None:
        if self._subscriber is not None:
            try:
                self._cupti.unsubscribe(self._subscriber)
            except Exception:  # noqa: BLE001
                pass
            self._subscriber = None

    def _refuse(self, why: str) -> bool:
        self.refused = why
        log.warning("laggard: CUPTI kernel timing refused: %s", why)
        return False

    def _fail(self, where: str, exc: BaseException) -> None:
        self.stats["errors"] += 1
        if self.stats["errors"] == 1:
            log.warning("laggard: CUPTI kernel timing failed in %s (%r); counting on", where, exc)


#: The window record's column of the kernel time (one window late).
KERNEL_COLUMN = "compute_kernel_seconds"


class KernelTimeParticipant(WindowParticipant):
    """The monitor's participant that puts the CUPTI kernel time in the window record:
    ``TrainingMonitor(config, participants=[KernelTimeParticipant()])`` (off unless given).

    Each step runs from the end of the previous one to its own end (the monitor's step
    boundaries; a step's launches after ``monitor.step()`` exits count to the next). Every
    ``sample_every``-th step is timed; at each window gather the column
    ``compute_kernel_seconds`` holds the median non-NCCL kernel seconds of the sampled steps
    CUPTI has handed back from before this window (one window late, as the device clock; NaN
    while none). Refused CUPTI (missing package, the profiler, another subscriber) leaves the
    column NaN, said once in the log.

    Args:
        sample_every: time every N-th step.
        timer: a :class:`KernelTimer` (tests pass one with a fake ``cupti``); made when None.
    """

    name = "cupti"
    columns = (
        WindowColumn(KERNEL_COLUMN, "seconds", "median",
                     "median non-NCCL kernel seconds per sampled step (CUPTI), one window late"),
        WindowColumn("kernel_sampled_steps", "count", "sum",
                     "sampled steps behind compute_kernel_seconds"),
    )

    def __init__(self, sample_every: int = 10, *, timer: KernelTimer | None = None) -> None:
        super().__init__()
        self.timer = timer if timer is not None else KernelTimer(sample_every)
        self._window_start = 0

    def attach(self, context: MonitorContext) -> None:
        super().attach(context)
        if self.timer.start():
            self.timer.begin_step(0)

    def end_step(self, step: int, column: int) -> None:
        self.timer.end_step()
        self.timer.begin_step(step + 1)

    def contribute(self, step: int) -> dict[str, object]:
        window_start = step + 1 - (self.context.window_steps if self.context else 1)
        steps = self.timer.take(before_step=window_start)
        seconds = sorted(v for v, _ in steps.values())
        median = float("nan")
        if seconds:
            mid = len(seconds) // 2
            median = seconds[mid] if len(seconds) % 2 else (seconds[mid - 1] + seconds[mid]) / 2
        return {KERNEL_COLUMN: median, "kernel_sampled_steps": float(len(seconds))}


__all__ = ["KERNEL_COLUMN", "NCCL_KERNEL_PREFIXES", "KernelAccumulator", "KernelTimeParticipant",
           "KernelTimer", "is_nccl_kernel", "load_cupti"]
