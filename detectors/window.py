"""The per-rank statistics of one detection window: the single definition of the gathered columns.

Every ``window_steps`` steps each rank reduces its per-step statistics to one value per column
(:func:`summarize_window`) and all ranks ``all_gather`` that fixed vector of float64, whatever
the window length. The monitor writes these columns, the straggler detector reads its inputs
from them (:data:`SUMMARY_FIELDS`), and the demo and run report read them back from saved
windows, all through this module, by name.

To add a column: append a :class:`WindowStat` to :data:`WINDOW_STATS` (name, unit, how the
window reduces its steps) and fill it by name (``window[STAT["name"], step]``). Readers index
by name, so nothing else changes; saved windows carry their own ``stat_names`` so a reader of
an older file finds the columns by name too (:func:`columns_of`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class WindowStat:
    """One column of the window gather.

    Attributes:
        name: the column's name, in the field's terms, with its unit as suffix.
        unit: ``seconds``, ``bytes`` or ``count``.
        reduce: how a rank's per-step values become the window's value: ``median`` (robust to
            one slow step, e.g. a garbage-collection pause) or ``sum`` (counts).
        description: what the value is.
    """

    name: str
    unit: str
    reduce: str
    description: str


#: The gathered columns, in gather order. The first four are the straggler detector's inputs.
WINDOW_STATS: tuple[WindowStat, ...] = (
    WindowStat("compute_seconds", "seconds", "median",
               "forward + backward (phases other than data), minus exposed collective time"),
    WindowStat("data_seconds", "seconds", "median", "the data-loading phase"),
    WindowStat("collective_wait_seconds", "seconds", "median",
               "exposed collective time: waiting inside the gradient collective"),
    # Launch-to-completion minus the exposed wait is the *hidden* time (backward compute
    # overlapped with communication), not a link's transfer time, and would blame the slow
    # rank's link: the monitor leaves this NaN until a per-link measurement fills it.
    WindowStat("transfer_seconds", "seconds", "median",
               "the collective's own transfer time (a slow link); NaN when not measured"),
    WindowStat("step_seconds", "seconds", "median", "wall time of the step"),
    WindowStat("collective_seconds", "seconds", "median",
               "launch-to-completion collective time (union over buckets)"),
    WindowStat("comm_bytes", "bytes", "median", "payload bytes handed to collectives"),
    # One value per window (every step holds it): the link probe runs once, at the gather.
    WindowStat("link_probe_seconds", "seconds", "median",
               "round trip of a fixed payload to the ring successor "
               "(laggard.integrations.link_probe); NaN when not probed"),
)
#: Column names, in gather order.
STAT_NAMES: tuple[str, ...] = tuple(s.name for s in WINDOW_STATS)
#: Column name -> column index.
STAT: dict[str, int] = {name: index for index, name in enumerate(STAT_NAMES)}
#: The straggler detector's inputs, in the order of its ``RankWindow.from_summaries``.
SUMMARY_FIELDS: tuple[str, ...] = (
    "compute_seconds",
    "data_seconds",
    "collective_wait_seconds",
    "transfer_seconds",
)
_SUMMARY_COLUMNS = [STAT[name] for name in SUMMARY_FIELDS]
_SUM_COLUMNS = [i for i, s in enumerate(WINDOW_STATS) if s.reduce == "sum"]
_MEDIAN_COLUMNS = [i for i, s in enumerate(WINDOW_STATS) if s.reduce == "median"]


def summarize_window(window: np.ndarray) -> np.ndarray:
    """One rank's window value of each column, reduced over its K steps as the column says.

    Args:
        window: ``(len(WINDOW_STATS), K)`` float64 per-step statistics (NaN where unmeasured).

    Returns:
        ``(len(WINDOW_STATS),)`` float64; NaN where a median column had no value.

    Raises:
        ValueError: ``window`` does not have one row per column.
    """
    values = np.asarray(window, dtype=np.float64)
    if values.ndim != 2 or values.shape[0] != len(WINDOW_STATS):
        raise ValueError(f"window must be ({len(WINDOW_STATS)}, K), got {values.shape}")
    out = np.full(len(WINDOW_STATS), np.nan)
    out[_MEDIAN_COLUMNS] = np.median(values[_MEDIAN_COLUMNS], axis=1)
    if _SUM_COLUMNS:
        out[_SUM_COLUMNS] = np.nansum(values[_SUM_COLUMNS], axis=1)
    return out


def detector_summaries(summaries: np.ndarray) -> np.ndarray:
    """The straggler detector's input columns of gathered window values.

    Args:
        summaries: ``(R, len(WINDOW_STATS))`` float64, one row per rank.

    Returns:
        ``(R, len(SUMMARY_FIELDS))`` float64, columns as :data:`SUMMARY_FIELDS`.
    """
    return np.asarray(summaries, dtype=np.float64)[:, _SUMMARY_COLUMNS]


def columns_of(stat_names: Sequence[str]) -> dict[str, int]:
    """Column name -> index for windows saved with their own ``stat_names`` (older files may
    hold fewer columns; a reader looks a name up and treats a missing one as unmeasured).

    Args:
        stat_names: the saved column names, in saved order.
    """
    return {name: index for index, name in enumerate(stat_names)}


# -- the straggler detector's input ------------------------------------------------------

@dataclass(kw_only=True, slots=True)
class RankWindow:
    """Per-rank timings of one detection window: R ranks x K steps.

    Attributes:
        step: last training step of the window.
        ranks: (R,) int64 global ranks present; a rank that did not report is simply absent.
        compute_seconds: (R, K) float64, forward + backward: work before the sync point.
        data_seconds: (R, K) float64, data loading.
        collective_wait_seconds: (R, K) float64, time waiting inside the gradient collective
            (least wait = the rank the others waited for).
        transfer_seconds: (R, K) float64, the collective's own transfer time as this rank saw
            it (a slow link), NaN where unknown; None when not measured at all.
        world_size: ranks in the job, if known (enables missing-rank counts and elastic resets).
        nodes: (R,) host name of each rank, if known.
        local_ranks: (R,) local rank of each rank on its node, if known.

    NaN, infinite or negative durations are dropped (counted in ``StragglerDetector.stats``).
    """

    step: int
    ranks: np.ndarray
    compute_seconds: np.ndarray
    data_seconds: np.ndarray
    collective_wait_seconds: np.ndarray
    transfer_seconds: np.ndarray | None = None
    world_size: int | None = None
    nodes: Sequence[str] | None = None
    local_ranks: np.ndarray | None = None

    @classmethod
    def from_summaries(
        cls,
        *,
        step: int,
        ranks: np.ndarray,
        summaries: np.ndarray,
        world_size: int | None = None,
        nodes: Sequence[str] | None = None,
        local_ranks: np.ndarray | None = None,
    ) -> RankWindow:
        """Build a K=1 window from gathered :func:`summarize_steps` vectors.

        Args:
            step: last training step of the window.
            ranks: (R,) global ranks, one per row of ``summaries``.
            summaries: (R, 4) float64, columns as :data:`SUMMARY_FIELDS`.
            world_size, nodes, local_ranks: as in :class:`RankWindow`.

        Raises:
            ValueError: ``summaries`` is not (R, 4).
        """
        values = np.asarray(summaries, dtype=np.float64)
        if values.ndim != 2 or values.shape[1] != len(SUMMARY_FIELDS):
            raise ValueError(f"summaries must be (R, {len(SUMMARY_FIELDS)}), got {values.shape}")
        return cls(
            step=step,
            ranks=np.asarray(ranks, dtype=np.int64),
            compute_seconds=values[:, 0:1],
            data_seconds=values[:, 1:2],
            collective_wait_seconds=values[:, 2:3],
            transfer_seconds=values[:, 3:4],
            world_size=world_size,
            nodes=nodes,
            local_ranks=local_ranks,
        )


def summarize_steps(
    compute_seconds: Sequence[float],
    data_seconds: Sequence[float],
    collective_wait_seconds: Sequence[float],
    transfer_seconds: Sequence[float] | None = None,
) -> np.ndarray:
    """One rank's summary of its last K steps: what the monitor all_gathers per window.

    Medians, not means: a single garbage-collection pause or data stall in K steps does not move
    a median, while a rank that is slow on most steps does.

    Args:
        compute_seconds, data_seconds, collective_wait_seconds: (K,) durations in seconds.
        transfer_seconds: (K,) durations in seconds, or None when not measured.

    Returns:
        (4,) float64, fields as :data:`SUMMARY_FIELDS`; NaN where no valid (finite,
        non-negative) value was given.
    """
    columns = [compute_seconds, data_seconds, collective_wait_seconds]
    columns.append(transfer_seconds if transfer_seconds is not None else [])
    out = np.full(len(SUMMARY_FIELDS), np.nan)
    for i, column in enumerate(columns):
        values = np.asarray(column, dtype=np.float64).ravel()
        values = values[np.isfinite(values) & (values >= 0)]
        if values.size:
            out[i] = np.median(values)
    return out


def row_nanmedian(values: np.ndarray) -> np.ndarray:
    """Median along the last axis ignoring NaN, vectorised (numpy's ``nanmedian`` loops in
    Python over rows).

    Args:
        values: (..., K) float64.

    Returns:
        (...) float64; NaN where a row has no finite value.
    """
    if values.shape[-1] == 1:
        return values[..., 0].copy()
    ordered = np.sort(values, axis=-1)  # NaN sort last
    count = np.sum(~np.isnan(ordered), axis=-1, keepdims=True)
    return _sorted_median(ordered, count)


def _sorted_median(ordered: np.ndarray, count: np.ndarray) -> np.ndarray:
    """Median of rows sorted with NaN last, given each row's count of non-NaN values."""
    last = ordered.shape[-1] - 1
    low = np.take_along_axis(ordered, np.clip((count - 1) // 2, 0, last), axis=-1)[..., 0]
    high = np.take_along_axis(ordered, np.clip(count // 2, 0, last), axis=-1)[..., 0]
    return np.where(count[..., 0] > 0, (low + high) / 2, np.nan)
