"""A plain cumulative histogram the exporter turns into a Prometheus histogram family."""

from __future__ import annotations

import bisect
from collections.abc import Sequence

#: Upper bounds in seconds for step phases and collectives: 1 ms (a tiny step on CPU) to 60 s
#: (a stalled collective long before NCCL's 10-minute watchdog).
DURATION_BUCKETS_SECONDS: tuple[float, ...] = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)


class Histogram:
    """Counts of observations per bucket, their sum and count (not thread-safe; callers lock).

    Args:
        bounds: sorted upper bounds (the ``le`` labels), without ``+Inf``.
    """

    __slots__ = ("bounds", "counts", "sum", "count")

    def __init__(self, bounds: Sequence[float] = DURATION_BUCKETS_SECONDS) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        """Add one observation (same unit as ``bounds``)."""
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1

    def cumulative_buckets(self) -> list[tuple[str, int]]:
        """``[(le, cumulative count), ...]`` ending with ``("+Inf", count)``."""
        out = []
        running = 0
        for bound, n in zip(self.bounds, self.counts, strict=False):
            running += n
            out.append((repr(bound), running))
        out.append(("+Inf", self.count))
        return out
