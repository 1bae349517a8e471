"""Sequential evidence for the straggler detector: Page's CUSUM with clipped increments.

Each rank's per-window excess over the median rank is accumulated by a one-sided cumulative sum
(Page, "Continuous inspection schemes", Biometrika 41, 1954)::

    S_t = max(0, S_{t-1} + clip(x_t - k, -c, c))        raise when S_t >= h

so a small steady excess adds up window after window while noise around zero drains away. ``k``
(the reference value) is the excess that counts as "not slow": half the shift the test is tuned
for (Page's choice, optimal for that shift) and never below the detector's relative floor.
``h`` (the decision interval) is set from the measured noise so that a rank with no excess
raises a false alarm once per ``false_alarm_windows`` windows on average, by Siegmund's
approximation of the CUSUM's in-control average run length for normal increments (Siegmund,
*Sequential Analysis*, Springer 1985, eq. 2.56; also Montgomery, *Introduction to Statistical
Quality Control*, 6th ed., §9.1.7)::

    ARL0(h) = (exp(2 k b) - 2 k b - 1) / (2 k^2),   b = h + 1.166   (k, h in units of sigma)

Each increment is clipped to ``c = h / (min_windows - 0.5)`` on both sides, Huber's bounded
influence ("Robust estimation of a location parameter", Ann. Math. Stat. 35, 1964) applied to
the CUSUM score: one window, however extreme (a data stall, a pause that a window median did not
absorb), can neither raise a finding nor wipe out the evidence gathered so far; ``min_windows``
windows are always needed. Clipping only shortens upward steps, so the false-alarm rate stays at or
below the approximation's.

Clearing is a chart of its own (hysteresis; issue 26): a second CUSUM accumulates evidence that
the rank's excess has fallen below ``k_r = k / 2`` (``clip(k_r - x_t, -c_r, c_r)``, Page's
reference for a fall from ``k`` to 0) and clears the finding when it reaches ``h_r``, set by the
same approximation for the same in-control run length: a rank whose excess stays at ``k`` or
above recovers falsely as rarely as a clean rank raises a false alarm. ``h_r`` is at least
``recovery_windows x k_r`` and ``c_r = h_r / (recovery_windows - 0.5)``, so that many windows are
always needed. (Issue 14's mirror test used ``k`` and ``h`` themselves: a rank measured at its
reference, or with a few windows near 0% on a loaded machine, was cleared while still slow.)

The noise sigma is the spread of the excess across ranks in one window (median absolute
deviation, scaled to a normal sigma with the small-sample factors of Croux & Rousseeuw,
"Time-efficient algorithms for two highly robust estimators of scale", 1992:
:func:`laggard.detectors.stats.robust_sigma`), pooled over recent windows by a median so that
a job of four ranks still gets a stable estimate.

Pure numpy; vectorised over ranks and signals.
"""

from __future__ import annotations

import math

import numpy as np

#: Siegmund's correction of the decision interval for the overshoot of a normal random walk
#: (2 x 0.583, the expected overshoot; Siegmund 1985).
_OVERSHOOT = 1.166


def in_control_run_length(h: float, k: float) -> float:
    """Siegmund's approximation of a one-sided CUSUM's mean windows to a false alarm.

    Args:
        h: decision interval, in units of the noise sigma (>= 0).
        k: reference value, in units of the noise sigma (> 0).

    Returns:
        Mean windows between false alarms for normal increments with mean 0.
    """
    b = h + _OVERSHOOT
    a = 2.0 * k * b
    if a > 700:  # exp overflows; the run length is astronomically long
        return math.inf
    return (math.exp(a) - a - 1.0) / (2.0 * k * k)


def decision_interval(k: float, false_alarm_windows: float) -> float:
    """The smallest ``h`` (sigma units) whose in-control run length reaches the target.

    Args:
        k: reference value in sigma units (> 0).
        false_alarm_windows: wanted mean windows between false alarms (> 1).

    Returns:
        h >= 0, to 1e-3 sigma (bisection on the monotone :func:`in_control_run_length`).
    """
    low, high = 0.0, 1.0
    while in_control_run_length(high, k) < false_alarm_windows:
        high *= 2.0
    if in_control_run_length(low, k) >= false_alarm_windows:
        return 0.0
    while high - low > 1e-3:
        mid = (low + high) / 2
        if in_control_run_length(mid, k) < false_alarm_windows:
            low = mid
        else:
            high = mid
    return high


def cusum_step(sums: np.ndarray, increments: np.ndarray, clip: np.ndarray) -> np.ndarray:
    """One window of clipped one-sided CUSUMs: ``max(0, S + clip(inc, -c, c))``.

    Args:
        sums: (R, S) float64 running sums (>= 0).
        increments: (R, S) float64 ``x - k`` (or ``k - x``); NaN = no observation, the sum is
            kept as it is (a missing window neither adds nor removes evidence).
        clip: (S,) float64 bound of one window's contribution.

    Returns:
        (R, S) float64 new sums.
    """
    bounded = np.clip(increments, -clip, clip)
    updated = np.maximum(0.0, sums + bounded)
    return np.where(np.isnan(increments), sums, updated)
