"""The window gather's column definition: one source, looked up by name, reduced per column."""

from __future__ import annotations

import numpy as np
import pytest

from laggard.detectors.straggler import SUMMARY_FIELDS as DETECTOR_FIELDS
from laggard.detectors.window import (
    STAT,
    STAT_NAMES,
    SUMMARY_FIELDS,
    WINDOW_STATS,
    columns_of,
    detector_summaries,
    summarize_window,
)


def test_names_indices_and_the_detector_inputs_agree() -> None:
    assert DETECTOR_FIELDS is SUMMARY_FIELDS
    assert [STAT[name] for name in STAT_NAMES] == list(range(len(WINDOW_STATS)))
    assert set(SUMMARY_FIELDS) <= set(STAT_NAMES)
    assert all(s.reduce in ("median", "sum") for s in WINDOW_STATS)
    assert len(set(STAT_NAMES)) == len(STAT_NAMES)


def test_summarize_window_takes_each_columns_median_over_its_steps() -> None:
    steps = np.arange(len(STAT_NAMES) * 5, dtype=np.float64).reshape(len(STAT_NAMES), 5)
    steps[STAT["compute_seconds"], 2] = 1e9  # one garbage-collection pause
    steps[STAT["transfer_seconds"]] = np.nan
    out = summarize_window(steps)
    assert out[STAT["compute_seconds"]] == pytest.approx(np.median(steps[0]))
    assert out[STAT["compute_seconds"]] < 1e3
    assert np.isnan(out[STAT["transfer_seconds"]])
    with pytest.raises(ValueError):
        summarize_window(np.zeros((3, 5)))


def test_detector_summaries_picks_the_inputs_by_name() -> None:
    rows = np.tile(np.arange(len(STAT_NAMES), dtype=np.float64), (3, 1))
    picked = detector_summaries(rows)
    assert picked.shape == (3, len(SUMMARY_FIELDS))
    assert picked[0].tolist() == [STAT[name] for name in SUMMARY_FIELDS]


def test_saved_windows_are_read_by_their_own_column_names() -> None:
    older = columns_of(["compute_seconds", "data_seconds"])
    assert older["data_seconds"] == 1 and "comm_bytes" not in older
