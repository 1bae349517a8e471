"""The window record: its columns declared once, packed and unpacked by name, summarised once."""

import numpy as np
import pytest

from laggard.detectors.window import (
    DETECTOR_COLUMNS,
    STEP_COLUMN_NAMES,
    STEP_COLUMNS,
    RankWindow,
    WindowColumn,
    WindowLayout,
    WindowRecord,
    summarize_window,
)


def test_step_columns_are_unique_and_hold_the_detector_inputs() -> None:
    assert len(set(STEP_COLUMN_NAMES)) == len(STEP_COLUMN_NAMES)
    assert set(DETECTOR_COLUMNS) <= set(STEP_COLUMN_NAMES)
    assert all(c.width == 1 and c.dtype == "float64" for c in STEP_COLUMNS)


def test_summarize_window_reduces_each_column_as_declared() -> None:
    columns = (
        WindowColumn("compute_seconds", "seconds", "median", ""),
        WindowColumn("transfer_seconds", "seconds", "median", ""),
        WindowColumn("gc_collections", "count", "sum", ""),
        WindowColumn("probe_seconds", "seconds", "last", ""),
    )
    steps = np.array([
        [0.010, 0.011, 1e9, 0.012, 0.010],  # one garbage-collection pause
        [np.nan] * 5,
        [1, 0, 2, np.nan, 1],
        [np.nan, 0.5, np.nan, 0.7, np.nan],
    ])
    out = summarize_window(steps, columns)
    assert out["compute_seconds"] == pytest.approx(0.011)
    assert np.isnan(out["transfer_seconds"])
    assert out["gc_collections"] == 4
    assert out["probe_seconds"] == 0.7
    with pytest.raises(ValueError):
        summarize_window(np.zeros((3, 5)), columns)


def test_layout_packs_and_unpacks_by_name_with_int64_words_bit_exact() -> None:
    words = np.array([-1, 2**62 + 7, 0x7FF0000000000001], dtype=np.int64)  # NaN-pattern too
    layout = WindowLayout(STEP_COLUMNS + (
        WindowColumn("block", "seconds", "last", "", width=4),
        WindowColumn("fingerprints", "words", "last", "", width=3, dtype="int64"),
    ))
    assert layout.size == len(STEP_COLUMNS) + 4 + 3
    rows = np.stack([
        layout.pack({"compute_seconds": 0.03 + r, "block": np.arange(4) + r,
                     "fingerprints": words + r, "unknown": 1.0})
        for r in range(3)])
    columns = layout.unpack(rows)
    assert columns["compute_seconds"].tolist() == [0.03, 1.03, 2.03]
    assert np.isnan(columns["data_seconds"]).all()  # not given: NaN
    assert columns["block"].shape == (3, 4) and columns["block"][2].tolist() == [2, 3, 4, 5]
    assert columns["fingerprints"].dtype == np.int64
    assert columns["fingerprints"][1].tolist() == (words + 1).tolist()
    with pytest.raises(ValueError, match="width"):
        layout.pack({"block": [1.0, 2.0]})
    with pytest.raises(ValueError):
        layout.unpack(rows[:, :-1])


def test_a_column_declared_twice_is_refused() -> None:
    with pytest.raises(ValueError, match="declared twice"):
        WindowLayout(STEP_COLUMNS + (STEP_COLUMNS[0],))
    with pytest.raises(ValueError):
        WindowColumn("x", "seconds", "mean", "")


def test_rank_window_reads_the_detector_columns_by_name() -> None:
    record = WindowRecord(step=19, ranks=np.arange(3), world_size=3, nodes=["a", "b", "c"],
                          columns={"data_seconds": np.array([1.0, 2, 3]),
                                   "compute_seconds": np.array([4.0, 5, 6]),
                                   "collective_wait_seconds": np.array([7.0, 8, 9])})
    window = RankWindow.from_record(record)
    assert window.compute_seconds.tolist() == [[4], [5], [6]]
    assert window.data_seconds.tolist() == [[1], [2], [3]]
    assert window.transfer_seconds is None  # not in the record: not measured
    assert (window.step, window.world_size, list(window.nodes)) == (19, 3, ["a", "b", "c"])


def test_saved_windows_are_read_by_their_own_column_names() -> None:
    older = WindowRecord.from_saved({"step": 39, "stat_names": ["data_seconds", "compute_seconds"],
                                     "medians": [[0.001, 0.02], [None, 0.03]], "world_size": 2})
    assert older["compute_seconds"].tolist() == [0.02, 0.03]
    assert np.isnan(older["data_seconds"][1]) and older.get("comm_bytes") is None
    assert np.isnan(older.table(["comm_bytes"])).all()
    with pytest.raises(ValueError):
        WindowRecord.from_saved({"step": 0, "stat_names": ["a"], "medians": [[1.0, 2.0]]})
    with pytest.raises(KeyError):
        WindowRecord.from_saved({"step": 0, "medians": []})
