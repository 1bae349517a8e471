"""The monitor's per-step table (``integrations/step_table.py``): plain data, no torch job."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

from laggard.detectors.window import STEP_COLUMN_NAMES, STEP_COLUMNS
from laggard.integrations.phases import StepTimes
from laggard.integrations.step_table import STEP_ROWS, StepTable


def _times(step_seconds: float, compute: float = 0.02) -> StepTimes:
    return StepTimes(phases={"forward": compute}, compute_seconds=compute, data_seconds=0.001,
                     collective_wait_seconds=0.003, collective_seconds=0.004, comm_bytes=1e6,
                     step_seconds=step_seconds)


def _row(table: StepTable, name: str) -> list[float]:
    return table.values[STEP_ROWS[name]].tolist()


def test_one_row_per_step_column_one_column_per_step_device_rows_nan() -> None:
    table = StepTable(4)
    assert table.values.shape == (len(STEP_COLUMNS), 4) and table.values.dtype == np.float64
    assert list(STEP_ROWS) == list(STEP_COLUMN_NAMES)
    assert all(math.isnan(v) for v in _row(table, "compute_device_seconds"))
    assert all(math.isnan(v) for v in _row(table, "collective_wait_device_seconds"))


def test_a_step_fills_its_column_with_its_times_gc_generation_and_work() -> None:
    table = StepTable(3)
    table.note_work("tokens", 100)
    table.note_work("tokens", 28.0)  # notes of one step add up
    table.record(0, _times(0.05), SimpleNamespace(generation=1))
    table.record(1, _times(0.06), SimpleNamespace(generation=0))  # the window's highest: 1
    table.record(2, _times(0.07), None)
    assert _row(table, "step_seconds") == [0.05, 0.06, 0.07]
    assert _row(table, "compute_cpu_seconds") == [0.02] * 3
    assert _row(table, "collective_wait_seconds") == [0.003] * 3
    assert _row(table, "gc_generation")[:2] == [1.0, 1.0] and math.isnan(
        _row(table, "gc_generation")[2])
    tokens = _row(table, "tokens")
    assert tokens[0] == 128.0 and all(math.isnan(v) for v in tokens[1:])  # reset each step
    table.record(0, _times(0.05), SimpleNamespace(generation=0))  # a new window: reset
    assert _row(table, "gc_generation")[0] == 0.0
    assert table.summary()["step_seconds"] == pytest.approx(0.06)


@pytest.mark.parametrize("value", [True, -1, math.nan, math.inf, "many", [1, 2]])
def test_work_that_is_not_a_finite_number_at_least_zero_is_refused(value: object) -> None:
    table = StepTable(2)
    with pytest.raises((TypeError, ValueError)):
        table.note_work("samples", value)
    table.record(0, _times(0.05), None)
    assert math.isnan(_row(table, "samples")[0])


def test_only_the_work_notes_are_kept() -> None:
    with pytest.raises(KeyError):
        StepTable(2).note_work("loss", 1.0)


def test_the_typical_step_is_the_median_of_the_steps_so_far() -> None:
    table = StepTable(4)
    assert table.typical_step_seconds(0) is None
    for column, seconds in enumerate((0.1, 0.3, 0.2)):
        table.record(column, _times(seconds), None)
    assert table.typical_step_seconds(1) == pytest.approx(0.1)
    assert table.typical_step_seconds(3) == pytest.approx(0.2)
    table.record(3, _times(0.4), None)
    assert table.typical_step_seconds(99) == pytest.approx(0.25)  # the last K steps
