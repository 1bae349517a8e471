"""Throttle detector on plain clock samples."""

from __future__ import annotations

import pytest

from laggard.detectors.throttle import ClockSample, ThrottleDetector

MAX = 1980e6


def sample(gpu: int, mhz: float, *reasons: str) -> ClockSample:
    return ClockSample(gpu, mhz * 1e6, MAX, frozenset(reasons))


def test_finding_after_min_samples_with_ratio_and_reasons() -> None:
    detector = ThrottleDetector(ThrottleDetector.Config(min_samples=3), node="node01")
    assert detector.update(sample(0, 1410, "sw_power_cap")) == []
    assert detector.update(sample(0, 1410, "sw_power_cap")) == []
    (finding,) = detector.update(sample(0, 1410, "sw_power_cap", "sync_boost"))
    assert (finding.detector, finding.kind, finding.gpu, finding.node) == (
        "throttle", "throttle", 0, "node01")
    assert finding.evidence["clock_ratio"] == pytest.approx(1410 / 1980, abs=1e-4)
    assert finding.evidence["reasons"] == ["sw_power_cap", "sync_boost"]  # as NVML gave them
    assert "sw_power_cap" in finding.message
    assert detector.update(sample(0, 1410, "sw_power_cap")) == []  # one finding per episode


def test_recovery_resets_the_streak_and_gpus_are_independent() -> None:
    detector = ThrottleDetector(ThrottleDetector.Config(min_samples=2))
    detector.update(sample(0, 1200, "hw_thermal"))
    detector.update(sample(0, 1980))  # recovered
    assert detector.update(sample(0, 1200, "hw_thermal")) == []
    assert detector.update(sample(1, 1200, "sw_thermal")) == []
    assert [f.gpu for f in detector.update(sample(0, 1200, "hw_thermal"))] == [0]
    assert [f.gpu for f in detector.update(sample(1, 1200, "sw_thermal"))] == [1]


@pytest.mark.parametrize("mhz,reasons", [
    (345, ("gpu_idle",)),  # idle is not a limit
    (1500, ("applications_clocks_setting",)),
    (1980, ("hw_power_brake", "sw_power_cap", "sw_thermal")),  # flags contradict the clock
])
def test_not_throttled(mhz: float, reasons: tuple[str, ...]) -> None:
    detector = ThrottleDetector(ThrottleDetector.Config(min_samples=1))
    assert detector.update(sample(0, mhz, *reasons)) == []


def test_config_validation() -> None:
    with pytest.raises(ValueError):
        ThrottleDetector.Config(min_samples=0)
    with pytest.raises(ValueError):
        ThrottleDetector.Config(clock_ratio_below=1.5)
