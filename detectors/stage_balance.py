"""Stage imbalance: one pipeline stage (peer group) does more work per step than the others.

In a pipeline-parallel job every stage waits for the slowest one at each send/recv, so a stage
given more layers (or the embedding, or the loss head) sets the step time for all. That is not a
straggler: all the stage's ranks are slow alike, and replacing their hardware buys nothing;
moving layers off the stage does. Lin et al. ("Understanding Stragglers in Large Model Training
Using What-if Analysis", OSDI'25) found stage imbalance among the commonest causes of slow jobs.

Per window each group's *stage work* (seconds of compute + data per step) is taken from its
ranks: the fastest rank's for groups of one or two ranks (a slow rank of two would move a
median, there the mean, halfway: the stage would read 12% heavy for a 1.25x rank), the median
for groups of three or more (robust to one slow and one fast rank, where the minimum of many
noisy ranks would read lighter the larger the group, so big groups would look light against
small ones). A group is *over* in a window when its stage work exceeds the others' (their
median; the other group's with two) by more than ``stage_imbalance_threshold`` AND its ranks
agree (their spread, max - min for small groups, the interquartile range for larger ones, is
under ``agreement_ratio`` of the gap): a group whose one rank is slow is a straggler, named by
the straggler detector. A finding is raised when a group is over in ``over_windows`` of the last
``persistence_windows`` windows and clears when it is over in none of them (hysteresis).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from laggard.detectors.finding import Finding, Severity
from laggard.detectors.peer_groups import PeerGroups
from laggard.detectors.stats import GroupIndex, evidence_round, nanmedian, nanmedian_rows
from laggard.detectors.straggler import DETECTOR, lost_text, time_lost
from laggard.detectors.window import WindowRecord

#: The kind of its findings (detector ``"straggler"``: the agent's straggler series carry it).
KIND = "stage_imbalance"
#: Groups of at most this many ranks take their fastest rank's work as the stage's.
_SMALL_GROUP = 2

__all__ = ["KIND", "StageBalance"]


class StageBalance:
    """Names the pipeline stage (peer group) the others wait for (module docstring).

    Args:
        groups: the job's peer groups (at least 2 for anything to compare).
        config: see :class:`StageBalance.Config`; defaults when None.

    Attributes:
        active: group index -> its raised finding.
        stage_seconds: each group's stage work in the latest window, seconds per step (NaN
            where its ranks gave no valid compute + data).
        stats: ``windows``, ``too_few_groups_windows`` (fewer than 2 groups with a valid stage
            work), ``invalid_durations`` (NaN, infinite or negative compute or data dropped),
            ``unknown_ranks`` (record rows of a rank in no group).
    """

    @dataclass(kw_only=True, slots=True)
    class Config:
        """Thresholds of the stage-balance detector."""

        stage_imbalance_threshold: float = 0.10
        """A group is over when its stage work exceeds the others' by more than this fraction
        (0.10: a stage 10% heavier than the rest)."""

        agreement_ratio: float = 0.5
        """The group's ranks agree when their spread is under this fraction of the gap (the
        stage's excess over the others, seconds): else one slow rank, not the stage, is
        heavy."""

        persistence_windows: int = 5
        """N: the windows of history behind a finding (evidence medians, hysteresis)."""

        over_windows: int = 3
        """Windows of the last N in which a group must be over to raise a finding."""

        def __post_init__(self) -> None:
            if not 0 < self.stage_imbalance_threshold < 10:
                raise ValueError("stage_imbalance_threshold must be in (0, 10)")
            if not 0 < self.agreement_ratio <= 1:
                raise ValueError("agreement_ratio must be in (0, 1]")
            if self.persistence_windows < 1:
                raise ValueError("persistence_windows must be >= 1")
            if not 1 <= self.over_windows <= self.persistence_windows:
                raise ValueError("over_windows must be in [1, persistence_windows]")

    #: The ``detector`` of its findings.
    name = DETECTOR

    def __init__(self, groups: PeerGroups, config: Config | None = None) -> None:
        self.groups = groups
        self.config = config or StageBalance.Config()
        count, n = len(groups.groups), self.config.persistence_windows
        self.active: dict[int, Finding] = {}
        self.stage_seconds = np.full(count, np.nan)
        self.stats: dict[str, int] = dict.fromkeys(
            ("windows", "too_few_groups_windows", "invalid_durations", "unknown_ranks"), 0)
        self._over = np.zeros((n, count), dtype=bool)
        self._work = np.full((n, count), np.nan)  # stage work per window slot
        self._step = np.full(n, np.nan)  # the job's step seconds per window slot
        self._p2p = np.full((n, count), np.nan)  # each group's median p2p wait per slot
        self._seen = 0
        self._group_of = np.full(groups.world_size, -1, dtype=np.int64)
        for g, ranks in enumerate(groups.groups):
            self._group_of[list(ranks)] = g

    def update(self, record: WindowRecord) -> list[Finding]:
        """Take one gathered window; return the stage-imbalance findings raised or cleared.

        Args:
            record: the window record (``compute_seconds``, ``data_seconds`` (R,) and, when
                present, ``step_seconds`` and ``p2p_wait_seconds``), rows by global rank.

        Bad input (NaN or negative durations, ranks in no group, a record without the
        columns) is counted in :attr:`stats`, never raised.
        """
        self.stats["windows"] += 1
        c = self.config
        slot = self._seen % c.persistence_windows
        self._seen += 1
        work, spread, p2p, step = self._stage_work(record)
        self.stage_seconds = work
        self._work[slot], self._p2p[slot], self._step[slot] = work, p2p, step
        self._over[slot] = False
        valid = np.isfinite(work)
        if valid.sum() < 2:
            self.stats["too_few_groups_windows"] += 1
        else:
            for g in np.flatnonzero(valid).tolist():
                reference = nanmedian(np.delete(work, g))
                gap = float(work[g]) - reference
                self._over[slot, g] = bool(
                    reference > 0 and gap > c.stage_imbalance_threshold * reference
                    and spread[g] < c.agreement_ratio * gap)
        findings: list[Finding] = []
        step_no = record.step
        for g in list(self.active):
            if not self._over[:, g].any():
                finding = self.active.pop(g)
                findings.append(finding.clear(
                    step=step_no, reason="recovered",
                    message=f"{finding.subject}: stage imbalance cleared (recovered)"))
        counts = self._over.sum(axis=0)
        for g in np.argsort(-counts).tolist():
            if counts[g] >= c.over_windows and g not in self.active and not self.active:
                self.active[g] = self._finding(g, step_no)
                findings.append(self.active[g])
        return findings

    def _stage_work(self, record: WindowRecord) -> tuple[np.ndarray, np.ndarray, np.ndarray,
                                                         float]:
        """Each group's stage work and ranks' spread (seconds per step), its ranks' median
        p2p wait, and the job's median step seconds, for one window: (G,), (G,), (G,),
        float."""
        count = len(self.groups.groups)
        work = np.full(count, np.nan)
        spread = np.full(count, np.nan)
        p2p = np.full(count, np.nan)
        try:
            ranks = np.asarray(record.ranks, dtype=np.int64).ravel()
            rows = np.asarray(record["compute_seconds"], dtype=np.float64) + np.asarray(
                record["data_seconds"], dtype=np.float64)
        except (KeyError, TypeError, ValueError):
            return work, spread, p2p, math.nan
        if rows.shape != ranks.shape:
            return work, spread, p2p, math.nan
        bad = ~(np.isfinite(rows) & (rows >= 0))
        self.stats["invalid_durations"] += int(bad.sum())
        known = (ranks >= 0) & (ranks < self._group_of.size)
        self.stats["unknown_ranks"] += int((~known).sum())
        group = np.where(known, self._group_of[np.clip(ranks, 0, self._group_of.size - 1)], -1)
        waits = _column(record, "p2p_wait_seconds", ranks.size)
        # each group's valid rows sorted, in one sort for all groups (not a pass per group)
        mine = (group >= 0) & ~bad
        by_group = np.lexsort((rows[mine], group[mine]))
        ordered = rows[mine][by_group]
        bounds = np.concatenate([[0], np.cumsum(np.bincount(group[mine], minlength=count))])
        for g in range(count):
            values = ordered[bounds[g]:bounds[g + 1]]
            if not values.size:
                continue
            if len(self.groups.groups[g]) <= _SMALL_GROUP:
                work[g], spread[g] = values[0], values[-1] - values[0]
            else:
                q1, q2, q3 = np.percentile(values, [25, 50, 75])
                work[g], spread[g] = q2, q3 - q1
        if waits is not None:
            medians = GroupIndex(group[known], count).medians(waits[known])
            p2p = np.where(np.isfinite(work), medians, np.nan)
        steps = _column(record, "step_seconds", ranks.size)
        step = math.nan if steps is None else nanmedian(steps)
        return work, spread, p2p, step

    def _finding(self, g: int, step: int) -> Finding:
        """The finding for group ``g``, from the medians over the last N windows."""
        c = self.config
        groups = self.groups
        per_stage = nanmedian_rows(self._work)
        heavy = float(per_stage[g])
        reference = nanmedian(np.delete(per_stage, g))
        balanced = float(np.nanmean(per_stage))
        lost_s = heavy - balanced  # every other stage waits this long per step
        step_s = nanmedian(self._step)
        step_s = step_s if math.isfinite(step_s) else heavy
        lost = time_lost(lost_s, step_s)
        evidence: dict[str, Any] = {
            "stage_seconds": {name: evidence_round(float(v))
                              for name, v in zip(groups.names, per_stage, strict=True)},
            "imbalance": evidence_round(heavy / reference - 1) if reference > 0 else None,
            "threshold": c.stage_imbalance_threshold,
            "balanced_stage_seconds": evidence_round(balanced),
            "balanced_step_seconds": evidence_round(step_s - lost_s),
            "windows_over": int(self._over[:, g].sum()),
            "windows": c.persistence_windows,
            "peer_group": groups.names[g],
            "compared": "across groups",
            **lost,
        }
        p2p = nanmedian_rows(self._p2p)
        if np.isfinite(p2p).any():
            evidence["p2p_wait_seconds"] = {
                name: evidence_round(float(v)) for i, (name, v) in enumerate(
                    zip(groups.names, p2p, strict=True)) if i != g and math.isfinite(v)}
        subject = groups.describe(g)
        what = "stage" if groups.stages[g] is not None else "group"
        message = (
            f"{subject} does {1e3 * heavy:.1f} ms of work per step, "
            f"{100 * (heavy / reference - 1):.0f}% more than the other {what}s "
            f"({1e3 * reference:.1f} ms), all its ranks alike: the others wait for it, no rank "
            f"is a straggler ({lost_text(lost)}); balance the split (every {what} at the mean, "
            f"{1e3 * balanced:.1f} ms: a step of {step_s - lost_s:.3g} s instead of "
            f"{step_s:.3g} s)")
        return Finding(detector=DETECTOR, kind=KIND, severity=Severity.WARNING,
                       message=message, rank=None, step=step, evidence=evidence,
                       subject=subject)


def _column(record: WindowRecord, name: str, size: int) -> np.ndarray | None:
    """The record's width-1 float column ``name`` of ``size`` rows, or None."""
    values = record.get(name)
    if values is None:
        return None
    out = np.asarray(values, dtype=np.float64)
    return out if out.shape == (size,) else None
