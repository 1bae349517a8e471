"""The agent's finding log: each finding logged once when raised (level by severity) and once when
cleared, repeats counted not logged, ``/findings`` with first-seen and last-seen times; on a real
agent process fed WindowReports, and on the FindingLog itself with fake clocks."""

from __future__ import annotations

import json
import logging
import socket
import time
from datetime import datetime

import pytest
from support import scrape, stop_agent, wait_for

from laggard.agent.context import FindingLog, finding_key
from laggard.detectors.finding import Finding, Severity
from laggard.wire import WindowReport

START = 1_796_160_800.0  # 2026-12-01T21:33:20Z


class Clocks:
    """A monotonic and a wall clock that move together, by hand."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def wall(self) -> float:
        return START + self.now


@pytest.fixture
def clocks() -> Clocks:
    return Clocks()


@pytest.fixture
def log(clocks: Clocks) -> FindingLog:
    return FindingLog(clock=clocks.monotonic, wall_clock=clocks.wall)


def slow_rank(rank: int = 3, severity: Severity = Severity.WARNING, step: int = 20) -> Finding:
    return Finding(detector="straggler", kind="compute", severity=severity, rank=rank,
                   node="node-b", step=step, message=f"rank {rank} on node-b computes 25% slower")


def lines(caplog: pytest.LogCaptureFixture) -> list[tuple[str, str]]:
    return [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "laggard.findings"]


def test_raised_once_repeats_counted_cleared_once(log, clocks, caplog) -> None:
    caplog.set_level(logging.INFO)
    raised = slow_rank()
    log.add(raised)
    for _ in range(4):
        clocks.now += 10.0
        log.add(raised)
    clocks.now += 10.0
    cleared = raised.clear(step=40, reason="recovered", message="rank 3: compute slowdown cleared")
    log.add(cleared)
    log.add(cleared)  # a clear sent twice is not news
    assert lines(caplog) == [
        ("WARNING", "raised warning straggler/compute node=node-b rank=3: rank 3 on node-b "
                    "computes 25% slower"),
        ("INFO", "cleared straggler/compute node=node-b rank=3: rank 3: compute slowdown cleared "
                 "(raised 2026-12-01T21:33:20.000Z, 5 times)"),
    ]
    (entry,) = log.recent()
    assert entry["count"] == 5 and entry["cleared"] is True
    assert (entry["first_seen"], entry["last_seen"], entry["cleared_at"]) == (
        "2026-12-01T21:33:20.000Z", "2026-12-01T21:34:00.000Z", "2026-12-01T21:34:10.000Z")
    assert entry["raised_message"] == "rank 3 on node-b computes 25% slower"
    assert log.counts() == {("straggler", "compute", "warning"): 5}
    log.add(raised)  # raised again after its clear: a new episode, logged
    assert len(lines(caplog)) == 3 and [e["count"] for e in log.recent()] == [5, 1]


@pytest.mark.parametrize(("severity", "level"), [
    (Severity.INFO, "INFO"), (Severity.WARNING, "WARNING"), (Severity.CRITICAL, "ERROR")])
def test_level_by_severity(log, caplog, severity, level) -> None:
    caplog.set_level(logging.INFO)
    log.add(slow_rank(severity=severity))
    assert [lvl for lvl, _ in lines(caplog)] == [level]
    log.add(slow_rank(severity=severity).clear(step=1, reason="recovered", message="ok"))
    assert [lvl for lvl, _ in lines(caplog)] == [level, "INFO"]


def test_a_rise_in_severity_is_logged_a_fall_is_not(log, caplog) -> None:
    caplog.set_level(logging.INFO)
    for severity in (Severity.INFO, Severity.CRITICAL, Severity.WARNING, Severity.CRITICAL):
        log.add(slow_rank(severity=severity))
    assert [(lvl, msg.split(" straggler")[0]) for lvl, msg in lines(caplog)] == [
        ("INFO", "raised info"), ("ERROR", "raised critical (was info)")]


def test_a_finding_quiet_for_a_while_is_logged_again(log, clocks, caplog) -> None:
    """An Xid is never cleared: the same one hours later is news again, a storm is not."""
    caplog.set_level(logging.INFO)
    xid = Finding(detector="xid", kind="xid", severity=Severity.WARNING, gpu=1,
                  message="Xid 13 on GPU 1", evidence={"xid": 13, "pci_bus_id": "0000:28:00"})
    for _ in range(100):  # a storm: one line
        clocks.now += 5.0
        log.add(xid)
    clocks.now += 601.0
    log.add(xid)
    assert len(lines(caplog)) == 2
    assert [e["count"] for e in log.recent()] == [100, 1]


def test_what_a_finding_is_about() -> None:
    def key(**fields):
        return finding_key({"detector": "xid", "kind": "xid", **fields})

    assert key(gpu=1, evidence={"xid": 13}) != key(gpu=1, evidence={"xid": 79})
    assert key(evidence={"sxid": 20034, "link": 48}) != key(evidence={"sxid": 20034, "link": 63})
    assert key(run="a", rank=3) != key(run="b", rank=3)
    assert key(rank=3, step=20, message="x") == key(rank=3, step=21, message="y")
    # Anything a sender puts on the wire is keyed, never raised on (unhashable evidence).
    odd = {"rank": [1], "evidence": {"xid": {"a": [1]}}}
    assert key(**odd) == key(**odd)


def test_bounded_records_and_lines(clocks, caplog) -> None:
    caplog.set_level(logging.INFO)
    log = FindingLog(maxlen=8, clock=clocks.monotonic, wall_clock=clocks.wall,
                     max_log_lines_per_minute=5)
    for rank in range(20):
        log.add(slow_rank(rank=rank))
    assert [e["rank"] for e in log.recent()] == list(range(12, 20))
    assert len(log._latest) == 8
    said = lines(caplog)
    assert len(said) == 6 and said[-1][0] == "WARNING" and "more than 5" in said[-1][1]
    clocks.now += 60.0
    log.add(slow_rank(rank=99))
    assert lines(caplog)[6:] == [
        ("WARNING", "15 finding lines were not logged in the last minute; /findings has the "
                    "findings"),
        ("WARNING", "raised warning straggler/compute node=node-b rank=99: rank 99 on node-b "
                    "computes 25% slower")]


def test_a_line_from_the_wire_stays_one_line(log, caplog) -> None:
    caplog.set_level(logging.INFO)
    log.add({"detector": "straggler", "kind": "compute", "severity": "bogus", "rank": 1,
             "node": "a b", "message": "slow\n2026-12-01 ERROR laggard: forged" + "x" * 1000})
    ((level, line),) = lines(caplog)
    assert level == "WARNING" and "\n" not in line and "slow\\n2026" in line
    assert 'node="a b"' in line and len(line) < 500


def test_a_clear_of_a_finding_raised_before_the_agent_started(log, caplog) -> None:
    caplog.set_level(logging.INFO)
    log.add(slow_rank().clear(step=40, reason="recovered", message="rank 3 cleared"))
    assert lines(caplog) == [("INFO", "cleared straggler/compute node=node-b rank=3: rank 3 "
                                      "cleared (not raised since the agent started)")]
    assert log.recent()[0]["count"] == 0 and log.counts() == {}


def test_a_finding_of_the_kernel_logs_history_says_when(log, caplog) -> None:
    caplog.set_level(logging.INFO)
    log.add(slow_rank(), at=START - 3600)
    ((_, line),) = lines(caplog)
    assert line.endswith("(at 2026-12-01T20:33:20.000Z)")
    assert log.recent()[0]["first_seen"] == "2026-12-01T20:33:20.000Z"
    for nonsense in (float("nan"), 1e30, -5.0):  # a garbled stamp: the time it was read
        log.add(slow_rank(rank=7), at=nonsense)
    assert log.recent()[-1]["last_seen"] == "2026-12-01T21:33:20.000Z"


def _send(port: int, *reports: WindowReport) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for report in reports:
            s.sendto(report.encode(), ("127.0.0.1", port))


def test_real_agent_logs_window_report_findings_once_and_serves_their_times(
        agent_factory) -> None:
    agent = agent_factory("--no-collector.host", "--no-collector.netdev", "--no-collector.xid",
                          "--no-collector.nvml", "--no-collector.infiniband")
    raised = slow_rank()
    flip = Finding(detector="integrity", kind="result_mismatch", severity=Severity.CRITICAL,
                   rank=1, step=22, message="rank 1's all-reduce result differs")
    before = time.time()
    _send(agent.intake_port, *[
        WindowReport(step=step, world_size=4, findings=[raised.to_dict()]) for step in (20, 21)],
        WindowReport(step=22, world_size=4, findings=[raised.to_dict(), flip.to_dict()]))
    url = f"http://127.0.0.1:{agent.port}/findings"

    def findings() -> list[dict]:
        return json.loads(scrape(url))

    assert wait_for(lambda: sum(f["count"] for f in findings()) == 4, timeout=10)
    cleared = raised.clear(step=30, reason="recovered", message="rank 3: compute slowdown cleared")
    _send(agent.intake_port, *[WindowReport(step=s, world_size=4, findings=[cleared.to_dict()])
                               for s in (30, 31)])
    assert wait_for(lambda: any(f.get("cleared") for f in findings()), timeout=10)
    entries = {f["kind"]: f for f in findings()}
    assert entries["compute"]["count"] == 3 and entries["result_mismatch"]["count"] == 1
    compute = entries["compute"]
    times = [datetime.fromisoformat(compute[k].replace("Z", "+00:00"))
             for k in ("first_seen", "last_seen", "cleared_at")]
    assert all(t.utcoffset().total_seconds() == 0 for t in times)
    assert before - 1 <= times[0].timestamp() <= times[1].timestamp() <= times[2].timestamp()
    assert times[2].timestamp() <= time.time() + 1
    status, out = stop_agent(agent)
    assert status == 0
    said = [line.split(" ", 2)[2] for line in out.splitlines() if "laggard.findings:" in line]
    assert len(said) == 3, out  # three raises and two clears of one finding: two lines
    assert said[0].startswith("WARNING laggard.findings: raised warning straggler/compute ")
    assert said[0].endswith(" node=node-b rank=3: rank 3 on node-b computes 25% slower")
    assert said[1].startswith("ERROR laggard.findings: raised critical integrity/result_mismatch ")
    assert said[2].startswith("INFO laggard.findings: cleared straggler/compute ")
    assert said[2].endswith(", 3 times)")
