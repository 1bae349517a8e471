"""Straggler detection across the ranks of a synchronous job, one window of steps at a time.

In synchronous data parallelism every rank waits in the gradient collective for the slowest one,
so step wall time is equal on every rank and says nothing about who is slow. What names the
straggler is the work each rank does *before* the synchronisation point (data loading, forward,
backward), corroborated by the wait inside the collective: the rank the others waited for waits
least. A slow link shows instead in the collective's own transfer time.

Every window the detector compares ranks with each other (median and MAD across ranks, so one
slow rank cannot move the reference) and raises a finding only when a rank's excess is both
statistically clear (a z-score against the job's measured noise) and large enough to matter (a
relative floor), in M of the last N windows. A slowdown of the whole job moves the cross-rank
median with it, so it is never blamed on a rank; it is reported on its own, against the best
the job has shown (each rank's history first, then the median rank).

Only durations are compared, never timestamps: clocks of different hosts are not synchronised.

What the monitor should gather (recommended): every K steps each rank computes
:func:`summarize_steps` over its own K steps (per-rank medians, robust to a one-step garbage
collection pause) and all_gathers that fixed vector of :data:`SUMMARY_FIELDS` float64 values
(32 bytes per rank, whatever K), then rank 0 builds a K=1 window with
:meth:`RankWindow.from_summaries`. Windows of raw K steps per rank are accepted too and give the
same statistic, at K times the gathered bytes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from laggard.detectors.finding import Finding, Severity
from laggard.detectors.window import SUMMARY_FIELDS

DETECTOR = "straggler"
#: Fewest reporting ranks the detector compares (``Config.min_ranks``' default and floor): with
#: two there is no majority to say who is slow.
MIN_RANKS = 3
#: Scales a median absolute deviation to the standard deviation of a normal distribution
#: (1 / Phi^-1(3/4); Rousseeuw & Croux 1993).
MAD_TO_SIGMA = 1.4826

#: The tested signals, in ring order; each is also the ``kind`` of the finding it raises.
SIGNAL_KINDS = ("compute", "data", "communication")
_COMPUTE, _DATA, _TRANSFER = 0, 1, 2
# Further columns of the per-rank history ring, after the signals' excess.
_WAIT_DEFICIT, _WORK_SECONDS = 3, 4


@dataclass(kw_only=True, slots=True)
class RankWindow:
    """Per-rank timings of one detection window: R ranks x K steps.

    Attributes:
        step: last training step of the window.
        ranks: (R,) int64 global ranks present; a rank that did not report is simply absent.
        compute_seconds: (R, K) float64, forward + backward: work before the sync point.
        data_seconds: (R, K) float64, data loading.
        collective_wait_seconds: (R, K) float64, time waiting inside the gradient collective
            (least wait = the rank the others waited for).
        transfer_seconds: (R, K) float64, the collective's own transfer time as this rank saw
            it (a slow link), NaN where unknown; None when not measured at all.
        world_size: ranks in the job, if known (enables missing-rank counts and elastic resets).
        nodes: (R,) host name of each rank, if known.
        local_ranks: (R,) local rank of each rank on its node, if known.

    NaN, infinite or negative durations are dropped (counted in ``StragglerDetector.stats``).
    """

    step: int
    ranks: np.ndarray
    compute_seconds: np.ndarray
    data_seconds: np.ndarray
    collective_wait_seconds: np.ndarray
    transfer_seconds: np.ndarray | None = None
    world_size: int | None = None
    nodes: Sequence[str] | None = None
    local_ranks: np.ndarray | None = None

    @classmethod
    def from_summaries(
        cls,
        *,
        step: int,
        ranks: np.ndarray,
        summaries: np.ndarray,
        world_size: int | None = None,
        nodes: Sequence[str] | None = None,
        local_ranks: np.ndarray | None = None,
    ) -> RankWindow:
        """Build a K=1 window from gathered :func:`summarize_steps` vectors.

        Args:
            step: last training step of the window.
            ranks: (R,) global ranks, one per row of ``summaries``.
            summaries: (R, 4) float64, columns as :data:`SUMMARY_FIELDS`.
            world_size, nodes, local_ranks: as in :class:`RankWindow`.

        Raises:
            ValueError: ``summaries`` is not (R, 4).
        """
        values = np.asarray(summaries, dtype=np.float64)
        if values.ndim != 2 or values.shape[1] != len(SUMMARY_FIELDS):
            raise ValueError(f"summaries must be (R, {len(SUMMARY_FIELDS)}), got {values.shape}")
        return cls(
            step=step,
            ranks=np.asarray(ranks, dtype=np.int64),
            compute_seconds=values[:, 0:1],
            data_seconds=values[:, 1:2],
            collective_wait_seconds=values[:, 2:3],
            transfer_seconds=values[:, 3:4],
            world_size=world_size,
            nodes=nodes,
            local_ranks=local_ranks,
        )


def summarize_steps(
    compute_seconds: Sequence[float],
    data_seconds: Sequence[float],
    collective_wait_seconds: Sequence[float],
    transfer_seconds: Sequence[float] | None = None,
) -> np.ndarray:
    """One rank's summary of its last K steps: what the monitor all_gathers per window.

    Medians, not means: a single garbage-collection pause or data stall in K steps does not move
    a median, while a rank that is slow on most steps does.

    Args:
        compute_seconds, data_seconds, collective_wait_seconds: (K,) durations in seconds.
        transfer_seconds: (K,) durations in seconds, or None when not measured.

    Returns:
        (4,) float64, fields as :data:`SUMMARY_FIELDS`; NaN where no valid (finite,
        non-negative) value was given.
    """
    columns = [compute_seconds, data_seconds, collective_wait_seconds]
    columns.append(transfer_seconds if transfer_seconds is not None else [])
    out = np.full(len(SUMMARY_FIELDS), np.nan)
    for i, column in enumerate(columns):
        values = np.asarray(column, dtype=np.float64).ravel()
        values = values[np.isfinite(values) & (values >= 0)]
        if values.size:
            out[i] = np.median(values)
    return out


def row_nanmedian(values: np.ndarray) -> np.ndarray:
    """Median along the last axis ignoring NaN, vectorised (numpy's ``nanmedian`` loops in
    Python over rows).

    Args:
        values: (..., K) float64.

    Returns:
        (...) float64; NaN where a row has no finite value.
    """
    if values.shape[-1] == 1:
        return values[..., 0].copy()
    ordered = np.sort(values, axis=-1)  # NaN sort last
    count = np.sum(~np.isnan(ordered), axis=-1, keepdims=True)
    return _sorted_median(ordered, count)


def _sorted_median(ordered: np.ndarray, count: np.ndarray) -> np.ndarray:
    """Median of rows sorted with NaN last, given each row's count of non-NaN values."""
    last = ordered.shape[-1] - 1
    low = np.take_along_axis(ordered, np.clip((count - 1) // 2, 0, last), axis=-1)[..., 0]
    high = np.take_along_axis(ordered, np.clip(count // 2, 0, last), axis=-1)[..., 0]
    return np.where(count[..., 0] > 0, (low + high) / 2, np.nan)


def _nanmedian(values: np.ndarray) -> float:
    finite = values[~np.isnan(values)]
    return float(np.median(finite)) if finite.size else math.nan


def _robust_sigma(values: np.ndarray) -> float:
    """Standard deviation estimated from the MAD of the non-NaN values (NaN if none)."""
    finite = values[~np.isnan(values)]
    if finite.size == 0:
        return math.nan
    return MAD_TO_SIGMA * float(np.median(np.abs(finite - np.median(finite))))


class StragglerDetector:
    """Names the rank that holds back a synchronous job, and the cause: compute, data or link.

    Feed it one :class:`RankWindow` per detection window (on one process, usually rank 0).

    Per window and per signal (compute, data, transfer), each rank's excess over the median rank
    is taken as a fraction of the median rank's per-step work (compute + data). A rank is over
    threshold in a window when that excess reaches ``max(min_slowdown, z_threshold x noise)``
    above the typical rank; a finding is raised when a rank is over threshold in M of the last N
    windows (``raise_windows`` of ``persistence_windows``), and cleared after N windows in a row
    under it. "Over in M of the last N" is computed as "the M-th largest of the last N excesses
    reaches the threshold", and the noise is measured on that same statistic across ranks, so
    the threshold is calibrated to what is compared.

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
            ``world_size_changes``.
    """

    @dataclass(kw_only=True, slots=True)
    class Config:
        """Thresholds of the straggler detector."""

        min_slowdown: float = 0.02
        """Relative floor: a rank is flagged only if it delays the step by at least this
        fraction of the median rank's work. GPUs of one model differ by a few percent (Sinha et
        al., "Not All GPUs Are Created Equal", 2022), so smaller gaps are not actionable, and a
        quiet job's tiny absolute differences never trip the z-score."""

        z_threshold: float = 6.0
        """Robust z-score (excess over the job's measured noise) the persistence statistic
        must reach. High because a job has many ranks and many windows: at 16,384 ranks a
        4-sigma event happens in most windows, and 6 keeps false alarms near one per 20,000
        windows even there (``benchmarks/straggler_quality.py``). A job of a few ranks makes far
        fewer tests per window and can trade some of that margin (4-5) for earlier detection."""

        raise_windows: int = 3
        """M: raise a finding when a rank is over threshold in M of the last N windows."""

        persistence_windows: int = 5
        """N: the windows considered; a finding clears after N windows in a row under
        threshold. The first N windows after a start or a reset only learn the noise."""

        corroboration_ratio: float = 0.5
        """A compute or data straggler must also wait less than the median rank in the
        collective, by at least this fraction of its excess (in a synchronous job the two are
        equal): timers that say slow while the wait says otherwise are not on the critical
        path. Skipped when the wait is not measured; 0 disables."""

        noise_history_windows: int = 32
        """Windows over which the per-window cross-rank noise is pooled (median of MADs): a
        lower bound on the noise, so a small job's estimate does not rest on a few ranks."""

        min_ranks: int = MIN_RANKS
        """Fewest reporting ranks for a comparison (at least :data:`MIN_RANKS`: with two there
        is no majority to say who is slow)."""

        job_slowdown_threshold: float = 0.10
        """Report a whole-job slowdown when the median rank's work per step (each rank's
        median over the last N windows) exceeds the best the job has shown by this fraction."""

        max_rank: int = 1 << 20
        """Largest global rank accepted (bounds memory whatever a window says)."""

        def __post_init__(self) -> None:
            if not 0 <= self.min_slowdown < 1:
                raise ValueError(f"min_slowdown must be in [0, 1), got {self.min_slowdown}")
            if self.z_threshold <= 0:
                raise ValueError(f"z_threshold must be > 0, got {self.z_threshold}")
            if not 1 <= self.raise_windows <= self.persistence_windows:
                raise ValueError(
                    "need 1 <= raise_windows <= persistence_windows, got "
                    f"{self.raise_windows} of {self.persistence_windows}"
                )
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

    def __init__(self, config: Config | None = None) -> None:
        self.config = config or StragglerDetector.Config()
        self.scores: dict[int, float] = {}
        self.active: dict[int, Finding] = {}
        self.job_slowdown: Finding | None = None
        self.stats: dict[str, int] = dict.fromkeys(
            (
                "windows",
                "malformed_windows",
                "too_few_ranks_windows",
                "missing_rank_reports",
                "invalid_ranks",
                "invalid_durations",
                "world_size_changes",
            ),
            0,
        )
        self._world_size: int | None = None
        self._order_sd = _order_statistic_sd(
            self.config.raise_windows, self.config.persistence_windows
        )
        self._reset_state()

    def reset(self) -> list[Finding]:
        """Forget all history (e.g. after a deliberate change of per-step work).

        Returns:
            the cleared findings for everything that was active.
        """
        cleared = self._clear_all(step=None, reason="reset")
        self._reset_state()
        return cleared

    # -- state -----------------------------------------------------------------------------

    def _reset_state(self) -> None:
        c = self.config
        n, s = c.persistence_windows, len(SIGNAL_KINDS)
        self._capacity = 0
        self._windows_seen = 0
        # History of the last N windows, [window slot, rank, column]; NaN = rank absent.
        # Columns: compute, data and transfer excess and wait deficit (fractions of the median
        # rank's work), then compute + data seconds (for the job baseline).
        self._ring = np.full((n, 0, s + 2), np.nan)
        self._threshold = np.full(s, np.inf)  # latest threshold per signal
        self._noise = np.full((c.noise_history_windows, s), np.nan)
        self._job_baseline = math.inf  # best typical work seconds of the median rank
        self._job_over = np.zeros(n, dtype=bool)
        self._active_signal: dict[int, int] = {}

    def _grow(self, capacity: int) -> None:
        """Extend per-rank arrays to hold ranks < ``capacity`` (doubling: elastic jobs)."""
        if capacity <= self._capacity:
            return
        capacity = max(capacity, 2 * self._capacity)
        extra = capacity - self._capacity

        self._ring = np.pad(self._ring, [(0, 0), (0, extra), (0, 0)], constant_values=np.nan)
        self._capacity = capacity

    # -- input checks ----------------------------------------------------------------------

    def _clean(self, window: RankWindow) -> tuple[np.ndarray, list[np.ndarray]] | None:
        """Validated ranks and the four (R, K) signal arrays, bad durations set to NaN."""
        try:
            ranks = np.asarray(window.ranks).astype(np.int64, copy=False).ravel()
            given = [window.compute_seconds, window.data_seconds, window.collective_wait_seconds]
            signals = [np.array(a, dtype=np.float64, ndmin=2) for a in given]
            if window.transfer_seconds is None:
                signals.append(np.full(signals[0].shape, np.nan))
            else:
                signals.append(np.array(window.transfer_seconds, dtype=np.float64, ndmin=2))
        except (TypeError, ValueError):
            return None
        shape = signals[0].shape
        if len(shape) != 2 or shape[0] != ranks.size or any(a.shape != shape for a in signals):
            return None
        for i, values in enumerate(signals):
            bad = ~(np.isfinite(values) & (values >= 0))
            # NaN transfer means "not measured" (documented); only other bad values count.
            counted = bad & ~np.isnan(values) if i == 3 else bad
            self.stats["invalid_durations"] += int(counted.sum())
            values[bad] = np.nan

        limit = self.config.max_rank
        if window.world_size is not None:
            limit = min(limit, window.world_size - 1)
        _, first = np.unique(ranks, return_index=True)
        keep = np.zeros(ranks.size, dtype=bool)
        keep[first] = True  # the first row of a duplicated rank wins
        keep &= (ranks >= 0) & (ranks <= limit)
        self.stats["invalid_ranks"] += int(ranks.size - keep.sum())
        return ranks[keep], [a[keep] for a in signals]

    # -- the detector ----------------------------------------------------------------------

    def update(self, window: RankWindow) -> list[Finding]:
        """Take one window; return the findings raised or cleared by it.

        A cleared finding repeats the kind, rank and node of the one it ends, with
        ``evidence["cleared"] = True``, ``evidence["reason"]`` (``recovered``,
        ``not_reporting``, ``world_size_changed``, ``reset``) and a message saying so.

        Bad input is counted in :attr:`stats` and skipped, never raised: a malformed window
        (arrays of different shapes) is ignored whole; bad ranks and bad durations are dropped;
        a change of world size clears every finding and restarts the history (an elastic job
        re-shards its work, so the old baselines no longer apply).
        """
        self.stats["windows"] += 1
        cleaned = self._clean(window)
        if cleaned is None:
            self.stats["malformed_windows"] += 1
            return []
        ranks, (compute, data, wait, transfer) = cleaned

        findings: list[Finding] = []
        world_size = window.world_size
        if world_size is not None:
            if self._world_size is not None and world_size != self._world_size:
                self.stats["world_size_changes"] += 1
                findings += self._clear_all(step=window.step, reason="world_size_changed")
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
        job_work = _nanmedian(work)
        if present.sum() < self.config.min_ranks or not job_work > 0:
            self.stats["too_few_ranks_windows"] += 1
            return findings

        self._grow(int(ranks.max()) + 1)
        findings += self._advance(
            window, ranks[present], per_rank[present], wait_med[present], work[present], job_work
        )
        return findings

    def _advance(
        self,
        window: RankWindow,
        ranks: np.ndarray,
        per_rank: np.ndarray,
        wait: np.ndarray,
        work: np.ndarray,
        job_work: float,
    ) -> list[Finding]:
        c = self.config
        n, m = c.persistence_windows, c.raise_windows
        slot = self._windows_seen % n
        noise_slot = self._windows_seen % c.noise_history_windows
        self._windows_seen += 1
        signals = range(len(SIGNAL_KINDS))

        # Excess over the median rank, per signal, as a fraction of the median rank's work per
        # step: the fraction by which this rank stretches every step of the job.
        medians = np.array([_nanmedian(per_rank[:, i]) for i in signals])
        excess = (per_rank - medians) / job_work
        self._ring[slot] = np.nan
        self._ring[slot, ranks, :_WAIT_DEFICIT] = excess
        self._ring[slot, ranks, _WAIT_DEFICIT] = (_nanmedian(wait) - wait) / job_work
        self._ring[slot, ranks, _WORK_SECONDS] = work
        self._noise[noise_slot] = [_robust_sigma(excess[:, i]) for i in signals]

        # One sort of the ranks' history gives every statistic below.
        history = self._ring[:, ranks]  # (N, R, C)
        count = np.sum(~np.isnan(history), axis=0)  # (R, C): windows present
        ordered = _sort_windows(history)  # (N, R, C), absent windows last
        typical = _pick(ordered, (count - 1) // 2) / 2 + _pick(ordered, count // 2) / 2
        typical[count == 0] = np.nan  # (R, C): median over the last N windows
        # Persistence statistic: the M-th largest excess of the last N windows (-inf if the
        # rank was present in fewer than M). It reaches a threshold exactly when the rank was
        # over it in M of the last N windows.
        excess_count = count[:, :_WAIT_DEFICIT]
        statistic = np.where(
            excess_count >= m, _pick(ordered[..., :_WAIT_DEFICIT], excess_count - m), -np.inf
        )  # (R, S)
        # Its typical value and noise, across ranks; the noise never below the pooled
        # per-window noise scaled to this order statistic (small jobs: few ranks to measure).
        center = np.zeros(len(SIGNAL_KINDS))
        sigma = np.zeros(len(SIGNAL_KINDS))
        for i in signals:
            finite = statistic[np.isfinite(statistic[:, i]), i]
            center[i] = _nanmedian(finite)
            pooled = _nanmedian(self._noise[:, i]) * self._order_sd
            sigma[i] = np.fmax(_robust_sigma(finite), pooled)
        threshold = np.fmax(c.min_slowdown, center + c.z_threshold * sigma)  # (S,), NaN-free
        threshold[np.isnan(threshold)] = np.inf  # a signal nobody measured is never over
        self._threshold = threshold

        warmed_up = self._windows_seen >= n
        with np.errstate(invalid="ignore"):
            over = (statistic >= threshold) & warmed_up
            # The rank the others waited for waits least: compute or data excess without a
            # matching wait deficit is not on the critical path (unless wait is not measured).
            deficit = typical[:, _WAIT_DEFICIT]
            corroborated = np.isnan(deficit)[:, None] | (
                deficit[:, None] >= c.corroboration_ratio * statistic[:, :_TRANSFER]
            )
        over[:, :_TRANSFER] &= corroborated

        score = np.nansum(typical[:, :_WAIT_DEFICIT], axis=1)
        self.scores = dict(zip(ranks.tolist(), np.round(score, 6).tolist(), strict=True))

        findings = self._clear_ranks(window.step)
        context = _RankContext(window)
        for row in np.flatnonzero(over.any(axis=1)).tolist():
            rank = int(ranks[row])
            if rank in self.active:
                continue
            signal = int(np.argmax(np.where(over[row], statistic[row] - threshold, -np.inf)))
            finding = self._rank_finding(
                rank=rank,
                signal=signal,
                step=window.step,
                context=context,
                typical=typical[row],
                threshold=float(threshold[signal]),
                sigma=float(sigma[signal]),
                wait_deficit=float(deficit[row]),
                job_work=job_work,
                medians=medians,
                windows_over=self._windows_over(rank, signal),
            )
            self.active[rank] = finding
            self._active_signal[rank] = signal
            findings.append(finding)

        findings += self._check_job(
            window.step, typical[:, _WORK_SECONDS], count[:, _WORK_SECONDS], slot,
            warmed_up,
        )
        return findings

    def _windows_over(self, rank: int, signal: int) -> int:
        """In how many of the last N windows the rank's excess reached the latest threshold."""
        with np.errstate(invalid="ignore"):
            return int(np.sum(self._ring[:, rank, signal] >= self._threshold[signal]))

    def _clear_ranks(self, step: int) -> list[Finding]:
        """Clear findings whose signal was under threshold in each of the last N windows."""
        cleared = []
        for rank in list(self.active):
            signal = self._active_signal[rank]
            if self._windows_over(rank, signal):
                continue
            absent = bool(np.isnan(self._ring[:, rank, signal]).all())
            reason = "not_reporting" if absent else "recovered"
            cleared.append(_cleared(self.active.pop(rank), step, reason))
            del self._active_signal[rank]
        return cleared

    def _check_job(
        self,
        step: int,
        work: np.ndarray,
        windows: np.ndarray,
        slot: int,
        warmed_up: bool,
    ) -> list[Finding]:
        """Whole-job slowdown: the median rank's work per step against the job's best.

        Each rank's history (median over its last N windows) first, then the median rank:
        both medians keep one slow rank or one slow window out of the job's baseline, and the
        baseline (the best seen) is taken from that smooth series so noise barely lowers it.

        Args:
            work: (R,) median compute + data seconds of each rank present over the last N
                windows.
            windows: (R,) in how many of the last N windows each was present.
        """
        c = self.config
        full = windows == c.persistence_windows
        now_s = _nanmedian(work[full])
        if warmed_up and now_s > 0:
            self._job_baseline = min(self._job_baseline, now_s)
        baseline_s = self._job_baseline
        ratio = now_s / baseline_s if math.isfinite(baseline_s) else math.nan
        self._job_over[slot] = warmed_up and ratio >= 1 + c.job_slowdown_threshold
        if self.job_slowdown is not None and not self._job_over.any():
            cleared = _cleared(self.job_slowdown, step, "recovered")
            self.job_slowdown = None
            return [cleared]
        if self.job_slowdown is None and self._job_over.sum() >= c.raise_windows:
            self.job_slowdown = Finding(
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
                    "slowdown": _round(ratio - 1),
                    "threshold": c.job_slowdown_threshold,
                    "work_seconds": _round(now_s),
                    "baseline_work_seconds": _round(baseline_s),
                    "ranks": int(full.sum()),
                },
            )
            return [self.job_slowdown]
        return []

    def _rank_finding(
        self,
        *,
        rank: int,
        signal: int,
        step: int,
        context: _RankContext,
        typical: np.ndarray,
        threshold: float,
        sigma: float,
        wait_deficit: float,
        job_work: float,
        medians: np.ndarray,
        windows_over: int,
    ) -> Finding:
        node, local_rank = context.lookup(rank)
        where = f"rank {rank}"
        if node is not None:
            where += f" on {node}"
        if local_rank is not None:
            where += f" (local rank {local_rank})"
        slowdown = float(typical[signal])
        extra_ms = 1e3 * slowdown * job_work
        pct = 100 * slowdown
        if signal == _COMPUTE:
            message = (
                f"{where}: forward+backward {extra_ms:.1f} ms/step ({pct:.1f}%) longer than the "
                "median rank's, and every other rank waits for it in the gradient collective: "
                "check that GPU's clocks, clock-event reasons and XIDs"
            )
        elif signal == _DATA:
            message = (
                f"{where}: data loading {extra_ms:.1f} ms/step ({pct:.1f}% of a step's work) "
                "longer than the median rank's, and every other rank waits for it: check its "
                "input pipeline (loader workers, storage, host CPU)"
            )
        else:
            message = (
                f"{where}: collective transfer {extra_ms:.1f} ms/step ({pct:.1f}% of a step's "
                "work) longer than the median rank's, and every other rank waits for it: check "
                "its network link (NIC, cable, switch port)"
            )
        evidence: dict[str, Any] = {
            "slowdown": _round(slowdown),
            "threshold": _round(threshold),
            "noise": _round(sigma),
            "compute_slowdown": _round(float(typical[_COMPUTE])),
            "data_slowdown": _round(float(typical[_DATA])),
            "transfer_slowdown": _round(float(typical[_TRANSFER])),
            "wait_deficit": _round(wait_deficit),
            "median_work_seconds": _round(job_work),
            "median_compute_seconds": _round(float(medians[_COMPUTE])),
            "median_data_seconds": _round(float(medians[_DATA])),
            "median_transfer_seconds": _round(float(medians[_TRANSFER])),
            "windows_over": windows_over,
            "windows": self.config.persistence_windows,
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
            evidence=evidence,
        )

    def _clear_all(self, step: int | None, reason: str) -> list[Finding]:
        cleared = [_cleared(f, step, reason) for f in self.active.values()]
        if self.job_slowdown is not None:
            cleared.append(_cleared(self.job_slowdown, step, reason))
        self.active.clear()
        self._active_signal.clear()
        self.job_slowdown = None
        return cleared


def _sort_windows(history: np.ndarray) -> np.ndarray:
    """Sort each rank's few windows: (N, R, C) ascending along N, NaN replaced by +inf.

    An odd-even transposition network (Knuth, TAOCP vol. 3, 5.3.4) of elementwise min/max over
    all ranks at once: N is small (a handful of windows), and numpy's sort of 16,384 x C rows of
    N values costs ten times more in per-row overhead.
    """
    rows = list(np.where(np.isnan(history), np.inf, history))  # N contiguous (R, C) arrays
    for phase in range(len(rows)):
        for i in range(phase % 2, len(rows) - 1, 2):
            low, high = rows[i], rows[i + 1]
            rows[i], rows[i + 1] = np.minimum(low, high), np.maximum(low, high)
    return np.stack(rows)


def _pick(ordered: np.ndarray, index: np.ndarray) -> np.ndarray:
    """``ordered[index[r, c], r, c]`` for every (r, c); index clipped into range."""
    index = np.clip(index, 0, ordered.shape[0] - 1)
    return np.take_along_axis(ordered, index[None], axis=0)[0]


def _order_statistic_sd(m: int, n: int) -> float:
    """Standard deviation of the m-th largest of n standard normal samples.

    Integrates the order-statistic density ``n!/((m-1)!(n-m)!) F^(n-m) (1-F)^(m-1) phi`` on a
    grid (David & Nagaraja, *Order Statistics*, 3rd ed., eq. 2.1.6): 1 for m = n = 1, about
    0.54 for the median of 5.
    """
    x = np.linspace(-10.0, 10.0, 8001)
    cdf = np.array([0.5 * (1.0 + math.erf(v / math.sqrt(2.0))) for v in x])
    pdf = np.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)
    coefficient = math.factorial(n) / (math.factorial(m - 1) * math.factorial(n - m))
    density = coefficient * cdf ** (n - m) * (1.0 - cdf) ** (m - 1) * pdf
    dx = x[1] - x[0]
    mean = float(np.sum(x * density) * dx)
    return math.sqrt(float(np.sum((x - mean) ** 2 * density) * dx))


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
    what = f"rank {finding.rank}" if finding.rank is not None else "whole job"
    return Finding(
        detector=finding.detector,
        kind=finding.kind,
        severity=finding.severity,
        message=f"{what}: {finding.kind} slowdown cleared ({reason.replace('_', ' ')})",
        rank=finding.rank,
        node=finding.node,
        gpu=finding.gpu,
        local_rank=finding.local_rank,
        step=step,
        evidence={**finding.evidence, "cleared": True, "reason": reason,
                  "raised_step": finding.step},
    )


def _round(value: float) -> float | None:
    """Six significant digits for evidence; None for NaN (JSON has no NaN)."""
    if not math.isfinite(value):
        return None
    return float(f"{value:.6g}")
