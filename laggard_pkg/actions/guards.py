"""The guards that keep `laggard remediate` from emptying a cluster: a per-hour cap on nodes
taken out, and a cap on the share of one job's nodes.

Both count what was done *or would have been done* (a dry run shows where a cap would stop),
and both are checked before an action, never after. The share of a job allows at least one node
(``max(1, floor(P% x nodes))``): a guard that forbade the single node an alert names would turn
remediation off for every job of fewer than 100/P nodes.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable

#: The window of the per-hour cap, in seconds.
HOUR_S = 3600.0


class HourlyCap:
    """At most ``limit`` nodes in any sliding hour.

    Args:
        limit: nodes per hour (0: none at all).
        clock: monotonic seconds (a test's clock).
    """

    def __init__(self, limit: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.limit = limit
        self._clock = clock
        self._taken: deque[float] = deque()

    def used(self) -> int:
        """Nodes taken within the last hour."""
        now = self._clock()
        while self._taken and now - self._taken[0] >= HOUR_S:
            self._taken.popleft()
        return len(self._taken)

    def allows(self) -> bool:
        """True while one more node fits in the hour."""
        return self.used() < self.limit

    def take(self) -> None:
        """Count one node taken now."""
        self._taken.append(self._clock())


def job_share_allows(job_nodes: int, held: int, percent: float) -> bool:
    """May one more of a job's ``job_nodes`` nodes be taken while ``held`` of them are?

    Args:
        job_nodes: the job's nodes (distinct ``node`` of its ``laggard_rank_info``).
        held: how many of them laggard holds (drained, cordoned or excluded) already.
        percent: the most of the job's nodes laggard may hold, in percent.

    Returns:
        ``held + 1 <= max(1, floor(percent / 100 * job_nodes))``.
    """
    allowed = max(1, math.floor(percent / 100.0 * job_nodes + 1e-9))
    return held + 1 <= allowed
