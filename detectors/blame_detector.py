"""Names whoever costs a synchronous job time, whatever the shape: steady, stalls, bursts.

Input per window: each rank's blame sums (:mod:`laggard.detectors.blame`). Per peer group and
chart, each rank's *deficit* against the median of the *other* ranks (seconds) is the job's
time lost to it in that window; a victim's is negative. Three charts:

* **work**: its own spike steps' work beyond the others' (``work_spike_seconds``: the phase
  clock saw the stall), counted only as far as the others' wait confirms it (at least half);
* **spike waits**: the others' spike waits beyond its own (``wait_spike_seconds``: they waited
  for a stall it did not wait for);
* **whole waits**: the others' whole wait beyond its own (``wait_sum_seconds``: also a loss no
  single step shows).

Rank 0's analysis thread's CPU in the window (``monitor_cpu_seconds``) is taken off rank 0's
wait deficits: laggard's cost, not the rank's. A chart's noise, per group, is the median over
its ranks of each rank's window-to-window change of deficit (over time, not across ranks: the
victims of two slow ranks of four carry their deficit with the opposite sign, and most ranks of
a clean window have no spike at all).

The test is sequential over a window-limited span (a window-limited generalised likelihood
ratio, Lai, "Information bounds and quick detection of parameter changes in stochastic
systems", IEEE Trans. Inf. Theory 44, 1998): after each window, for every span of the last
L = 2..``span_windows`` windows it asks whether the rank's summed deficit on a chart is

* at least ``min_share`` of the job's time over the span (what is worth naming),
* beyond the noise: ``z`` sigmas of a span of L windows (``z`` from the chart's false-alarm
  budget, Bonferroni over ranks and spans; the wait charts' budget is stricter: a loaded host
  pauses every rank now and then, and the others wait for it),
* made of ``min_events`` separate episodes of windows beyond ``event_sigmas`` sigmas (and half
  of ``min_share``), or one of more windows than that: one pause, however long, is not a
  pattern (a one-off checkpoint of rank 0, a single full collection).

A sum over a span, not a per-window statistic clipped to a fraction of the interval, is what
names a rank stalling 1 step in 40: its windows alternate between large and zero deficits and
the sum carries the stalls through the quiet windows. A finding clears when the rank's share
over the last ``span_windows`` windows falls under ``clear_share``, not before
``span_windows`` windows: a stall that recurs within the span keeps its finding, so periodic
stalls do not flap.

The shape, said in the message: its own spike steps (else the median victim's) in most windows
of the span, carrying a quarter of the loss or more, are ``stalls`` (~X ms on about 1 step in
N, X the others' wait where longer than the stall's own time); a loss more on every step (its
window-median work over the others', times the steps) than in slow steps is ``steady`` when in
most windows, ``bursts`` when in a few; slow steps several to a window in a few windows are
``bursts`` too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

import numpy as np

from laggard.detectors.blame import leave_one_out_median
from laggard.detectors.finding import Finding, Severity
from laggard.detectors.stats import evidence_round, row_nanmedian
from laggard.detectors.straggler import lost_text, time_lost
from laggard.detectors.window import WindowRecord

__all__ = ["DETECTOR", "KIND", "BlameDetector", "RankBlame"]

DETECTOR = "straggler"
#: ``kind`` of a rank finding: the rank the others waited for.
KIND = "waited_for"
#: Fewest ranks of a peer group compared (a majority to compare with, as the median detector).
MIN_RANKS = 3
#: The charts, by the column whose leave-one-out deficit each tests: the waits of spike steps
#: beyond each rank's window median, and the whole wait sum (:mod:`laggard.detectors.blame`),
#: the rank's own work spikes, and its window-median work times its steps (``median_work``, from
#: the record's ``compute_seconds`` + ``data_seconds`` and ``steps_count``: a burst of half a
#: window or more moves the median, not a spike). The spikes' deficit carries only the stalls
#: (noise near 0); the whole wait sum's carries every step's random arrival order too (on the
#: demo's 4 ranks, clean, +-10% of a window's time per window), so it names only a large loss;
#: on a CPU-time phase clock the two work charts barely move without a fault.
SIGNALS = ("wait_spike_seconds", "wait_sum_seconds", "work_spike_seconds", "median_work")
#: Per signal: +1 where the blamed rank's value is *lower* than the others' (it waited less),
#: -1 where it is higher (its own work: the phase clock saw it, :mod:`blame`).
_DEFICIT = np.array([1.0, 1.0, -1.0, -1.0])
#: The charts of the rank's own work (the others' wait must confirm them).
_WORK_CHARTS = (2, 3)
#: Which chart a finding reports when several name the rank (module docstring).
_PREFERENCE = (2, 3, 0, 1)
#: The work chart counts only as far as the others' waits confirm it: the rank's wait
#: deficit over the span (either wait chart) must be at least this share of its work excess.
_CORROBORATION = 0.5


def _median_work(record: WindowRecord, rows: np.ndarray,
                 steps: np.ndarray | None = None) -> np.ndarray:
    """Each row's window-median compute + data, seconds per step (times ``steps`` when given:
    seconds per window); NaN where unknown."""
    compute, data = record.get("compute_seconds"), record.get("data_seconds")
    if compute is None:
        return np.full(rows.size, np.nan)
    work = np.asarray(compute, dtype=np.float64)[rows]
    if data is not None:
        work = work + np.nan_to_num(np.asarray(data, dtype=np.float64)[rows])
    if steps is not None:
        work = work * np.asarray(steps, dtype=np.float64)[rows]
    return work


@dataclass(frozen=True, slots=True)
class RankBlame:
    """A rank's blame over its best span (what a finding reports).

    Attributes:
        share: fraction of the job's time lost to the rank over the span.
        lost_seconds: seconds of the job lost to it over the span.
        windows: L, the span's windows.
        events: windows of the span in which its deficit was beyond the noise.
        job_seconds: the job's time over the span (the median rank's step sums), seconds.
        steps: steps in the span (the median rank's).
        spikes: the median other rank's spike count over the span (steps it waited for a stall).
        spike_seconds: the rank's deficit in the others' spike waits over the span (the
            stalls' seconds).
        spike_windows: windows of the span holding at least one of those spike steps.
        steady_seconds: its window-median work's excess over the others' times the steps,
            summed over the span (>= 0): the part of its loss that is on every step.
    """

    share: float
    lost_seconds: float
    windows: int
    events: int
    job_seconds: float
    steps: float
    spikes: float
    spike_seconds: float = math.nan
    spike_windows: int = 0
    steady_seconds: float = 0.0

    @property
    def shape(self) -> str:
        """``stalls``, ``bursts`` or ``steady`` (module docstring)."""
        regular = self.spike_windows >= 0.6 * self.windows and self.spikes >= 1
        if regular and self.spike_seconds >= 0.25 * self.lost_seconds:
            return "stalls"  # slow steps in most windows carrying a good part of the loss
        if not self.spike_seconds > self.steady_seconds:
            # more of the loss on every step than in its slow steps: steady, or whole windows
            return "steady" if self.events >= 0.6 * self.windows else "bursts"
        # slow steps in a minority of windows, several together: bursts; else stalls
        if self.spike_windows < 0.6 * self.windows and \
                self.spikes >= 3 * max(self.spike_windows, 1):
            return "bursts"
        return "stalls"

    def describe(self) -> str:
        """``"stalls ~400 ms on about 1 step in 25"``, ``"slow in bursts: 3 of the last 10
        windows"`` or ``"slower on every step by ~10%"``."""
        shape = self.shape
        if shape == "stalls":
            every = self.steps / self.spikes
            stall = self.spike_seconds if self.spike_seconds > 0 else self.lost_seconds
            return (f"stalls ~{1e3 * stall / self.spikes:.0f} ms on about 1 step in "
                    f"{every:.0f}")
        if shape == "bursts":
            return f"slow in bursts: {self.events} of the last {self.windows} windows"
        per_step = self.job_seconds / self.steps if self.steps else math.nan
        rest = per_step - self.lost_seconds / self.steps if self.steps else math.nan
        pct = 100 * (self.lost_seconds / self.steps) / rest if rest and rest > 0 else math.nan
        return f"slower on every step by ~{pct:.0f}%"


class BlameDetector:
    """Names every rank that costs its peer group at least ``min_share`` of the job's time.

    Feed it one gathered :class:`~laggard.detectors.window.WindowRecord` per window with the
    blame columns (:data:`laggard.detectors.blame.BLAME_COLUMNS`) and each row's peer-group
    label; a record without them is skipped (counted).

    Args:
        config: thresholds; None for the defaults.

    Attributes:
        active: global rank -> its raised finding.
        stats: ``windows``, ``skipped_windows`` (no blame columns or too few ranks).
    """

    @dataclass(kw_only=True, slots=True)
    class Config:
        """Thresholds of the blame detector."""

        min_share: float = 0.04
        """Least fraction of the job's time lost to one rank over a span that names it: a rank
        costing the job 5% is named, the few percent that ranks of one model differ by
        (Sinha et al., "Not All GPUs Are Created Equal", 2022) are not."""

        clear_share: float = 0.02
        """A finding clears when its rank's share over the last ``span_windows`` windows is
        under this."""

        span_windows: int = 10
        """Longest span tested (and the clearing span): a stall recurring at most every
        ``span_windows / min_events`` windows is carried by the sum."""

        min_events: int = 2
        """Fewest separate episodes (runs of consecutive windows in which the rank's deficit
        is beyond ``event_sigmas``) in a span, or one run of more windows than this: one
        pause, however long, spanning a window boundary or not, is not a pattern (on a clean
        4-rank demo at load 18 one rank held the job ~1 s across two windows, once)."""

        event_sigmas: float = 2.0
        """How far beyond the pooled noise a window's deficit counts as an event."""

        false_alarm_windows: float = 1e5
        """Mean windows between false alarms of the whole job on the work chart: ``z`` is the
        normal quantile of ``1 / (false_alarm_windows x ranks x span_windows)`` (Bonferroni
        over ranks and spans; the span sums are dependent, so this is conservative)."""

        wait_false_alarm_windows: float = 1e8
        """The same for the two wait charts, whose noise is heavy-tailed: on a loaded host
        every rank is descheduled now and then and the others wait for it (a clean 4-rank job
        at load 10 showed a rank 10% up in two separate windows of ten, 5.75 sigmas of the
        pooled noise). They name a rank whose own phase clock shows nothing (a sleep on a
        CPU-time clock, code outside the timed phases) only at this stricter budget."""

        warmup_windows: int = 5
        """Windows of a peer group's noise measured before any of its ranks is named: two or
        three windows of a job starting up (compiling, warming caches) tell nothing of its
        noise."""

        noise_floor_share: float = 0.005
        """Least noise assumed, as a share of the window's time (a perfectly quiet job would
        otherwise name a rank for microseconds)."""

        def __post_init__(self) -> None:
            if not 0 < self.clear_share < self.min_share < 1:
                raise ValueError("need 0 < clear_share < min_share < 1")
            if self.span_windows < 2 or self.min_events < 1 or \
                    self.min_events > self.span_windows:
                raise ValueError("need span_windows >= 2 and 1 <= min_events <= span_windows")
            if self.event_sigmas <= 0 or self.false_alarm_windows <= 1:
                raise ValueError("event_sigmas must be > 0 and false_alarm_windows > 1")

    def __init__(self, config: Config | None = None) -> None:
        self.config = config if config is not None else BlameDetector.Config()
        self.active: dict[int, Finding] = {}
        self.stats = {"windows": 0, "skipped_windows": 0}
        span = self.config.span_windows
        self._size = 0
        # (signal, span, W) rings by global rank; NaN: absent that window
        self._deficit = np.zeros((len(SIGNALS), span, 0))  # seconds
        self._sigma = np.zeros((len(SIGNALS), span, 0))  # its group's pooled noise
        self._job = np.zeros((span, 0))  # its group's time that window (median step sum)
        self._steps = np.zeros((span, 0))  # its group's steps that window
        self._spikes = np.zeros((span, 0))  # its group's median victim spike count
        self._own = np.zeros((2, span, 0))  # the rank's own work spikes: count, seconds
        self._steady = np.zeros((span, 0))  # its median work's excess x steps, seconds
        self._events = np.zeros((len(SIGNALS), span, 0), dtype=bool)  # windows beyond noise
        self._raw = np.zeros((len(SIGNALS), span, 0))  # deficits as measured (the noise's)
        self._seen: dict[int, int] = {}  # group -> windows compared
        self._slot = -1
        self._windows = 0  # windows tested
        self._raised_at: dict[int, int] = {}  # rank -> window its finding was raised in

    _RINGS = ("_deficit", "_raw", "_sigma", "_job", "_steps", "_spikes", "_own", "_steady")

    def _change_rms(self) -> np.ndarray:
        """(S, W) each rank's root mean square window-to-window change of deficit over the
        span, NaN with fewer than 2 changes. A group's noise on a chart is the median of its
        ranks' over sqrt(2) (the change of two independent windows has twice the variance).
        Over time, not across ranks: across ranks the victims of two slow ranks of four show
        the slow ones' deficit with the opposite sign, and a MAD across ranks is 0 when most
        ranks had no spike; a rank's persistent offset (a steady straggler, a victim) changes
        little from window to window, a loaded host's random pauses a lot."""
        c = self.config
        order = [(self._slot - i) % c.span_windows for i in range(c.span_windows)][::-1]
        changes = np.diff(self._raw[:, order], axis=1)  # (S, span - 1, W), NaN-padded
        known = np.isfinite(changes)
        counts = known.sum(axis=1)
        with np.errstate(invalid="ignore", divide="ignore"):
            rms = np.sqrt((np.where(known, changes, 0.0) ** 2).sum(axis=1) / counts)
        return np.where(counts >= 2, rms, np.nan)

    def _grow(self, size: int) -> None:
        if size <= self._size:
            return
        extra = size - self._size
        for name in self._RINGS:
            old = getattr(self, name)
            pad = np.full(old.shape[:-1] + (extra,), np.nan)
            setattr(self, name, np.concatenate([old, pad], axis=-1))
        self._events = np.concatenate(
            [self._events, np.zeros(self._events.shape[:-1] + (extra,), dtype=bool)], axis=-1)
        self._size = size

    def _z(self, ranks: int) -> np.ndarray:
        """(S, 1, 1) the sigmas each chart's span sum must reach."""
        c = self.config
        tests = max(ranks, 1) * c.span_windows
        budgets = [c.false_alarm_windows if signal in _WORK_CHARTS else
                   c.wait_false_alarm_windows for signal in range(len(SIGNALS))]
        return np.array([NormalDist().inv_cdf(1 - 1 / (b * tests)) for b in budgets])[:, None,
                                                                                       None]

    def update(self, record: WindowRecord, labels: np.ndarray | None = None, *,
               exclude: set[int] | frozenset[int] = frozenset(),
               steady_elsewhere: set[int] | frozenset[int] = frozenset()) -> list[Finding]:
        """Test one window.

        Args:
            record: the gathered window (rows of ``record.ranks``).
            labels: (R,) int peer group of each row; None: one group.
            exclude: global ranks not to raise now (another detector names them); a finding
                of this detector on one of them is left to clear by itself.
            steady_elsewhere: global ranks whose steady slowness another detector sees (the
                median detector's score over its floor): not raised here when their shape is
                ``steady`` (that detector names the cause), raised when it is stalls or bursts.

        Returns:
            Findings raised or cleared in this window.
        """
        c = self.config
        self.stats["windows"] += 1
        self._windows += 1
        job = record.get("step_sum_seconds")
        ranks = np.asarray(record.ranks, dtype=np.int64)
        if job is None or record.get("wait_sum_seconds") is None or ranks.size == 0 or \
                (ranks < 0).any():
            self.stats["skipped_windows"] += 1
            return []
        labels = np.zeros(ranks.size, dtype=np.int64) if labels is None else \
            np.asarray(labels, dtype=np.int64)
        self._grow(int(ranks.max()) + 1)
        self._slot = slot = (self._slot + 1) % c.span_windows
        for name in self._RINGS:
            getattr(self, name)[..., slot, :] = np.nan
        spikes_col = record.get("wait_spike_count")
        steps_col = record.get("steps_count")
        # a column the record lacks (an older file) is a chart with nothing to say: NaN
        columns = [np.full(ranks.size, np.nan) if record.get(name) is None
                   else np.asarray(record[name], dtype=np.float64) for name in SIGNALS[:3]]
        columns.append(_median_work(record, np.arange(ranks.size), steps_col))
        finite = np.isfinite(job) & np.isfinite(columns[1])
        overhead = record.get("monitor_cpu_seconds")
        overhead = np.zeros(ranks.size) if overhead is None else \
            np.nan_to_num(np.clip(np.asarray(overhead, dtype=np.float64), 0.0, None))
        compared: list[tuple[np.ndarray, float]] = []  # (global ranks, job seconds) by group
        order = np.argsort(labels, kind="stable")  # one sort, then each group a slice
        bounds = np.flatnonzero(np.diff(labels[order])) + 1
        for part in np.split(order, bounds):
            group = int(labels[part[0]]) if part.size else 0
            rows = part[finite[part]]
            if rows.size < MIN_RANKS:
                continue
            at = ranks[rows]
            job_s = float(np.median(job[rows]))
            compared.append((at, job_s))
            self._job[slot, at] = job_s
            self._steps[slot, at] = float(np.median(steps_col[rows])) \
                if steps_col is not None else math.nan
            work = columns[3][rows]
            if np.isfinite(work).all():
                self._steady[slot, at] = work - leave_one_out_median(work)
            for i, name in enumerate(("work_spike_count", "work_spike_seconds")):
                own = record.get(name)
                self._own[i, slot, at] = np.nan if own is None else own[rows]
            self._spikes[slot, at] = float(np.median(spikes_col[rows])) \
                if spikes_col is not None else 0.0
            own = overhead[rows]
            seen = self._seen[group] = self._seen.get(group, 0) + 1
            for signal, col in enumerate(columns):
                if not np.isfinite(col[rows]).all():
                    continue
                deficit = _DEFICIT[signal] * (leave_one_out_median(col[rows]) - col[rows])
                if signal not in _WORK_CHARTS:  # rank 0's analysis thread held it back
                    deficit = np.where(deficit > 0, np.maximum(deficit - own, 0.0), deficit)
                self._raw[signal, slot, at] = deficit
                if seen < c.warmup_windows:
                    deficit = np.minimum(deficit, 0.0)  # nothing to blame while warming up
                self._deficit[signal, slot, at] = deficit
        if compared:
            rms = self._change_rms()  # (S, W), every rank at once
            for at, job_s in compared:
                sigma = row_nanmedian(rms[:, at]) / math.sqrt(2)
                self._sigma[:, slot, at] = np.maximum(np.nan_to_num(sigma),
                                                      c.noise_floor_share * job_s)[:, None]
        # this window's events (fixed once its deficit, noise and time are): beyond the
        # noise, and at least half the least share worth naming
        d = self._deficit[:, slot]
        floor = np.maximum(c.event_sigmas * np.nan_to_num(self._sigma[:, slot]),
                           0.5 * c.min_share * np.nan_to_num(self._job[slot]))
        with np.errstate(invalid="ignore"):
            self._events[:, slot] = np.isfinite(d[1]) & (d > floor)
        if not compared:
            self.stats["skipped_windows"] += 1
        return self._test(record, ranks, exclude, steady_elsewhere)

    def _test(self, record: WindowRecord, ranks: np.ndarray, exclude: set[int] | frozenset[int],
              steady_elsewhere: set[int] | frozenset[int]) -> list[Finding]:
        c = self.config
        order = [(self._slot - i) % c.span_windows for i in range(c.span_windows)]
        # Only a rank with min_events events in the span on some chart, or a finding held,
        # can change state: the rest is computed for those columns alone (at 65,536 ranks a
        # few per cent of them), rank 0's analysis stays within its budget.
        here = np.zeros(self._size, dtype=bool)
        here[ranks] = True
        held = np.zeros_like(here)
        held[[r for r in self.active if r < held.size]] = True
        counts = self._events.sum(axis=1, dtype=np.int16).max(axis=0)  # (W,)
        cols = np.flatnonzero(here & ((counts >= min(c.min_events, 2)) | held))
        deficit = self._deficit[..., cols][:, order]  # (S, span, W'), newest first
        present = np.isfinite(deficit[1])  # the wait sum: every record has it
        job_w = np.where(present, self._job[:, cols][order], 0.0)
        sigma = np.where(present, np.nan_to_num(self._sigma[..., cols][:, order]), 0.0)
        d = np.where(present, np.nan_to_num(deficit), 0.0)
        events = self._events[..., cols][:, order]
        lost = np.cumsum(d, axis=-2)  # (S, span, W'): span of L = index L - 1
        job = np.cumsum(job_w, axis=0)
        noise = np.sqrt(np.cumsum(sigma ** 2, axis=-2))
        count = np.cumsum(events, axis=-2)
        # episodes: runs of consecutive event windows (newest first: a run starts where the
        # next older window is not an event); one pause spanning a window boundary is one
        older = np.concatenate([events[..., 1:, :], np.zeros_like(events[..., :1, :])], axis=-2)
        episodes = np.cumsum(events & ~older, axis=-2)
        seen = np.cumsum(present, axis=0)

        def ring(values: np.ndarray) -> np.ndarray:  # a ring's candidate columns, newest first
            return np.where(present, np.nan_to_num(values[..., order, :][..., cols]), 0.0)

        steps = np.cumsum(ring(self._steps), axis=0)
        victim = ring(self._spikes)
        spikes = np.cumsum(victim, axis=0)
        victim_windows = np.cumsum(victim >= 1, axis=0)
        steady = np.maximum(np.cumsum(ring(self._steady), axis=0), 0.0)
        own = ring(self._own)  # (2, span, W') count, seconds; 0 where unknown
        own_windows = np.cumsum(own[0] >= 1, axis=0)  # windows with a stall of its own
        own = np.cumsum(own, axis=-2)
        z = self._z(ranks.size)
        with np.errstate(invalid="ignore", divide="ignore"):
            share = lost / job
        lengths = np.arange(1, c.span_windows + 1)[:, None]
        full = (seen == lengths) & (lengths >= 2)  # spans the rank reported in every window of
        # a pattern: min_events separate episodes, or one loss lasting min_events + 1 windows
        pattern = (episodes >= c.min_events) | (count > c.min_events)
        # a work chart is in CPU time on a CPU-time clock: what the job lost is the others'
        # wait, the wait charts' share, when larger
        worth = share.copy()
        worth[list(_WORK_CHARTS)] = np.fmax(share[list(_WORK_CHARTS)], share[:2].max(axis=0))
        hit = full & pattern & (worth >= c.min_share) & (lost >= z * noise)
        for chart in _WORK_CHARTS:  # the others' wait confirms it, and says the cost
            hit[chart] &= np.maximum(lost[0], lost[1]) >= _CORROBORATION * lost[chart]
        score = np.where(hit, share, -np.inf)  # (S, span, W')
        span_now = seen[-1]  # (W',) windows each rank reported in, of the span
        found: list[Finding] = []
        for j, rank in enumerate(cols.tolist()):
            active = self.active.get(rank)
            if active is not None:
                latest = float(np.nanmax(share[:, -1, j])) if span_now[j] else math.nan
                if not latest >= c.clear_share and \
                        self._windows - self._raised_at[rank] >= c.span_windows:
                    del self.active[rank]
                    found.append(active.clear(
                        step=record.step, reason="recovered",
                        message=f"rank {rank} no longer holds the job up: "
                                f"{100 * max(latest, 0):.1f}% of its time over the last "
                                f"{c.span_windows} windows"))
                continue
            if rank in exclude or not hit[:, :, j].any():
                continue
            # the chart to report: the rank's own work first (its phase clock saw the stall),
            # then the others' spike waits, then their whole waits; its span of most share
            signal = next(s for s in _PREFERENCE if hit[s, :, j].any())
            best = int(np.argmax(score[signal, :, j]))
            # said from its first event in that span on (windows before it dilute the shape)
            best = int(np.flatnonzero(events[signal, :best + 1, j])[-1])
            stalls, stall_seconds = float(spikes[best, j]), float(lost[0, best, j])
            spike_windows = int(victim_windows[best, j])
            if own[0, best, j] >= 1:  # its own spike steps count its stalls best; what
                # they cost is the others' wait, which on a CPU-time clock of a loaded host
                # is longer than the stall's CPU time
                stalls, spike_windows = float(own[0, best, j]), int(own_windows[best, j])
                stall_seconds = max(float(own[1, best, j]), stall_seconds)
            # the cost said: the others' wait where it is the larger (wall time lost), the
            # chart that named it otherwise
            chart = signal if lost[1, best, j] <= lost[signal, best, j] else 1
            blame = RankBlame(share=float(share[chart, best, j]),
                              lost_seconds=float(lost[chart, best, j]),
                              windows=best + 1, events=int(count[signal, best, j]),
                              job_seconds=float(job[best, j]), steps=float(steps[best, j]),
                              spikes=stalls, spike_seconds=stall_seconds,
                              spike_windows=spike_windows,
                              steady_seconds=float(steady[best, j]))
            if rank in steady_elsewhere and blame.shape == "steady":
                continue
            finding = self._finding(record, rank, blame,
                                    float(z[signal, 0, 0] * noise[signal, best, j]),
                                    SIGNALS[signal])
            self.active[rank] = finding
            self._raised_at[rank] = self._windows
            found.append(finding)
        return found

    def _finding(self, record: WindowRecord, rank: int, blame: RankBlame,
                 noise_seconds: float, signal: str) -> Finding:
        row = int(np.flatnonzero(np.asarray(record.ranks) == rank)[0])
        node = record.nodes[row] if record.nodes is not None else None
        local = int(record.local_ranks[row]) if record.local_ranks is not None else None
        per_step = blame.lost_seconds / blame.steps if blame.steps else math.nan
        step_s = blame.job_seconds / blame.steps if blame.steps else math.nan
        cost = time_lost(per_step if math.isfinite(per_step) else 0.0,
                         step_s if math.isfinite(step_s) else math.nan)
        where = f"rank {rank}" + (f" on {node}" if node else "")
        message = (f"{where} costs the job {100 * blame.share:.1f}% of its time over the last "
                   f"{blame.windows} windows: {blame.describe()}; every other rank waited for it "
                   f"at the collective ({lost_text(cost)}): check what runs beside it on its "
                   f"host, its GPU's clock-event reasons and XIDs, and its data loader")
        evidence: dict[str, Any] = {
            "share": evidence_round(blame.share),
            "lost_seconds": evidence_round(blame.lost_seconds),
            "span_windows": blame.windows,
            "event_windows": blame.events,
            "shape": blame.shape,
            "stalls": evidence_round(blame.spikes),
            "steps": evidence_round(blame.steps),
            "noise_seconds": evidence_round(noise_seconds),
            "signal": signal,
            **cost,
        }
        severity = Severity.CRITICAL if blame.share >= 0.25 else Severity.WARNING
        return Finding(detector=DETECTOR, kind=KIND, severity=severity, message=message,
                       rank=rank, node=node, local_rank=local, step=record.step,
                       evidence=evidence)
