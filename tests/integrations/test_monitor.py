"""TrainingMonitor and CommTimer: real UDP sockets, real torch futures, a real 2-rank gloo job."""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from support import budget  # noqa: E402

from laggard.detectors.finding import Finding, Severity  # noqa: E402
from laggard.detectors.window import (  # noqa: E402
    STEP_COLUMN_NAMES,
    WindowColumn,
    WindowRecord,
)
from laggard.integrations.agent_reports import MAX_BACKLOG_DATAGRAMS  # noqa: E402
from laggard.integrations.comm_timing import CommTimer  # noqa: E402
from laggard.integrations.monitor import TrainingMonitor  # noqa: E402
from laggard.integrations.participants import WindowOutcome, WindowParticipant  # noqa: E402
from laggard.wire import Heartbeat, StepRecord, WindowReport, decode_datagram  # noqa: E402

HERE = Path(__file__).resolve().parent


def _recv(sock: socket.socket) -> StepRecord | WindowReport:
    """The next step record or window report (the heartbeat thread's datagrams skipped)."""
    while True:
        item = decode_datagram(sock.recv(65536))
        if not isinstance(item, Heartbeat):
            return item


def _monitor(port: int, **kwargs) -> TrainingMonitor:
    kwargs.setdefault("rank", 1)
    kwargs.setdefault("world_size", 4)
    kwargs.setdefault("local_rank", 1)
    config = TrainingMonitor.Config(agent_address=f"127.0.0.1:{port}", detect=False,
                                    node="node07")
    return TrainingMonitor(config, **kwargs)


def test_one_step_record_per_step_with_the_phases(receiver):
    monitor = _monitor(receiver.getsockname()[1])
    for _ in range(3):
        with monitor.step():
            with monitor.phase("data"):
                pass
            with monitor.phase("forward"):
                torch.ones(64, 64) @ torch.ones(64, 64)
            with monitor.phase("backward"):
                pass
            with monitor.phase("backward"):  # a phase entered twice in a step adds up
                pass
    records = [_recv(receiver) for _ in range(3)]
    assert [r.step for r in records] == [0, 1, 2]
    for r in records:
        assert (r.rank, r.world_size, r.local_rank, r.node) == (1, 4, 1, "node07")
        assert set(r.phases) == {"data", "forward", "backward"}
        assert r.step_seconds >= sum(r.phases.values())
        assert r.collective_wait_seconds == 0.0
    assert monitor.stats.records_sent == 3
    assert monitor.stats.send_errors == monitor.stats.internal_errors == 0
    monitor.close()


def test_a_collective_wait_phase_is_reported_as_collective_wait(receiver):
    monitor = _monitor(receiver.getsockname()[1])
    with monitor.step():
        with monitor.phase("forward"):
            pass
        with monitor.phase("collective_wait"):
            time.sleep(0.01)
    record = _recv(receiver)
    assert "collective_wait" not in record.phases
    assert record.collective_wait_seconds >= 0.01
    monitor.close()


def test_exposed_collective_time_moves_from_backward_to_collective_wait(receiver):
    timer = CommTimer()
    monitor = _monitor(receiver.getsockname()[1], comm_timer=timer)
    with monitor.step():
        with monitor.phase("forward"):
            pass
        with monitor.phase("backward"):
            # a bucket ready at the end of backward whose collective completes 50 ms later:
            # all of that is exposed wait, none of it this rank's backward work
            fut = torch.futures.Future()
            timer.track(fut, nbytes=4096, raw_bytes=8192)
            time.sleep(0.05)
            fut.set_result([torch.zeros(1)])
    record = _recv(receiver)
    assert record.collective_wait_seconds >= 0.05
    assert record.phases["backward"] < record.collective_wait_seconds
    assert [(c.op, c.bytes) for c in record.collectives] == [("allreduce", 4096)]
    assert record.comm["bytes"] == 4096 and record.comm["raw_bytes"] == 8192
    assert record.comm["exposed_seconds"] == pytest.approx(record.collective_wait_seconds)
    monitor.close()


def test_thread_cpu_phases_count_work_not_waiting(receiver):
    monitor = TrainingMonitor(
        TrainingMonitor.Config(agent_address=f"127.0.0.1:{receiver.getsockname()[1]}",
                               detect=False, phase_clock="thread_cpu"),
        comm_timer=CommTimer())
    with monitor.step():
        with monitor.phase("forward"):
            time.sleep(0.05)  # a thread that waits uses no CPU time
        with monitor.phase("backward"):
            deadline = time.thread_time() + 0.02
            while time.thread_time() < deadline:
                pass
    record = _recv(receiver)
    assert record.phases["forward"] < 0.01
    assert record.phases["backward"] >= 0.02
    assert record.step_seconds >= 0.07  # step time stays wall time
    with pytest.raises(ValueError, match="phase_clock"):
        TrainingMonitor.Config(phase_clock="gpu")
    monitor.close()


def test_comm_timer_overlapping_buckets_are_not_double_counted():
    timer = CommTimer()
    first, second = torch.futures.Future(), torch.futures.Future()
    timer.track(first, 100)
    timer.track(second, 200)  # launched while the first is in flight
    time.sleep(0.02)
    first.set_result(1)
    second.set_result(2)
    step = timer.take_step()
    assert len(step.collectives) == 2 and step.bytes == 300
    longest = max(c.seconds for c in step.collectives)
    # the union of [launch, completion]: the longest interval plus the few microseconds
    # between the two launches and the two completions, not the sum (about twice as much)
    assert longest <= step.total_seconds < longest + 0.005
    assert sum(c.seconds for c in step.collectives) > 1.5 * step.total_seconds
    assert step.hidden_seconds == pytest.approx(step.total_seconds - step.exposed_seconds)
    assert timer.take_step().collectives == []  # taken once


def test_comm_timer_keeps_collectives_in_flight_for_the_next_step():
    timer = CommTimer()
    fut = torch.futures.Future()
    timer.track(fut, 100)
    assert timer.take_step().collectives == []
    fut.set_result(0)
    assert [c.bytes for c in timer.take_step().collectives] == [100]


def test_monitor_never_raises_when_the_agent_is_down():
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nobody listens there
    monitor = _monitor(port)
    for _ in range(20):
        with monitor.step():
            with monitor.phase("forward"):
                pass
    # the kernel answers the first datagram with ICMP port unreachable; later sends report
    # ECONNREFUSED, which the monitor counts
    assert monitor.step_index == 20
    assert monitor.stats.send_errors > 0
    assert monitor.stats.records_sent + monitor.stats.send_errors == 20
    monitor.close()


class _FailingSocket:
    def __init__(self, exc: OSError) -> None:
        self.exc = exc

    def send(self, payload: bytes) -> int:
        raise self.exc

    def close(self) -> None:
        pass


def test_full_socket_buffer_and_socket_errors_are_counted(receiver):
    monitor = _monitor(receiver.getsockname()[1])
    monitor._agent.sock = _FailingSocket(BlockingIOError(11, "EAGAIN"))
    # A refused datagram is kept to send first next step; past the backlog the oldest drops.
    for _ in range(MAX_BACKLOG_DATAGRAMS + 1):
        with monitor.step():
            pass
    assert (monitor.stats.send_dropped, monitor.stats.send_errors) == (1, 0)
    monitor._agent.sock = _FailingSocket(OSError(101, "Network is unreachable"))
    with monitor.step():  # its record overflows the backlog; then all the backlog fails
        pass
    assert (monitor.stats.send_dropped, monitor.stats.send_errors) == (
        2, MAX_BACKLOG_DATAGRAMS)
    monitor.close()


class _BrokenTimer:
    def take_step(self):
        raise RuntimeError("a bug in a hook")


def test_monitor_failures_stay_inside_and_training_errors_pass_through(receiver, caplog):
    monitor = _monitor(receiver.getsockname()[1], comm_timer=_BrokenTimer())
    with caplog.at_level(logging.WARNING, logger="laggard.integrations.monitor"):
        for _ in range(3):
            with monitor.step():
                pass
    assert monitor.stats.internal_errors == 3
    assert monitor.step_index == 3
    assert sum("monitor error" in r.message for r in caplog.records) == 1  # logged once
    with pytest.raises(ValueError, match="from the training code"):
        with monitor.step():
            raise ValueError("from the training code")
    monitor.close()


def test_invalid_configuration_is_rejected_before_training():
    with pytest.raises(ValueError):
        TrainingMonitor.Config(agent_address="no-port")
    with pytest.raises(ValueError):
        TrainingMonitor.Config(window_steps=1)


def test_agent_address_empty_sends_nothing():
    monitor = TrainingMonitor(TrainingMonitor.Config(agent_address="", detect=False))
    with monitor.step():
        pass
    assert monitor.stats.records_sent == monitor.stats.send_errors == 0
    assert (monitor.rank, monitor.world_size) == (0, 1)


def _window(rng: np.random.Generator, step: int, slow_rank: int | None,
            ranks: int = 4) -> WindowRecord:
    """A gathered window: 30 ms compute, 10 ms wait, a few % of noise."""
    compute = 0.030 * (1 + 0.01 * rng.standard_normal(ranks))
    wait = 0.010 * (1 + 0.01 * rng.standard_normal(ranks))
    if slow_rank is not None:
        compute[slow_rank] *= 1.3
        wait[slow_rank] = 0.001  # the others wait for it; it waits least
    columns = {"compute_seconds": compute, "data_seconds": np.full(ranks, 0.001),
               "collective_wait_seconds": wait, "transfer_seconds": np.full(ranks, np.nan),
               "step_seconds": np.full(ranks, compute.max() + 0.003),
               "collective_seconds": wait + 0.002, "comm_bytes": np.full(ranks, 1e6),
               # the device clock's columns, as a monitor on the wall clock fills them
               "compute_device_seconds": np.full(ranks, np.nan), "compute_cpu_seconds": compute,
               "collective_wait_device_seconds": np.full(ranks, np.nan),
               "device_pending_count": np.zeros(ranks),
               # no collection, no work noted
               "gc_seconds": np.zeros(ranks), "gc_generation": np.full(ranks, -1.0),
               "tokens": np.full(ranks, np.nan), "samples": np.full(ranks, np.nan),
               "p2p_wait_seconds": np.zeros(ranks)}
    return WindowRecord(step=step, columns=columns, ranks=np.arange(ranks), world_size=ranks,
                        nodes=["node07"] * ranks)


def test_rank0_logs_a_straggler_once_when_raised_and_once_when_cleared(receiver, caplog):
    monitor = _monitor(receiver.getsockname()[1], rank=0)
    rng = np.random.default_rng(0)
    plan = [None] * 6 + [2] * 8 + [None] * 8
    with caplog.at_level(logging.WARNING, logger="laggard.integrations.monitor"):
        for i, slow in enumerate(plan):
            monitor.analyse(_window(rng, 20 * i + 19, slow))
    messages = [r.getMessage() for r in caplog.records]
    raised = [m for m in messages if "straggler: rank 2" in m]
    cleared = [m for m in messages if "cleared" in m]
    assert len(raised) == 1 and len(cleared) == 1, messages
    assert [f.rank for f in monitor.findings] == [2]
    assert [f.rank for f in monitor.cleared] == [2]
    assert 6 * 20 <= monitor.findings[0].step < 14 * 20
    assert len(monitor.windows) == len(plan)

    monitor.close()
    sent = []
    while not (sent and isinstance(sent[-1], WindowReport) and sent[-1].end):
        sent.append(_recv(receiver))
    assert all(isinstance(r, WindowReport) for r in sent)
    # each window: its scores and findings, then (while the straggler holds) its active one
    reports = [r for r in sent if r.scores]
    assert len(reports) == len(plan)
    assert all(set(r.scores) == {0, 1, 2, 3} for r in reports)
    flagged = [f for r in reports for f in r.findings if not f.get("cleared")]
    ended = [f for r in reports for f in r.findings if f.get("cleared")]
    assert [f["rank"] for f in flagged] == [2] and [f["rank"] for f in ended] == [2]
    assert reports[-1].comm["bytes"] == 1e6
    assert reports[-1].detector_stats["windows"] == len(reports)  # rank 0 counts every window
    held = [r for r in sent if r.active]
    raised_at, cleared_at = flagged[0]["step"], ended[0]["step"]
    assert [r.step for r in held] == [r.step for r in reports
                                      if raised_at <= r.step < cleared_at]
    assert all([f["rank"] for f in r.active] == [2] for r in held)
    assert sent[-1].end and sent[-1].run == monitor._agent.run and not sent[-1].findings
    assert monitor.stats.active_left_out == 0
    # the log says the evidence in words, not as a Python dict
    assert "{" not in raised[0] and "':" not in raised[0], raised[0]
    assert re.search(r"forward\+backward \d+% slower than the median rank in its last 3 "
                     r"windows .*\(step \d+; evidence \d\.\d\d of 1 decision interval, "
                     r"rank-to-rank noise \d+\.\d% of a step's work\)$", raised[0]), raised[0]
    assert cleared[0].startswith("laggard: rank 2: compute slowdown cleared (recovered)")


def test_other_findings_log_their_evidence_fields_in_words():
    from laggard.integrations.finding_log import evidence_text

    text = evidence_text({"slowdown": 0.123456, "threshold": 0.1, "ranks": 4,
                           "gpu_state": {"reason": "x"}, "cause": None})
    assert text == "evidence: slowdown 0.1235, threshold 0.1, ranks 4"
    assert evidence_text({}) == "evidence: none"


@pytest.mark.slow
def test_comm_timing_hook_on_a_real_two_rank_gloo_job(tmp_path):
    """Rank 1 sleeps 0.3 s before backward from step 2: rank 0's exposed wait holds it."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         str(HERE / "comm_timing_worker.py"), str(tmp_path)],
        env=env, capture_output=True, text=True, timeout=budget(120),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    for rank in ranks:
        assert rank["dropped"] == 0
        for step in rank["steps"]:
            assert step["grads_match"]  # the hook averages exactly like DDP's all-reduce
            assert step["bytes"] == step["raw_bytes"] == rank["grad_bytes"]
            assert sum(c[2] for c in step["collectives"]) == rank["grad_bytes"]
            assert 0 <= step["exposed"] <= step["total"] + 1e-9
            assert step["hidden"] == pytest.approx(step["total"] - step["exposed"])
        # DDP rebuilds its buckets after the first step: 0.3 MB at bucket_cap_mb=0.1 is
        # several buckets from then on
        assert all(len(s["collectives"]) >= 2 for s in rank["steps"][1:])
    waiting, late = ranks[0]["steps"], ranks[1]["steps"]
    for step in (2, 3, 4):
        assert waiting[step]["exposed"] >= 0.25
        assert late[step]["exposed"] < waiting[step]["exposed"] - 0.2


def test_rank0_saves_each_window_as_a_json_line_with_its_notes(receiver, tmp_path):
    path = tmp_path / "windows.jsonl"
    config = TrainingMonitor.Config(agent_address=f"127.0.0.1:{receiver.getsockname()[1]}",
                                    detect=False, node="node07", windows_path=str(path))
    monitor = TrainingMonitor(config, rank=0, world_size=4)
    rng = np.random.default_rng(1)
    plan = [None] * 6 + [2] * 6
    for i, slow in enumerate(plan):
        monitor.note("loss", 3.0 - 0.1 * i)
        monitor.note("loss", float("nan"))  # dropped, not averaged in
        monitor.analyse(_window(rng, 20 * i + 19, slow))
    monitor.close()
    docs = [json.loads(line) for line in path.read_text().splitlines()]
    assert [d["step"] for d in docs] == [20 * i + 19 for i in range(len(plan))]
    assert docs[0]["stat_names"] == list(STEP_COLUMN_NAMES)
    transfer = STEP_COLUMN_NAMES.index("transfer_seconds")
    assert len(docs[0]["medians"]) == 4 and docs[0]["medians"][0][transfer] is None
    assert [d["notes"]["loss"] for d in docs[:2]] == [3.0, 2.9]
    raised = [f for d in docs for f in d["findings"] if not f.get("cleared")]
    assert [f["rank"] for f in raised] == [2] and monitor.stats.save_errors == 0


def test_an_unwritable_windows_path_is_counted_never_raised(receiver, tmp_path):
    config = TrainingMonitor.Config(agent_address="", detect=False,
                                    windows_path=str(tmp_path / "missing-dir" / "w.jsonl"))
    monitor = TrainingMonitor(config, rank=0, world_size=4)
    rng = np.random.default_rng(2)
    for i in range(3):
        monitor.analyse(_window(rng, 20 * i + 19, None))
    assert monitor.stats.save_errors == 3
    monitor.close()


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full")
def test_a_full_disk_is_counted_per_window_logged_once_and_training_goes_on(receiver, caplog):
    """/dev/full opens and takes a write into the file's buffer: the error comes at the flush."""
    port = receiver.getsockname()[1]
    config = TrainingMonitor.Config(agent_address=f"127.0.0.1:{port}", detect=False,
                                    windows_path="/dev/full")
    monitor = TrainingMonitor(config, rank=0, world_size=4)
    rng = np.random.default_rng(3)
    with caplog.at_level(logging.WARNING, logger="laggard.integrations.monitor"):
        for i in range(4):
            monitor.analyse(_window(rng, 20 * i + 19, None))
        monitor.close()
    assert monitor.stats.save_errors == 4  # every window, none twice
    assert monitor.save_error == "[Errno 28] No space left on device"
    assert monitor.stats.internal_errors == 0  # close() did not trip over the unflushed file
    said = [r.getMessage() for r in caplog.records if "windows file" in r.getMessage()]
    assert len(said) == 1, said
    assert said[0].startswith("laggard: cannot write the windows file /dev/full: ")
    assert "No space left on device" in said[0]
    assert len(monitor.windows) == 4  # the windows were still analysed and kept
    assert all(isinstance(_recv(receiver), WindowReport)
               for _ in range(4))  # and sent to the agent


class _CountingParticipant(WindowParticipant):
    """A participant of a test's own: one column, a finding when its column disagrees."""

    name = "counter"
    columns = (WindowColumn("things_total", "count", "sum", "things seen"),)

    def __init__(self) -> None:
        super().__init__()
        self.windows = 0

    def on_window(self, record: WindowRecord) -> WindowOutcome | None:
        self.windows += 1
        values = record["things_total"]
        if np.ptp(values) > 0:
            return WindowOutcome(findings=[Finding(
                detector="counter", kind="disagree", severity=Severity.INFO, step=record.step,
                message=f"ranks disagree: {values.tolist()}")])
        return None


class _BrokenParticipant(WindowParticipant):
    name = "broken"

    def end_step(self, step: int, column: int) -> None:
        raise RuntimeError("a participant's bug")

    def on_window(self, record: WindowRecord) -> WindowOutcome | None:
        raise RuntimeError("a participant's bug")


def test_a_participant_of_ones_own_gets_its_column_and_a_broken_one_stops_nothing(receiver):
    counter = _CountingParticipant()
    monitor = _monitor(receiver.getsockname()[1], rank=0,
                       participants=[_BrokenParticipant(), counter])
    assert "things_total" in monitor.layout and monitor.participant("counter") is counter
    with monitor.step():  # the broken participant's end_step is counted, the record still sent
        pass
    assert isinstance(_recv(receiver), StepRecord)
    rng = np.random.default_rng(3)
    record = _window(rng, 19, None)
    record.columns["things_total"] = np.array([1.0, 1.0, 2.0, 1.0])
    found = monitor.analyse(record)
    assert [f.kind for f in found] == ["disagree"] and counter.windows == 1
    assert monitor.stats.internal_errors == 2  # end_step and on_window, each counted
    report = _recv(receiver)
    assert isinstance(report, WindowReport)
    assert [f["detector"] for f in report.findings] == ["counter"]
    monitor.close()


def test_two_participants_declaring_one_column_are_refused_at_construction():
    with pytest.raises(ValueError, match="declared twice"):
        TrainingMonitor(TrainingMonitor.Config(agent_address="", detect=False),
                        participants=[_CountingParticipant(), _CountingParticipant()])


def test_more_findings_than_one_report_holds_go_out_in_several_reports(receiver):
    class Many(WindowParticipant):
        name = "many"

        def on_window(self, record: WindowRecord) -> WindowOutcome:
            return WindowOutcome(findings=[Finding(
                detector="many", kind="x", severity=Severity.INFO, rank=r % 4,
                message=f"finding {r}") for r in range(40)])

    monitor = _monitor(receiver.getsockname()[1], rank=0, participants=[Many()])
    monitor.analyse(_window(np.random.default_rng(4), 19, None))
    reports = [_recv(receiver) for _ in range(3)]
    assert [len(r.findings) for r in reports] == [16, 16, 8]
    assert set(reports[0].scores) == {0, 1, 2, 3} and not reports[1].scores
    monitor.close()


def test_step_records_and_window_reports_carry_the_run(receiver, monkeypatch):
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "elastic-7")
    port = receiver.getsockname()[1]
    from_env = _monitor(port, rank=0)
    assert from_env.run == "elastic-7"
    from_env.close()
    end = _recv(receiver)  # rank 0's close ends its run on the agent
    assert isinstance(end, WindowReport) and end.end and end.run == "elastic-7"
    config = TrainingMonitor.Config(agent_address=f"127.0.0.1:{port}", detect=False,
                                    run="job 42/step\x07")  # sanitised on the wire
    monitor = TrainingMonitor(config, rank=0, world_size=4)
    with monitor.step():
        pass
    record = _recv(receiver)
    assert isinstance(record, StepRecord) and record.run == monitor.run
    assert monitor.run and "\x07" not in monitor.run and " " not in monitor.run
    monitor.analyse(_window(np.random.default_rng(5), 19, None))
    report = _recv(receiver)
    assert isinstance(report, WindowReport) and report.run == monitor.run
    monitor.close()


def test_the_default_target_is_the_agents_socket_falling_back_to_udp(monkeypatch):
    monkeypatch.delenv("LAGGARD_INTAKE", raising=False)
    monitor = TrainingMonitor(TrainingMonitor.Config(detect=False), rank=0, world_size=1)
    assert monitor.config.agent_address == "/run/laggard/intake.sock"
    with monitor.step():
        pass
    assert monitor.stats.records_sent + monitor.stats.send_errors == 1  # sent or counted
    monitor.close()


def test_the_device_clocks_first_window_is_not_bad_input_for_the_detector(receiver):
    monitor = _monitor(receiver.getsockname()[1], rank=0)
    record = _window(np.random.default_rng(6), 19, None)
    record.columns["compute_seconds"] = np.full(4, np.nan)  # one window late: nothing yet
    record.columns["compute_device_seconds"] = np.full(4, np.nan)
    monitor.analyse(record)
    straggler = monitor.participant("straggler")
    assert straggler.device_windows_skipped == 1
    assert straggler.detector.stats["invalid_durations"] == 0
    monitor.analyse(_window(np.random.default_rng(7), 39, None))  # a CPU-clock record goes in
    assert straggler.detector.stats["windows"] == 1
    monitor.close()


def test_tokens_and_samples_are_noted_on_every_rank_per_step_and_bad_ones_counted(receiver,
                                                                                   caplog):
    monitor = _monitor(receiver.getsockname()[1], rank=3)  # not rank 0, no windows path
    with caplog.at_level(logging.WARNING, logger="laggard.integrations.monitor"):
        for step, notes in enumerate([[512, 488], [], [1000.0], [-1, float("nan"), "many",
                                                                  True, torch.ones(2)]]):
            with monitor.step():
                for n in notes:
                    monitor.note("tokens", n)
                if step == 0:
                    monitor.note("samples", torch.tensor(8))  # a 1-element tensor is a number
    rows = {name: monitor._table.values[STEP_COLUMN_NAMES.index(name), :4].tolist()
            for name in ("tokens", "samples")}
    assert rows["tokens"][:3] == [1000.0, pytest.approx(float("nan"), nan_ok=True), 1000.0]
    assert rows["tokens"][3] != rows["tokens"][3]  # only bad notes: not noted
    assert rows["samples"][0] == 8.0 and all(v != v for v in rows["samples"][1:])
    assert monitor.stats.bad_notes == 5
    assert sum("stats.bad_notes" in r.getMessage() for r in caplog.records) == 1  # logged once
    monitor.close()


def test_a_gc_straggler_reaches_the_log_and_the_agent_as_kind_gc(receiver, caplog):
    monitor = _monitor(receiver.getsockname()[1], rank=0)
    rng = np.random.default_rng(3)
    plan = [None] * 6 + [2] * 8
    with caplog.at_level(logging.WARNING, logger="laggard"):
        for i, slow in enumerate(plan):
            record = _window(rng, 20 * i + 19, slow)
            if slow is not None:  # of its 9 ms excess, 8 ms are collections
                record.columns["gc_seconds"][slow] = 0.008
                record.columns["gc_generation"][slow] = 1
            # a token note on one rank only: not work-normalised, logged once
            record.columns["tokens"][1] = 512
            monitor.analyse(record)
    assert [(f.rank, f.kind) for f in monitor.findings] == [(2, "gc")]
    assert "Python garbage collection" in monitor.findings[0].message
    reports = [_recv(receiver) for _ in plan]
    assert [(f["rank"], f["kind"]) for r in reports for f in r.findings] == [(2, "gc")]
    messages = [r.getMessage() for r in caplog.records]
    assert sum("on every rank, every step" in m for m in messages) == 1
    assert monitor.participant("straggler").causes.stats["partial_work_notes"] == len(plan)
    monitor.close()
