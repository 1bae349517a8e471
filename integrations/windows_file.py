"""The windows file: rank 0 appends every gathered window to ``MonitorConfig.windows_path`` as
one JSON line, what ``laggard report WINDOWS.jsonl --html`` reads.

Streamed: each line is written and flushed as its window is gathered, nothing is kept. A line
holds the window's step, ``world_size``, ``stat_names``, each rank's window value of each column
(``medians``: the medians of the step columns; null for NaN), the detectors' ``scores``, the
findings raised or cleared, and ``notes``: the mean over the window of each value given to
``TrainingMonitor.note`` under a name of the job's own (``loss``...).

A write that fails (a full disk) is counted, logged once, and not retried; the next window
reopens the file and tries anew with its own line. Training goes on.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import IO, Any

import numpy as np

from laggard.detectors.window import WindowRecord

#: Distinct note names kept (beyond it a new name is ignored): a bounded line.
MAX_NOTE_NAMES = 16


class WindowsFile:
    """Appends windows to a JSON-lines file (rank 0 only); never raises.

    Args:
        path: the file, opened for appending at the first window.
        log_once: ``(key, msg, *args)``, the monitor's once-only log.

    Attributes:
        errors: windows that could not be written, plus a final flush that failed on close.
        first_error: the first error's text (``"[Errno 28] No space left on device"``), ""
            if none.
    """

    def __init__(self, path: str, *, log_once: Callable[..., Any]) -> None:
        self.path = path
        self.errors = 0
        self.first_error = ""
        self._log_once = log_once
        self._file: IO[str] | None = None
        self._notes: dict[str, list[float]] = {}

    def note(self, name: str, value: object) -> None:
        """Keep a value of the job's own (a finite number; anything else is dropped) for the
        next line's ``notes``; at most :data:`MAX_NOTE_NAMES` names."""
        try:
            values = self._notes.get(name)
            if values is None:
                if len(self._notes) >= MAX_NOTE_NAMES:
                    return
                values = self._notes[name] = []
            number = float(value)  # type: ignore[arg-type]
            if np.isfinite(number):
                values.append(number)
        except (TypeError, ValueError):
            return

    def take_notes(self) -> dict[str, float]:
        """The notes since the last call, each name's mean, and start anew: called on the
        training thread at the gather, so the line written later (on rank 0's analysis
        thread) holds its own window's notes."""
        notes = {name: float(np.mean(v)) for name, v in self._notes.items() if v}
        self._notes = {name: [] for name in self._notes}
        return notes

    def append(self, kept: WindowRecord, world_size: int, scores: dict[int, float],
               findings: list[Any], notes: dict[str, float] | None = None) -> None:
        """Write one window as a JSON line and flush it.

        Args:
            kept: the window's width-1 columns (``WindowRecord.scalars()``).
            world_size: ranks in the job.
            scores: rank -> the detectors' score.
            findings: the findings raised or cleared in this window (``Finding``).
            notes: the window's notes (:meth:`take_notes`); None takes them now.
        """
        if notes is None:
            notes = self.take_notes()
        try:
            if self._file is None:
                self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - streamed
            names = list(kept.columns)
            doc = {
                "step": kept.step, "world_size": world_size, "stat_names": names,
                # each rank's window value of each column (the medians of the step columns)
                "medians": [[v if np.isfinite(v) else None for v in row]
                            for row in kept.table(names).tolist()],
                "scores": {str(r): v for r, v in scores.items()},
                "findings": [f.to_dict() for f in findings],
                "notes": notes,
            }
            self._file.write(json.dumps(doc) + "\n")
            # A full disk fails here, not in write(): the line sat in the file's buffer.
            self._file.flush()
        except (OSError, TypeError, ValueError) as exc:
            self.errors += 1
            self.first_error = self.first_error or str(exc)
            self._log_once("save", "laggard: cannot write the windows file %s: %s; windows "
                           "that cannot be written are counted (stats.save_errors), not "
                           "retried, and training goes on", self.path, exc)
            if isinstance(exc, OSError):
                # Drop the unwritten bytes: the next window reopens the file and tries anew
                # with its own line, rather than after a stale, partly written buffer.
                self.close(count=False)  # this window's error, counted above

    def close(self, count: bool = True) -> None:
        """Close the file; a flush that fails on close (a full disk) is counted as an error
        (``count``), never raised. The next :meth:`append` reopens it."""
        file, self._file = self._file, None
        if file is None:
            return
        try:
            file.close()  # closed even when its final flush fails
        except OSError:
            self.errors += count


__all__ = ["MAX_NOTE_NAMES", "WindowsFile"]
