"""detectors/sequential.py: the clipped one-sided CUSUM and Siegmund's decision interval, on
plain arrays (the straggler detector's use of them is in test_straggler.py)."""
import math

import numpy as np
import pytest

from laggard.detectors.sequential import cusum_step, decision_interval, in_control_run_length
from laggard.detectors.straggler import RankWindow, StragglerDetector


def run_chart(increments: np.ndarray, clip: float) -> np.ndarray:
    """The sums after each window of one chart: increments (W,) -> sums (W,)."""
    sums, out = np.zeros((1, 1)), []
    for inc in increments:
        sums = cusum_step(sums, np.array([[inc]]), np.array([clip]))
        out.append(float(sums[0, 0]))
    return np.array(out)


# -- clipping -------------------------------------------------------------------------------

def test_clipping_bounds_one_windows_influence_both_ways():
    clip = np.array([0.5, 2.0])
    sums = np.array([[1.0, 1.0]])
    up = cusum_step(sums, np.array([[100.0, 100.0]]), clip)
    np.testing.assert_array_equal(up, [[1.5, 3.0]])  # one extreme window adds at most c
    down = cusum_step(up, np.array([[-100.0, -100.0]]), clip)
    np.testing.assert_array_equal(down, [[1.0, 1.0]])  # and removes at most c
    # never below 0; a window inside the clip adds exactly its increment
    np.testing.assert_array_equal(cusum_step(np.zeros((1, 2)), np.array([[-0.1, 0.3]]), clip),
                                  [[0.0, 0.3]])


def test_a_missing_window_neither_adds_nor_removes_evidence():
    sums = np.array([[0.7, 0.2], [0.0, 1.5]])
    increments = np.array([[np.nan, 1.0], [np.nan, np.nan]])
    out = cusum_step(sums, increments, np.array([10.0, 10.0]))
    np.testing.assert_array_equal(out, [[0.7, 1.2], [0.0, 1.5]])


@pytest.mark.parametrize("min_windows", [1, 2, 3, 5])
def test_min_windows_windows_at_the_clip_are_needed_to_reach_h(min_windows):
    # the detector's clip: c = h / (min_windows - 0.5)
    h = 4.0
    clip = h / (min_windows - 0.5)
    sums = run_chart(np.full(min_windows + 2, 1e9), clip)  # every window as extreme as can be
    windows_to_h = int(np.argmax(sums >= h)) + 1
    assert windows_to_h == min_windows
    if min_windows > 1:
        assert sums[min_windows - 2] < h


def test_one_extreme_window_does_not_wipe_out_the_evidence_gathered():
    h, min_windows = 3.0, 3
    clip = h / (min_windows - 0.5)
    sums = run_chart(np.array([1.0, 1.0, -1e9]), clip)
    assert sums[1] == pytest.approx(2.0)
    assert sums[2] == pytest.approx(2.0 - clip)  # 0.8 left: one window removes at most c


# -- Siegmund's approximation -----------------------------------------------------------------

def test_siegmund_matches_a_table_value():
    # the one-sided CUSUM's in-control ARL for k = 1/2 is 336 at h = 4 and 930 at h = 5 by the
    # integral equation (Montgomery's table for the two-sided scheme gives half: 168 and 465);
    # Siegmund's approximation is within 1% of both
    assert in_control_run_length(4.0, 0.5) == pytest.approx(336, rel=0.01)
    assert in_control_run_length(5.0, 0.5) == pytest.approx(930, rel=0.01)
    assert in_control_run_length(1e4, 0.5) == math.inf  # overflow guarded


@pytest.mark.parametrize(("k", "h"), [(0.5, 3.0), (0.25, 4.0)])
def test_siegmund_arl0_against_a_simulation_of_normal_increments(k, h):
    """Mean windows to a false alarm of a CUSUM of N(0, 1) increments (no clip), simulated:
    2,000 seeded chains, each to its alarm (bounded at 40 x the approximation; the chance a
    chain runs that long is below e^-30)."""
    rng = np.random.default_rng(20261202)
    chains = 2_000
    expected = in_control_run_length(h, k)
    limit = int(40 * expected)
    sums = np.zeros(chains)
    alarm_at = np.full(chains, -1)
    for t in range(1, limit + 1):
        live = alarm_at < 0
        if not live.any():
            break
        sums[live] = np.maximum(0.0, sums[live] + rng.standard_normal(live.sum()) - k)
        alarm_at[live & (sums >= h)] = t
    assert (alarm_at > 0).all()
    simulated = alarm_at.mean()
    # standard error of the mean about expected / sqrt(2000) = 2.2%; the approximation's own
    # error at these k and h is a few percent
    assert simulated == pytest.approx(expected, rel=0.10)


@pytest.mark.parametrize("k", [0.1, 0.5, 1.0, 2.0])
@pytest.mark.parametrize("target", [10.0, 1e3, 1e6, 4.9e10])
def test_the_decision_interval_is_the_smallest_h_reaching_the_run_length(k, target):
    h = decision_interval(k, target)
    assert in_control_run_length(h, k) >= target
    if h > 1e-3:
        assert in_control_run_length(h - 1e-3, k) < target


def test_the_decision_interval_grows_with_the_run_length_asked_for():
    hs = [decision_interval(0.5, t) for t in (1e2, 1e4, 1e6, 1e8)]
    assert hs == sorted(hs) and hs[0] < hs[-1]


def test_the_decision_interval_grows_with_noise():
    """For a fixed reference in excess units (k = 2.5% of the median rank's work), a noisier
    job (sigma in the same units) needs more evidence: h x sigma grows with sigma."""
    k = 0.025
    intervals = [decision_interval(k / sigma, 1e6) * sigma for sigma in (0.005, 0.01, 0.02, 0.04)]
    assert all(b > a for a, b in zip(intervals, intervals[1:], strict=False))


def test_the_detectors_interval_grows_with_the_jobs_noise():
    """The straggler detector derives h every window from the measured cross-rank noise."""
    def interval(jitter: float) -> float:
        detector = StragglerDetector()
        rng = np.random.default_rng(7)
        for index in range(12):
            compute = 0.1 * rng.lognormal(0, jitter, (16, 1))
            data = np.full((16, 1), 0.005)
            work = compute + data
            detector.update(RankWindow(
                step=index, ranks=np.arange(16), compute_seconds=compute, data_seconds=data,
                collective_wait_seconds=work.max() - work, transfer_seconds=None,
                world_size=16))
        stats = detector.statistics(0)
        assert stats is not None
        return stats["raise_interval"][0]

    quiet, noisy = interval(0.01), interval(0.08)
    assert noisy > 2 * quiet


# -- the recovery chart --------------------------------------------------------------------------

def test_the_recovery_chart_clears_only_after_recovery_windows_of_a_recovered_rank():
    """The detector's recovery chart: increments k_r - x with k_r = k / 2, interval h_r at least
    recovery_windows x k_r, clip h_r / (recovery_windows - 0.5)."""
    k, recovery_windows = 0.05, 5
    k_r = k / 2
    h_r = recovery_windows * k_r  # the floor (a quiet job)
    clip = h_r / (recovery_windows - 0.5)
    # fully recovered (excess 0): k_r per window, recovery_windows windows to h_r
    recovered = run_chart(k_r - np.zeros(recovery_windows), clip)
    assert recovered[-1] >= h_r - 1e-12 and recovered[-2] < h_r
    # one window far faster than the median adds no more than a clip
    assert run_chart(np.array([k_r + 10.0]), clip)[0] == pytest.approx(clip)
    # still 2k slow, with an isolated window at 0 every fourth: it never clears
    excess = np.tile([2 * k, 2 * k, 2 * k, 0.0], 25)
    assert run_chart(k_r - excess, clip).max() < h_r
    # at the reference k itself the increments have mean -k / 2: it does not clear either
    assert run_chart(np.full(100, k_r - k), clip).max() == 0.0
