"""The between-scrape arithmetic of one GPU's fast samples: time in each clock-event reason and
the trailing minimum of the SM clock (pure: times are passed in)."""

from __future__ import annotations

import pytest

from laggard.collectors.gpu_track import GpuTrack

REASONS = [("gpu_idle", 0x1), ("sw_power_cap", 0x4), ("hw_thermal", 0x40)]


def track(window: float = 15.0, max_gap: float = 3.0) -> GpuTrack:
    return GpuTrack(REASONS, window, max_gap)


def test_each_sample_credits_its_reasons_with_the_time_since_the_previous_one() -> None:
    t = track()
    for i in range(10):  # 0.1 s samples: power cap during samples 3..6 (4 samples)
        t.add(i * 0.1, 1980.0, 0x4 if 3 <= i <= 6 else 0)
    assert t.reason_seconds == {"sw_power_cap": pytest.approx(0.4)}
    t.add(1.0, 1200.0, 0x4 | 0x40)  # two reasons at once: both credited
    assert t.reason_seconds["sw_power_cap"] == pytest.approx(0.5)
    assert t.reason_seconds["hw_thermal"] == pytest.approx(0.1)
    assert sorted(t.active()) == ["hw_thermal", "sw_power_cap"]


def test_a_reason_active_at_the_first_sample_is_seen_with_zero_time() -> None:
    t = track()
    t.add(5.0, 345.0, 0x1)
    assert t.reason_seconds == {"gpu_idle": 0.0} and t.active() == ["gpu_idle"]


def test_a_gap_longer_than_the_limit_is_not_guessed() -> None:
    t = track(max_gap=0.5)
    t.add(0.0, 1980.0, 0x4)
    t.add(10.0, 1980.0, 0x4)  # the thread stalled (or the GPU was lost) for 10 s
    assert t.reason_seconds == {"sw_power_cap": 0.0}
    t.add(10.2, 1980.0, 0x4)
    assert t.reason_seconds["sw_power_cap"] == pytest.approx(0.2)
    t.forget_times()  # a lost GPU: the next sample credits nothing
    t.add(10.3, 1980.0, 0x4)
    assert t.reason_seconds["sw_power_cap"] == pytest.approx(0.2)


def test_an_unanswered_mask_credits_nothing_and_keeps_the_last_one() -> None:
    t = track()
    t.add(0.0, 1980.0, 0x4)
    t.add(0.1, 1980.0, None)
    assert t.reason_seconds == {"sw_power_cap": 0.0} and t.active() == ["sw_power_cap"]


def test_the_minimum_is_the_lowest_clock_of_the_window() -> None:
    t = track(window=15.0)
    assert t.min_sm_mhz(0.0) is None
    for i in range(201):  # 20 s at 0.1 s: one 0.1 s dip to 900 MHz at t = 10.0 s
        t.add(i * 0.1, 900.0 if i == 100 else 1980.0, 0)
    assert t.last_sm_mhz == 1980.0
    assert t.min_sm_mhz(20.0) == 900.0  # 10 s later: still inside the 15 s window
    for i in range(201, 256):
        t.add(i * 0.1, 1980.0, 0)
    assert t.min_sm_mhz(25.5) == 1980.0  # 15.5 s later: gone
    t.add(30.0, None, 0)  # an unanswered clock changes nothing
    assert t.min_sm_mhz(30.0) == 1980.0 and t.last_sm_mhz == 1980.0


def test_the_minimum_holds_the_last_sample_when_every_sample_is_old() -> None:
    t = track(window=1.0)
    t.add(0.0, 1410.0, 0)
    assert t.min_sm_mhz(100.0) == 1410.0


def test_the_window_stays_small_at_a_constant_clock() -> None:
    t = track(window=15.0)
    for i in range(10_000):
        t.add(i * 0.1, 1980.0, 0)
    assert len(t._lows) == 1  # the monotonic queue drops equal and higher clocks


def test_a_window_must_be_positive() -> None:
    with pytest.raises(ValueError, match="window"):
        GpuTrack(REASONS, 0.0, 1.0)
