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
* **gc** is the training thread's Python garbage collection (:mod:`laggard.integrations.
  gc_timing`, per phase, on the phase clock): each phase loses the collections that fell in it
  and a phase ``"gc"`` holds them, so ``backward`` measures backward and the pause has a name.
  ``gc`` is not ``data``, so it counts in compute: a rank whose collections hold the job up is
  still a compute straggler, and :mod:`laggard.detectors.causes` names the cause. A collection
  in the loop's ``data`` phase thus moves from data to compute. Collections between two timed
  phases were in no phase and stay out of every one.
* **exposed P2P wait** (pipeline parallelism: the training thread blocked in the schedule's
  waits for sends and receives, :func:`~laggard.integrations.trace_sources.instrument_pipeline`)
  sat inside the wall-clock phase that ran the schedule: it comes off compute on the wall clock,
  and travels as ``p2p_wait_seconds``, never as collective wait.

On the device clock (:func:`device_step_times`) a step also has *device marks*: timing events
recorded on the stream at each phase's start and end, at the last gradient bucket's readiness
(DDP), at the end of DDP's buffer broadcast, and around FSDP2's waits for its collectives, each
read back as device seconds since the step's first mark. Their arithmetic is pure too:

* a phase's **device time** is its end mark minus its start mark; its **device wait** is the
  union, inside the phase, of the times the stream waited for peers: from the last bucket ready
  to the phase's end (DDP's exposed communication: after the last bucket the compute stream only
  waits for the collectives), from the phase's start to the end of the buffer broadcast, and
  each FSDP2 stall (start to end mark, nested stalls counted once);
* per phase the rank's own work is ``max(device - device wait, cpu)``, as Megatron-LM's
  StragglerDetector keeps ``max(event time, perf_counter time)``: a launch-bound or data-bound
  rank still shows; compute and data add these up as on the CPU clock;
* the collective wait is the device wait when any wait mark was read, else the CPU's.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

#: The phase the loop may time its own collective wait in (used when nothing else measures it).
WAIT_PHASE = "collective_wait"
#: The data-loading phase.
DATA_PHASE = "data"
#: The phase that holds the training thread's garbage-collection pauses.
GC_PHASE = "gc"

#: Kinds of device marks (``(kind, name, device_seconds)`` in :func:`device_step_times`).
PHASE_START, PHASE_END = "start", "end"
#: The last gradient bucket of a DDP model became ready (one mark per CommTimer per step).
BUCKET_READY = "ready"
#: DDP's broadcast of module buffers at forward start is done (the stream waited for peers).
SYNC_END = "sync_end"
#: Around a point where FSDP2's compute stream waits for an all-gather or reduce-scatter.
STALL_START, STALL_END = "stall_start", "stall_end"


class StepCollectives(Protocol):
    """One step's collectives as :class:`~laggard.integrations.comm_timing.CommStep` and
    :class:`~laggard.integrations.trace_records.TraceStep` give them (seconds, bytes)."""

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
        gc_seconds: the training thread's garbage collection inside the compute this step
            reports: the ``gc`` phase when phases were timed, every collection of the step when
            none was (compute is then the whole step); NaN when not measured.
        p2p_wait_seconds: exposed P2P wait (pipeline send / receive waits).
    """

    phases: dict[str, float]
    compute_seconds: float
    data_seconds: float
    collective_wait_seconds: float
    collective_seconds: float
    comm_bytes: float
    step_seconds: float
    gc_seconds: float = math.nan
    p2p_wait_seconds: float = 0.0

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
            "gc_seconds": self.gc_seconds,
            "p2p_wait_seconds": self.p2p_wait_seconds,
        }


def step_times(
    intervals: Sequence[tuple[str, float, float]],
    *,
    step_seconds: float,
    collectives: StepCollectives | None = None,
    exposed_interval: tuple[float, float] | None = None,
    wall_clock: bool = True,
    blocking_collectives: bool = False,
    gc_by_phase: Mapping[str, float] | None = None,
    move_gc: bool = True,
    p2p_wait_seconds: float = 0.0,
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
        gc_by_phase: phase name -> seconds (on the phases' clock) the training thread spent
            collecting garbage in that phase (``GcStep.wall_by_phase`` / ``cpu_by_phase``);
            ``"step"``: between timed phases. None: not measured (``gc_seconds`` NaN).
        move_gc: move each phase's collections into the ``gc`` phase (a phase never loses
            more than it had); False (the device clock, whose phases are device time) only
            reports ``gc_seconds``, every collection of the step.
        p2p_wait_seconds: the step's exposed P2P wait (the tracer's); off compute on the wall
            clock.

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
    gc_seconds = math.nan
    if gc_by_phase is not None:
        gc_seconds = sum(v for v in gc_by_phase.values() if v > 0)
        if move_gc and phases:
            gc_seconds = _move_gc(phases, gc_by_phase)
    own_wait = phases.pop(WAIT_PHASE, 0.0)
    wait = collectives.exposed_seconds if collectives is not None else own_wait
    data = phases.get(DATA_PHASE, 0.0)
    if phases:
        compute = sum(v for k, v in phases.items() if k != DATA_PHASE)
    else:
        compute = max(0.0, step_seconds - wait)
    if collectives is not None and blocking_collectives and wall_clock and exposed is None:
        compute = max(0.0, compute - wait)
    p2p_wait = max(0.0, p2p_wait_seconds) if math.isfinite(p2p_wait_seconds) else 0.0
    if wall_clock or not phases:
        compute = max(0.0, compute - p2p_wait)
    return StepTimes(
        phases=phases,
        compute_seconds=compute,
        data_seconds=data,
        collective_wait_seconds=wait,
        collective_seconds=collectives.total_seconds if collectives is not None else wait,
        comm_bytes=float(collectives.bytes) if collectives is not None else 0.0,
        step_seconds=step_seconds,
        gc_seconds=gc_seconds,
        p2p_wait_seconds=p2p_wait,
    )


def _move_gc(phases: dict[str, float], gc_by_phase: Mapping[str, float]) -> float:
    """Move each phase's garbage collection into :data:`GC_PHASE` (in place); returns the
    seconds of collection now in that phase. A phase the loop itself named ``gc`` (a timed
    manual ``gc.collect()``) keeps its time and gains the rest."""
    moved = in_gc_phase = 0.0
    for name, seconds in gc_by_phase.items():
        if name not in phases or not seconds > 0:
            continue  # between phases ("step"), or a phase that was not timed
        taken = min(phases[name], seconds)
        if name == GC_PHASE:
            in_gc_phase += taken
            continue
        phases[name] -= taken
        moved += taken
    if moved > 0:
        phases[GC_PHASE] = phases.get(GC_PHASE, 0.0) + moved
    return moved + in_gc_phase


@dataclass(frozen=True, slots=True)
class DevicePhases:
    """One step's device marks turned into per-phase device seconds.

    Attributes:
        seconds: phase name -> device seconds (end mark minus start mark; repeated phases add).
        waits: phase name -> device seconds waiting for peers inside the phase (module
            docstring); phases without a wait mark are absent.
        wait_marks: number of wait marks (bucket ready, sync end, stall pairs) placed in a phase.
        unplaced_marks: wait marks outside every phase (ignored; e.g. a hook fired between
            phases).
    """

    seconds: dict[str, float]
    waits: dict[str, float]
    wait_marks: int
    unplaced_marks: int


def device_phases(marks: Sequence[tuple[str, str, float]]) -> DevicePhases:
    """Per-phase device seconds and waits from one step's device marks.

    Args:
        marks: ``(kind, name, seconds)`` in the order they were recorded on the CPU; kind one of
            :data:`PHASE_START` / :data:`PHASE_END` (name: the phase), :data:`BUCKET_READY`,
            :data:`SYNC_END`, :data:`STALL_START` / :data:`STALL_END` (name: the FSDP2
            function); seconds: device time since the step's first mark.

    Returns:
        :class:`DevicePhases`. A start without its end, or an end without its start, is
        ignored.
    """
    open_phases: dict[str, float] = {}
    spans: list[tuple[str, float, float]] = []
    readies: list[float] = []
    syncs: list[float] = []
    stalls: list[tuple[float, float]] = []
    open_stalls: list[tuple[str, float]] = []
    for kind, name, t in marks:
        if kind == PHASE_START:
            open_phases[name] = t
        elif kind == PHASE_END:
            if name in open_phases:
                spans.append((name, open_phases.pop(name), t))
        elif kind == BUCKET_READY:
            readies.append(t)
        elif kind == SYNC_END:
            syncs.append(t)
        elif kind == STALL_START:
            open_stalls.append((name, t))
        elif kind == STALL_END:
            # pair with the innermost open stall of the same name (calls nest in CPU order)
            for i in range(len(open_stalls) - 1, -1, -1):
                if open_stalls[i][0] == name:
                    stalls.append((open_stalls.pop(i)[1], t))
                    break
    seconds: dict[str, float] = {}
    waits: dict[str, float] = {}
    for name, start, end in spans:
        seconds[name] = seconds.get(name, 0.0) + max(0.0, end - start)
        inside: list[tuple[float, float]] = []
        last_ready = max((r for r in readies if start <= r <= end), default=None)
        if last_ready is not None:
            inside.append((last_ready, end))
        inside += [(start, s) for s in syncs if start <= s <= end]
        inside += [(a, min(b, end)) for a, b in stalls if start <= a <= end]
        if inside:
            waits[name] = waits.get(name, 0.0) + _union(inside)
    points = readies + syncs + [a for a, _ in stalls]
    placed = sum(any(s <= t <= e for _, s, e in spans) for t in points)
    return DevicePhases(seconds=seconds, waits=waits, wait_marks=placed,
                        unplaced_marks=len(points) - placed)


def _union(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of ``(start, end)`` intervals (empty ones ignored)."""
    total, reach = 0.0, -math.inf
    for start, end in sorted(i for i in intervals if i[1] > i[0]):
        if end <= reach:
            continue
        total += end - max(start, reach)
        reach = end
    return total


@dataclass(frozen=True, slots=True)
class DeviceStepTimes:
    """One step on the device clock: the detector's values and both clocks beside them.

    Attributes:
        compute_seconds: sum over the phases other than ``data`` of
            ``max(device - device wait, cpu)`` (what the straggler detector ranks on).
        data_seconds: the same for ``data`` (0 when not timed).
        collective_wait_seconds: the device wait when any wait mark was read, else the CPU's.
        compute_device_seconds: sum of ``device - device wait`` over the compute phases; NaN
            when a compute phase has no device time.
        compute_cpu_seconds: the CPU clock's compute of the same step.
        collective_wait_device_seconds: the device wait (NaN when no wait mark was read and the
            step had collectives on the CPU clock).
        phases: phase name -> ``max(device - wait, cpu)`` seconds.
    """

    compute_seconds: float
    data_seconds: float
    collective_wait_seconds: float
    compute_device_seconds: float
    compute_cpu_seconds: float
    collective_wait_device_seconds: float
    phases: dict[str, float]

    def columns(self) -> dict[str, float]:
        """The window record's device-clock step columns this step fills."""
        return {
            "compute_seconds": self.compute_seconds,
            "data_seconds": self.data_seconds,
            "collective_wait_seconds": self.collective_wait_seconds,
            "compute_device_seconds": self.compute_device_seconds,
            "compute_cpu_seconds": self.compute_cpu_seconds,
            "collective_wait_device_seconds": self.collective_wait_device_seconds,
        }


def device_step_times(cpu: StepTimes, marks: Sequence[tuple[str, str, float]] | DevicePhases,
                      ) -> DeviceStepTimes:
    """Combine one step's CPU times with its device marks (module docstring).

    Args:
        cpu: the step on the CPU clock (:func:`step_times` on the wall clock).
        marks: the step's device marks (see :func:`device_phases`), or their
            :class:`DevicePhases`.

    Returns:
        :class:`DeviceStepTimes`; durations >= 0 (NaN only in the device-only fields).
    """
    dev = marks if isinstance(marks, DevicePhases) else device_phases(marks)
    phases: dict[str, float] = {}
    own_device: dict[str, float] = {}
    for name, cpu_seconds in cpu.phases.items():
        device = dev.seconds.get(name)
        if device is None or not math.isfinite(device):
            phases[name] = cpu_seconds  # no device time: the CPU clock's
            continue
        own = max(0.0, device - dev.waits.get(name, 0.0))
        own_device[name] = own
        phases[name] = max(own, cpu_seconds)
    compute_names = [n for n in cpu.phases if n != DATA_PHASE]
    if compute_names:
        compute = sum(phases[n] for n in compute_names)
        compute_device = (sum(own_device[n] for n in compute_names)
                          if all(n in own_device for n in compute_names) else math.nan)
    else:
        compute, compute_device = cpu.compute_seconds, math.nan
    device_wait = sum(dev.waits.values()) + dev.seconds.get(WAIT_PHASE, 0.0)
    measured = dev.wait_marks > 0 or WAIT_PHASE in dev.seconds
    if measured:
        wait, wait_device = device_wait, device_wait
    else:
        # no wait mark: a step without collectives (no_sync) waited for nothing on the device
        wait = cpu.collective_wait_seconds
        wait_device = 0.0 if cpu.collective_seconds == 0.0 else math.nan
    return DeviceStepTimes(
        compute_seconds=compute,
        data_seconds=phases.get(DATA_PHASE, 0.0),
        collective_wait_seconds=wait,
        compute_device_seconds=compute_device,
        compute_cpu_seconds=cpu.compute_seconds,
        collective_wait_device_seconds=wait_device,
        phases=phases,
    )


__all__ = ["BUCKET_READY", "DATA_PHASE", "GC_PHASE", "PHASE_END", "PHASE_START", "STALL_END",
           "STALL_START", "SYNC_END", "WAIT_PHASE", "DevicePhases", "DeviceStepTimes",
           "StepCollectives", "StepTimes", "device_phases", "device_step_times", "step_times"]
