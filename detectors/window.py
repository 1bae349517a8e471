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
