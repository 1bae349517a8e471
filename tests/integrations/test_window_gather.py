"""The window gather and the participants' round (``integrations/window_gather.py``): a
one-rank gloo group in this process, plain participants."""

from __future__ import annotations

import numpy as np
import pytest

from laggard.detectors.finding import Finding, Severity
from laggard.detectors.window import STEP_COLUMNS, WindowColumn, WindowLayout, WindowRecord
from laggard.integrations.participants import StopJob, WindowOutcome, WindowParticipant
from laggard.integrations.window_gather import WindowGather, analyse_window

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")


@pytest.fixture
def one_rank_group():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_one_rank_gathers_its_own_values_as_a_record(one_rank_group) -> None:
    layout = WindowLayout(STEP_COLUMNS + (WindowColumn("things_total", "1", "sum", "x"),))
    gather = WindowGather(dist, None, world_size=1, node="node07", local_rank=0)
    assert gather.group is None  # the default group is gloo: no group of its own
    values = {column.name: 0.5 for column in STEP_COLUMNS} | {"things_total": 3.0}
    record = gather.gather(19, values, layout)
    assert record.step == 19 and record.world_size == 1 and record.nodes == ["node07"]
    assert record["things_total"].tolist() == [3.0] and record.local_ranks.tolist() == [0]
    assert record["step_seconds"].tolist() == [0.5]
    gather.close()


@pytest.mark.parametrize("everywhere", [False, True])
def test_the_receive_buffer_is_made_once_and_each_record_is_a_copy(one_rank_group, everywhere):
    layout = WindowLayout(STEP_COLUMNS)
    gather = WindowGather(dist, None, world_size=1, node="n", local_rank=None,
                          everywhere=everywhere)
    first = gather.gather(4, {c.name: 1.0 for c in STEP_COLUMNS}, layout)
    buffer = gather._table  # noqa: SLF001
    second = gather.gather(9, {c.name: 2.0 for c in STEP_COLUMNS}, layout)
    assert gather._table is buffer  # noqa: SLF001 - no new buffer per window
    assert first["step_seconds"].tolist() == [1.0] and second["step_seconds"].tolist() == [2.0]
    assert first.local_ranks is None and second.nodes == ["n"]
    gather.close()


def _finding(rank: int) -> Finding:
    return Finding(detector="d", kind="k", severity=Severity.INFO, message="m", rank=rank)


class _Finds(WindowParticipant):
    def __init__(self, name: str, rank: int) -> None:
        super().__init__()
        self.name, self.rank = name, rank

    def on_window(self, record: WindowRecord) -> WindowOutcome:
        return WindowOutcome(findings=[_finding(self.rank)], scores={self.rank: 1.0})


class _Broken(WindowParticipant):
    name = "broken"

    def on_window(self, record: WindowRecord) -> WindowOutcome:
        raise RuntimeError("bug")


class _Stops(WindowParticipant):
    name = "stops"

    def on_window(self, record: WindowRecord) -> WindowOutcome:
        raise StopJob("stop", [_finding(9)])


def _record() -> WindowRecord:
    return WindowRecord(step=19, columns={}, ranks=np.arange(2), world_size=2)


def test_a_broken_participant_is_counted_and_the_others_go_on() -> None:
    errors: list[str] = []
    outcome, stop = analyse_window([_Finds("a", 0), _Broken(), _Finds("b", 1)], _record(),
                                   lambda where, exc: errors.append(where))
    assert [f.rank for f in outcome.findings] == [0, 1] and outcome.scores == {0: 1.0, 1: 1.0}
    assert errors == ["broken"] and stop is None


def test_a_stop_ends_the_round_with_its_findings_kept() -> None:
    outcome, stop = analyse_window([_Finds("a", 0), _Stops(), _Finds("b", 1)], _record(),
                                   lambda where, exc: None)
    assert isinstance(stop, StopJob) and [f.rank for f in outcome.findings] == [0, 9]
