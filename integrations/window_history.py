"""Rank 0's kept windows: the last few in full, every kept one as a compact summary.

A full window (its width-1 columns, ``WindowRecord.scalars()``) is an R x C float64 table:
~7.8 MB at 65,536 ranks with the 16 step columns and a few participants' (issue 31), so the
256 windows kept before took ~2 GB there. Now full windows are kept while their tables total at
most ``MonitorConfig.history_full_bytes`` (the latest always: 4 windows at 65,536 ranks under
the default 32 MiB, all 256 at 4-1,024 ranks), and every window also leaves a
:class:`WindowSummary` of C x 5 quantiles (~1 KB whatever R) in a deque of
``history_windows``.
"""

from __future__ import annotations

import collections
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from laggard.detectors.finding import Finding
from laggard.detectors.window import WindowRecord

#: The quantiles of each column over the ranks a summary keeps, in this order.
SUMMARY_QUANTILES = (0.0, 0.25, 0.5, 0.75, 1.0)
#: Ranks of the highest straggler scores a summary keeps.
TOP_SCORES = 8


@dataclass(frozen=True, slots=True)
class WindowSummary:
    """One window in a few numbers whatever the world size.

    Attributes:
        step: the window's last step.
        ranks: rows in the window (R).
        names: its width-1 column names, in table order (C).
        quantiles: ``(C, 5)`` float64: each column's min, 25th percentile, median, 75th
            percentile and max over the ranks (:data:`SUMMARY_QUANTILES`), NaN values
            ignored (NaN for a column with no finite value).
        invalid: ``(C,)`` int64: ranks whose value of the column is NaN or infinite.
        top_scores: up to :data:`TOP_SCORES` ``(rank, score)`` of the highest scores, highest
            first.
        raised, cleared: findings raised and cleared in the window.
    """

    step: int
    ranks: int
    names: tuple[str, ...]
    quantiles: np.ndarray
    invalid: np.ndarray
    top_scores: tuple[tuple[int, float], ...]
    raised: int
    cleared: int

    def column(self, name: str) -> dict[str, float]:
        """``{"min", "p25", "median", "p75", "max"}`` of one column, seconds (or its unit).

        Raises:
            KeyError: the window has no such column.
        """
        if name not in self.names:
            raise KeyError(name)
        row = self.quantiles[self.names.index(name)]
        return dict(zip(("min", "p25", "median", "p75", "max"), row.tolist(), strict=True))


def summarise(kept: WindowRecord, scores: Mapping[int, float],
              findings: Sequence[Finding]) -> WindowSummary:
    """The :class:`WindowSummary` of a window's width-1 columns, scores and findings."""
    names = tuple(kept.columns)
    table = kept.table(names)  # (R, C)
    finite = np.isfinite(table)
    with warnings.catch_warnings():  # an all-NaN column is NaN, said by the NaN itself
        warnings.simplefilter("ignore", RuntimeWarning)
        quantiles = (np.nanquantile(np.where(finite, table, np.nan), SUMMARY_QUANTILES,
                                    axis=0).T if table.size else
                     np.full((len(names), len(SUMMARY_QUANTILES)), np.nan))
    top = sorted(((int(r), float(v)) for r, v in scores.items() if v == v),
                 key=lambda rv: -rv[1])[:TOP_SCORES]
    return WindowSummary(
        step=kept.step, ranks=int(kept.ranks.size), names=names,
        quantiles=np.ascontiguousarray(quantiles, dtype=np.float64),
        invalid=(~finite).sum(axis=0).astype(np.int64), top_scores=tuple(top),
        raised=sum(not f.cleared for f in findings), cleared=sum(f.cleared for f in findings))


class WindowHistory:
    """The kept windows (full, bounded in bytes) and their summaries (bounded in count).

    Args:
        max_windows: windows kept at most, full or summarised (``history_windows``).
        full_bytes: bytes the full windows' arrays may take together; the latest window is
            kept in full whatever its size.

    Attributes:
        windows: the latest full windows, oldest first.
        summaries: a :class:`WindowSummary` of each of the last ``max_windows`` windows.
    """

    def __init__(self, max_windows: int, full_bytes: int) -> None:
        self.full_bytes = full_bytes
        self.windows: collections.deque[WindowRecord] = collections.deque(maxlen=max_windows)
        self.summaries: collections.deque[WindowSummary] = collections.deque(
            maxlen=max_windows)
        self._sizes: collections.deque[int] = collections.deque(maxlen=max_windows)

    @property
    def nbytes(self) -> int:
        """Bytes of the full windows' column arrays."""
        return sum(self._sizes)

    def add(self, kept: WindowRecord, scores: Mapping[int, float],
            findings: Sequence[Finding]) -> None:
        """Keep one window (its width-1 columns) and its summary; drop the oldest full ones
        past the byte budget."""
        if self.summaries.maxlen == 0:
            return
        self.summaries.append(summarise(kept, scores, findings))
        self.windows.append(kept)
        self._sizes.append(sum(v.nbytes for v in kept.columns.values()))
        while len(self.windows) > 1 and sum(self._sizes) > self.full_bytes:
            self.windows.popleft()
            self._sizes.popleft()


__all__ = ["SUMMARY_QUANTILES", "TOP_SCORES", "WindowHistory", "WindowSummary", "summarise"]
