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
    the ranks doing the same work:

    - a group of at least ``min_ranks`` ranks gets a detector of its own, fed that group's rows
      (global ranks kept, ``world_size=None`` so the other groups' ranks do not count as
      missing), so its thresholds follow its own noise;
    - groups smaller than that are pooled into one comparison across groups by work-normalised
      time: each rank's compute, data, wait and transfer seconds divided by its group's
      reference work, the *fastest* rank's compute + data in the window (with two ranks the
      median is their mean, which would split a 1.25x rank's excess in half between it and its
      peer; the fastest rank is the group's work without the straggler in it), so stages with
      different work compare (logged once);
    - :class:`~laggard.detectors.stage_balance.StageBalance` compares the groups' work (2 or
      more groups): a heavier stage is ``kind="stage_imbalance"``, not a straggler.

    Each of the D detectors is tuned for ``false_alarm_windows x D`` windows between false
    alarms, so the job as a whole keeps the configured rate. Memory: a group's detector keeps
    per-rank arrays up to its highest global rank (about 330 bytes a rank), so G groups of a
    job of R ranks hold about ``330 x G x R`` bytes on rank 0 (64 groups of 16,384 ranks: 350
    MB); the per-group rows are not compacted yet.

    Scores are merged over groups (global ranks are distinct), detector stats summed (but
    ``windows``: this participant's; ``missing_rank_reports``: counted once over the job;
    ``stage_too_few_groups_windows``, ``stage_unknown_ranks``: the stage balance's;
    ``peer_group_mismatch_windows``: windows of another world
    size than the groups', skipped). Every
    straggler finding carries ``evidence["peer_group"]`` (its group's name, ``"all"`` without
    groups) and ``evidence["compared"]`` (``"within peer group"`` or ``"across groups,
    work-normalised"``). Without peer groups (or with one group of every rank) it behaves
    exactly as one detector over all ranks.

    Args:
        config: ``StragglerDetector.Config``; None for its defaults.
        peer_groups: the job's peer groups; None: every rank in one group.

    Raises:
        ValueError: at :meth:`attach`, peer groups of another world size than the monitor's.

    Attributes:
        detector: the all-ranks detector (rank 0 without peer groups; None otherwise).
        detectors: group name (or ``"pooled"``) -> its detector (rank 0 with peer groups).
        stage_balance: the :class:`~laggard.detectors.stage_balance.StageBalance` (rank 0,
            2 or more groups), else None.
        device_windows_skipped: windows on the device clock with no device value yet (the
            first: device columns are gathered one window late), not given to the detector.
        causes: the :class:`~laggard.detectors.causes.CauseAttribution` (rank 0; its
            ``stats``), else None.
    """

    name = "straggler"
    #: ``detectors`` key of the comparison across small groups.
    POOLED = "pooled"

    def __init__(self, config: Any = None, peer_groups: Any = None) -> None:
        super().__init__()
        self.config = config
        self.peer_groups = peer_groups
        self.detector: Any = None
        self.detectors: dict[str, Any] = {}
        self.stage_balance: Any = None
        self.device_windows_skipped = 0
        self._pooled_groups: list[int] = []
        self._causes: Any = None
        self._mismatched_windows = 0
        self._group_windows = 0
        self._stray_ranks = 0
        self._missing_reports = 0

    def attach(self, context: MonitorContext) -> None:
        super().attach(context)
        groups = self.peer_groups
        if groups is not None and groups.world_size != context.world_size:
            raise ValueError(f"peer groups cover {groups.world_size} ranks, the job has "
                             f"{context.world_size}")
        if context.rank != 0:
            return
        # imported here: numpy-heavy detector code is loaded only where detection runs
        from laggard.detectors.straggler import StragglerDetector

        self._causes = _cause_attribution(context)
        if groups is None or groups.is_all:
            self.detector = StragglerDetector(self.config)
            min_ranks = self.detector.config.min_ranks
            if 1 < context.world_size < min_ranks:
                # The detector needs a majority to compare a rank against (and the user may ask
                # for more ranks than that). Say so once rather than report nothing.
                log.warning("laggard: straggler detection needs at least %d ranks; this job has "
                            "%d, so only step records are sent", min_ranks, context.world_size)
            return
        from laggard.detectors.stage_balance import StageBalance

        base = self.config or StragglerDetector.Config()
        min_ranks = base.min_ranks
        big = [g for g, ranks in enumerate(groups.groups) if len(ranks) >= min_ranks]
        self._pooled_groups = [g for g in range(len(groups.groups)) if g not in big]
        pooled = sum(len(groups.groups[g]) for g in self._pooled_groups)
        small = [groups.names[g] for g in self._pooled_groups]
        # Each detector splits its false-alarm budget over its own ranks only: D detectors
        # side by side would raise D times as many false alarms as one over the job, so each
        # gets D times the mean windows between them (the job's rate is the configured one).
        count = len(big) + (pooled >= min_ranks)
        config = dataclasses.replace(
            base, false_alarm_windows=base.false_alarm_windows * max(count, 1))
        for g in big:
            self.detectors[groups.names[g]] = StragglerDetector(config)
        if pooled >= min_ranks:
            self.detectors[self.POOLED] = StragglerDetector(config)
            context.log_once("peer-groups-pooled", "laggard: peer groups %s have fewer than %d "
                             "ranks each: their ranks are compared across groups by "
                             "work-normalised time (each rank's times over its group's fastest "
                             "rank's compute + data)", small, min_ranks)
        elif small:
            self._pooled_groups = []
            context.log_once("peer-groups-small", "laggard: peer groups %s have %d ranks in "
                             "all, fewer than the %d a comparison needs: their ranks are not "
                             "compared", small, pooled, min_ranks)
        self.stage_balance = StageBalance(groups)

    def on_window(self, record: WindowRecord) -> WindowOutcome | None:
        if self.detector is None and not self.detectors and self.stage_balance is None:
            return None
        device = record.get("compute_device_seconds")
        if device is not None and all(v != v for v in record["compute_seconds"]):
            # the device clock's first window: its values arrive one window late, so there
            # is nothing to compare yet (not bad input for the detector to count)
            self.device_windows_skipped += 1
            return None
        from laggard.detectors.straggler import RankWindow

        step_seconds = _median_step(record)
        if self.detector is not None:
            self.detector.step_seconds = step_seconds
            found = [_tagged(f, "all", "within peer group")
                     for f in self.detector.update(RankWindow.from_record(record))]
            scores, stats = self.detector.scores, dict(self.detector.stats)
        else:
            found, scores, stats = self._update_groups(record, step_seconds)
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
        findings = [with_gpu_cause(f, record) for f in found]
        return WindowOutcome(
            findings=findings,
            scores={int(r): float(v) for r, v in scores.items()},
            detector_stats={k: int(v) for k, v in stats.items()},
        )

    @property
    def causes(self) -> Any:
        """The cause attribution (rank 0), else None."""
        return self._causes

    def _peers_of(self, rank: int) -> tuple[int, ...]:
        """The ranks ``rank`` is compared with (its peer group; every rank without groups)."""
        groups = self.peer_groups
        world = self.context.world_size if self.context is not None else 0
        if groups is None or not 0 <= rank < groups.world_size:
            return tuple(range(world))
        return groups.peers_of(rank)

    def _update_groups(self, record: WindowRecord, step_seconds: float | None,
                       ) -> tuple[list[Finding], dict[int, float], dict[str, int]]:
        """One window through every group's detector, the pooled one and the stage balance:
        (findings, merged scores, summed stats)."""
        import numpy as np

        from laggard.detectors.straggler import RankWindow

        groups = self.peer_groups
        stats: dict[str, int] = {}
        scores: dict[int, float] = {}
        found: list[Finding] = []
        if record.world_size is not None and record.world_size != groups.world_size:
            self._mismatched_windows += 1  # the groups no longer describe this job
            return [], {}, {"peer_group_mismatch_windows": self._mismatched_windows}
        window = RankWindow.from_record(record)
        ranks = np.asarray(window.ranks, dtype=np.int64).ravel()
        # rows of a rank in no group (negative, past the world size) reach no detector
        stray = int((~np.isin(ranks, np.arange(groups.world_size))).sum())
        for g, name in enumerate(groups.names):
            detector = self.detectors.get(name)
            if detector is None:
                continue
            rows = np.flatnonzero(np.isin(ranks, groups.groups[g]))
            detector.step_seconds = step_seconds
            found += [_tagged(f, name, "within peer group")
                      for f in detector.update(_rows(window, rows))]
        pooled = self.detectors.get(self.POOLED)
        if pooled is not None:
            part, units = _normalised(window, ranks, groups, self._pooled_groups)
            pooled.step_seconds = step_seconds
            pooled.unit_seconds = units
            for f in pooled.update(part):
                name = (groups.names[groups.group_of(f.rank)]
                        if f.rank is not None and 0 <= f.rank < groups.world_size else "pooled")
                found.append(_tagged(f, name, "across groups, work-normalised"))
        for detector in self.detectors.values():
            scores.update(detector.scores)
            for key, value in detector.stats.items():
                stats[key] = stats.get(key, 0) + int(value)
        # cumulative, like the detectors' own counters
        self._group_windows += 1
        self._stray_ranks += stray
        if record.world_size is not None:
            # each detector sees a subset with world_size=None: count absent ranks once here
            known = np.unique(ranks[(ranks >= 0) & (ranks < groups.world_size)]).size
            self._missing_reports += max(record.world_size - int(known), 0)
        stats["windows"] = self._group_windows  # not one per group
        stats["invalid_ranks"] = stats.get("invalid_ranks", 0) + self._stray_ranks
        stats["missing_rank_reports"] = self._missing_reports
        if self.stage_balance is not None:
            found += self.stage_balance.update(record)
            # two of its counters only: a WindowReport carries at most 16 (laggard.wire)
            for key in ("too_few_groups_windows", "unknown_ranks"):
                stats[f"stage_{key}"] = int(self.stage_balance.stats[key])
        return found, scores, stats


def _cause_attribution(context: MonitorContext) -> Any:
    """The cause attribution (:mod:`laggard.detectors.causes`), or None when it cannot be
    built (counted: detection goes on without causes)."""
    from laggard.detectors.causes import CauseAttribution

    try:
        return CauseAttribution()
    except Exception as exc:  # noqa: BLE001 - no attribution, detection goes on
        context.count_error("cause_attribution", exc)
        return None


def _median_step(record: WindowRecord) -> float | None:
    """The median rank's ``step_seconds`` in the window, or None (absent, no finite value)."""
    values = record.get("step_seconds")
    if values is None:
        return None
    finite = [float(v) for v in values if v == v and 0 < v < float("inf")]
    return sorted(finite)[len(finite) // 2] if finite else None


def _tagged(finding: Finding, group: str, compared: str) -> Finding:
    """A rank finding with its peer group and how it was compared in its evidence (and, for a
    group other than the whole job, said in its message)."""
    if finding.kind == "stage_imbalance":
        return finding
    if finding.rank is None:  # a group detector's slowdown is its group's, not the job's
        if group == "all":
            return finding
        return dataclasses.replace(
            finding, message=finding.message.replace("whole job", f"peer group {group}", 1),
            evidence={**finding.evidence, "peer_group": group})
    message = finding.message
    if group != "all" and not finding.cleared:
        message += (f" [compared within its peer group {group}]"
                    if compared == "within peer group"
                    else f" [peer group {group}; compared {compared}]")
    return dataclasses.replace(finding, message=message, evidence={
        **finding.evidence, "peer_group": group, "compared": compared})


def _rows(window: Any, rows: Any) -> Any:
    """The :class:`RankWindow` of ``rows`` only, global ranks kept, ``world_size=None``."""
    return dataclasses.replace(
        window,
        ranks=window.ranks[rows],
        compute_seconds=window.compute_seconds[rows],
        data_seconds=window.data_seconds[rows],
        collective_wait_seconds=window.collective_wait_seconds[rows],
        transfer_seconds=None if window.transfer_seconds is None
        else window.transfer_seconds[rows],
        world_size=None,
        nodes=None if window.nodes is None else [window.nodes[i] for i in rows.tolist()
                                                 if i < len(window.nodes)],
        local_ranks=None if window.local_ranks is None else window.local_ranks[rows],
    )


def _normalised(window: Any, ranks: Any, groups: Any,
                pooled: list[int]) -> tuple[Any, dict[int, float]]:
    """The pooled groups' rows with every duration divided by the rank's group reference work
    (its fastest rank's compute + data this window), and rank -> that reference (seconds).

    A group without a valid reference (no rank with finite, positive compute + data) leaves
    its rows NaN: absent for the detector, which counts them."""
    import numpy as np

    rows = np.flatnonzero(np.isin(ranks, [r for g in pooled for r in groups.groups[g]]))
    part = _rows(window, rows)
    work = (part.compute_seconds + part.data_seconds)[:, 0]
    scale = np.full(rows.size, np.nan)
    units: dict[int, float] = {}
    for g in pooled:
        mine = np.isin(part.ranks, groups.groups[g])
        valid = work[mine][np.isfinite(work[mine]) & (work[mine] > 0)]
        if valid.size:
            reference = float(valid.min())
            scale[mine] = reference
            units.update(dict.fromkeys(part.ranks[mine].tolist(), reference))
    per = scale[:, None]
    return dataclasses.replace(
        part,
        compute_seconds=part.compute_seconds / per,
        data_seconds=part.data_seconds / per,
        collective_wait_seconds=part.collective_wait_seconds / per,
        transfer_seconds=None if part.transfer_seconds is None else part.transfer_seconds / per,
    ), units


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
