"""The monitor's per-step table: one rank's step columns over the current window.

A ``(16, K)`` float64 array: one row per step column of
:data:`laggard.detectors.window.STEP_COLUMNS` (in that order), one column per step of the
window (``step % K``, K = ``MonitorConfig.window_steps``), NaN where unmeasured. Every window
:func:`~laggard.detectors.window.summarize_window` reduces it to one value per column, and
the next window overwrites it in place.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from laggard.detectors.blame import window_blame
from laggard.detectors.stats import nanmedian
from laggard.detectors.window import STEP_COLUMN_NAMES, STEP_COLUMNS, summarize_window
from laggard.integrations.phases import StepTimes

#: Step column name -> row of the table.
STEP_ROWS = {name: row for row, name in enumerate(STEP_COLUMN_NAMES)}
#: The notes every rank keeps, per step, for the window's work columns (``monitor.note``).
WORK_NOTES = ("tokens", "samples")
#: Rows only the device clock fills (NaN on the CPU clocks).
_DEVICE_ROWS = ("compute_device_seconds", "collective_wait_device_seconds")


class StepTable:
    """One rank's per-step values over the current window, and this step's work notes.

    Args:
        window_steps: K, steps per window (columns of the table).

    Attributes:
        values: the ``(len(STEP_COLUMNS), window_steps)`` float64 table.
    """

    def __init__(self, window_steps: int) -> None:
        self.window_steps = window_steps
        self.values = np.zeros((len(STEP_COLUMNS), window_steps), dtype=np.float64)
        self.values[[STEP_ROWS[name] for name in _DEVICE_ROWS]] = np.nan
        self._work = dict.fromkeys(WORK_NOTES, math.nan)  # this step's noted work
        self._gc_generation = -1  # the highest generation collected so far in this window

    def note_work(self, name: str, value: object) -> None:
        """Add a ``tokens`` or ``samples`` note to this step's sum.

        Raises:
            KeyError: ``name`` is not one of :data:`WORK_NOTES`.
            TypeError, ValueError (or what ``float(value)`` raises): not a finite number
                >= 0 (a bool, NaN, a negative number, a tensor of several elements); the
                note is not kept.
        """
        total = self._work[name]
        if isinstance(value, bool):
            raise TypeError("a bool is not an amount of work")
        amount = float(value)  # type: ignore[arg-type]
        if not (math.isfinite(amount) and amount >= 0):
            raise ValueError(f"work must be a finite number >= 0, got {amount}")
        self._work[name] = amount if total != total else total + amount

    def record(self, column: int, times: StepTimes, collected: Any) -> None:
        """Write one step into ``column`` (``step % K``).

        Args:
            column: the step's column.
            times: the step's times (:func:`~laggard.integrations.phases.step_times`).
            collected: the step's garbage collections (``GcStep``: its ``generation`` is the
                highest collected), or None when GC timing is off.
        """
        for name, value in times.columns().items():
            self.values[STEP_ROWS[name], column] = value
        if column == 0:
            self._gc_generation = -1
        generation = math.nan
        if collected is not None:
            # the window's highest so far, for the column's "last" reduction
            self._gc_generation = max(self._gc_generation, collected.generation)
            generation = float(self._gc_generation)
        self.values[STEP_ROWS["gc_generation"], column] = generation
        for name, amount in self._work.items():
            self.values[STEP_ROWS[name], column] = amount
            self._work[name] = math.nan
        self.values[STEP_ROWS["compute_cpu_seconds"], column] = times.compute_seconds

    def typical_step_seconds(self, steps_done: int) -> float | None:
        """The median of the last ``min(steps_done, K)`` step times, seconds; None before the
        first step. Safe from another thread (reads a few floats)."""
        count = min(steps_done, self.window_steps)
        if count <= 0:
            return None
        return nanmedian(self.values[STEP_ROWS["step_seconds"], :count])

    def summary(self) -> dict[str, float]:
        """The window value of each step column (:func:`summarize_window`) and the window's
        blame sums (:data:`laggard.detectors.blame.BLAME_COLUMNS`: the exposed collective and
        P2P waits, the step times)."""
        values = self.values
        out = summarize_window(values)
        wait = values[STEP_ROWS["collective_wait_seconds"]] + values[STEP_ROWS["p2p_wait_seconds"]]
        work = values[STEP_ROWS["compute_seconds"]] + values[STEP_ROWS["data_seconds"]]
        out.update(window_blame(wait, values[STEP_ROWS["step_seconds"]], work))
        return out


__all__ = ["STEP_ROWS", "WORK_NOTES", "StepTable"]
