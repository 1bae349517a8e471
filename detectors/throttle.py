"""Throttle detector: a GPU held under its maximum SM clock by a power or thermal limit.

Pure logic on per-GPU clock samples; the NVML collector feeds it one sample per GPU per round.

A sample counts as throttled when the SM clock is below ``clock_ratio_below`` of the maximum SM
clock *and* at least one non-idle clock-event reason is active: ``sw_power_cap``, ``hw_slowdown``,
``sw_thermal``, ``hw_thermal``, ``hw_power_brake`` (NVML ``nvmlClocksEventReason*``; "GPU idle",
application-clock and sync-boost reasons are choices, not limits). After ``min_samples``
consecutive throttled samples one finding is raised; the next one needs the GPU to recover first.
Reasons are reported exactly as NVML gives them, even when they disagree with the clocks (NVML
can flag a power brake while the clock sits at its maximum, see corpus ``smi01``): such samples
are not throttled, since the clock is not held down.
"""

from __future__ import annotations

from dataclasses import dataclass

from laggard.detectors.finding import Finding, Severity

#: Clock-event reasons that are limits imposed on the GPU (NVML names, laggard labels).
LIMITING_REASONS = frozenset({"sw_power_cap", "hw_slowdown", "sw_thermal", "hw_thermal",
                              "hw_power_brake"})


@dataclass(frozen=True, slots=True)
class ClockSample:
    """One GPU's clocks at one sampling round.

    Attributes:
        gpu: NVML index.
        sm_clock_hertz: current SM clock, Hz.
        sm_clock_max_hertz: maximum SM clock, Hz.
        reasons: active clock-event reasons (laggard label values, e.g. ``"sw_power_cap"``).
    """

    gpu: int
    sm_clock_hertz: float
    sm_clock_max_hertz: float
    reasons: frozenset[str]


class ThrottleDetector:
    """Raises a finding when a GPU stays throttled for ``min_samples`` consecutive samples."""

    @dataclass(kw_only=True, slots=True)
    class Config:
        """Throttle detector settings."""

        min_samples: int = 3
        """Consecutive throttled samples before a finding (at 1 s sampling: 3 s)."""

        clock_ratio_below: float = 0.95
        """A sample is throttled only when SM clock / max SM clock is below this."""

        def __post_init__(self) -> None:
            if self.min_samples < 1:
                raise ValueError("min_samples must be at least 1")
            if not 0 < self.clock_ratio_below <= 1:
                raise ValueError("clock_ratio_below must be in (0, 1]")

    #: The ``detector`` of its findings.
    name = "throttle"

    def __init__(self, config: Config | None = None, *, node: str | None = None) -> None:
        self.config = config or ThrottleDetector.Config()
        self.node = node
        self._streak: dict[int, int] = {}

    def update(self, sample: ClockSample) -> list[Finding]:
        """Take one sample; return a finding when this sample completes a throttle episode.

        Args:
            sample: the GPU's clocks and active reasons.

        Returns:
            Zero or one :class:`Finding` (detector ``"throttle"``, kind ``"throttle"``).
        """
        limiting = sample.reasons & LIMITING_REASONS
        ratio = (sample.sm_clock_hertz / sample.sm_clock_max_hertz
                 if sample.sm_clock_max_hertz > 0 else 1.0)
        if not limiting or ratio >= self.config.clock_ratio_below:
            self._streak.pop(sample.gpu, None)
            return []
        streak = self._streak.get(sample.gpu, 0) + 1
        self._streak[sample.gpu] = streak
        if streak != self.config.min_samples:
            return []
        reasons = sorted(sample.reasons)
        return [Finding(
            detector=self.name, kind="throttle", severity=Severity.WARNING, node=self.node,
            gpu=sample.gpu,
            message=(f"GPU {sample.gpu} held at {ratio:.0%} of its maximum SM clock by "
                     f"{', '.join(sorted(limiting))} for {streak} samples"),
            evidence={"clock_ratio": round(ratio, 4), "sm_clock_hertz": sample.sm_clock_hertz,
                      "sm_clock_max_hertz": sample.sm_clock_max_hertz, "reasons": reasons,
                      "samples": streak},
        )]

    def forget(self, gpu: int) -> None:
        """Drop the streak of a GPU that stopped reporting (lost)."""
        self._streak.pop(gpu, None)
