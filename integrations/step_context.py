"""``with monitor.step():`` and ``with monitor.phase(name):``, the monitor's hot path.

Each boundary reads one clock and appends one ``(phase, start, end)`` interval; on the device
clock it also records a pooled timing event on the current stream. ``monitor.where`` (phase,
``perf_counter`` at entry) is replaced whole at each boundary, one assignment, so the heartbeat
thread can read it without a lock.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Literal


class StepContext:
    """``with monitor.step():`` (one object per monitor, reused every step); the training
    code's exception passes through (the step is then not recorded)."""

    __slots__ = ("_monitor",)

    def __init__(self, monitor: Any) -> None:
        self._monitor = monitor

    def __enter__(self) -> StepContext:
        self._monitor._begin_step()
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> Literal[False]:
        if exc_type is None:
            self._monitor._end_step()
        return False  # the training code's exception passes through


class PhaseContext:
    """``with monitor.phase(name):``: appends ``(name, start, end)`` to the step's intervals
    (``monitor._intervals``) and publishes ``monitor.where`` (the phase, then ``step`` again on
    exit) for the heartbeat.

    Args:
        monitor: the TrainingMonitor.
        name: the phase.
        clock: the phase clock, seconds.
    """

    __slots__ = ("_clock", "_intervals", "_monitor", "_name", "_start")

    def __init__(self, monitor: Any, name: str, clock: Callable[[], float]) -> None:
        self._monitor = monitor
        self._intervals = monitor._intervals
        self._name = name
        self._clock = clock
        self._start = 0.0

    def __enter__(self) -> PhaseContext:
        self._monitor.where = (self._name, time.perf_counter())
        self._start = self._clock()
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> Literal[False]:
        self._intervals.append((self._name, self._start, self._clock()))
        self._monitor.where = ("step", time.perf_counter())
        return False


class DevicePhaseContext(PhaseContext):
    """``with monitor.phase(name):`` on the device clock: an event on the current stream at
    each boundary (``device.phase_mark``), the wall clock beside it."""

    __slots__ = ("_device",)

    def __init__(self, monitor: Any, name: str, clock: Callable[[], float],
                 device: Any) -> None:
        super().__init__(monitor, name, clock)
        self._device = device

    def __enter__(self) -> PhaseContext:
        self._monitor.where = (self._name, time.perf_counter())
        try:
            self._device.phase_mark("start", self._name)
        except Exception:  # noqa: BLE001 - a failed mark leaves the step untimed (counted)
            pass
        self._start = self._clock()
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> Literal[False]:
        end = self._clock()
        try:
            self._device.phase_mark("end", self._name)
        except Exception:  # noqa: BLE001
            pass
        self._intervals.append((self._name, self._start, end))
        self._monitor.where = ("step", time.perf_counter())
        return False


__all__ = ["DevicePhaseContext", "PhaseContext", "StepContext"]
