"""The file of excluded hosts (srun --exclude=PATH) and the filtered hostfile, on real files."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from laggard.actions.audit import AUDIT_LOGGER
from laggard.actions.exclude_file import ExcludeFile


def test_dry_run_writes_nothing_and_says_what_it_would(tmp_path: Path,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, AUDIT_LOGGER)
    target = ExcludeFile(tmp_path / "exclude")
    decision = target.quarantine("n3", "laggard:gpu_lost:gpu1", why="LaggardGpuLost firing")
    assert decision.outcome == "would_act"
    assert decision.detail == f"add n3 to {tmp_path / 'exclude'}"
    assert not (tmp_path / "exclude").exists()
    assert [r.getMessage() for r in caplog.records] == [decision.line()]


def test_exclude_and_include_again_rewrite_both_files(tmp_path: Path) -> None:
    hosts = tmp_path / "hosts"
    hosts.write_text("n1 slots=8\nn2 slots=8\nn3 slots=8\n")
    exclude, hostfile = tmp_path / "exclude", tmp_path / "hostfile"
    target = ExcludeFile(exclude, act=True, hosts=hosts, hostfile=hostfile)
    assert target.quarantine("n2", "laggard:hung:r/rank3", why="x").outcome == "acted"
    assert target.quarantine("n3", "laggard:sdc:r/rank5", why="x").outcome == "acted"
    assert exclude.read_text() == "n2\nn3\n"
    assert hostfile.read_text() == "n1 slots=8\n"
    assert (target.held_reason("n2"), target.held_reason("n1")) == ("laggard:excluded", "")
    again = target.quarantine("n2", "laggard:hung:r/rank3", why="x")
    assert (again.outcome, again.detail) == ("skipped", f"already in {exclude}")
    assert target.release("n2", why="resolved").outcome == "acted"
    assert exclude.read_text() == "n3\n"
    assert hostfile.read_text() == "n1 slots=8\nn2 slots=8\n"
    assert target.release("n1", why="resolved").outcome == "skipped"


def test_an_unwritable_file_is_a_failed_decision_not_an_exception(tmp_path: Path) -> None:
    target = ExcludeFile(tmp_path / "missing-dir" / "exclude", act=True)
    decision = target.quarantine("n1", "laggard:gpu_lost:gpu0", why="x")
    assert decision.outcome == "failed" and "missing-dir" in decision.detail
