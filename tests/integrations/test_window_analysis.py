"""Rank 0's analysis thread (window_analysis.py), the kept windows (window_history.py) and the
monitor's hand-over: real threads, real events, no wall-clock budget but the scaled ceiling."""

from __future__ import annotations

import threading

import numpy as np
import pytest

pytest.importorskip("torch")

from support import budget  # noqa: E402

from laggard.detectors.finding import Finding, Severity  # noqa: E402
from laggard.detectors.window import WindowRecord  # noqa: E402
from laggard.integrations.monitor import TrainingMonitor  # noqa: E402
from laggard.integrations.monitor_config import MonitorStats  # noqa: E402
from laggard.integrations.participants import (  # noqa: E402
    StopJob,
    WindowOutcome,
    WindowParticipant,
)
from laggard.integrations.window_analysis import PendingWindow, WindowAnalysis  # noqa: E402
from laggard.integrations.window_history import WindowHistory, summarise  # noqa: E402


def _record(step: int, ranks: int = 4, value: float = 0.1) -> WindowRecord:
    rng = np.random.default_rng(step)
    return WindowRecord(step=step, columns={
        "compute_seconds": value * (1 + 0.01 * rng.standard_normal(ranks)),
        "data_seconds": np.full(ranks, 0.001), "collective_wait_seconds": np.full(ranks, 0.01),
        "transfer_seconds": np.full(ranks, np.nan), "step_seconds": np.full(ranks, value)},
        ranks=np.arange(ranks), world_size=ranks)


def _finding(kind: str, step: int) -> Finding:
    return Finding(detector="test", kind=kind, severity=Severity.INFO, step=step,
                   message=f"{kind} at {step}")


class _Gate:
    """A ``work`` that blocks until released, recording the windows it got."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.started = threading.Event()
        self.seen: list[PendingWindow] = []

    def __call__(self, item: PendingWindow) -> None:
        self.seen.append(item)
        self.started.set()
        assert self.release.wait(budget(30))


def test_a_window_handed_over_while_one_is_analysed_waits_and_a_newer_one_replaces_it():
    stats, gate = MonitorStats(), _Gate()
    analysis = WindowAnalysis(gate, stats=stats, count_error=pytest.fail)
    assert analysis.submit(PendingWindow(_record(4))) == 0
    assert gate.started.wait(budget(10))  # window 4 in hand, the thread blocked in it
    # neither call waits for the blocked thread: the slot takes 9, then 14 replaces it
    assert analysis.submit(PendingWindow(_record(9), WindowOutcome([_finding("a", 9)]))) == 0
    assert analysis.submit(PendingWindow(_record(14), WindowOutcome([_finding("b", 14)]))) == 1
    assert stats.windows_coalesced == 1 and stats.windows_analysed == 0
    gate.release.set()
    assert analysis.close()  # drains: the window in the slot is analysed before the end
    assert [p.record.step for p in gate.seen] == [4, 14]
    last = gate.seen[-1]
    # the dropped window's inline findings ride with the newer window's, oldest first
    assert [f.kind for f in last.inline.findings] == ["a", "b"] and last.coalesced == 1
    assert stats.windows_analysed == 2 and stats.analysis_seconds > 0
    assert analysis.submit(PendingWindow(_record(19))) == 1  # after close: dropped, counted
    assert stats.windows_coalesced == 2


def test_a_failing_analysis_is_counted_and_the_thread_goes_on():
    errors: list[str] = []
    done: list[int] = []

    def work(item: PendingWindow) -> None:
        if item.record.step == 4:
            raise ValueError("a detector's bug")
        done.append(item.record.step)

    stats = MonitorStats()
    analysis = WindowAnalysis(work, stats=stats, count_error=lambda w, e: errors.append(w))
    analysis.submit(PendingWindow(_record(4)))
    assert analysis.wait_idle(budget(10))
    analysis.submit(PendingWindow(_record(9)))
    assert analysis.close()
    assert errors == ["analysis"] and done == [9] and stats.windows_analysed == 2


def test_close_is_bounded_when_the_analysis_is_stuck():
    stats, gate = MonitorStats(), _Gate()
    analysis = WindowAnalysis(gate, stats=stats, count_error=pytest.fail)
    analysis.submit(PendingWindow(_record(4)))
    assert gate.started.wait(budget(10))
    assert analysis.close(timeout=0.05) is False  # stuck: close returns, the job exits
    assert analysis.wait_idle(0.01) is False
    gate.release.set()
    assert analysis.wait_idle(budget(10)) and analysis.close()


def test_a_monitor_that_never_gathers_starts_no_thread():
    before = threading.active_count()
    monitor = TrainingMonitor(TrainingMonitor.Config(agent_address="", heartbeat_seconds=0,
                                                     hang_store_seconds=0, gc_timing=False))
    assert threading.active_count() == before
    monitor.close()


class _Stopper(WindowParticipant):
    """Stops the job at a window (integrity policy ``raise`` stands for it)."""

    name = "stopper"

    def __init__(self, inline: bool) -> None:
        super().__init__()
        self.inline = inline

    def on_window(self, record: WindowRecord) -> WindowOutcome | None:
        raise StopJob("stop", [_finding("integrity", record.step)])


def _rank0(participants, **config) -> TrainingMonitor:
    return TrainingMonitor(TrainingMonitor.Config(
        agent_address="", detect=False, heartbeat_seconds=0, hang_store_seconds=0,
        gc_timing=False, **config), rank=0, world_size=4, participants=participants)


def test_an_inline_stop_is_reported_then_raised_on_the_training_thread():
    monitor = _rank0([_Stopper(inline=True)])
    # the gathered window's path (monitor._gather_window after the collective)
    with pytest.raises(StopJob):
        monitor._hand_over(_record(4))  # noqa: SLF001
    assert [f.kind for f in monitor.findings] == ["integrity"]  # reported before the raise
    assert len(monitor.windows) == 1
    monitor.close()


def test_a_stop_on_the_analysis_thread_is_reported_and_counted_never_raised():
    monitor = _rank0([_Stopper(inline=False)])
    monitor._hand_over(_record(4))  # noqa: SLF001 - returns at once: the thread has it
    monitor.close()
    assert [f.kind for f in monitor.findings] == ["integrity"]
    assert monitor.stats.internal_errors == 1 and monitor.stats.windows_analysed == 1


def test_a_row_of_nans_is_counted_and_never_raised_by_either_path():
    monitor = _rank0([])
    record = _record(4)
    record.columns["step_seconds"][2] = np.nan
    record.columns["compute_seconds"][2] = np.nan
    assert monitor.analyse(record) == []  # synchronous path
    monitor._hand_over(_record(9))  # noqa: SLF001
    assert monitor.wait_analysed(budget(10))  # else 14 would replace 9 in the slot
    bad = _record(14)
    bad.columns["step_seconds"][1] = -np.inf
    monitor._hand_over(bad)  # noqa: SLF001 - the thread's path
    monitor.close()
    assert monitor.stats.bad_rows == 2 and monitor.stats.internal_errors == 0
    assert [w.step for w in monitor.windows] == [4, 9, 14]


def test_notes_go_with_the_window_they_were_noted_in(tmp_path):
    path = tmp_path / "windows.jsonl"
    monitor = _rank0([], windows_path=str(path))
    monitor.note("loss", 2.0)
    monitor._hand_over(_record(4))  # noqa: SLF001 - notes taken on the training thread here
    monitor.note("loss", 1.0)  # the next window's, whenever the thread writes line 4
    monitor._hand_over(_record(9))  # noqa: SLF001
    monitor.close()
    import json

    lines = [json.loads(line) for line in path.read_text().splitlines()]
    by_step = {doc["step"]: doc["notes"] for doc in lines}
    assert by_step.get(4, {"loss": 2.0}) == {"loss": 2.0} and by_step[9] == {"loss": 1.0}


def test_full_windows_are_bounded_in_bytes_and_every_window_is_summarised():
    ranks = 1000
    one = 5 * ranks * 8  # five float64 columns
    history = WindowHistory(max_windows=6, full_bytes=3 * one)
    for step in range(10):
        history.add(_record(step, ranks), {1: 0.5, 7: 3.0, 3: float("nan")},
                    [_finding("x", step)])
    assert [w.step for w in history.windows] == [7, 8, 9] and history.nbytes == 3 * one
    assert [s.step for s in history.summaries] == [4, 5, 6, 7, 8, 9]
    tiny = WindowHistory(max_windows=6, full_bytes=0)
    tiny.add(_record(1, ranks), {}, [])
    assert len(tiny.windows) == 1  # the latest is kept whatever its size
    assert len(WindowHistory(max_windows=0, full_bytes=1 << 30).summaries) == 0


def test_a_summary_holds_the_quantiles_the_invalid_counts_and_the_top_scores():
    record = _record(9, ranks=101)
    record.columns["compute_seconds"][5] = np.nan
    record.columns["step_seconds"][:] = np.inf
    summary = summarise(record, {5: 0.1, 9: 4.0, 3: 2.0}, [_finding("x", 9)])
    compute = record["compute_seconds"]
    expected = np.nanquantile(compute, [0, 0.25, 0.5, 0.75, 1.0])
    assert np.allclose(list(summary.column("compute_seconds").values()), expected)
    assert summary.invalid.tolist() == [1, 0, 0, 101, 101]
    assert np.isnan(summary.column("step_seconds")["median"])
    assert summary.top_scores == ((9, 4.0), (3, 2.0), (5, 0.1))
    assert (summary.raised, summary.cleared, summary.ranks) == (1, 0, 101)
    with pytest.raises(KeyError):
        summary.column("nope")
