"""Python garbage collection per training step: how long the training thread paused, in which
phase, up to which generation.

A rank whose collector pauses it holds every other rank up at the next synchronisation point,
just as a slow GPU does: ByteDance's study of 3,079 production jobs (Lin et al., "Understanding
Stragglers in Large Model Training Using What-if Analysis", OSDI'25) names Python GC among the
three main causes of stragglers. Without this timer the pause is inside whatever phase it fell
in, and the straggler detector calls the rank's compute slow.

How: CPython calls every function in :data:`gc.callbacks` twice per collection, with
``phase="start"`` before and ``phase="stop"`` after, and an ``info`` dict holding
``"generation"`` (the oldest generation being collected, 0-2), ``"collected"`` and
``"uncollectable"`` (https://docs.python.org/3/library/gc.html#gc.callbacks). The callbacks run
on the thread whose allocation triggered the collection (or that called :func:`gc.collect`),
holding the GIL, and collections do not nest, so a start is always followed by its own stop on
the same thread. The timer reads ``time.perf_counter`` at start and stop, and on the training
thread ``time.thread_time`` too when asked (``thread_cpu=True``: the monitor's ``thread_cpu``
phase clock): the pause on the clock the phases are timed on. Measured on a loaded 2-core VM:
1.5-2 µs per collection on the wall clock, 3-6 µs with the thread CPU clock (a thread's CPU
clock is a system call there, ~1.3 µs a read), against 10 µs or more for a gen-0 collection
of a few hundred objects.

Only the training thread's collections count toward its step: a collection another thread
triggers (the heartbeat thread's allocations can) pauses that thread, not the training loop,
even though the GIL stops the loop meanwhile; it is counted apart (:class:`GcStats`) and never
taken out of a phase. Collections between steps (the loop's own code outside ``with
monitor.step()``, the monitor's window gather) are counted apart too.

The callback never raises (an exception in a gc callback would be printed by CPython as
"Exception ignored in ..." at every collection): its own failures are counted.
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

#: Generations CPython collects (0 youngest, 2 oldest: a "full" collection).
GENERATIONS = 3
#: What the ``phase_of`` callable returns outside a step (nothing counts toward a step then).
OUTSIDE = "outside"
#: What it returns inside a step but between two timed phases.
BETWEEN_PHASES = "step"


@dataclass(slots=True)
class GcStats:
    """Counters of what the timer saw since it was installed; never reset.

    Attributes:
        collections: ``[gen0, gen1, gen2]`` collections of the training thread inside steps.
        seconds: wall seconds the training thread spent in them.
        other_thread_collections: collections another thread ran (never in a step's time).
        other_thread_seconds: their wall seconds.
        outside_step_collections: training-thread collections between steps.
        outside_step_seconds: their wall seconds.
        errors: failures inside the callback (counted, never raised).
    """

    collections: list[int] = field(default_factory=lambda: [0] * GENERATIONS)
    seconds: float = 0.0
    other_thread_collections: int = 0
    other_thread_seconds: float = 0.0
    outside_step_collections: int = 0
    outside_step_seconds: float = 0.0
    errors: int = 0


@dataclass(frozen=True, slots=True)
class GcStep:
    """The training thread's collections in one step.

    Attributes:
        wall_seconds: seconds of ``time.perf_counter`` spent collecting.
        cpu_seconds: seconds of the training thread's ``time.thread_time`` spent collecting.
        generation: the highest generation collected (0-2); -1 when none.
        collections: ``(gen0, gen1, gen2)`` collections in the step.
        wall_by_phase: phase name -> wall seconds of the collections that fell in that phase
            (``"step"``: between timed phases).
        cpu_by_phase: the same in thread CPU seconds.
    """

    wall_seconds: float = 0.0
    cpu_seconds: float = 0.0
    generation: int = -1
    collections: tuple[int, ...] = (0,) * GENERATIONS
    wall_by_phase: dict[str, float] = field(default_factory=dict)
    cpu_by_phase: dict[str, float] = field(default_factory=dict)


class GcTimer:
    """Times every collection of the training thread, per step and per phase (module docstring).

    Usage (what :class:`~laggard.integrations.monitor.TrainingMonitor` does)::

        timer = GcTimer(phase_of=lambda: monitor.where[0]).install()
        timer.begin_step()          # at each step's start, on the training thread
        ...                         # the step; collections are timed as they happen
        step = timer.take_step()    # at its end: a GcStep
        timer.remove()              # monitor.close()

    Args:
        phase_of: returns the training thread's current phase name (:data:`OUTSIDE` between
            steps, :data:`BETWEEN_PHASES` between two timed phases); read once per collection
            on the training thread. None: every collection after :meth:`begin_step` counts, in
            phase :data:`BETWEEN_PHASES`.
        thread_id: the training thread's ``threading.get_ident()``; default the constructing
            thread, replaced by the thread that calls :meth:`begin_step`.
        thread_cpu: also read the training thread's CPU clock (``GcStep.cpu_seconds`` and
            ``cpu_by_phase``; 0 without it).

    Attributes:
        stats: :class:`GcStats`.
        installed: whether the callback is in :data:`gc.callbacks`.
    """

    def __init__(self, phase_of: Callable[[], str] | None = None,
                 thread_id: int | None = None, thread_cpu: bool = True) -> None:
        self._phase_of = phase_of
        self._thread_cpu = thread_cpu
        self.thread_id = thread_id if thread_id is not None else threading.get_ident()
        self.stats = GcStats()
        self.installed = False
        # the collection in progress: the thread that started it and its start times
        self._start_thread = 0
        self._start_wall = 0.0
        self._start_cpu = 0.0
        self._reset_step()

    def _reset_step(self) -> None:
        self._wall = 0.0
        self._cpu = 0.0
        self._generation = -1
        self._counts = [0] * GENERATIONS
        self._wall_by_phase: dict[str, float] = {}
        self._cpu_by_phase: dict[str, float] = {}

    def install(self) -> GcTimer:
        """Append the callback to :data:`gc.callbacks` (once); returns self."""
        if not self.installed:
            gc.callbacks.append(self._callback)
            self.installed = True
        return self

    def remove(self) -> None:
        """Take the callback out of :data:`gc.callbacks`; safe to call twice, never raises."""
        self.installed = False
        try:
            gc.callbacks.remove(self._callback)
        except ValueError:
            pass

    def begin_step(self) -> None:
        """A step starts on the calling thread (the training thread): forget collections since
        the last :meth:`take_step` (they were between steps, counted in ``stats``)."""
        self.thread_id = threading.get_ident()
        self._reset_step()

    def take_step(self) -> GcStep:
        """The collections since :meth:`begin_step`, and start the next step's count.

        Returns:
            :class:`GcStep` (empty when the step had none).
        """
        # swap first: a collection triggered by the allocations below lands in the next step
        wall_by_phase, self._wall_by_phase = self._wall_by_phase, {}
        cpu_by_phase, self._cpu_by_phase = self._cpu_by_phase, {}
        counts, self._counts = self._counts, [0] * GENERATIONS
        step = GcStep(wall_seconds=self._wall, cpu_seconds=self._cpu,
                      generation=self._generation, collections=tuple(counts),
                      wall_by_phase=wall_by_phase, cpu_by_phase=cpu_by_phase)
        self._wall, self._cpu, self._generation = 0.0, 0.0, -1
        return step

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        """``gc.callbacks`` entry: ``phase`` ``"start"`` or ``"stop"``; never raises."""
        try:
            if phase == "start":
                self._start_thread = threading.get_ident()
                if self._thread_cpu and self._start_thread == self.thread_id:
                    self._start_cpu = time.thread_time()
                self._start_wall = time.perf_counter()
                return
            wall = time.perf_counter() - self._start_wall
            if self._start_thread != self.thread_id:
                self.stats.other_thread_collections += 1
                self.stats.other_thread_seconds += wall
                return
            cpu = time.thread_time() - self._start_cpu if self._thread_cpu else 0.0
            where = self._phase_of() if self._phase_of is not None else BETWEEN_PHASES
            if where == OUTSIDE:
                self.stats.outside_step_collections += 1
                self.stats.outside_step_seconds += wall
                return
            generation = int(info.get("generation", 0))
            if 0 <= generation < GENERATIONS:
                self._counts[generation] += 1
                self.stats.collections[generation] += 1
            self._generation = max(self._generation, generation)
            self._wall += wall
            self._cpu += cpu
            self.stats.seconds += wall
            self._wall_by_phase[where] = self._wall_by_phase.get(where, 0.0) + wall
            self._cpu_by_phase[where] = self._cpu_by_phase.get(where, 0.0) + cpu
        except Exception:  # noqa: BLE001 - a gc callback must never raise
            self.stats.errors += 1


__all__ = ["BETWEEN_PHASES", "GENERATIONS", "OUTSIDE", "GcStats", "GcStep", "GcTimer"]
