"""The straggler detection of a job with peer groups: every group compared within itself in
one pass over the window, small groups pooled by work-normalised time, and the stage balance
beside them.

With peer groups (:class:`~laggard.detectors.peer_groups.PeerGroups` of more than one group: a
pipeline's stages, tensor-parallel coordinates), each rank is compared only with the ranks doing
the same work:

- each group of at least ``min_ranks`` ranks is a comparison of its own (its thresholds follow
  its own noise, its warm-up and whole-group slowdown are its own), all of them run by one
  :class:`StragglerDetector` (:meth:`~StragglerDetector.update_groups`: the window's rows
  labelled by comparison, global ranks kept, ``world_size=None`` so the ranks of groups not
  compared do not count as missing);
- groups smaller than that are pooled into one comparison across groups by work-normalised time
  (:func:`normalised`): each rank's compute, data, wait and transfer seconds divided by its
  group's reference work, the *fastest* rank's compute + data in the window (with two ranks the
  median is their mean, which would split a 1.25x rank's excess in half between it and its peer;
  the fastest rank is the group's work without the straggler in it), so stages with different
  work compare;
- :class:`~laggard.detectors.stage_balance.StageBalance` compares the groups' work (2 or more
  groups): a heavier stage is ``kind="stage_imbalance"``, not a straggler.

Each of the D comparisons is tuned for ``false_alarm_windows x D`` windows between false
alarms, so the job as a whole keeps the configured rate. Its findings, scores and counters are
those of D detectors side by side, one per comparison, each fed its group's rows (what this
module did before issue 31; ``tests/detectors/test_straggler_replay.py`` replays recorded
windows against their outputs), except the step counter's ``step_regressions`` and
``window_length_changes``, counted once per window rather than once per detector.

Cost: the per-rank state is one array for the whole job, about 340 bytes a rank (the history
ring of 5 windows x 5 columns, the CUSUM sums, the last excess), whatever the number of groups:
22 MB at 65,536 ranks; the per-group figures (medians, noise) come from one sort of the window
(:class:`~laggard.detectors.stats.GroupIndex`), not a pass per group. ``benchmarks/scale.py``
measures it.

Pure numpy, no torch: the monitor's :class:`~laggard.integrations.participants.
StragglerParticipant` feeds it the gathered window record on rank 0.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from laggard.detectors.finding import Finding
from laggard.detectors.peer_groups import PeerGroups
from laggard.detectors.stage_balance import StageBalance
from laggard.detectors.stats import nanmedian
from laggard.detectors.straggler import RankWindow, StragglerDetector
from laggard.detectors.window import WindowRecord

#: ``evidence["compared"]`` of a finding from a group's own detector (or the all-ranks one).
WITHIN = "within peer group"
#: ``evidence["compared"]`` of a finding from the pooled comparison across small groups.
ACROSS = "across groups, work-normalised"

__all__ = ["ACROSS", "WITHIN", "GroupOutcome", "PeerGroupStraggler", "median_step",
           "normalised", "tagged", "window_rows"]


@dataclass(slots=True)
class GroupOutcome:
    """One window through every group's detector.

    Attributes:
        findings: raised or cleared, tagged with their peer group (:func:`tagged`).
        scores: global rank -> straggler score, merged over groups (global ranks are distinct).
        stats: the detectors' counters summed (module docstring of :class:`PeerGroupStraggler`
            for the ones counted once over the job).
    """

    findings: list[Finding] = field(default_factory=list)
    scores: dict[int, float] = field(default_factory=dict)
    stats: dict[str, int] = field(default_factory=dict)


class PeerGroupStraggler:
    """The straggler detection of a job with peer groups (module docstring), on rank 0.

    Counters (:attr:`GroupOutcome.stats`): the detector's, but ``windows`` (this one's),
    ``missing_rank_reports`` (counted once over the job), ``invalid_ranks`` (the detector's
    plus rows of a rank in no group), ``stage_too_few_groups_windows`` and
    ``stage_unknown_ranks`` (the stage balance's), and ``peer_group_mismatch_windows``
    (windows of another world size than the groups', skipped). ``too_few_ranks_windows``
    counts each compared group's windows without enough ranks.

    Args:
        groups: the job's peer groups (more than one group, or one smaller than the job).
        config: ``StragglerDetector.Config`` of the comparisons (its ``false_alarm_windows``
            multiplied by the number of comparisons); None for the defaults.

    Attributes:
        detector: the one :class:`StragglerDetector` of every comparison (its groups are
            :attr:`compared`), or None when no group is compared.
        compared: the names of the comparisons, in order: each group of ``min_ranks`` ranks
            or more, then :attr:`POOLED` when the small groups are pooled.
        stage_balance: the :class:`StageBalance` of the groups.
        notes: ``(key, message, *args)`` to log once: groups pooled, or too small to compare.
    """

    #: Name of the comparison across small groups.
    POOLED = "pooled"

    def __init__(self, groups: PeerGroups,
                 config: StragglerDetector.Config | None = None) -> None:
        self.groups = groups
        self.notes: list[tuple[object, ...]] = []
        base = config or StragglerDetector.Config()
        min_ranks = base.min_ranks
        big = [g for g, ranks in enumerate(groups.groups) if len(ranks) >= min_ranks]
        self._pooled_groups = [g for g in range(len(groups.groups)) if g not in big]
        pooled = sum(len(groups.groups[g]) for g in self._pooled_groups)
        small = [groups.names[g] for g in self._pooled_groups]
        self.compared = [groups.names[g] for g in big]
        if pooled >= min_ranks:
            self.compared.append(self.POOLED)
            self.notes.append((
                "peer-groups-pooled", "laggard: peer groups %s have fewer than %d ranks each: "
                "their ranks are compared across groups by work-normalised time (each rank's "
                "times over its group's fastest rank's compute + data)", small, min_ranks))
        elif small:
            self._pooled_groups = []
            self.notes.append((
                "peer-groups-small", "laggard: peer groups %s have %d ranks in all, fewer than "
                "the %d a comparison needs: their ranks are not compared", small, pooled,
                min_ranks))
        # Each comparison splits its false-alarm budget over its own ranks only: D of them
        # side by side would raise D times as many false alarms as one over the job, so each
        # gets D times the mean windows between them (the job's rate is the configured one).
        count = len(self.compared)
        config = dataclasses.replace(
            base, false_alarm_windows=base.false_alarm_windows * max(count, 1))
        self.detector = StragglerDetector(config, groups=count) if count else None
        # global rank -> its comparison (-1: none), and -> its peer group
        self._comparison = np.full(groups.world_size, -1, dtype=np.int64)
        self._group = np.full(groups.world_size, -1, dtype=np.int64)
        for g, ranks in enumerate(groups.groups):
            self._group[list(ranks)] = g
        for c, g in enumerate(big):
            self._comparison[list(groups.groups[g])] = c
        if self._pooled_groups:
            for g in self._pooled_groups:
                self._comparison[list(groups.groups[g])] = len(big)
        self._normalised = np.array([name == self.POOLED for name in self.compared])
        self.stage_balance = StageBalance(groups)
        self._mismatched_windows = 0
        self._windows = 0
        self._stray_ranks = 0
        self._missing_reports = 0

    @property
    def detectors(self) -> dict[str, StragglerDetector]:
        """Comparison name -> the detector that runs it (the one :attr:`detector`)."""
        return {} if self.detector is None else dict.fromkeys(self.compared, self.detector)

    def update(self, record: WindowRecord, *, step_seconds: float | None = None) -> GroupOutcome:
        """One window through every comparison (one pass of :attr:`detector`) and the stage
        balance.

        Args:
            record: the gathered window (needs ``compute_seconds``, ``data_seconds`` and
                ``collective_wait_seconds``; ``transfer_seconds`` optional).
            step_seconds: the job's step time in the window (:func:`median_step`), seconds.

        Raises:
            KeyError: the record lacks one of the columns above.
        """
        groups = self.groups
        if record.world_size is not None and record.world_size != groups.world_size:
            self._mismatched_windows += 1  # the groups no longer describe this job
            return GroupOutcome(stats={"peer_group_mismatch_windows": self._mismatched_windows})
        out = GroupOutcome()
        window = RankWindow.from_record(record)
        ranks = np.asarray(window.ranks, dtype=np.int64).ravel()
        # rows of a rank in no group (negative, past the world size) reach no comparison
        known = (ranks >= 0) & (ranks < groups.world_size)
        stray = int((~known).sum())
        comparison = np.full(ranks.size, -1, dtype=np.int64)
        comparison[known] = self._comparison[ranks[known]]
        stats = out.stats
        if self.detector is not None:
            # each comparison's rows in the window's order, the pooled ones work-normalised
            rows = np.flatnonzero(comparison >= 0)
            # every row compared (the usual window): no copy of the columns
            part = (dataclasses.replace(window, world_size=None) if rows.size == ranks.size
                    else window_rows(window, rows))
            labels = comparison[rows]
            units: dict[int, float] | None = None
            if self._pooled_groups:
                part, units = _normalise_pooled(part, self._group[part.ranks],
                                                labels == len(self.compared) - 1)
            found = self.detector.update_groups(part, labels, step_seconds=step_seconds,
                                                unit_seconds=units, normalised=self._normalised)
            for name, mine in zip(self.compared, found, strict=True):
                if name != self.POOLED:
                    out.findings += [tagged(f, name, WITHIN) for f in mine]
                    continue
                for f in mine:
                    group = (groups.names[groups.group_of(f.rank)]
                             if f.rank is not None and 0 <= f.rank < groups.world_size
                             else self.POOLED)
                    out.findings.append(tagged(f, group, ACROSS))
            out.scores = self.detector.scores
            stats.update(self.detector.stats)
        # cumulative, like the detector's own counters
        self._windows += 1
        self._stray_ranks += stray
        if record.world_size is not None:
            # the detector sees the groups' rows with world_size=None: count absent ranks here
            # distinct ranks reporting (a bincount: numpy's hash-based unique took 90 ms
            # a window at 65,536 ranks)
            present = np.count_nonzero(np.bincount(ranks[known], minlength=groups.world_size))
            self._missing_reports += max(record.world_size - int(present), 0)
        stats["windows"] = self._windows  # not one per group
        stats["invalid_ranks"] = stats.get("invalid_ranks", 0) + self._stray_ranks
        stats["missing_rank_reports"] = self._missing_reports
        out.findings += self.stage_balance.update(record)
        # two of its counters only: a WindowReport carries at most 16 (laggard.wire)
        for key in ("too_few_groups_windows", "unknown_ranks"):
            stats[f"stage_{key}"] = int(self.stage_balance.stats[key])
        return out


def median_step(record: WindowRecord) -> float | None:
    """The job's step time in the window: the median of the ranks' finite, positive
    ``step_seconds`` (seconds), or None (no such column, no such value)."""
    values = record.get("step_seconds")
    if values is None:
        return None
    steps = np.asarray(values, dtype=np.float64).ravel()
    median = nanmedian(steps[steps > 0])
    return median if median == median else None


def tagged(finding: Finding, group: str, compared: str) -> Finding:
    """A rank finding with its peer group and how it was compared (:data:`WITHIN`,
    :data:`ACROSS`) in its evidence (and, for a group other than ``"all"``, said in its
    message); a group detector's whole-group slowdown names its group instead of the whole job;
    a stage imbalance is returned as it is."""
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
                    if compared == WITHIN
                    else f" [peer group {group}; compared {compared}]")
    return dataclasses.replace(finding, message=message, evidence={
        **finding.evidence, "peer_group": group, "compared": compared})


def window_rows(window: RankWindow, rows: np.ndarray) -> RankWindow:
    """The :class:`RankWindow` of ``rows`` only (int64 row indices), global ranks kept,
    ``world_size=None`` (the other rows' ranks are not missing)."""
    return dataclasses.replace(
        window,
        ranks=np.asarray(window.ranks)[rows],
        compute_seconds=window.compute_seconds[rows],
        data_seconds=window.data_seconds[rows],
        collective_wait_seconds=window.collective_wait_seconds[rows],
        transfer_seconds=None if window.transfer_seconds is None
        else window.transfer_seconds[rows],
        world_size=None,
        nodes=None if window.nodes is None else [window.nodes[i] for i in rows.tolist()
                                                 if i < len(window.nodes)],
        local_ranks=None if window.local_ranks is None
        else np.asarray(window.local_ranks)[rows],
    )


def normalised(window: RankWindow, ranks: np.ndarray, groups: PeerGroups,
               pooled: list[int]) -> tuple[RankWindow, Mapping[int, float]]:
    """The pooled groups' rows with every duration divided by the rank's group reference work
    (its fastest rank's compute + data this window), and rank -> that reference (seconds).

    Args:
        window: the whole job's window, (R, K) durations.
        ranks: (R,) int64 global rank of each row.
        groups: the job's peer groups.
        pooled: indices into ``groups.groups`` of the groups compared together.

    A group without a valid reference (no rank with finite, positive compute + data) leaves
    its rows NaN: absent for the detector, which counts them."""
    group_of = np.full(groups.world_size, -1, dtype=np.int64)
    for g in pooled:
        group_of[list(groups.groups[g])] = g
    known = (ranks >= 0) & (ranks < groups.world_size)
    label = np.full(ranks.size, -1, dtype=np.int64)
    label[known] = group_of[ranks[known]]
    rows = np.flatnonzero(label >= 0)
    return _normalise_pooled(window_rows(window, rows), label[rows],
                             np.ones(rows.size, dtype=bool))


def _normalise_pooled(part: RankWindow, group: np.ndarray,
                      pooled: np.ndarray) -> tuple[RankWindow, dict[int, float]]:
    """:func:`normalised` of the rows ``pooled`` ((R,) bool) of ``part``, each in peer group
    ``group`` ((R,) int64 index into the groups); the other rows as they are. Returns the
    window and global rank -> its group's reference work (seconds), for the pooled rows of a
    group with one."""
    work = (part.compute_seconds + part.data_seconds)[:, 0]
    valid = pooled & np.isfinite(work) & (work > 0)
    reference = np.full(int(group.max()) + 1 if group.size else 0, np.inf)
    np.minimum.at(reference, group[valid], work[valid])  # each group's fastest rank
    scale = np.ones(group.size)
    scale[pooled] = reference[group[pooled]]
    scale[pooled & np.isinf(scale)] = np.nan  # no valid reference: the rows are absent
    with_unit = np.flatnonzero(pooled & np.isfinite(scale))
    units = dict(zip(np.asarray(part.ranks)[with_unit].tolist(), scale[with_unit].tolist(),
                     strict=True))
    per = scale[:, None]
    return dataclasses.replace(
        part,
        compute_seconds=part.compute_seconds / per,
        data_seconds=part.data_seconds / per,
        collective_wait_seconds=part.collective_wait_seconds / per,
        transfer_seconds=None if part.transfer_seconds is None else part.transfer_seconds / per,
    ), units
