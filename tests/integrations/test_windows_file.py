"""The windows file (``integrations/windows_file.py``): one JSON line per window, streamed."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest

from laggard.detectors.finding import Finding, Severity
from laggard.detectors.window import WindowRecord
from laggard.integrations.windows_file import MAX_NOTE_NAMES, WindowsFile
from laggard.log_once import LogOnce


def _kept(step: int) -> WindowRecord:
    return WindowRecord(step=step, columns={"step_seconds": np.array([0.1, np.nan])},
                        ranks=np.arange(2), world_size=2)


class _Log:
    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[object, ...]]] = []

    def __call__(self, key: str, msg: str, *args: object) -> None:
        self.calls.append((key, args))


def test_each_window_is_one_line_with_its_notes_means(tmp_path: Path) -> None:
    path = tmp_path / "w.jsonl"
    out = WindowsFile(str(path), log_once=_Log())
    for value in (1.0, 3.0, float("nan"), "bad"):
        out.note("loss", value)  # NaN and non-numbers dropped
    finding = Finding(detector="straggler", kind="compute", severity=Severity.WARNING,
                      rank=1, message="slow", step=19)
    out.append(_kept(19), 2, {1: 4.5}, [finding])
    out.append(_kept(39), 2, {}, [])
    first, second = (json.loads(line) for line in path.read_text().splitlines())
    assert first["step"] == 19 and first["stat_names"] == ["step_seconds"]
    assert first["medians"] == [[0.1], [None]] and first["scores"] == {"1": 4.5}
    assert first["notes"] == {"loss": 2.0} and first["findings"][0]["rank"] == 1
    assert second["notes"] == {} and out.errors == 0  # the notes are the window's own
    out.close()


def test_note_names_are_bounded(tmp_path: Path) -> None:
    out = WindowsFile(str(tmp_path / "w.jsonl"), log_once=_Log())
    for i in range(MAX_NOTE_NAMES + 5):
        out.note(f"n{i}", 1.0)
    out.append(_kept(9), 2, {}, [])
    out.close()
    line = json.loads((tmp_path / "w.jsonl").read_text())
    assert len(line["notes"]) == MAX_NOTE_NAMES


def test_a_full_disk_is_counted_per_window_logged_once_and_retried_next_window(
        caplog: pytest.LogCaptureFixture) -> None:
    out = WindowsFile("/dev/full", log_once=LogOnce(logging.getLogger("laggard.test")))
    with caplog.at_level(logging.WARNING, logger="laggard.test"):
        for step in (9, 19, 29):
            out.append(_kept(step), 2, {}, [])
        out.close()
    assert out.errors == 3 and out.first_error == "[Errno 28] No space left on device"
    assert len(caplog.records) == 1 and "stats.save_errors" in caplog.text


def test_a_missing_directory_is_counted_never_raised(tmp_path: Path) -> None:
    out = WindowsFile(str(tmp_path / "missing" / "w.jsonl"), log_once=_Log())
    out.append(_kept(9), 2, {}, [])
    out.close()
    assert out.errors == 1 and "No such file" in out.first_error
