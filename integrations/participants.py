"""The monitor's participants: what each adds to the window gather and does with the result.

A :class:`~laggard.integrations.monitor.TrainingMonitor` measures each step's phases itself and
hosts participants for everything else it does once per window. A participant

1. declares the :class:`~laggard.detectors.window.WindowColumn` s it adds to every rank's
   gathered vector (``columns``; fixed for the run),
2. is told of every step (``end_step``, on the training thread: keep it cheap),
3. gives its values for the window on every rank right before the gather (``contribute``; it
   may run a collective of its own there, as the link probe does: every rank calls it at the
   same point),
4. gets the gathered :class:`~laggard.detectors.window.WindowRecord` (``on_window``) and
   returns what it found (:class:`WindowOutcome`).

Where ``on_window`` runs: a participant with ``inline = True`` (the integrity check, whose
policy ``raise`` must stop every rank at the same window) runs on the training thread of every
rank, right after the gather, and makes the gather an all-gather (every rank gets the
record). The others run on rank 0 only, on its analysis thread
(:mod:`laggard.integrations.window_analysis`): their findings come at most one window later
and rank 0's steps never wait for them; without an inline participant the other ranks send
their vector to rank 0 and hold nothing else (:mod:`laggard.integrations.window_gather`).
Only an inline participant may raise :class:`StopJob`: one raised on the analysis thread is
reported and counted (``stats.internal_errors``), not raised. Without the attribute a
participant is not inline.

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

from laggard.detectors.finding import Finding
from laggard.detectors.host_contention import with_host_cause
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
        """The gathered window (rank 0; every rank if ``inline``); return what was found
        (or None)."""
        ...


class WindowParticipant:
    """A participant that adds nothing and finds nothing: subclass and override.

    Attributes:
        context: the :class:`MonitorContext`, once attached.
    """

    name = "participant"
    columns: tuple[WindowColumn, ...] = ()
    #: Run ``on_window`` on the training thread of every rank (module docstring).
    inline = False

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
    """The straggler detector on rank 0, on the window record's step columns, per peer group.

    Adds no column (it reads the monitor's own ``compute_seconds``, ``data_seconds``,
    ``collective_wait_seconds`` and ``transfer_seconds``); on rank 0 runs
    :class:`~laggard.detectors.straggler.StragglerDetector` and returns its findings and
    per-rank scores. When the record has the GPU-state columns
    (:class:`~laggard.integrations.gpu_state.GpuStateParticipant`), a compute finding names
    the cause from the straggler's GPU (:func:`with_gpu_cause`). Before that, a compute
    finding whose excess over its peers is mostly Python GC or extra work (tokens or samples
    noted) becomes kind ``gc`` or ``load_imbalance``
    (:class:`~laggard.detectors.causes.CauseAttribution`); a token note on some ranks only is
    said once in the log.

    With peer groups (:class:`~laggard.detectors.peer_groups.PeerGroups` of more than one
    group: a pipeline's stages, tensor-parallel coordinates), each rank is compared only with
    the ranks doing the same work, by
    :class:`~laggard.detectors.group_straggler.PeerGroupStraggler` (each group compared
    within itself, small groups pooled by work-normalised time, the stage balance; its
    docstring says how and what it costs). Every straggler finding carries
    ``evidence["peer_group"]`` (its group's name, ``"all"`` without groups) and
    ``evidence["compared"]`` (``"within peer group"`` or ``"across groups,
    work-normalised"``). Without peer groups (or with one group of every rank) it is one
    detector over all ranks.

    Args:
        config: ``StragglerDetector.Config``; None for its defaults.
        peer_groups: the job's peer groups; None: every rank in one group.
        cpu_only: the job runs on no CUDA device: a compute finding advises on the rank's CPU,
            not "that GPU's clocks" (unless ``config`` names a hint of its own).
        blame: also run the blame detector, the node verdict and hold a whole-job slowdown
            while ranks are named (:meth:`_blame`, :meth:`_whole_node_or_job`); False: the
            median detector alone, as before them.

    Raises:
        ValueError: at :meth:`attach`, peer groups of another world size than the monitor's.

    Attributes:
        detector: the all-ranks detector (rank 0 without peer groups; None otherwise).
        grouped: the :class:`~laggard.detectors.group_straggler.PeerGroupStraggler` (rank 0
            with peer groups), else None.
        device_windows_skipped: windows on the device clock with no device value yet (the
            first: device columns are gathered one window late), not given to the detector.
    """

    name = "straggler"

    def __init__(self, config: Any = None, peer_groups: Any = None, *,
                 cpu_only: bool = False, blame: bool = True) -> None:
        super().__init__()
        self.with_blame = blame
        self.config = config
        self.cpu_only = cpu_only
        self.peer_groups = peer_groups
        self.detector: Any = None
        self.grouped: Any = None
        self.device_windows_skipped = 0
        self.blame: Any = None
        self.nodes: Any = None
        self.moving: Any = None
        self._hidden_job: set[str] = set()  # peer groups whose job_slowdown raise was held back
        self._causes: Any = None
        self._labels: dict[int, int] = {}  # global rank -> peer group index (blame)

    @property
    def detectors(self) -> dict[str, Any]:
        """Group name (or ``"pooled"``) -> its detector (rank 0 with peer groups), else {}."""
        return {} if self.grouped is None else self.grouped.detectors

    @property
    def stage_balance(self) -> Any:
        """The :class:`~laggard.detectors.stage_balance.StageBalance` (rank 0, 2 or more
        groups), else None."""
        return None if self.grouped is None else self.grouped.stage_balance

    @property
    def causes(self) -> Any:
        """The :class:`~laggard.detectors.causes.CauseAttribution` (rank 0; its ``stats``),
        else None."""
        return self._causes

    def attach(self, context: MonitorContext) -> None:
        super().attach(context)
        groups = self.peer_groups
        if groups is not None and groups.world_size != context.world_size:
            raise ValueError(f"peer groups cover {groups.world_size} ranks, the job has "
                             f"{context.world_size}")
        if context.rank != 0:
            return
        # imported here: numpy-heavy detector code is loaded only where detection runs
        from laggard.detectors.straggler import CPU_COMPUTE_HINT, StragglerDetector

        if self.cpu_only:
            config = self.config if self.config is not None else StragglerDetector.Config()
            if config.compute_hint == StragglerDetector.Config().compute_hint:
                self.config = dataclasses.replace(config, compute_hint=CPU_COMPUTE_HINT)

        self._causes = _cause_attribution(context)
        from laggard.detectors.blame_detector import BlameDetector
        from laggard.detectors.moving import MovingSlowness
        from laggard.detectors.node_verdict import NodeVerdict

        if self.with_blame:
            self.blame = BlameDetector()
            self.nodes = NodeVerdict()
            self.moving = MovingSlowness()
        if groups is not None and not groups.is_all:
            self._labels = {rank: groups.group_of(rank) for rank in range(groups.world_size)}
        if groups is None or groups.is_all:
            self.detector = StragglerDetector(self.config)
            min_ranks = self.detector.config.min_ranks
            if 1 < context.world_size < min_ranks:
                # The detector needs a majority to compare a rank against (and the user may ask
                # for more ranks than that). Say so once rather than report nothing.
                log.warning("laggard: straggler detection needs at least %d ranks; this job has "
                            "%d, so only step records are sent", min_ranks, context.world_size)
            return
        from laggard.detectors.group_straggler import PeerGroupStraggler

        self.grouped = PeerGroupStraggler(groups, self.config)
        for key, message, *args in self.grouped.notes:
            context.log_once(key, message, *args)

    def on_window(self, record: WindowRecord) -> WindowOutcome | None:
        if self.detector is None and self.grouped is None:
            return None
        device = record.get("compute_device_seconds")
        if device is not None and all(v != v for v in record["compute_seconds"]):
            # the device clock's first window: its values arrive one window late, so there
            # is nothing to compare yet (not bad input for the detector to count)
            self.device_windows_skipped += 1
            return None
        from laggard.detectors.group_straggler import WITHIN, median_step, tagged
        from laggard.detectors.straggler import RankWindow

        step_seconds = median_step(record)
        if self.detector is not None:
            found = [tagged(f, "all", WITHIN) for f in self.detector.update(
                RankWindow.from_record(record), step_seconds=step_seconds)]
            scores, stats = self.detector.scores, dict(self.detector.stats)
        else:
            outcome = self.grouped.update(record, step_seconds=step_seconds)
            found, scores, stats = outcome.findings, outcome.scores, outcome.stats
        # Cause attribution (detectors/causes.py): GC pauses and uneven work
        # (tokens/samples noted) turn a compute finding into kind "gc" / "load_imbalance",
        # judged against the rank's peers; before with_gpu_cause, which reads kind "compute".
        if self._causes is not None:
            try:
                found = self._causes.apply(found, record, self._peers_of)
            except Exception as exc:  # noqa: BLE001 - the findings go out without a cause
                if self.context is not None:
                    self.context.count_error("cause_attribution", exc)
            if getattr(self._causes, "stats", {}).get("partial_work_notes") and \
                    self.context is not None:
                from laggard.detectors.causes import PARTIAL_NOTES_MESSAGE

                self.context.log_once("partial-work-notes", PARTIAL_NOTES_MESSAGE)
        if self.with_blame:
            found += self._blame(record, scores)
            found = self._whole_node_or_job(record, found)
        findings = [with_host_cause(with_gpu_cause(f, record), record) for f in found]
        return WindowOutcome(
            findings=findings,
            scores={int(r): float(v) for r, v in scores.items()},
            detector_stats={k: int(v) for k, v in stats.items()},
        )

    def _median_active(self) -> dict[int, Finding]:
        """Global rank -> the finding the median detector(s) hold for it."""
        detectors = [self.detector] if self.detector is not None else \
            list(self.detectors.values())
        return {int(r): f for d in detectors for r, f in getattr(d, "active", {}).items()}

    def _named(self) -> dict[int, Finding]:
        """Global rank -> its active rank finding, either detector's."""
        named = self._median_active()
        if self.blame is not None:
            named.update({r: f for r, f in self.blame.active.items() if r not in named})
        return named

    def _whole_node_or_job(self, record: WindowRecord, found: list[Finding]) -> list[Finding]:
        """A node whose ranks are all named gets one finding of its own
        (:class:`~laggard.detectors.node_verdict.NodeVerdict`); a whole-job slowdown is not
        raised while ranks are named (it is their cost, not the job's), and the clear of a
        raise held back is dropped with it. Never raises (errors counted)."""
        try:
            named = self._named()
            out: list[Finding] = []
            for finding in found:
                if finding.kind != "job_slowdown":
                    out.append(finding)
                    continue
                group = str(finding.evidence.get("peer_group", "all"))
                if finding.cleared and group in self._hidden_job:
                    self._hidden_job.discard(group)
                elif not finding.cleared and named:
                    self._hidden_job.add(group)
                    if self.context is not None:
                        self.context.log_once(
                            "job-slowdown-held", "laggard: a whole-job slowdown was not "
                            "reported while ranks %s are named: their cost, not the job's",
                            sorted(named))
                else:
                    out.append(finding)
            if self.nodes is not None:
                out += self.nodes.update(record, named)
            if self.moving is not None:
                out += self.moving.update(record.step, named)
            return out
        except Exception as exc:  # noqa: BLE001 - the findings go out as they were
            if self.context is not None:
                self.context.count_error("node_verdict", exc)
            return found

    def _blame(self, record: WindowRecord, scores: Mapping[int, float]) -> list[Finding]:
        """The blame detector's findings (:mod:`laggard.detectors.blame_detector`): a rank
        the others waited for on some steps, whatever the shape. A rank the median detector
        names is left to it, and so is a steady slowness of a rank whose straggler score (its
        median excess) is over that detector's ``min_slowdown``: it names the cause (compute,
        data, GC, more work), which the waits cannot. Never raises (errors counted)."""
        if self.blame is None:
            return []
        try:
            import numpy as np

            labels = None
            if self._labels:
                labels = np.array([self._labels.get(int(r), -1) for r in record.ranks])
            floor = getattr(self.config, "min_slowdown", None)
            if floor is None:
                from laggard.detectors.straggler import StragglerDetector

                floor = StragglerDetector.Config().min_slowdown
            steady = {int(r) for r, v in scores.items() if v >= floor}
            return list(self.blame.update(record, labels, exclude=set(self._median_active()),
                                          steady_elsewhere=steady))
        except Exception as exc:  # noqa: BLE001 - the median detector's findings still go out
            if self.context is not None:
                self.context.count_error("blame", exc)
            return []

    def _peers_of(self, rank: int) -> tuple[int, ...]:
        """The ranks ``rank`` is compared with (its peer group; every rank without groups)."""
        groups = self.peer_groups
        world = self.context.world_size if self.context is not None else 0
        if groups is None or not 0 <= rank < groups.world_size:
            return tuple(range(world))
        return groups.peers_of(rank)


def _cause_attribution(context: MonitorContext) -> Any:
    """The cause attribution (:mod:`laggard.detectors.causes`), or None when it cannot be
    built (counted: detection goes on without causes)."""
    from laggard.detectors.causes import CauseAttribution

    try:
        return CauseAttribution()
    except Exception as exc:  # noqa: BLE001 - no attribution, detection goes on
        context.count_error("cause_attribution", exc)
        return None


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
