"""What the monitor sends its agent (``integrations/agent_reports.py``), on a loopback socket."""

from __future__ import annotations

import socket

import numpy as np

from laggard.detectors.finding import Finding, Severity
from laggard.detectors.window import WindowRecord
from laggard.integrations.agent_reports import (
    MAX_COLLECTIVES_PER_RECORD,
    AgentReports,
    capped,
    window_reports,
)
from laggard.integrations.monitor_config import MonitorStats
from laggard.integrations.participants import WindowOutcome
from laggard.integrations.phases import StepTimes
from laggard.wire import MAX_REPORT_FINDINGS, MAX_REPORT_RANKS, CollectiveTiming, decode_datagram


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
