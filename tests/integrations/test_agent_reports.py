"""What the monitor sends its agent (``integrations/agent_reports.py``), on a loopback socket."""

from __future__ import annotations

import socket

import numpy as np
import pytest

from laggard.detectors.finding import Finding, Severity
from laggard.detectors.window import WindowRecord
from laggard.integrations.agent_reports import (
    BATCH_SECONDS,
    MAX_ACTIVE_SENT,
    MAX_BACKLOG_DATAGRAMS,
    MAX_COLLECTIVES_PER_RECORD,
    AgentReports,
    active_reports,
    capped,
    note_held,
    window_reports,
)
from laggard.integrations.monitor_config import MonitorStats
from laggard.integrations.participants import WindowOutcome
from laggard.integrations.phases import StepTimes
from laggard.wire import (
    MAX_DATAGRAM_BYTES,
    MAX_REPORT_FINDINGS,
    MAX_REPORT_RANKS,
    CollectiveTiming,
    decode_datagram,
    split_batch,
)


def _reports(address: str, stats: MonitorStats, logged: list[str]) -> AgentReports:
    return AgentReports(address, stats=stats, log_once=lambda key, *a: logged.append(key),
                        rank=1, world_size=4, local_rank=1, node="node07", run="r1",
                        device_id=None)


def test_a_step_record_carries_the_rank_and_the_step(receiver: socket.socket) -> None:
    stats, logged = MonitorStats(), []
    agent = _reports(f"127.0.0.1:{receiver.getsockname()[1]}", stats, logged)
    times = StepTimes(phases={"forward": 0.02}, compute_seconds=0.02, data_seconds=0.0,
                      collective_wait_seconds=0.003, collective_seconds=0.003, comm_bytes=0.0,
                      step_seconds=0.03)
    agent.send_step(7, times, None)
    record = decode_datagram(receiver.recv(65536))
    assert (record.rank, record.world_size, record.step, record.run, record.node) == (
        1, 4, 7, "r1", "node07")
    assert record.phases == {"forward": 0.02} and stats.records_sent == 1
    agent.close()
    agent.send_step(8, times, None)  # closed: nothing, no error
    assert stats.records_sent == 1 and stats.send_errors == 0 and not logged


def test_no_address_sends_nothing_and_a_bad_one_is_counted_once() -> None:
    stats, logged = MonitorStats(), []
    assert _reports("", stats, logged).sock is None

    class Failing:
        def send(self, payload: bytes) -> int:
            raise OSError(101, "Network is unreachable")

    agent = _reports("", stats, logged)
    agent.sock = Failing()
    agent.send(b"x")
    agent.send(b"x")
    assert stats.send_errors == 2 and set(logged) == {"send"}  # one key: LogOnce logs it once


def test_many_collectives_are_merged_per_op() -> None:
    few = [CollectiveTiming("allreduce", 0.001, 10)] * MAX_COLLECTIVES_PER_RECORD
    assert capped(few) is few
    many = few + [CollectiveTiming("allgather", 0.002, 5)]
    merged = {c.op: (round(c.seconds, 6), c.bytes) for c in capped(many)}
    assert merged == {"allreduce": (0.032, 320), "allgather": (0.002, 5)}


def test_a_window_goes_out_in_reports_of_bounded_size() -> None:
    ranks = MAX_REPORT_RANKS + 10
    record = WindowRecord(step=19, columns={"collective_seconds": np.full(ranks, 0.5),
                                            "collective_wait_seconds": np.full(ranks, np.nan)},
                          ranks=np.arange(ranks), world_size=ranks)
    findings = [Finding(detector="d", kind="k", severity=Severity.INFO, message=str(i), rank=i)
                for i in range(MAX_REPORT_FINDINGS * 2 + 1)]
    outcome = WindowOutcome(findings=findings, scores={r: float(r) for r in range(ranks)})
    reports = window_reports(record, outcome, run="r1")
    assert [len(r.findings) for r in reports] == [MAX_REPORT_FINDINGS, MAX_REPORT_FINDINGS, 1]
    assert set(reports[0].scores) == set(range(10, ranks))  # the highest scores
    assert reports[0].comm == {"total_seconds": 0.5, "exposed_seconds": 0.0, "bytes": 0.0}
    assert all(r.run == "r1" and r.step == 19 for r in reports)


def _straggler(rank: int, *, cleared: bool = False, severity: Severity = Severity.WARNING,
               message: str = "slow") -> Finding:
    raised = Finding(detector="straggler", kind="compute", severity=severity, message=message,
                     rank=rank, step=19)
    return raised.clear(step=39, reason="recovered", message="ok") if cleared else raised


def _window(step: int, ranks: int = 4) -> WindowRecord:
    return WindowRecord(step=step, columns={}, ranks=np.arange(ranks), world_size=ranks)


def test_active_findings_go_with_every_window_until_cleared_and_close_sends_the_end(
        receiver: socket.socket) -> None:
    stats, logged = MonitorStats(), []
    agent = _reports(f"127.0.0.1:{receiver.getsockname()[1]}", stats, logged)
    integrity = Finding(detector="integrity", kind="nonfinite", severity=Severity.CRITICAL,
                        message="nan", rank=1, step=19)
    windows = [[_straggler(2), integrity], [], [_straggler(2, cleared=True)], []]
    sent = []
    for i, findings in enumerate(windows):
        agent.send_window(_window(20 * i + 19), WindowOutcome(findings=findings))
    agent.send_end()
    agent.close()
    agent.send_end()  # closed: nothing more
    receiver.settimeout(5)
    while not (sent and sent[-1].end):
        sent.append(decode_datagram(receiver.recv(65536)))
    held = [(r.step, [f["rank"] for f in r.active]) for r in sent if r.active]
    assert held == [(19, [2]), (39, [2])]  # an integrity finding is an event: not held
    end = sent[-1]
    assert (end.run, end.step, end.world_size, end.findings, end.scores) == ("r1", 79, 4, [], {})
    assert stats.active_left_out == 0 and stats.send_errors == 0
    receiver.settimeout(0.2)
    with pytest.raises(TimeoutError):
        receiver.recv(65536)


def test_active_findings_are_bounded_and_what_does_not_fit_is_counted() -> None:
    many = [_straggler(r).to_dict() for r in range(MAX_ACTIVE_SENT + 5)]
    many[-1]["severity"] = "critical"  # the most severe go first
    reports, left_out = active_reports(many, step=9, world_size=10_000, run="r1")
    sent = [f for r in reports for f in r.active]
    assert len(sent) == MAX_ACTIVE_SENT and left_out == 5
    assert sent[0]["rank"] == MAX_ACTIVE_SENT + 4
    assert all(len(r.active) <= MAX_REPORT_FINDINGS and len(r.encode()) <= MAX_DATAGRAM_BYTES
               and not r.findings and not r.scores for r in reports)
    # large findings: fewer to a datagram, none over the limit; one too large alone is left out
    big = [_straggler(r, message="x" * 2000).to_dict() for r in range(6)]
    huge = _straggler(7, message="y" * MAX_DATAGRAM_BYTES).to_dict()
    reports, left_out = active_reports([*big, huge], step=9, world_size=8)
    assert left_out == 1 and sum(len(r.active) for r in reports) == 6
    assert all(len(r.encode()) <= MAX_DATAGRAM_BYTES for r in reports) and len(reports) >= 2
    assert all(decode_datagram(r.encode()).active == r.active for r in reports)


def test_a_clear_matches_its_raise_by_subject() -> None:
    active: dict = {}
    note_held(active, [_straggler(1).to_dict(), _straggler(2).to_dict()])
    note_held(active, [_straggler(1, cleared=True).to_dict()])
    assert [d["rank"] for d in active.values()] == [2]
_TIMES = StepTimes(phases={"forward": 0.02}, compute_seconds=0.02, data_seconds=0.0,
                   collective_wait_seconds=0.0, collective_seconds=0.0, comm_bytes=0.0,
                   step_seconds=0.03)


def _unix_reports(path: str, stats: MonitorStats, logged: list, now: list[float],
                  **kwargs: object) -> AgentReports:
    return AgentReports(path, stats=stats, log_once=lambda key, msg, *a: logged.append(
        (key, msg % a)), rank=1, world_size=4, local_rank=1, node="n", run="r1",
        device_id=None, clock=lambda: now[0], **kwargs)


def _records(payload: bytes) -> list[int]:
    split = split_batch(payload)
    lines = [payload] if split is None else split[1]
    return [decode_datagram(line).step for line in lines]


def test_fast_steps_share_a_datagram_slow_ones_go_at_once(tmp_path) -> None:
    path = str(tmp_path / "intake.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as receiver:
        receiver.bind(path)
        receiver.settimeout(2)
        stats, logged, now = MonitorStats(), [], [100.0]
        agent = _unix_reports(path, stats, logged, now)
        agent.send_step(0, _TIMES, None)  # the first goes at once
        assert _records(receiver.recv(MAX_DATAGRAM_BYTES)) == [0]
        for step in range(1, 11):  # 10 ms apart: batched until BATCH_SECONDS passed
            now[0] += 0.01
            agent.send_step(step, _TIMES, None)
        now[0] += BATCH_SECONDS
        agent.send_step(11, _TIMES, None)
        assert _records(receiver.recv(MAX_DATAGRAM_BYTES)) == list(range(1, 12))
        now[0] += 1.0  # a slow step: at once
        agent.send_step(12, _TIMES, None)
        assert _records(receiver.recv(MAX_DATAGRAM_BYTES)) == [12]
        now[0] += 0.01
        agent.send_step(13, _TIMES, None)
        agent.close()  # what is batched goes at close
        assert _records(receiver.recv(MAX_DATAGRAM_BYTES)) == [13]
        assert stats.records_sent == 14 and stats.batches_sent == 1
        assert stats.send_dropped == stats.send_errors == 0 and not logged


def test_a_full_queue_keeps_a_backlog_then_drops_counted_and_warned_once(tmp_path) -> None:
    path = str(tmp_path / "intake.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as receiver:
        receiver.bind(path)
        stats, logged, now = MonitorStats(), [], [100.0]
        agent = _unix_reports(path, stats, logged, now, batch_seconds=0.0)  # one a datagram
        sent = 0
        # Nobody reads: the kernel's queue fills (net.unix.max_dgram_qlen), then the backlog.
        while stats.send_dropped == 0:
            agent.send_step(sent, _TIMES, None)
            sent += 1
            now[0] += 0.001
            assert sent < 100_000
        queued = stats.records_sent
        assert sent == queued + MAX_BACKLOG_DATAGRAMS + 1  # the backlog held the rest
        for _ in range(3):
            agent.send_step(sent, _TIMES, None)
            sent += 1
        assert stats.send_dropped == 4 and not logged  # said once, a second after the first
        now[0] += 1.5
        agent.send_step(sent, _TIMES, None)
        sent += 1
        receiver.settimeout(2)
        got = [_records(receiver.recv(MAX_DATAGRAM_BYTES))[0] for _ in range(queued)]
        assert got == list(range(queued))  # in order
        agent.close()  # the queue has room again: the backlog goes
        receiver.settimeout(0.5)
        rest = []
        try:
            while True:
                rest += _records(receiver.recv(MAX_DATAGRAM_BYTES))
        except TimeoutError:
            pass
        assert stats.records_sent + stats.send_dropped == sent
        assert len(rest) == stats.records_sent - queued and rest == sorted(rest)
        warned = [msg for key, msg in logged if key == "dropped"]
        assert len(warned) == 1 and "sysctl -w net.unix.max_dgram_qlen=" in warned[0]
        assert f"5 records dropped at the agent's socket unix:{path}" in warned[0]


def test_a_window_follows_its_batched_steps(tmp_path) -> None:
    path = str(tmp_path / "intake.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as receiver:
        receiver.bind(path)
        receiver.settimeout(2)
        stats, logged, now = MonitorStats(), [], [100.0]
        agent = _unix_reports(path, stats, logged, now)
        for step in range(3):
            agent.send_step(step, _TIMES, None)
            now[0] += 0.01
        record = WindowRecord(step=2, columns={"collective_seconds": np.zeros(4)},
                              ranks=np.arange(4), world_size=4)
        agent.send_window(record, WindowOutcome(findings=[], scores={0: 1.0}))
        assert _records(receiver.recv(MAX_DATAGRAM_BYTES)) == [0]
        assert _records(receiver.recv(MAX_DATAGRAM_BYTES)) == [1, 2]
        assert decode_datagram(receiver.recv(MAX_DATAGRAM_BYTES)).scores == {0: 1.0}
        agent.close()


def test_no_agent_socket_counts_errors_and_sends_nowhere_else(tmp_path) -> None:
    stats, logged, now = MonitorStats(), [], [100.0]
    agent = _unix_reports(str(tmp_path / "absent.sock"), stats, logged, now)
    assert agent.sock is not None and agent.sock.target == ""
    agent.send_step(0, _TIMES, None)
    agent.close()
    assert stats.send_errors == 1 and stats.records_sent == 0
    assert any(str(tmp_path / "absent.sock") in msg for _, msg in logged)
