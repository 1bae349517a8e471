"""The monitor's participants: what each adds to the window gather and does with the result.

A :class:`~laggard.integrations.monitor.TrainingMonitor` measures each step's phases itself and
hosts participants for everything else it does once per window. A participant

1. declares the :class:`~laggard.detectors.window.WindowColumn` s it adds to every rank's
   gathered vector (``columns``; fixed for the run),
2. is told of every step (``end_step``, on the training thread: keep it cheap),
3. gives its values for the window on every rank right before the gather (``contribute``; it
   may run a collective of its own there, as the link probe does: every rank calls it at the
   same point),
4. gets the gathered :class:`~laggard.detectors.window.WindowRecord` back on every rank
   (``on_window``) and returns what it found (:class:`WindowOutcome`).

The monitor reports the outcome: on rank 0 it logs each finding once when raised and once when
cleared, keeps it in ``monitor.findings`` / ``monitor.cleared``, and sends one WindowReport to
the node agent. A participant uses only the :class:`MonitorContext` it is attached to (rank,
world size, the gather group, ``log_once``, ``count_error``), never the monitor's internals.

The built-in participants: :class:`StragglerParticipant` (here), the tracer's per-group block
and the link detector (:mod:`laggard.integrations.trace_window`), the link probe
(:mod:`laggard.integrations.link_probe`), the gradient-integrity check
(:mod:`laggard.integrations.integrity`).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from laggard.detectors.causes import PARTIAL_NOTES_MESSAGE, CauseAttribution
from laggard.detectors.finding import Finding
from laggard.detectors.window import WindowColumn, WindowRecord

log = logging.getLogger(__name__)


@dataclass(slots=True)
class WindowOutcome:
    """What a participant found in one window.

    Attributes:
        findings: findings raised or cleared (``Finding.cleared``) in this window.
        scores: global rank -> score, for the WindowReport's ``scores`` (the straggler score).
        detector_stats: counters for the WindowReport's ``detector_stats``.
    """

    findings: list[Finding] = field(default_factory=list)
    scores: dict[int, float] = field(default_factory=dict)
    detector_stats: dict[str, int] = field(default_factory=dict)


class StopJob(RuntimeError):
    """Raised by a participant's ``on_window`` to stop the job (an integrity policy ``raise``):
    the monitor reports ``findings`` first, then lets it propagate into the training loop, the
    one exception it ever raises there.

    Args:
        findings: what made the participant stop the job.
    """

    def __init__(self, message: str, findings: list[Finding]) -> None:
        super().__init__(message)
        self.findings = findings


class MonitorContext:
    """What a participant may use of the monitor that hosts it.

    Args:
        rank, world_size, node, local_rank, window_steps: the monitor's.
        group: a callable returning the gather group (a gloo ``ProcessGroup``; None for the
            default group).
        log_once: ``(key, message, *args)``: log a warning the first time ``key`` is seen.
        count_error: ``(where, exc)``: count an internal error of the participant (the
            monitor's ``stats.internal_errors``) and log it once.
    """

    def __init__(self, *, rank: int, world_size: int, node: str, local_rank: int | None,
                 window_steps: int, group: Callable[[], Any],
                 log_once: Callable[..., None],
                 count_error: Callable[[str, BaseException], None]) -> None:
        self.rank = rank
        self.world_size = world_size
        self.node = node
        self.local_rank = local_rank
        self.window_steps = window_steps
        self._group = group
        self.log_once = log_once
        self.count_error = count_error

    @property
    def group(self) -> Any:
        """The monitor's gather group (gloo), for a participant's own collectives."""
        return self._group()


@runtime_checkable
class Participant(Protocol):
    """The protocol every participant implements (module docstring);
    :class:`WindowParticipant` gives no-op defaults."""

    name: str
    columns: tuple[WindowColumn, ...]

    def attach(self, context: MonitorContext) -> None:
        """Called once, when the monitor is built."""

    def end_step(self, step: int, column: int) -> None:
        """After every step (``column`` = ``step % window_steps``), on the training thread."""

    def contribute(self, step: int) -> Mapping[str, object]:
        """This rank's value of each of its columns for the window ending at ``step``."""
        ...

    def on_window(self, record: WindowRecord) -> WindowOutcome | None:
        """The gathered window, on every rank; return what was found (or None)."""
        ...


class WindowParticipant:
    """A participant that adds nothing and finds nothing: subclass and override.

    Attributes:
        context: the :class:`MonitorContext`, once attached.
    """

    name = "participant"
    columns: tuple[WindowColumn, ...] = ()

    def __init__(self) -> None:
        self.context: MonitorContext | None = None

    def attach(self, context: MonitorContext) -> None:
        self.context = context

    def end_step(self, step: int, column: int) -> None:
        return None

    def contribute(self, step: int) -> Mapping[str, object]:
        return {}

    def on_window(self, record: WindowRecord) -> WindowOutcome | None:
        return None


class StragglerParticipant(WindowParticipant):
    """The straggler detector on rank 0, on the window record's step columns.

    Adds no column (it reads the monitor's own ``compute_seconds``, ``data_seconds``,
    ``collective_wait_seconds`` and ``transfer_seconds``); on rank 0 runs
    :class:`~laggard.detectors.straggler.StragglerDetector` and returns its findings and
    per-rank scores. A compute finding whose excess is mostly Python GC or extra work becomes
    kind ``gc`` or ``load_imbalance`` (:class:`~laggard.detectors.causes.CauseAttribution`).
    When the record has the GPU-state columns
    (:class:`~laggard.integrations.gpu_state.GpuStateParticipant`), a compute finding names
    the cause from the straggler's GPU (:func:`with_gpu_cause`).

    Args:
        config: ``StragglerDetector.Config``; None for its defaults.

    Attributes:
        detector: the detector (rank 0 only; None elsewhere).
        device_windows_skipped: windows on the device clock with no device value yet (the
            first: device columns are gathered one window late), not given to the detector.
        causes: the :class:`~laggard.detectors.causes.CauseAttribution` (its ``stats``).
    """

    name = "straggler"

    def __init__(self, config: Any = None) -> None:
        super().__init__()
        self.config = config
        self.detector: Any = None
        self.device_windows_skipped = 0
        self.causes = CauseAttribution()

    def attach(self, context: MonitorContext) -> None:
        super().attach(context)
        if context.rank != 0:
            return
        # imported here: numpy-heavy detector code is loaded only where detection runs
        from laggard.detectors.straggler import StragglerDetector

        self.detector = StragglerDetector(self.config)
        min_ranks = self.detector.config.min_ranks
        if 1 < context.world_size < min_ranks:
            # The detector needs a majority to compare a rank against (and the user may ask
            # for more ranks than that). Say so once rather than report nothing.
            log.warning("laggard: straggler detection needs at least %d ranks; this job has "
                        "%d, so only step records are sent", min_ranks, context.world_size)

    def on_window(self, record: WindowRecord) -> WindowOutcome | None:
        if self.detector is None:
            return None
        device = record.get("compute_device_seconds")
        if device is not None and all(v != v for v in record["compute_seconds"]):
            # the device clock's first window: its values arrive one window late, so there
            # is nothing to compare yet (not bad input for the detector to count)
            self.device_windows_skipped += 1
            return None
        from laggard.detectors.straggler import RankWindow

        ranks = [int(r) for r in record.ranks]  # every rank is every rank's peer
        found = self.causes.apply(self.detector.update(RankWindow.from_record(record)),
                                  record, lambda rank: ranks)
        if self.causes.stats["partial_work_notes"] and self.context is not None:
            self.context.log_once("partial-work-notes", PARTIAL_NOTES_MESSAGE)
        findings = [with_gpu_cause(f, record) for f in found]
        return WindowOutcome(
            findings=findings,
            scores={int(r): float(v) for r, v in self.detector.scores.items()},
            detector_stats={k: int(v) for k, v in self.detector.stats.items()},
        )


def with_gpu_cause(finding: Finding, record: WindowRecord) -> Finding:
    """A raised compute straggler finding with its GPU's cause, from the record's GPU-state
    columns (:func:`laggard.detectors.gpu_state.describe_cause`): the message gains
    ``"; compute: GPU 3 (node07) sw_thermal active in 100% of the window, SM clock 1.41 of 1.98
    GHz"`` (or ``"; compute: no clock event on its GPU ..."``, ``"; compute: no GPU state: CPU
    job"``), the evidence a ``gpu_state`` entry, ``gpu`` the NVML index. Any other finding, or
    a record without those columns, is returned as it is.
    """
    if finding.kind != "compute" or finding.cleared or finding.rank is None:
        return finding
    from laggard.detectors.gpu_state import describe_cause

    cause = describe_cause(record, finding.rank)
    if cause is None:
        return finding
    return dataclasses.replace(
        finding, message=f"{finding.message}; compute: {cause.text}",
        gpu=cause.gpu if cause.gpu is not None else finding.gpu,
        evidence={**finding.evidence, "gpu_state": cause.evidence})


__all__ = ["MonitorContext", "Participant", "StopJob", "StragglerParticipant", "WindowOutcome",
           "WindowParticipant", "with_gpu_cause"]
