"""What one GPU did between two full rounds of the nvml collector, from its fast samples: the
time in each clock-event reason and the lowest SM clock of a trailing window.

Pure (no NVML, no clock of its own: times are passed in), so the arithmetic is tested with
plain numbers. The nvml collector samples each GPU's SM clock and clock-event reasons every
``--collector.nvml.interval`` (0.1 s and up) and publishes these once a second, so a 15 s
scrape sees what happened between scrapes, not one sample of it.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable

__all__ = ["GpuTrack"]


class GpuTrack:
    """Per-GPU accumulators of the fast samples.

    Args:
        reasons: ``(label, NVML bit)`` of every clock-event reason the NVML module defines.
        window_seconds: how far back :attr:`min_sm_mhz` looks, in seconds (> 0).
        max_gap_seconds: the most time one sample may credit to its reasons: after a longer
            gap (the GPU was lost, the thread stalled) the time is not guessed.

    Attributes:
        reason_seconds: reason label -> seconds it was active (float64, grows only), holding
            a key from the first sample the reason was active in.
        last_sm_mhz: the SM clock of the last sample (MHz), None before the first.
        last_mask: the clock-event bitmask of the last sample (0 before the first).
    """

    def __init__(self, reasons: Iterable[tuple[str, int]], window_seconds: float,
                 max_gap_seconds: float) -> None:
        if not window_seconds > 0:
            raise ValueError(f"window must be > 0 s, got {window_seconds}")
        self._reasons = tuple(reasons)
        self._window = window_seconds
        self._max_gap = max_gap_seconds
        self._last_time: float | None = None
        # A sliding minimum: (time, MHz) pairs with increasing MHz from the front; the front is
        # the lowest clock within the window (the monotonic-queue algorithm, O(1) amortised).
        self._lows: deque[tuple[float, float]] = deque()
        self.reason_seconds: dict[str, float] = {}
        self.last_sm_mhz: float | None = None
        self.last_mask = 0

    def add(self, now: float, sm_mhz: float | None, mask: int | None) -> None:
        """One sample taken at ``now`` (seconds, monotonic).

        Args:
            now: the sample's time in seconds.
            sm_mhz: the SM clock in MHz, None when NVML did not answer.
            mask: the clock-event reasons' bitmask (nvmlDeviceGetCurrentClocksEventReasons),
                None when NVML did not answer (no reason is credited).
        """
        if mask is not None:
            previous = self._last_time
            if mask and previous is not None and 0 <= now - previous <= self._max_gap:
                # Sample and hold: this sample's reasons held since the previous sample.
                elapsed = now - previous
                for label, bit in self._reasons:
                    if mask & bit:
                        self.reason_seconds[label] = self.reason_seconds.get(label, 0.0) + elapsed
            elif mask:
                for label, bit in self._reasons:
                    if mask & bit:
                        self.reason_seconds.setdefault(label, 0.0)
            self._last_time = now
            self.last_mask = mask
        if sm_mhz is not None and math.isfinite(sm_mhz):
            self.last_sm_mhz = sm_mhz
            lows = self._lows
            while lows and lows[-1][1] >= sm_mhz:
                lows.pop()
            lows.append((now, sm_mhz))
            self._expire(now)

    def _expire(self, now: float) -> None:
        lows = self._lows
        while len(lows) > 1 and lows[0][0] < now - self._window:
            lows.popleft()

    def min_sm_mhz(self, now: float) -> float | None:
        """The lowest SM clock sampled in the ``window_seconds`` before ``now`` (MHz); the last
        sample's when every sample is older; None before the first sample."""
        self._expire(now)
        return self._lows[0][1] if self._lows else None

    def active(self) -> list[str]:
        """Labels of the reasons active at the last sample."""
        return [label for label, bit in self._reasons if self.last_mask & bit]

    def forget_times(self) -> None:
        """Start the reasons' time afresh after a gap (a lost GPU): the next sample credits
        nothing."""
        self._last_time = None
