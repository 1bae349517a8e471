"""The monitor's device clock: one pooled timing event per phase boundary, read one window late.

On CUDA a phase timed on the CPU measures how long the CPU took to *launch* its kernels. With
``TrainingMonitor.Config(phase_clock="device")`` every phase boundary also records a timing event
on the current stream (:class:`~laggard.integrations.device_events.EventPool`, made once: the hot
path creates and destroys no event), as do the DDP timing hook when a gradient bucket becomes
ready (:meth:`~laggard.integrations.comm_timing.CommTimer.bucket_ready`) and the FSDP2 stall
markers (:mod:`laggard.integrations.fsdp_device`). A step's events form one *group*; at each step
end the groups at the front of a FIFO whose events have all completed are read (``query()``
only, never ``synchronize()``), turned into the step's device times by the pure
:func:`~laggard.integrations.phases.device_step_times` (``max(device, cpu)`` per phase), and
written into a per-step table.

One window late: the gather at the end of window ``w`` carries window ``w - 1``'s device columns
(:data:`~laggard.detectors.window.DEVICE_CLOCK_COLUMNS`), so the device has had a whole window to
finish them; detection takes one window longer than on the CPU clock, and the first window's
device columns are NaN. A step whose events are still pending at its window's gather keeps its
CPU times in ``compute_seconds`` / ``data_seconds`` / ``collective_wait_seconds`` (the CPU clock
used instead), NaN device columns, and is counted in ``device_pending_count`` and
:attr:`DeviceClockStats.steps_pending`; its events, once read, are discarded (``steps_late``).

Steps the device clock cannot time are counted and fall back to the CPU clock: a mark recorded
on a stream other than the step's first (a stream the user switched to;
``stream_switches``), an event missing (pool exhausted or ``record`` raised; ``untimed_steps``).
"""

from __future__ import annotations

import collections
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from laggard.detectors.blame import window_blame
from laggard.detectors.window import DEVICE_CLOCK_COLUMNS, STEP_COLUMNS, summarize_window
from laggard.integrations.device_events import DeviceEventStats, EventPool
from laggard.integrations.phases import (
    BUCKET_READY,
    PHASE_END,
    PHASE_START,
    StepTimes,
    device_step_times,
)

#: The late table's rows: :data:`DEVICE_CLOCK_COLUMNS`' columns, in that order.
_COLUMNS = tuple(next(c for c in STEP_COLUMNS if c.name == n) for n in DEVICE_CLOCK_COLUMNS)
_ROW = {name: row for row, name in enumerate(DEVICE_CLOCK_COLUMNS)}
_PENDING = _ROW["device_pending_count"]


#: The blame sums (laggard.detectors.blame) the device clock's waits and work replace: a GPU's
#: collective waits are on its stream, the CPU's are launch times (the step sums stay the CPU's).
DEVICE_BLAME_COLUMNS = ("wait_sum_seconds", "wait_spike_count", "wait_spike_seconds",
                        "work_spike_count", "work_spike_seconds")


def _device_blame(slot: np.ndarray) -> dict[str, float]:
    """:data:`DEVICE_BLAME_COLUMNS` of one window of the late table (its per-step device
    waits and compute + data; a step's typical length for the spike threshold is their sum)."""
    wait = slot[_ROW["collective_wait_seconds"]]
    work = slot[_ROW["compute_seconds"]] + slot[_ROW["data_seconds"]]
    values = window_blame(wait, work + wait, work)
    return {name: values[name] for name in DEVICE_BLAME_COLUMNS}


@dataclass(slots=True)
class DeviceClockStats:
    """Counters of the device clock; read them, they are never reset.

    Attributes:
        steps_read: steps whose device times were read in time for their window.
        steps_pending: steps still pending at their window's gather (CPU clock used).
        steps_late: steps read after their window was gathered (discarded).
        events: the event pool's counters.
        steps_expired: steps dropped still pending (too many behind them; events not reused).
        stream_switches: steps with a mark on a stream other than the step's first (CPU clock).
        untimed_steps: steps with a missing event (pool empty, ``record`` raised; CPU clock).
        read_errors: groups whose ``query``/``elapsed_time`` raised (CPU clock).
    """

    # the steps read, in time or not
    steps_read: int = 0
    steps_pending: int = 0
    steps_late: int = 0
    events: DeviceEventStats = field(default_factory=DeviceEventStats)
    # the steps the device clock could not time (CPU clock used)
    steps_expired: int = 0
    stream_switches: int = 0
    untimed_steps: int = 0
    read_errors: int = 0


@dataclass(slots=True)
class _Group:
    """One step's events, waiting for the device."""

    step: int
    marks: list[tuple[str, str, Any]]
    cpu: StepTimes
    late: bool = False  # its window was gathered while it was pending
    discard: bool = False  # untimed or stream-switched: queued only to free its events


class DeviceClock:
    """Per-step device marks on a ``torch.cuda``-like module, harvested without blocking.

    Args:
        cuda: ``torch.cuda`` or a module with its names (``Event(enable_timing=True)`` with
            ``record``/``query``/``elapsed_time``, ``current_stream()``).
        window_steps: K of the monitor's windows.
        pool_events: events made up front (a step uses 2 per phase, 1 per DDP model, 2 per FSDP2
            wait; the pool holds a few windows of steps in flight).
        log_once: ``(key, message, *args)`` for what is reported once.

    Raises:
        ValueError: ``window_steps`` < 1 or ``pool_events`` < 2.
        Whatever ``cuda.Event`` raises (no device), here, never on the hot path.

    Attributes:
        stats: :class:`DeviceClockStats`.
        pool: the :class:`EventPool` (shared with the CommTimer and the FSDP2 markers).
    """

    def __init__(self, cuda: Any, *, window_steps: int, pool_events: int = 1024,
                 log_once: Callable[..., None] | None = None) -> None:
        if window_steps < 1:
            raise ValueError("window_steps must be >= 1")
        self.cuda = cuda
        self.window_steps = window_steps
        self.stats = DeviceClockStats()
        self.pool = EventPool(cuda, pool_events, self.stats.events)
        self._log_once = log_once or (lambda *a: None)
        # (2 windows, rows, K): slot (step // K) % 2 holds the window being read
        self._table = np.full((2, len(_COLUMNS), window_steps), np.nan)
        self._queue: collections.deque[_Group] = collections.deque()
        self._max_pending = 2 * window_steps + 2
        self._marks: list[tuple[str, str, Any]] | None = None
        self._stream: Any = None
        self._switched = False
        self._ready: dict[int, Any] = {}
        self._closed_before = 0  # windows < this were gathered

    # ------------------------------------------------------------------ hot path (per step)
    def begin_step(self) -> None:
        """Open a step's group (the monitor's ``step()`` entry)."""
        self._marks = []
        self._switched = False
        self._ready.clear()
        try:
            self._stream = self.cuda.current_stream()
        except Exception:  # noqa: BLE001 - no stream: this step is untimed
            self._stream = None

    def mark(self, kind: str, name: str = "") -> Any:
        """Record one event of kind ``kind`` (:mod:`laggard.integrations.phases`' kinds) on
        the current stream into the open step; None outside a step or when none was taken."""
        marks = self._marks
        if marks is None:
            return None
        event = self.pool.record()
        marks.append((kind, name, event))  # None makes the step untimed (counted at its end)
        return event

    def phase_mark(self, kind: str, name: str) -> None:
        """A phase boundary: :meth:`mark`, and note a stream other than the step's first."""
        if self._marks is None:
            return
        try:
            if self.cuda.current_stream() != self._stream:
                self._switched = True
        except Exception:  # noqa: BLE001
            self._switched = True
        self.mark(kind, name)

    def bucket_ready(self, owner: int) -> None:
        """A gradient bucket of DDP model ``owner`` (a CommTimer's id) became ready: the first
        bucket of the step takes an event, later ones re-record it, so the step keeps only the
        last (CUDA events may be re-recorded; the latest record is the one queried)."""
        if self._marks is None:
            return
        event = self._ready.get(owner)
        if event is None:
            event = self.mark(BUCKET_READY)
            if event is not None:
                self._ready[owner] = event
            return
        try:
            event.record()
        except Exception:  # noqa: BLE001 - the earlier record stands
            self.stats.events.errors += 1

    def end_step(self, step: int, cpu: StepTimes) -> None:
        """Close the step's group, queue it, and read every completed group at the front.

        Args:
            step: the step's index.
            cpu: the step's times on the CPU clock (kept beside the device times).
        """
        marks, self._marks = self._marks, None
        if marks is None:
            return
        self._write(step, self._cpu_values(cpu, pending=1.0))
        untimed = not marks or any(event is None for _, _, event in marks)
        if untimed or self._switched:
            if untimed:
                self.stats.untimed_steps += 1
                self._log_once("device-untimed", "laggard: a step's device events could not be "
                               "recorded (event pool empty or record failed); such steps use "
                               "the CPU clock (counted in monitor.device_clock.stats)")
            else:
                self.stats.stream_switches += 1
                self._log_once("device-stream", "laggard: a phase ran on a stream other than "
                               "the step's first; such steps use the CPU clock (counted)")
            self._write(step, self._cpu_values(cpu, pending=0.0))
            # the recorded events may still be pending on the device: queue them to be freed
            self._queue.append(_Group(step, [m for m in marks if m[2] is not None], cpu,
                                      discard=True))
        else:
            self._queue.append(_Group(step, marks, cpu))
        while len(self._queue) > self._max_pending:
            self._queue.popleft()  # its events are not reused: the device may still write them
            self.stats.steps_expired += 1
        self.harvest()

    def harvest(self) -> int:
        """Read the groups at the front whose events have all completed (``query()`` only).

        Returns:
            Groups read.
        """
        read = 0
        while self._queue:
            group = self._queue[0]
            try:
                # the last mark first: the stream completes in order, so it is usually the
                # only one still pending
                if not all(event.query() for _, _, event in reversed(group.marks)):
                    break
                if not group.marks:
                    self._queue.popleft()
                    continue
                first = group.marks[0][2]
                marks = [(kind, name, first.elapsed_time(event) / 1e3)  # ms -> s
                         for kind, name, event in group.marks]
            except Exception:  # noqa: BLE001 - an unreadable group keeps its CPU times
                self._queue.popleft()
                self.stats.read_errors += 1
                continue
            self._queue.popleft()
            self.pool.give_back(*{id(e): e for _, _, e in group.marks}.values())
            read += 1
            if group.discard:
                continue
            if group.late:
                self.stats.steps_late += 1
                continue
            times = device_step_times(group.cpu, marks)
            values = times.columns()
            values["device_pending_count"] = 0.0
            self._write(group.step, values)
            self.stats.steps_read += 1
        return read

    # ----------------------------------------------------------------------- per window
    def window_values(self, step: int) -> dict[str, float]:
        """The device-clock columns to gather at the end of the window holding ``step``:
        the previous window's (all NaN for the first window; pending steps counted).

        Returns:
            Column name -> value for :data:`~laggard.detectors.window.DEVICE_CLOCK_COLUMNS`.
        """
        self.harvest()
        window = step // self.window_steps
        previous = window - 1
        if previous < 0:
            values = dict.fromkeys(DEVICE_CLOCK_COLUMNS + DEVICE_BLAME_COLUMNS, math.nan)
            values["device_pending_count"] = 0.0
        else:
            slot = self._table[previous % 2]
            values = summarize_window(slot, _COLUMNS)
            values.update(_device_blame(slot))
            pending = int(np.nansum(slot[_PENDING]))
            if pending:
                self.stats.steps_pending += pending
                self._log_once("device-pending", "laggard: %d step(s) of window ending at step "
                               "%d still pending on the device at its gather: NaN device "
                               "columns, CPU clock used (counted; the device is more than a "
                               "window behind the CPU, or its events never complete)",
                               pending, step - self.window_steps)
            for group in self._queue:
                if group.step // self.window_steps <= previous:
                    group.late = True
            slot[:] = np.nan  # reused by window + 1
        self._closed_before = max(self._closed_before, window)
        return values

    # ------------------------------------------------------------------------- helpers
    @staticmethod
    def _cpu_values(cpu: StepTimes, pending: float) -> dict[str, float]:
        return {"compute_seconds": cpu.compute_seconds, "data_seconds": cpu.data_seconds,
                "collective_wait_seconds": cpu.collective_wait_seconds,
                "compute_device_seconds": math.nan, "compute_cpu_seconds": cpu.compute_seconds,
                "collective_wait_device_seconds": math.nan, "device_pending_count": pending}

    def _write(self, step: int, values: dict[str, float]) -> None:
        window = step // self.window_steps
        if window < self._closed_before:
            return  # its window was gathered already
        column = step % self.window_steps
        slot = self._table[window % 2]
        for name, value in values.items():
            slot[_ROW[name], column] = value


__all__ = ["PHASE_END", "PHASE_START", "DeviceClock", "DeviceClockStats"]
