"""Straggler detection across the ranks of a synchronous job, one window of steps at a time.

In synchronous data parallelism every rank waits in the gradient collective for the slowest one,
so step wall time is equal on every rank and says nothing about who is slow. What names the
straggler is the work each rank does *before* the synchronisation point (data loading, forward,
backward), corroborated by the wait inside the collective: the rank the others waited for waits
least. A slow link shows instead in the collective's own transfer time.

Every window the detector compares ranks with each other (the excess of each rank over the
median rank, so one slow rank cannot move the reference) and adds that excess to sequential
evidence per rank and signal: a clipped one-sided CUSUM (:mod:`laggard.detectors.sequential`)
whose decision interval follows the job's measured noise. A small steady excess adds up window
after window; one noisy window can neither raise nor clear a finding; clearing needs the mirror
test's evidence of recovery (hysteresis). A slowdown of the whole job moves the cross-rank median
with it, so it is never blamed on a rank; it is reported on its own, against the best the job
has shown (each rank's history first, then the median rank).

Clearing has a chart of its own (issue 26): a CUSUM of the evidence that the rank's excess has
fallen to half the raise reference, on the rank's own excess (not the wait-corroborated one),
with a decision interval for a false recovery once per ``false_alarm_windows`` windows at the
measured noise, and at least ``recovery_windows`` windows; so the finding holds while the excess
stays above the reference, whatever one window (or a few) near 0% says.

Only durations are compared, never timestamps: clocks of different hosts are not synchronised.

Input: one :class:`RankWindow` per detection window. The monitor builds it from the gathered
window record by name (:meth:`RankWindow.from_record`: each rank's medians over its own K steps,
robust to a one-step garbage-collection pause, so K = 1); windows of raw K steps per rank are
accepted too and give the same statistic, at K times the gathered bytes.

Peer groups (issue 31): one detector compares several groups of ranks side by side, each
within itself (:meth:`StragglerDetector.update_groups`, rows labelled by group), as separate
detectors would, in one pass over the window: the per-rank state is one array indexed by
global rank for all groups (each rank is in one group), the per-group figures (medians, noise,
thresholds, warm-up, whole-group baseline) are (G,) arrays computed from one sort of the window
(:class:`~laggard.detectors.stats.GroupIndex`). :meth:`StragglerDetector.update` is the one
group case.

This module is over 600 lines: it is one cohesive class, :class:`StragglerDetector`, with its
findings' text and evidence beside the test that raises them; the window format
(:mod:`~laggard.detectors.window`), the sequential test (:mod:`~laggard.detectors.sequential`),
the shared statistics (:mod:`~laggard.detectors.stats`) and the per-peer-group slicing
(:mod:`~laggard.detectors.group_straggler`) have modules of their own.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from laggard.detectors.finding import Finding, Severity
from laggard.detectors.sequential import cusum_step, decision_interval
from laggard.detectors.stats import (
    GroupIndex,
    evidence_round,
    nanmedian_rows,
    row_nanmedian,
)
from laggard.detectors.window import RankWindow

DETECTOR = "straggler"
#: Fewest reporting ranks the detector compares (``Config.min_ranks``' default and floor): with
#: two there is no majority to say who is slow.
MIN_RANKS = 3

#: The tested signals, in ring order; each is also the ``kind`` of the finding it raises.
SIGNAL_KINDS = ("compute", "data", "communication")
_COMPUTE, _DATA, _TRANSFER = 0, 1, 2
# Further columns of the per-rank history ring, after the signals' excess.
_WAIT_DEFICIT, _WORK_SECONDS = 3, 4

#: Windows of the last N in which the whole job must be over its threshold.
_JOB_OVER_WINDOWS = 3
#: The recovery chart's reference as a fraction of the raise chart's (chart 0): Page's k =
#: delta / 2 for the fall from the least excess a finding stands for (the raise reference) to 0.
_RECOVERY_REFERENCE = 0.5

__all__ = ["DETECTOR", "MIN_RANKS", "SIGNAL_KINDS", "RankWindow", "StragglerDetector",
           "lost_text", "time_lost"]


@dataclass(slots=True)
class _Test:
    """The sequential test's parameters for one window, per signal, in excess units (fractions
    of the median rank's per-step work)."""

    noise: np.ndarray  # (S,) pooled cross-rank sigma of the excess
    reference: np.ndarray  # (J, S) k of each chart: excess that counts as "not slow"
    interval: np.ndarray  # (J, S) h: the evidence that raises a finding
    clip: np.ndarray  # (J, S) c: most evidence one window can add or remove
    deficit_noise: float  # pooled cross-rank sigma of the wait deficit (NaN: unmeasured)
    recovery_reference: np.ndarray  # (S,) the recovery chart's k: excess that counts as "fast"
    recovery_interval: np.ndarray  # (S,) its h: the evidence of recovery that clears a finding
    recovery_clip: np.ndarray  # (S,) its c


#: What a compute finding tells the reader to check on a GPU job (the default).
GPU_COMPUTE_HINT = "check that GPU's clocks, clock-event reasons and XIDs"
#: The same on a CPU-only job (no CUDA device on the rank): no GPU to blame (issue 35).
CPU_COMPUTE_HINT = ("check that rank's CPU: other processes or threads on its cores, its "
                    "cgroup's CPU quota, and its input")


class StragglerDetector:
    """Names the rank that holds back a synchronous job, and the cause: compute, data or link.

    Feed it one :class:`RankWindow` per detection window (on one process, usually rank 0).

    Per window and per signal (compute, data, transfer), each rank's excess over the median rank
    is taken as a fraction of the median rank's per-step work (compute + data). Compute and data
    excess count only as far as the rank's wait deficit confirms it (the others waited for it).
    Each rank's excess feeds a clipped CUSUM (:mod:`laggard.detectors.sequential`): a finding is
    raised when the evidence reaches the decision interval ``h``, derived every window from the
    measured cross-rank noise for one false alarm per ``false_alarm_windows`` rank-windows. Each
    window adds at most ``h / (min_windows - 0.5)``, so ``min_windows`` windows are needed.

    It clears on a recovery chart of its own: a CUSUM of ``k / 2 - x`` on the rank's excess
    ``x`` in the finding's signal (uncorroborated: a noisy wait is no evidence of recovery),
    ``k`` the raise reference. Page's reference for a fall from ``k`` (the least excess a
    finding stands for) to 0 is ``k / 2``; its interval is set, like the raise chart's, for one
    false recovery per ``false_alarm_windows`` windows of a rank whose excess stays at ``k``, and
    is never less than ``recovery_windows`` windows of a fully recovered rank (excess 0, adding
    ``k / 2`` each). Each window adds at most ``h_r / (recovery_windows - 0.5)``. A rank still
    ``2k`` slow drains ``1.5 k`` per window, so the isolated windows near 0% excess a loaded
    machine shows (another rank slow in the same window) cannot add up to a recovery.

    Attributes:
        scores: global rank -> straggler score in the latest window, for the ranks in it: by
            how much the rank stretches each step of the job, as a fraction of the median rank's
            per-step work (compute + data): the sum over compute, data and transfer of its median
            excess over the last N windows. 0 is typical, 0.05 means the rank makes the job
            about 5% slower, negative means faster than the median rank.
        active: global rank -> the finding currently raised for that rank.
        job_slowdown: the active whole-job slowdown finding, or None.
        stats: counters of bad or unusable input: ``windows``, ``malformed_windows``,
            ``too_few_ranks_windows``, ``missing_rank_reports`` (ranks absent from a window
            whose world size is known), ``invalid_ranks`` (negative, duplicate or out of range),
            ``invalid_durations`` (NaN, infinite or negative values dropped),
            ``world_size_changes``, ``step_regressions`` (a window's step at or before the
            previous one: a restart), ``window_length_changes`` (steps between windows changed).
            None of these raises or clears a finding by itself.
    """

    @dataclass(kw_only=True, slots=True)
    class Config:
        """Thresholds of the straggler detector."""

        min_slowdown: float = 0.02
        """Relative floor: excess up to this fraction of the median rank's work never adds
        evidence (it is the CUSUM's reference value when larger than half of
        ``target_slowdown``). GPUs of one model differ by a few percent (Sinha et al., "Not All
        GPUs Are Created Equal", 2022), so smaller gaps are not actionable."""

        target_slowdown: float = 0.05
        """The slowdown the test is tuned to find fastest: the CUSUM's reference value is half
        of it (Page 1954: k = delta / 2 is optimal for a shift delta)."""

        false_alarm_windows: float = 1e6
        """Mean windows between false alarms of the whole job with no straggler: each rank and
        signal's CUSUM gets an in-control run length of this times the tests per window
        (ranks x measured signals, a Bonferroni split; Siegmund's approximation). A job of 4
        ranks thus tolerates more noise per test than one of 16,384, whose 49,152 tests per
        window each need a run length of 4.9e10 windows."""

        charts: tuple[float, ...] = (1.0, 2.0)
        """CUSUMs run side by side per rank and signal, each tuned for ``target_slowdown``
        times one of these (a multi-chart CUSUM, Lorden, Ann. Math. Stat. 42, 1971): the first
        finds small steady excess, the second finds larger excess in fewer windows. The split
        of the false-alarm budget over charts costs little (h grows with its logarithm)."""

        reference_sigmas: float = 0.5
        """Floor of the reference value in units of the measured noise: in a noisy job the
        test is tuned for a shift of at least twice this many sigmas (Page's k = delta / 2),
        since smaller shifts cannot be told from noise in useful time anyway."""

        min_windows: int = 3
        """Fewest windows whose evidence raises or clears a finding: one window adds at most
        ``h / (min_windows - 0.5)``, so one or two outlying windows (a data stall, a pause that a
        window median did not absorb) never do. With 2, the simulator's data stalls (20-200 ms
        over 5 ms of data loading) in two consecutive windows of one rank raised 6 false
        alarms in 27 M rank-steps; with 3, none."""

        recovery_windows: int = 5
        """Fewest windows whose evidence of recovery clears a finding: a fully recovered rank
        (excess 0) adds ``k / 2`` per window, and the recovery interval is never under this
        many of those. On the demo's loaded 2-core machine 1 window in 20 of a 10% straggler
        read under 2.5% (another rank slow in the same window, issue 26): five such windows
        in a row, against a drain of 1.5 k per window at the straggler's level, is what a
        false recovery would take."""

        corroboration_sigmas: float = 2.0
        """Slack of the wait corroboration, in units of the measured cross-rank noise of the
        wait deficit: a window's compute or data excess is capped at ``(deficit + this x
        sigma) / corroboration_ratio``, so the wait vetoes an excess only when it says so
        beyond its own noise (a one-sided test at about 2.3% for 2 sigmas). On an
        oversubscribed CPU the waits are wall time and their deficit swings by half a step's
        work from window to window (the demo: sigma 0.45-0.6 of the median rank's work),
        which vetoed one window in five of a real 10% straggler, its first slowed one among
        them (issue 26); where waits are exact (a GPU job, the simulator) sigma is small and
        the cap as strict as before."""

        persistence_windows: int = 5
        """N: the windows of history behind scores and evidence (per-rank medians); a rank
        absent for N windows in a row has its finding cleared (``not_reporting``). The first N
        windows after a start or a reset only learn the noise."""

        corroboration_ratio: float = 0.5
        """A compute or data excess counts only up to its wait deficit / this ratio: in a
        synchronous job the others wait for the slow rank as long as it is late, so timers that
        say slow while the wait says otherwise are not on the critical path. Skipped when the
        wait is not measured; 0 disables."""

        noise_history_windows: int = 32
        """Windows over which the per-window cross-rank noise is pooled (median of robust
        sigmas), so a small job's estimate does not rest on a few ranks."""

        min_ranks: int = MIN_RANKS
        """Fewest reporting ranks for a comparison (at least :data:`MIN_RANKS`: with two there
        is no majority to say who is slow)."""

        job_slowdown_threshold: float = 0.10
        """Report a whole-job slowdown when the median rank's work per step (each rank's
        median over the last N windows) exceeds the best the job has shown by this fraction,
        in 3 of the last N windows."""

        max_rank: int = 1 << 20
        """Largest global rank accepted (bounds memory whatever a window says)."""

        compute_hint: str = GPU_COMPUTE_HINT
        """What a compute finding's message tells the reader to check (a CPU-only job says
        :data:`CPU_COMPUTE_HINT`, ``laggard demo`` its own)."""

        def __post_init__(self) -> None:
            if not 0 <= self.min_slowdown < 1:
                raise ValueError(f"min_slowdown must be in [0, 1), got {self.min_slowdown}")
            if not 0 < self.target_slowdown < 2:
                raise ValueError(f"target_slowdown must be in (0, 2), got {self.target_slowdown}")
            if not self.false_alarm_windows > 1:
                raise ValueError("false_alarm_windows must be > 1")
            if self.reference_sigmas < 0:
                raise ValueError("reference_sigmas must be >= 0")
            if not self.charts or min(self.charts) < 1:
                raise ValueError(f"charts must be >= 1 each, got {self.charts}")
            if self.min_windows < 1:
                raise ValueError(f"min_windows must be >= 1, got {self.min_windows}")
            if self.recovery_windows < 1:
                raise ValueError(f"recovery_windows must be >= 1, got {self.recovery_windows}")
            if self.corroboration_sigmas < 0:
                raise ValueError("corroboration_sigmas must be >= 0")
            if self.persistence_windows < 3:
                raise ValueError("persistence_windows must be >= 3")
            if self.noise_history_windows < 1:
                raise ValueError("noise_history_windows must be >= 1")
            if self.corroboration_ratio < 0:
                raise ValueError("corroboration_ratio must be >= 0")
            if self.min_ranks < MIN_RANKS:
                raise ValueError(f"min_ranks must be >= {MIN_RANKS}, got {self.min_ranks}")
            if self.job_slowdown_threshold <= 0:
                raise ValueError("job_slowdown_threshold must be > 0")
            if self.max_rank < 1:
                raise ValueError("max_rank must be >= 1")

        @property
        def reference(self) -> float:
            """The least k: max(min_slowdown, target_slowdown / 2); see ``reference_sigmas``."""
            return max(self.min_slowdown, self.target_slowdown / 2)

    #: The ``detector`` of its findings.
    name = DETECTOR

    def __init__(self, config: Config | None = None, *, groups: int = 1) -> None:
        if groups < 1:
            raise ValueError(f"groups must be >= 1, got {groups}")
        self.config = config or StragglerDetector.Config()
        self.groups = groups
        self.active: dict[int, Finding] = {}
        self.stats: dict[str, int] = dict.fromkeys(
            (
                "windows",
                "malformed_windows",
                "too_few_ranks_windows",
                "missing_rank_reports",
                "invalid_ranks",
                "invalid_durations",
                "world_size_changes",
                "step_regressions",
                "window_length_changes",
            ),
            0,
        )
        self._last_step: int | None = None
        self._window_length: int | None = None
        self._world_size: int | None = None
        # (k / sigma, log10 run length) -> h / sigma (a cache: bisection per window is wasted)
        self._intervals: dict[tuple[float, float], float] = {}
        self._reset_state()

    @property
    def scores(self) -> dict[int, float]:
        """Global rank -> straggler score (class docstring), each group's from its latest
        window with enough ranks."""
        if self.groups == 1:
            return self._scores[0]
        merged: dict[int, float] = {}
        for scores in self._scores:
            merged.update(scores)
        return merged

    @property
    def job_slowdown(self) -> Finding | None:
        """The active whole-job slowdown finding (of the first group with one), or None."""
        return next((f for f in self._job_slowdown if f is not None), None)

    def reset(self) -> list[Finding]:
        """Forget all history (e.g. after a deliberate change of per-step work).

        Returns:
            the cleared findings for everything that was active.
        """
        cleared = [f for group in self._clear_all(step=None, reason="reset") for f in group]
        self._reset_state()
        return cleared

    def statistics(self, rank: int) -> dict[str, Any] | None:
        """The sequential test's figures for ``rank`` after the latest window: what raised or
        holds its finding, window by window (``benchmarks/demo_detection.py --trace``).

        Returns:
            None before the history is warm or for a rank never seen; else, each a list over
            :data:`SIGNAL_KINDS` (fractions of the median rank's work per step): ``excess``
            (this window's, NaN when absent), ``confirmed`` (capped by the wait),
            ``raise_evidence`` (the raise CUSUMs' sums, chart with most evidence relative to
            its interval), ``raise_interval`` (that chart's h), ``raise_reference``,
            ``recovery_evidence``, ``recovery_interval``, ``recovery_reference``; and
            ``noise``, ``deficit_noise``, ``active`` (the finding's kind or None).
        """
        if not 0 <= rank < self._capacity or self._rank_group[rank] < 0:
            return None
        t = self._tests[int(self._rank_group[rank])]
        if not np.isfinite(t.interval).any():
            return None
        by_chart = self._raise_sum[rank] / t.interval  # (J, S)
        chart = np.argmax(np.nan_to_num(by_chart, nan=-1.0), axis=0)  # (S,)
        columns = np.arange(len(SIGNAL_KINDS))

        def listed(values: np.ndarray) -> list[float | None]:
            return [evidence_round(float(v)) for v in values]

        active = self.active.get(rank)
        return {
            "excess": listed(self._last_excess[rank]),
            "confirmed": listed(self._last_confirmed[rank]),
            "raise_evidence": listed(self._raise_sum[rank][chart, columns]),
            "raise_interval": listed(t.interval[chart, columns]),
            "raise_reference": listed(t.reference[chart, columns]),
            "recovery_evidence": listed(self._clear_sum[rank]),
            "recovery_interval": listed(t.recovery_interval),
            "recovery_reference": listed(t.recovery_reference),
            "noise": listed(t.noise),
            "deficit_noise": evidence_round(t.deficit_noise),
            "active": None if active is None else active.kind,
        }

    # -- state -----------------------------------------------------------------------------

    def _reset_state(self) -> None:
        c = self.config
        n, s, g = c.persistence_windows, len(SIGNAL_KINDS), self.groups
        self._capacity = 0
        # Windows each group has recorded (its ring slot and warm-up), (G,).
        self._windows_seen = np.zeros(g, dtype=np.int64)
        # History of the last N windows, [window slot, rank, column]; NaN = rank absent.
        # Columns: compute, data and transfer excess and wait deficit (fractions of the median
        # rank's work), then compute + data seconds (for the job baseline). One array for all
        # groups, indexed by global rank: each rank is in one group (its slot is its group's).
        self._ring = np.full((n, 0, s + 2), np.nan)
        # The group each rank was last seen in (-1: never), for its group's slot and absence.
        self._rank_group = np.full(0, -1, dtype=np.int64)
        # Sequential evidence per [rank, signal]: for a slowdown, and (while a finding is
        # active) for recovery; windows in a row each rank was absent.
        j = len(c.charts)
        self._raise_sum = np.zeros((0, j, s))
        self._clear_sum = np.zeros((0, s))
        self._absent = np.zeros(0, dtype=np.int64)
        self._tests = [_Test(noise=np.full(s, np.nan), reference=np.full((j, s), c.reference),
                             interval=np.full((j, s), np.inf), clip=np.full((j, s), np.inf),
                             deficit_noise=math.nan,
                             recovery_reference=np.full(s, c.reference * _RECOVERY_REFERENCE),
                             recovery_interval=np.full(s, np.inf),
                             recovery_clip=np.full(s, np.inf))
                       for _ in range(g)]
        # Pooled noise per group: per window, the cross-rank sigma of each signal's excess,
        # then of the wait deficit (the last column).
        self._noise = np.full((g, c.noise_history_windows, s + 1), np.nan)
        self._last_excess = np.zeros((0, s))  # (R, S) raw, then confirmed: for statistics()
        self._last_confirmed = np.zeros((0, s))
        self._job_baseline = np.full(g, math.inf)  # best typical work seconds, median rank
        self._job_over = np.zeros((g, n), dtype=bool)
        self._job_slowdown: list[Finding | None] = [None] * g
        self._scores: list[dict[int, float]] = [{} for _ in range(g)]
        self._active_signal: dict[int, int] = {}

    def _grow(self, capacity: int) -> None:
        """Extend per-rank arrays to hold ranks < ``capacity`` (doubling: elastic jobs)."""
        if capacity <= self._capacity:
            return
        capacity = max(capacity, 2 * self._capacity)
        extra = capacity - self._capacity
        self._ring = np.pad(self._ring, [(0, 0), (0, extra), (0, 0)], constant_values=np.nan)
        self._rank_group = np.pad(self._rank_group, [(0, extra)], constant_values=-1)
        self._raise_sum = np.pad(self._raise_sum, [(0, extra), (0, 0), (0, 0)])
        self._clear_sum = np.pad(self._clear_sum, [(0, extra), (0, 0)])
        self._last_excess = np.pad(self._last_excess, [(0, extra), (0, 0)],
                                   constant_values=np.nan)
        self._last_confirmed = np.pad(self._last_confirmed, [(0, extra), (0, 0)],
                                      constant_values=np.nan)
        self._absent = np.pad(self._absent, [(0, extra)])
        self._capacity = capacity

    def _members(self, groups: np.ndarray) -> np.ndarray:
        """(capacity,) bool: the ranks last seen in one of ``groups`` ((G,) bool)."""
        known = self._rank_group >= 0
        out = np.zeros(self._capacity, dtype=bool)
        out[known] = groups[self._rank_group[known]]
        return out

    # -- input checks ----------------------------------------------------------------------

    def _clean(self, window: RankWindow, labels: np.ndarray | None,
               ) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]] | None:
        """Validated ranks, their groups and the (R, K) durations by :class:`RankWindow` field
        name, bad durations set to NaN; a row of a group outside ``[0, groups)`` is an invalid
        rank."""
        try:
            ranks = np.asarray(window.ranks).astype(np.int64, copy=False).ravel()
            signals = {name: np.array(getattr(window, name), dtype=np.float64, ndmin=2)
                       for name in ("compute_seconds", "data_seconds",
                                    "collective_wait_seconds")}
            transfer = window.transfer_seconds
            signals["transfer_seconds"] = (
                np.full(signals["compute_seconds"].shape, np.nan) if transfer is None
                else np.array(transfer, dtype=np.float64, ndmin=2))
            groups = (np.zeros(ranks.size, dtype=np.int64) if labels is None
                      else np.asarray(labels).astype(np.int64, copy=False).ravel())
        except (TypeError, ValueError):
            return None
        shape = signals["compute_seconds"].shape
        if len(shape) != 2 or shape[0] != ranks.size or groups.size != ranks.size or any(
                a.shape != shape for a in signals.values()):
            return None
        for name, values in signals.items():
            bad = ~(np.isfinite(values) & (values >= 0))
            # NaN transfer means "not measured" (documented); only other bad values count.
            counted = bad & ~np.isnan(values) if name == "transfer_seconds" else bad
            self.stats["invalid_durations"] += int(counted.sum())
            values[bad] = np.nan

        limit = self.config.max_rank
        if window.world_size is not None:
            limit = min(limit, window.world_size - 1)
        _, first = np.unique(ranks, return_index=True)
        keep = np.zeros(ranks.size, dtype=bool)
        keep[first] = True  # the first row of a duplicated rank wins
        keep &= (ranks >= 0) & (ranks <= limit) & (groups >= 0) & (groups < self.groups)
        self.stats["invalid_ranks"] += int(ranks.size - keep.sum())
        return ranks[keep], groups[keep], {name: a[keep] for name, a in signals.items()}

    def _check_steps(self, step: int) -> None:
        """Count a step counter that went back (a rank restarted from a checkpoint) and a
        change of steps per window; both windows are still used (their durations are valid)."""
        try:
            step = int(step)
        except (TypeError, ValueError):
            return
        last, length = self._last_step, self._window_length
        if last is not None:
            if step <= last:
                self.stats["step_regressions"] += 1
            else:
                if length is not None and step - last != length:
                    self.stats["window_length_changes"] += 1
                self._window_length = step - last
        self._last_step = step

    def update(self, window: RankWindow, *, step_seconds: float | None = None,
               unit_seconds: Mapping[int, float] | None = None) -> list[Finding]:
        """Take one window; return the findings raised or cleared by it.

        Args:
            window: the window's durations per rank.
            step_seconds: the job's step time in this window (seconds; the monitor's median
                ``step_seconds``), for a finding's time lost per hour; None (or not > 0):
                estimated as the median rank's compute + data + wait (+ transfer).
            unit_seconds: when the window's durations are work-normalised (each rank's divided
                by its peer group's work per step, :func:`laggard.detectors.group_straggler.
                normalised`): global rank -> the seconds one unit stands for on that rank, so
                a finding's seconds (message, ``lost_seconds_per_step``) are the rank's own;
                None: durations are seconds.

        A cleared finding repeats the kind, rank and node of the one it ends, with
        ``cleared=True``, ``evidence["reason"]`` (``recovered``,
        ``not_reporting``, ``world_size_changed``, ``reset``) and a message saying so.

        Bad input is counted in :attr:`stats` and skipped, never raised: a malformed window
        (arrays of different shapes) is ignored whole; bad ranks and bad durations are dropped;
        a change of world size clears every finding and restarts the history (an elastic job
        re-shards its work, so the old baselines no longer apply).
        """
        normalised = None if unit_seconds is None else np.ones(self.groups, dtype=bool)
        return [f for group in self.update_groups(
            window, None, step_seconds=step_seconds, unit_seconds=unit_seconds,
            normalised=normalised) for f in group]

    def update_groups(self, window: RankWindow, labels: np.ndarray | None, *,
                      step_seconds: float | None = None,
                      unit_seconds: Mapping[int, float] | None = None,
                      normalised: np.ndarray | None = None) -> list[list[Finding]]:
        """Take one window of every group's rows; return each group's findings.

        Each group is compared within itself, as by a detector of its own (:meth:`update`
        on its rows alone, with its own noise, calibration, warm-up and whole-job baseline),
        in one pass over the window's (R, K) arrays: the per-rank state is one array for all
        groups, the per-group figures come from a :class:`~laggard.detectors.stats.
        GroupIndex`.

        Args:
            window: every group's rows; its ``world_size`` as in :meth:`update` (None when the
                groups do not cover the job).
            labels: (R,) int64 group of each row in ``[0, groups)`` (other values: counted
                in ``invalid_ranks``, dropped); None: every row in group 0.
            step_seconds: as in :meth:`update`, for every group.
            unit_seconds: as in :meth:`update`, for the ranks of the ``normalised`` groups.
            normalised: (G,) bool, the groups whose durations are work-normalised; None: none.

        Returns:
            G lists: each group's findings raised or cleared by this window, in the order a
            detector of its own would give them.
        """
        self.stats["windows"] += 1
        self._check_steps(window.step)
        findings: list[list[Finding]] = [[] for _ in range(self.groups)]
        cleaned = self._clean(window, labels)
        if cleaned is None:
            self.stats["malformed_windows"] += 1
            return findings
        ranks, groups, signals = cleaned
        compute, data = signals["compute_seconds"], signals["data_seconds"]
        wait, transfer = signals["collective_wait_seconds"], signals["transfer_seconds"]

        world_size = window.world_size
        if world_size is not None:
            if self._world_size is not None and world_size != self._world_size:
                self.stats["world_size_changes"] += 1
                for mine, cleared in zip(findings, self._clear_all(
                        step=window.step, reason="world_size_changed"), strict=True):
                    mine += cleared
                self._reset_state()
            self._world_size = world_size
            self.stats["missing_rank_reports"] += max(world_size - ranks.size, 0)

        per_rank = np.stack(
            [row_nanmedian(compute), row_nanmedian(data), row_nanmedian(transfer)], axis=1
        )
        wait_med = row_nanmedian(wait)
        work = row_nanmedian(compute + data)
        # A rank without a valid compute and data time in this window counts as absent.
        present = ~np.isnan(work)
        index = GroupIndex(groups[present], self.groups)
        job_work = index.medians(work[present])  # (G,)
        with np.errstate(invalid="ignore"):
            advancing = (index.counts >= self.config.min_ranks) & (job_work > 0)
        self.stats["too_few_ranks_windows"] += int((~advancing).sum())
        if not advancing.any():
            return findings

        self._grow(int(ranks.max()) + 1)
        if step_seconds is not None and step_seconds > 0:
            step_s = np.full(self.groups, float(step_seconds))
        else:
            # every rank's step ends at the sync point: its work, its wait, its transfer
            step_s = index.medians((work + np.nan_to_num(wait_med)
                                    + np.nan_to_num(per_rank[:, _TRANSFER]))[present])
        flags = (np.zeros(self.groups, dtype=bool) if normalised is None or unit_seconds is None
                 else np.asarray(normalised, dtype=bool))
        scales = [_Scale(step_seconds=float(step_s[g]),
                         units=unit_seconds if flags[g] else None,
                         step_in_units=bool(flags[g]) and step_seconds is None)
                  for g in range(self.groups)]
        rows = present & advancing[groups]
        self._rank_group[ranks[rows]] = groups[rows]
        self._advance(window, ranks[rows], groups[rows], per_rank[rows], wait_med[rows],
                      work[rows], job_work, scales, advancing, findings)
        return findings

    # -- the detector ----------------------------------------------------------------------

    def _advance(
        self,
        window: RankWindow,
        ranks: np.ndarray,
        groups: np.ndarray,
        per_rank: np.ndarray,
        wait: np.ndarray,
        work: np.ndarray,
        job_work: np.ndarray,
        scales: list[_Scale],
        advancing: np.ndarray,
        findings: list[list[Finding]],
    ) -> None:
        """One window of the present ranks of the advancing groups (enough ranks): record,
        test, clear, raise, then each group's whole job; findings appended per group."""
        slots = self._windows_seen % self.config.persistence_windows  # (G,) before recording
        index = GroupIndex(groups, self.groups)
        excess, deficit, medians = self._record(slots, index, ranks, groups, per_rank, wait,
                                                work, job_work, advancing)
        typical, count = self._history(ranks)
        score = np.round(np.nansum(typical[:, :_WAIT_DEFICIT], axis=1), 6)
        order = np.argsort(groups, kind="stable")
        bounds = np.concatenate([[0], np.cumsum(index.counts)])
        ranks_by_group, score_by_group = ranks[order].tolist(), score[order].tolist()
        for g in np.flatnonzero(advancing).tolist():
            start, end = int(bounds[g]), int(bounds[g + 1])
            self._scores[g] = dict(zip(ranks_by_group[start:end], score_by_group[start:end],
                                       strict=True))
        warmed = advancing & (self._windows_seen >= self.config.persistence_windows)
        warm_rows = warmed[groups]
        if warmed.any():
            # every group's pooled noise at once: the median of its last windows' sigmas
            noise = self._noise
            pooled = row_nanmedian(np.where(np.isfinite(noise), noise, np.nan).transpose(0, 2, 1))
            for g in np.flatnonzero(warmed).tolist():
                self._tests[g] = self._calibrate(pooled[g], int(index.counts[g]))
            confirmed = self._corroborated(excess[warm_rows], deficit[warm_rows],
                                           groups[warm_rows])
            self._accumulate(ranks[warm_rows], groups[warm_rows], excess[warm_rows], confirmed)
            stale = self._members(warmed)
            self._last_excess[stale], self._last_confirmed[stale] = np.nan, np.nan
            self._last_excess[ranks[warm_rows]] = excess[warm_rows]
            self._last_confirmed[ranks[warm_rows]] = confirmed
        self._clear_ranks(window.step, advancing, findings)
        if warmed.any():
            self._raise_ranks(window, ranks, groups, warm_rows, typical, job_work, medians,
                              scales, findings)
        self._check_job(window.step, index, groups, typical[:, _WORK_SECONDS],
                        count[:, _WORK_SECONDS], slots, advancing, findings)

    def _record(
        self, slots: np.ndarray, index: GroupIndex, ranks: np.ndarray, groups: np.ndarray,
        per_rank: np.ndarray, wait: np.ndarray, work: np.ndarray, job_work: np.ndarray,
        advancing: np.ndarray,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Excess over the group's median rank per signal and wait deficit, as fractions of
        that median rank's work per step (the fraction by which a rank stretches every step of
        its group), into the history ring and the noise pool.

        Returns:
            excess (R, S), wait deficit (R,), each group's median rank's seconds per signal
            (G, S).
        """
        c = self.config
        medians = index.medians(per_rank)  # (G, S)
        row_work = job_work[groups]
        excess = (per_rank - medians[groups]) / row_work[:, None]
        deficit = (index.medians(wait)[groups] - wait) / row_work
        # each advancing group's slot is emptied for its ranks, then filled for those present
        members = np.flatnonzero(self._members(advancing))
        self._ring[slots[self._rank_group[members]], members] = np.nan
        row_slots = slots[groups]
        self._ring[row_slots, ranks, :_WAIT_DEFICIT] = excess
        self._ring[row_slots, ranks, _WAIT_DEFICIT] = deficit
        self._ring[row_slots, ranks, _WORK_SECONDS] = work
        sigmas = index.robust_sigmas(np.column_stack([excess, deficit]))  # (G, S + 1)
        for g in np.flatnonzero(advancing).tolist():
            self._noise[g, self._windows_seen[g] % c.noise_history_windows] = sigmas[g]
        self._absent[members] += 1
        self._absent[ranks] = 0
        self._windows_seen[advancing] += 1
        return excess, deficit, medians

    def _history(self, ranks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each present rank's median over the last N windows, per ring column, and in how
        many of them it was present: (R, C) float64 and (R, C) int64."""
        if ranks.size == self._capacity and (ranks == np.arange(ranks.size)).all():
            history = self._ring  # every rank, in order (the usual window): no copy
        else:
            history = self._ring[:, ranks]  # (N, R, C)
        missing = np.isnan(history)
        n = history.shape[0]
        if not missing.any():
            # every rank in each of the N windows (a steady job): the middle rows of the
            # sorted history, without the per-element picks (the same values)
            ordered = _sort_windows(history, absent=False)
            typical = ordered[(n - 1) // 2] / 2 + ordered[n // 2] / 2
            return typical, np.full(typical.shape, n, dtype=np.int64)
        count = n - np.sum(missing, axis=0)
        ordered = _sort_windows(history)  # absent windows last
        typical = _pick(ordered, (count - 1) // 2) / 2 + _pick(ordered, count // 2) / 2
        typical[count == 0] = np.nan
        return typical, count

    def _calibrate(self, pooled: np.ndarray, ranks: int) -> _Test:
        """Each chart's reference value and interval from a group's pooled noise ((S + 1,):
        the median over its last windows of each signal's cross-rank sigma, then the wait
        deficit's), for its ``ranks`` present ranks: h such that the group raises a false
        alarm once per ``false_alarm_windows`` windows (Siegmund's approximation per test, the
        run length split over ranks x measured signals x charts)."""
        c = self.config
        signals, charts = len(SIGNAL_KINDS), len(c.charts)
        noise, deficit_noise = pooled[:signals], float(pooled[signals])
        measured = np.isfinite(noise)
        run_length = c.false_alarm_windows * ranks * max(int(measured.sum()), 1) * charts
        reference = np.full((charts, signals), c.reference)
        interval = np.full((charts, signals), np.inf)  # a signal nobody measured never raises
        for (j, multiple), i in itertools.product(enumerate(c.charts),
                                                  np.flatnonzero(measured).tolist()):
            sigma = float(noise[i])
            k = max(c.min_slowdown, multiple * c.target_slowdown / 2,
                    multiple * c.reference_sigmas * sigma)
            reference[j, i] = k
            # However quiet the job, a rank half of the chart's shift over its reference value
            # still needs min_windows windows: the noise model is normal, real tails are not.
            interval[j, i] = max(self._interval(k, sigma, run_length),
                                 c.min_windows * multiple * c.target_slowdown / 2)
        # The recovery chart, on the first (smallest) reference: in control the rank is still
        # at least k slow, so its increments k / 2 - x have mean -k / 2 or less, the same
        # distance in sigmas as the raise chart's in-control increments x - k at x = k / 2;
        # the same per-test run length, so a false recovery is as rare as a false alarm.
        recovery_reference = reference[0] * _RECOVERY_REFERENCE
        recovery_interval = np.full(signals, np.inf)
        for i in np.flatnonzero(measured).tolist():
            k_r = float(recovery_reference[i])
            recovery_interval[i] = max(self._interval(k_r, float(noise[i]), run_length),
                                       c.recovery_windows * k_r)
        # min_windows - 0.5: min_windows - 1 windows at the clip fall short of h, and
        # min_windows windows reach it without each having to be at the clip.
        return _Test(noise=noise, reference=reference, interval=interval,
                     clip=interval / (c.min_windows - 0.5), deficit_noise=deficit_noise,
                     recovery_reference=recovery_reference, recovery_interval=recovery_interval,
                     recovery_clip=recovery_interval / max(c.recovery_windows - 0.5, 0.5))

    def _interval(self, k: float, sigma: float, run_length: float) -> float:
        """Siegmund's h (excess units) for reference ``k`` at noise ``sigma`` and the per-test
        in-control run length; 0 without noise (the callers' floors apply). Cached: a
        bisection per window and signal would be wasted."""
        if not sigma > 0:
            return 0.0
        key = (round(k / sigma, 3), round(math.log10(run_length), 2))
        if key not in self._intervals:
            if len(self._intervals) > 4096:
                self._intervals.clear()
            self._intervals[key] = decision_interval(key[0], 10 ** key[1])
        return self._intervals[key] * sigma

    def _per_row(self, name: str, groups: np.ndarray) -> np.ndarray:
        """The tests' field ``name`` stacked over groups, taken at each row's group."""
        return np.stack([getattr(t, name) for t in self._tests])[groups]

    def _corroborated(self, excess: np.ndarray, deficit: np.ndarray,
                      groups: np.ndarray) -> np.ndarray:
        """Compute and data excess capped by what the wait confirms, (deficit + z sigma) /
        ratio (``corroboration_sigmas``: the wait's own noise is no veto); the transfer excess,
        and every signal where the wait is not measured, as they are."""
        c = self.config
        if c.corroboration_ratio == 0:
            return excess
        slack = c.corroboration_sigmas * np.array([t.deficit_noise for t in self._tests])
        slack = np.where(np.isfinite(slack), slack, 0.0)[groups]
        confirmed = excess.copy()
        with np.errstate(invalid="ignore"):
            cap = np.where(np.isnan(deficit), np.inf,
                           (deficit + slack) / c.corroboration_ratio)[:, None]
            confirmed[:, :_TRANSFER] = np.minimum(excess[:, :_TRANSFER], cap)
        return confirmed

    def _accumulate(self, ranks: np.ndarray, groups: np.ndarray, excess: np.ndarray,
                    confirmed: np.ndarray) -> None:
        """Add this window's evidence: of a slowdown (the confirmed excess) always, of recovery
        (the rank's own excess) while a finding is active."""
        self._raise_sum[ranks] = cusum_step(
            self._raise_sum[ranks], confirmed[:, None, :] - self._per_row("reference", groups),
            self._per_row("clip", groups))
        self._clear_sum[ranks] = cusum_step(
            self._clear_sum[ranks], self._per_row("recovery_reference", groups) - excess,
            self._per_row("recovery_clip", groups))
        inactive = np.ones(ranks.size, dtype=bool)
        inactive[np.isin(ranks, list(self.active))] = False
        self._clear_sum[ranks[inactive]] = 0.0  # recovery evidence counts only once raised

    def _clear_ranks(self, step: int, advancing: np.ndarray,
                     findings: list[list[Finding]]) -> None:
        """Clear the findings of the advancing groups whose recovery evidence reached the
        interval, or whose rank has been absent for N windows in a row."""
        for rank in list(self.active):
            group = int(self._rank_group[rank])
            if not advancing[group]:
                continue
            signal = self._active_signal[rank]
            if self._absent[rank] >= self.config.persistence_windows:
                reason = "not_reporting"
            elif self._clear_sum[rank, signal] >= self._tests[group].recovery_interval[signal]:
                reason = "recovered"
            else:
                continue
            findings[group].append(_cleared(self.active.pop(rank), step, reason))
            del self._active_signal[rank]
            self._raise_sum[rank] = 0.0
            self._clear_sum[rank] = 0.0

    def _raise_ranks(
        self, window: RankWindow, ranks: np.ndarray, groups: np.ndarray, warm: np.ndarray,
        typical: np.ndarray, job_work: np.ndarray, medians: np.ndarray, scales: list[_Scale],
        findings: list[list[Finding]],
    ) -> None:
        """Raise a finding for each present rank of a warmed-up group whose evidence reached
        the interval, on the signal with the most evidence relative to its interval."""
        rows = np.flatnonzero(warm)
        by_chart = self._raise_sum[ranks[rows]] / self._per_row("interval", groups[rows])
        progress = by_chart.max(axis=1)  # (R, S): 1 = enough evidence
        context = _RankContext(window)
        for i in np.flatnonzero((progress >= 1).any(axis=1)).tolist():
            row = int(rows[i])
            rank, group = int(ranks[row]), int(groups[row])
            if rank in self.active:
                continue
            signal = int(np.argmax(progress[i]))
            chart = int(np.argmax(by_chart[i, :, signal]))
            finding = self._rank_finding(
                rank=rank, group=group, signal=signal, step=window.step, context=context,
                typical=self._recent(rank, group, typical[row]), chart=chart,
                job_work=float(job_work[group]), medians=medians[group], scale=scales[group],
            )
            self.active[rank] = finding
            self._active_signal[rank] = signal
            self._raise_sum[rank] = 0.0
            self._clear_sum[rank] = 0.0
            findings[group].append(finding)

    def _recent(self, rank: int, group: int, typical: np.ndarray) -> np.ndarray:
        """The rank's median over its last ``min_windows`` windows, per ring column (where
        it was absent in all of them: ``typical``, its median over N): the figures a raised
        finding states (slowdown, time lost). A rank named ``min_windows`` windows after its
        onset still has unslowed windows among the last N, whose median would state a 25%
        straggler as 7% (issue 23's re-run of the demo) and its cost a third of the truth."""
        n = self.config.persistence_windows
        seen = int(self._windows_seen[group])
        last = [(seen - 1 - i) % n for i in range(min(self.config.min_windows, n))]
        recent = self._ring[last, rank]  # (W, C)
        median = nanmedian_rows(recent)
        return np.where(np.isnan(median), typical, median)

    def _check_job(
        self,
        step: int,
        index: GroupIndex,
        groups: np.ndarray,
        work: np.ndarray,
        windows: np.ndarray,
        slots: np.ndarray,
        advancing: np.ndarray,
        findings: list[list[Finding]],
    ) -> None:
        """Whole-job (whole-group) slowdown: the median rank's work per step against the
        group's best.

        Each rank's history (median over its last N windows) first, then the median rank:
        both medians keep one slow rank or one slow window out of the job's baseline, and the
        baseline (the best seen) is taken from that smooth series so noise barely lowers it.

        Args:
            work: (R,) median compute + data seconds of each rank present over the last N
                windows.
            windows: (R,) in how many of the last N windows each was present.
            slots: (G,) each group's ring slot of this window.
        """
        c = self.config
        full = windows == c.persistence_windows
        steady = GroupIndex(groups[full], self.groups)
        now = steady.medians(work[full])  # (G,)
        for g in np.flatnonzero(advancing).tolist():
            findings[g] += self._check_group_job(g, step, float(now[g]), int(steady.counts[g]),
                                                 int(slots[g]))

    def _check_group_job(self, group: int, step: int, now_s: float, ranks: int,
                         slot: int) -> list[Finding]:
        """:meth:`_check_job` for one group: ``now_s`` its median rank's work (seconds),
        ``ranks`` how many ranks that median is over."""
        c = self.config
        warmed_up = self._windows_seen[group] >= c.persistence_windows
        if warmed_up and now_s > 0:
            self._job_baseline[group] = min(self._job_baseline[group], now_s)
        baseline_s = float(self._job_baseline[group])
        ratio = now_s / baseline_s if math.isfinite(baseline_s) else math.nan
        over = self._job_over[group]
        over[slot] = warmed_up and ratio >= 1 + c.job_slowdown_threshold
        active = self._job_slowdown[group]
        if active is not None and not over.any():
            self._job_slowdown[group] = None
            return [_cleared(active, step, "recovered")]
        if active is None and over.sum() >= _JOB_OVER_WINDOWS:
            finding = Finding(
                detector=DETECTOR,
                kind="job_slowdown",
                severity=Severity.WARNING,
                step=step,
                message=(
                    f"whole job {100 * (ratio - 1):.1f}% slower than its best (median rank's "
                    f"compute+data {1e3 * now_s:.1f} ms/step vs {1e3 * baseline_s:.1f} ms), not "
                    "one rank: check shared storage, the network fabric, or a job-wide change "
                    "of batch or sequence length"
                ),
                evidence={
                    "slowdown": evidence_round(ratio - 1),
                    "threshold": c.job_slowdown_threshold,
                    "work_seconds": evidence_round(now_s),
                    "baseline_work_seconds": evidence_round(baseline_s),
                    "ranks": ranks,
                },
            )
            self._job_slowdown[group] = finding
            return [finding]
        return []

    def _rank_finding(
        self,
        *,
        rank: int,
        group: int,
        signal: int,
        step: int,
        context: _RankContext,
        typical: np.ndarray,
        chart: int,
        job_work: float,
        medians: np.ndarray,
        scale: _Scale,
    ) -> Finding:
        node, local_rank = context.lookup(rank)
        # Work-normalised windows (peer groups pooled across stages): into the rank's seconds.
        unit = scale.unit(rank)
        job_work, medians = job_work * unit, medians * unit
        step_seconds = scale.step_seconds * unit if scale.step_in_units else scale.step_seconds
        where = f"rank {rank}"
        if node is not None:
            where += f" on {node}"
        if local_rank is not None:
            where += f" (local rank {local_rank})"
        slowdown = float(typical[signal])
        lost = time_lost(slowdown * job_work, step_seconds)
        message = _message(signal=signal, where=where, slowdown=slowdown, job_work=job_work,
                           signal_seconds=float(medians[signal]),
                           hint=self.config.compute_hint,
                           windows=min(self.config.min_windows,
                                       self.config.persistence_windows),
                           cost=lost_text(lost))
        t = self._tests[group]
        details: dict[str, Any] = {
            "slowdown": evidence_round(slowdown),
            "evidence": evidence_round(float(self._raise_sum[rank, chart, signal])),
            "decision_interval": evidence_round(float(t.interval[chart, signal])),
            "reference": evidence_round(float(t.reference[chart, signal])),
            "noise": evidence_round(float(t.noise[signal])),
            "compute_slowdown": evidence_round(float(typical[_COMPUTE])),
            "data_slowdown": evidence_round(float(typical[_DATA])),
            "transfer_slowdown": evidence_round(float(typical[_TRANSFER])),
            "wait_deficit": evidence_round(float(typical[_WAIT_DEFICIT])),
            "median_work_seconds": evidence_round(job_work),
            "median_compute_seconds": evidence_round(float(medians[_COMPUTE])),
            "median_data_seconds": evidence_round(float(medians[_DATA])),
            "median_transfer_seconds": evidence_round(float(medians[_TRANSFER])),
            "windows": min(self.config.min_windows, self.config.persistence_windows),
            **lost,
        }
        return Finding(
            detector=DETECTOR,
            kind=SIGNAL_KINDS[signal],
            severity=Severity.WARNING,
            message=message,
            rank=rank,
            node=node,
            local_rank=local_rank,
            step=step,
            evidence=details,
        )

    def _clear_all(self, step: int | None, reason: str) -> list[list[Finding]]:
        """Every active finding cleared, per group (rank findings, then the group's whole-job
        one)."""
        cleared: list[list[Finding]] = [[] for _ in range(self.groups)]
        for rank, finding in self.active.items():
            group = int(self._rank_group[rank]) if rank < self._capacity else 0
            cleared[max(group, 0)].append(_cleared(finding, step, reason))
        for group, active in enumerate(self._job_slowdown):
            if active is not None:
                cleared[group].append(_cleared(active, step, reason))
        self.active.clear()
        self._active_signal.clear()
        self._job_slowdown = [None] * self.groups
        return cleared


def time_lost(lost_seconds_per_step: float, step_seconds: float) -> dict[str, float | None]:
    """What a finding costs the job: its evidence ``lost_seconds_per_step`` (the seconds per
    step every other rank waits at the synchronisation point for this one's excess) and
    ``lost_seconds_per_hour`` (``3600 x lost / step seconds``: job time lost per hour of
    training at the current step time) and ``step_seconds`` (that step time).

    Args:
        lost_seconds_per_step: the excess, seconds per step (clipped at 0).
        step_seconds: the job's step time, seconds (NaN or <= 0: per hour unknown, None).
    """
    lost = max(float(lost_seconds_per_step), 0.0)
    per_hour = 3600 * lost / step_seconds if step_seconds > 0 else math.nan
    return {"lost_seconds_per_step": evidence_round(lost),
            "lost_seconds_per_hour": evidence_round(per_hour),
            "step_seconds": evidence_round(step_seconds)}


def lost_text(lost: dict[str, float | None]) -> str:
    """``"costs the job 0.031 s per step, 9.4 min per hour"`` from :func:`time_lost`'s
    evidence (the per-hour part left out when unknown)."""
    per_step = lost.get("lost_seconds_per_step") or 0.0
    text = f"costs the job {per_step:.3g} s per step"
    per_hour = lost.get("lost_seconds_per_hour")
    if per_hour is not None:
        text += f", {per_hour / 60:.1f} min per hour"
    return text


def _message(*, signal: int, where: str, slowdown: float, job_work: float,
             signal_seconds: float, hint: str, windows: int, cost: str) -> str:
    """A rank finding's message: one number for the slowdown, said over which windows, then
    what to check.

    Args:
        slowdown: the rank's excess as a fraction of the median rank's work per step (its
            median over the last ``windows`` windows).
        job_work: the median rank's work (compute + data) per step, seconds.
        signal_seconds: the median rank's seconds per step of this signal.
        windows: the windows that median is taken over (``persistence_windows``).
        cost: what it costs the job (:func:`lost_text`).
    """
    extra_ms = 1e3 * slowdown * job_work
    over = f"in its last {windows} windows"  # the median of those windows
    if signal == _COMPUTE:
        # compute: this rank's forward+backward over the median rank's
        pct = 100 * slowdown * job_work / signal_seconds if signal_seconds > 0 else 100 * slowdown
        return (f"{where}: forward+backward {pct:.0f}% slower than the median rank {over} "
                f"(+{extra_ms:.1f} ms per step), and every other rank waits for it in the "
                f"gradient collective ({cost}): {hint}")
    if signal == _DATA:
        return (f"{where}: data loading +{extra_ms:.1f} ms per step over the median rank {over} "
                f"({100 * slowdown:.0f}% of a step's work), and every other rank waits for it "
                f"({cost}): check its input pipeline (loader workers, storage, host CPU)")
    return (f"{where}: collective transfer +{extra_ms:.1f} ms per step over the median rank "
            f"{over} ({100 * slowdown:.0f}% of a step's work), and every other rank waits for "
            f"it ({cost}): check its network link (NIC, cable, switch port)")


def _sort_windows(history: np.ndarray, *, absent: bool = True) -> np.ndarray:
    """Sort each rank's few windows: (N, R, C) ascending along N, NaN replaced by +inf
    (``absent=False``: the caller has checked there is no NaN).

    An odd-even transposition network (Knuth, TAOCP vol. 3, 5.3.4) of elementwise min/max over
    all ranks at once: N is small (a handful of windows), and numpy's sort of 16,384 x C rows of
    N values costs ten times more in per-row overhead. Sorted in place in one copy: a new
    array per compare-exchange (megabytes at 65,536 ranks) cost more in page faults than in
    comparisons.
    """
    ordered = np.where(np.isnan(history), np.inf, history) if absent else history.copy()
    smaller = np.empty_like(ordered[0])
    for phase in range(len(ordered)):
        for i in range(phase % 2, len(ordered) - 1, 2):
            low, high = ordered[i], ordered[i + 1]
            np.minimum(low, high, out=smaller)
            np.maximum(low, high, out=high)
            low[...] = smaller
    return ordered


def _pick(ordered: np.ndarray, index: np.ndarray) -> np.ndarray:
    """``ordered[index[r, c], r, c]`` for every (r, c); index clipped into range."""
    index = np.clip(index, 0, ordered.shape[0] - 1)
    return np.take_along_axis(ordered, index[None], axis=0)[0]


@dataclass(frozen=True, slots=True)
class _Scale:
    """What one window's durations are in: the job's step time (seconds, or units when
    ``step_in_units``: estimated from work-normalised durations) and, for work-normalised
    durations, global rank -> seconds per unit (None: durations are seconds)."""

    step_seconds: float
    units: Mapping[int, float] | None
    step_in_units: bool

    def unit(self, rank: int) -> float:
        """Seconds per unit of ``rank``'s durations (1.0 for seconds)."""
        return 1.0 if self.units is None else float(self.units.get(rank, 1.0))


@dataclass(slots=True)
class _RankContext:
    """Node and local rank of the ranks in a window, looked up by global rank."""

    window: RankWindow
    _rows: dict[int, int] = field(default_factory=dict)

    def lookup(self, rank: int) -> tuple[str | None, int | None]:
        if not self._rows:
            raw = np.asarray(self.window.ranks).ravel().tolist()
            self._rows = {}
            for index, global_rank in enumerate(raw):
                self._rows.setdefault(int(global_rank), index)  # the first row of a duplicate
        row = self._rows.get(rank)
        node: str | None = None
        local: int | None = None
        if row is not None:
            nodes = self.window.nodes
            if nodes is not None and row < len(nodes):
                node = str(nodes[row])
            locals_ = self.window.local_ranks
            if locals_ is not None and row < len(locals_):
                local = int(locals_[row])
        return node, local


def _cleared(finding: Finding, step: int | None, reason: str) -> Finding:
    what = (f"rank {finding.rank}: {finding.kind} slowdown" if finding.rank is not None
            else "whole-job slowdown")
    return finding.clear(
        step=step, reason=reason,
        message=f"{what} cleared ({reason.replace('_', ' ')})")
