"""The one file tailer: appends, partial lines, rotation, truncation, absence, runaway lines."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from laggard.collectors.tailer import FileTailer


def _tailer(path: Path, **kw: object) -> FileTailer:
    args = {"start_at_end": False, "max_read_bytes": 1 << 20, "max_line_bytes": 64, **kw}
    return FileTailer(str(path), **args)  # type: ignore[arg-type]


@pytest.mark.parametrize("keep_open", [True, False])
def test_appended_lines_in_order_partial_lines_wait(tmp_path: Path, keep_open: bool) -> None:
    path = tmp_path / "log"
    path.write_bytes(b"one\ntwo\nthr")
    tailer = _tailer(path, keep_open=keep_open)
    assert tailer.read_lines() == [b"one", b"two"]
    assert tailer.read_lines() == []
    with path.open("ab") as f:
        f.write(b"ee\nfour\n")
    assert tailer.read_lines() == [b"three", b"four"]
    assert not tailer.restarted


def test_start_at_end_skips_history_only_at_the_first_open(tmp_path: Path) -> None:
    path = tmp_path / "log"
    path.write_bytes(b"old\n")
    tailer = _tailer(path, start_at_end=True)
    assert tailer.read_lines() == []
    with path.open("ab") as f:
        f.write(b"new\n")
    assert tailer.read_lines() == [b"new"]


@pytest.mark.parametrize("keep_open", [True, False])
def test_rotation_reads_the_old_tail_then_the_new_file_from_its_start(
        tmp_path: Path, keep_open: bool) -> None:
    path = tmp_path / "log"
    path.write_bytes(b"a\n")
    tailer = _tailer(path, start_at_end=True, keep_open=keep_open)
    assert tailer.read_lines() == []
    with path.open("ab") as f:
        f.write(b"last of old\n")
    os.rename(path, tmp_path / "log.1")
    path.write_bytes(b"first of new\n")
    lines = tailer.read_lines() + tailer.read_lines()
    assert lines == ([b"last of old", b"first of new"] if keep_open else [b"first of new"])
    assert tailer.read_lines() == []


def test_truncation_restarts_and_says_so(tmp_path: Path) -> None:
    path = tmp_path / "log"
    path.write_bytes(b"x" * 40 + b"\n")
    tailer = _tailer(path)
    assert len(tailer.read_lines()) == 1
    path.write_bytes(b"short\n")  # same inode, shorter than the offset read
    assert tailer.read_lines() == []
    assert tailer.read_lines() == [b"short"]
    assert tailer.restarted


def test_absent_file_is_no_error_and_is_read_from_its_start_when_it_appears(
        tmp_path: Path) -> None:
    path = tmp_path / "later"
    tailer = _tailer(path, start_at_end=True)
    assert tailer.read_lines() == []
    path.write_bytes(b"hello\n")
    assert tailer.read_lines() == [b"hello"]


def test_a_runaway_line_is_dropped_and_counted(tmp_path: Path) -> None:
    path = tmp_path / "log"
    path.write_bytes(b"y" * 100)
    tailer = _tailer(path)
    assert tailer.read_lines() == []
    assert tailer.oversized_lines == 1
    with path.open("ab") as f:
        f.write(b"tail of it\nok\n")
    assert tailer.read_lines() == [b"tail of it", b"ok"]


def test_unreadable_file_raises_oserror(tmp_path: Path) -> None:
    path = tmp_path / "dir-not-file"
    path.mkdir()
    with pytest.raises(OSError):
        _tailer(path).read_lines()


def test_at_end_says_when_a_long_history_is_read(tmp_path: Path) -> None:
    path = tmp_path / "log"
    path.write_bytes(b"0123456789\n" * 10)  # 110 bytes
    tailer = _tailer(path, max_read_bytes=50)
    rounds = []
    while not tailer.at_end:
        rounds.append(len(tailer.read_lines()))
    assert rounds == [4, 5, 1] and sum(rounds) == 10
    absent = _tailer(tmp_path / "absent")
    assert absent.read_lines() == [] and absent.at_end  # nothing to read: nothing left
