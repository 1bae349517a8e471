"""The phase arithmetic of one training step: what counts as compute, data and collective wait.

A pure function of the step's timed phases and its collectives (no torch, no clock, no socket),
so the rules are tested with plain numbers:

* **collective wait** is the step's *exposed* collective time: the time the training thread
  waited for collectives to finish (``CommTimer``: last completion minus the last bucket ready;
  the tracer: time blocked in synchronous collectives). Without either, a phase the loop named
  ``"collective_wait"`` is the wait. It travels in one place only, the StepRecord's
  ``collective_wait_seconds``: never as a phase.
* **phases** measure the rank's own work. On the wall clock DDP waits for its buckets inside
  ``backward()``: the exposed interval is taken out of whichever phases it overlapped. Other
  clocks (thread CPU time) do not advance while the thread waits, so nothing is taken out.
* **data** is the phase named ``"data"``; **compute** every other phase (forward, backward,
  optimizer, the loop's own names), or the step's time minus the wait when no phase was timed.
  Synchronous collectives that only the tracer saw (FSDP2 on gloo) sat inside the wall-clock
  phases with no interval to subtract: their exposed time comes off compute.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

#: The phase the loop may time its own collective wait in (used when nothing else measures it).
WAIT_PHASE = "collective_wait"
#: The data-loading phase.
DATA_PHASE = "data"


class StepCollectives(Protocol):
    """One step's collectives as :class:`~laggard.integrations.comm_timing.CommStep` and
    :class:`~laggard.integrations.tracer.TraceStep` give them (seconds, bytes)."""

    @property
    def exposed_seconds(self) -> float: ...

    @property
    def total_seconds(self) -> float: ...

    @property
    def bytes(self) -> int: ...


@dataclass(frozen=True, slots=True)
class StepTimes:
    """One step's times, as the window record's step columns and the StepRecord carry them.

    Attributes:
        phases: phase name -> seconds of this rank's own work (exposed wait taken out on the
            wall clock); never holds ``collective_wait``.
        compute_seconds: the phases other than ``data``.
        data_seconds: the ``data`` phase (0 when not timed).
        collective_wait_seconds: exposed collective time.
        collective_seconds: launch-to-completion collective time (union over buckets); the wait
            when no collective was timed.
        comm_bytes: payload bytes handed to collectives.
        step_seconds: wall time of the step.
    """

    phases: dict[str, float]
    compute_seconds: float
    data_seconds: float
    collective_wait_seconds: float
    collective_seconds: float
    comm_bytes: float
    step_seconds: float

    def columns(self) -> dict[str, float]:
        """The window record's step columns (``laggard.detectors.window.STEP_COLUMNS``) this
        step fills; ``transfer_seconds`` is NaN (not measured per step)."""
        return {
            "compute_seconds": self.compute_seconds,
            "data_seconds": self.data_seconds,
            "collective_wait_seconds": self.collective_wait_seconds,
            "transfer_seconds": float("nan"),
            "step_seconds": self.step_seconds,
            "collective_seconds": self.collective_seconds,
            "comm_bytes": self.comm_bytes,
        }


def step_times(
    intervals: Sequence[tuple[str, float, float]],
    *,
    step_seconds: float,
    collectives: StepCollectives | None = None,
    exposed_interval: tuple[float, float] | None = None,
    wall_clock: bool = True,
    blocking_collectives: bool = False,
) -> StepTimes:
    """Split one step's time into compute, data and collective wait (module docstring).

    Args:
        intervals: ``(phase, start, stop)`` per timed phase, in the phase clock's seconds; a
            name used twice adds up.
        step_seconds: wall time of the step.
        collectives: the step's collectives (a CommTimer's or the tracer's step), or None.
        exposed_interval: ``(start, end)`` of the exposed wait on the wall clock (DDP's
            CommTimer), or None; ignored unless ``wall_clock``.
        wall_clock: the phases were timed on the wall clock (``time.perf_counter``).
        blocking_collectives: the collectives were synchronous calls made inside the phases
            that only the tracer saw (no CommTimer): their exposed time comes off compute on
            the wall clock.

    Returns:
        :class:`StepTimes`; every duration >= 0.
    """
    exposed = exposed_interval if wall_clock else None
    phases: dict[str, float] = {}
    for name, start, stop in intervals:
        seconds = stop - start
        if exposed is not None:
            # DDP waits for the collectives inside backward(): move that wait out of the
            # phase it fell in, so phases measure this rank's own work.
            seconds -= max(0.0, min(stop, exposed[1]) - max(start, exposed[0]))
        phases[name] = phases.get(name, 0.0) + max(0.0, seconds)
    own_wait = phases.pop(WAIT_PHASE, 0.0)
    wait = collectives.exposed_seconds if collectives is not None else own_wait
    data = phases.get(DATA_PHASE, 0.0)
    if phases:
        compute = sum(v for k, v in phases.items() if k != DATA_PHASE)
    else:
        compute = max(0.0, step_seconds - wait)
    if collectives is not None and blocking_collectives and wall_clock and exposed is None:
        compute = max(0.0, compute - wait)
    return StepTimes(
        phases=phases,
        compute_seconds=compute,
        data_seconds=data,
        collective_wait_seconds=wait,
        collective_seconds=collectives.total_seconds if collectives is not None else wait,
        comm_bytes=float(collectives.bytes) if collectives is not None else 0.0,
        step_seconds=step_seconds,
    )


__all__ = ["DATA_PHASE", "WAIT_PHASE", "StepCollectives", "StepTimes", "step_times"]
