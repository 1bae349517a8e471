"""A slowness that moves from rank to rank: one finding for the job, not a rank at a time.

A job or daemon migrating between hosts, a hot data shard passed along, a thermal or power
event spreading: each rank it visits is named in turn (by the median detector,
:mod:`laggard.detectors.straggler`, or the blame one, :mod:`laggard.detectors.blame_detector`),
and what the reader needs is that it moves. :class:`MovingSlowness` watches the ranks named:
:data:`MIN_RANKS` or more distinct ranks newly named in as many distinct windows within
``windows`` windows raise one finding (``kind="moving"``, no rank); it clears once no rank was
newly named for ``windows`` windows and none is held. Several ranks slow at once are named in
the same window or two, not in turn: they are not "moving".
"""

from __future__ import annotations

from collections.abc import Mapping

from laggard.detectors.finding import Finding, Severity

__all__ = ["KIND", "MIN_RANKS", "MovingSlowness"]

#: ``kind`` of the finding.
KIND = "moving"
#: Distinct ranks named in turn, in as many windows, that make a slowness "moving".
MIN_RANKS = 3


class MovingSlowness:
    """One finding for ranks named in turn.

    Args:
        windows: how far back a rank newly named still counts (windows).

    Attributes:
        active: the raised finding, or None.
    """

    def __init__(self, windows: int = 20) -> None:
        self.windows = windows
        self.active: Finding | None = None
        self._window = 0
        self._named: set[int] = set()
        self._raises: list[tuple[int, int]] = []  # (window, rank) newly named

    def update(self, step: int, named: Mapping[int, Finding]) -> list[Finding]:
        """One window: ``named`` is global rank -> its active rank finding, any detector's.

        Returns:
            The moving finding raised or cleared in this window (or nothing).
        """
        self._window += 1
        for rank in sorted(set(named) - self._named):
            self._raises.append((self._window, rank))
        self._named = set(named)
        self._raises = [(w, r) for w, r in self._raises if w > self._window - self.windows]
        ranks = sorted({r for _, r in self._raises})
        turns = len({w for w, _ in self._raises})
        if self.active is None and len(ranks) >= MIN_RANKS and turns >= MIN_RANKS:
            self.active = Finding(
                detector="straggler", kind=KIND, severity=Severity.WARNING, step=step,
                message=(f"a slowness moving from rank to rank: ranks "
                         f"{', '.join(map(str, ranks))} each held the job up in turn within "
                         f"{self.windows} windows: look for what moves between them (a job or "
                         f"daemon migrating between hosts, a hot data shard, a thermal or power "
                         f"event spreading) rather than at one rank"),
                evidence={"ranks": ranks, "windows": self.windows})
            return [self.active]
        if self.active is not None and not self._raises and not named:
            cleared, self.active = self.active, None
            return [cleared.clear(step=step, reason="recovered",
                                  message=f"the moving slowness ended: no rank named for "
                                          f"{self.windows} windows")]
        return []
