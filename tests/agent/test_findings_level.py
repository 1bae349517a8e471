"""A job's verdict is a level: active findings re-sent each window, the run's end ends them.

The run table and its FindingLog fed real datagrams (``WindowReport.encode``): a re-sent active
finding changes nothing an agent already has, an agent that missed the raise takes it up, and
the run's end drops its flags at once and keeps its findings on ``/findings`` as ended.
"""

from __future__ import annotations

import json
import logging

import pytest
from support import registry_of

from laggard.agent.context import FindingLog
from laggard.agent.run_metrics import RunMetrics
from laggard.agent.run_table import RankTable
from laggard.wire import MAX_REPORT_FINDINGS, RecordError, WindowReport, decode_datagram

RAISED = {"detector": "straggler", "kind": "compute", "severity": "warning", "rank": 2,
          "step": 40, "message": "rank 2 slow", "evidence": {"slowdown": 0.3}}
ACTIVE = ("laggard_straggler_active", {"run": "r1", "rank": "2", "kind": "compute"})


def _table() -> tuple[RankTable, FindingLog]:
    findings = FindingLog()
    return RankTable(max_ranks=8, findings=findings, default_node="n0"), findings


def _window(step: int, **fields) -> bytes:
    return WindowReport(step=step, world_size=4, run="r1", **fields).encode()


def _active(table: RankTable) -> float | None:
    return registry_of(RunMetrics(table)).get_sample_value(*ACTIVE)


def test_a_resent_active_finding_is_idempotent(caplog) -> None:
    table, findings = _table()
    with caplog.at_level(logging.INFO, logger="laggard.findings"):
        table.ingest(_window(40, scores={2: 9.0}, findings=[RAISED], active=[RAISED]))
        for step in (60, 80, 100):
            table.ingest(_window(step, scores={2: 9.0}, active=[RAISED]))
    assert _active(table) == 1
    assert findings.counts() == {("straggler", "compute", "warning"): 1}
    assert [r.getMessage().split()[0] for r in caplog.records] == ["raised"]
    [episode] = findings.recent()
    assert episode["count"] == 1 and "cleared_at" not in episode and "ended_at" not in episode
    assert table.series == registry_of(RunMetrics(table)).get_sample_value(
        "laggard_intake_series")


def test_an_agent_that_missed_the_raise_takes_the_finding_up_once(caplog) -> None:
    table, findings = _table()  # a new agent: the raise went to the one before
    with caplog.at_level(logging.INFO, logger="laggard.findings"):
        table.ingest(_window(60, scores={2: 9.0}, active=[RAISED]))
        table.ingest(_window(80, scores={2: 9.0}, active=[RAISED]))
    assert _active(table) == 1
    assert findings.counts() == {}  # raised before this agent: counted by the one that saw it
    [line] = [r.getMessage() for r in caplog.records]
    assert line.startswith("holds warning straggler/compute run=r1 rank=2: rank 2 slow")
    [episode] = findings.recent()
    assert episode["count"] == 0 and episode["run"] == "r1"
    # its clear is logged once and kept with its time
    table.ingest(_window(100, findings=[{**RAISED, "cleared": True}]))
    assert _active(table) is None
    [episode] = findings.recent()
    assert "cleared_at" in episode and "ended_at" not in episode


def test_the_runs_end_drops_its_flags_and_keeps_its_findings_as_ended(caplog) -> None:
    table, findings = _table()
    other = {**RAISED, "rank": 1}
    table.ingest(_window(40, scores={2: 9.0}, findings=[RAISED], active=[RAISED]))
    table.ingest(WindowReport(step=40, world_size=4, run="r2", findings=[other],
                              active=[other]).encode())
    cleared_before = {**RAISED, "kind": "data", "rank": 3}
    table.ingest(_window(60, findings=[cleared_before, {**cleared_before, "cleared": True}]))
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="laggard.findings"):
        table.ingest(_window(60, end=True))
    r = registry_of(RunMetrics(table))
    assert r.get_sample_value(*ACTIVE) is None
    assert r.get_sample_value("laggard_straggler_score", {"run": "r1", "rank": "2"}) is None
    assert r.get_sample_value("laggard_intake_job_resets_total", {"reason": "ended"}) == 1
    # the other run's verdict holds
    assert r.get_sample_value("laggard_straggler_active",
                              {"run": "r2", "rank": "1", "kind": "compute"}) == 1
    by_run = {(e["run"], e["kind"]): e for e in findings.recent()}
    assert "ended_at" in by_run[("r1", "compute")]
    assert "ended_at" not in by_run[("r1", "data")]  # cleared before the end: cleared only
    assert "ended_at" not in by_run[("r2", "compute")]
    [line] = [r.getMessage() for r in caplog.records]
    assert line.startswith("ended straggler/compute run=r1 rank=2: the job ended while it held")
    # a second end, or the same end again, is no news
    table.ingest(_window(60, end=True))
    assert len(caplog.records) == 1
    # raised again after the end (a new run of the same name): a new episode, counted
    table.ingest(_window(0, findings=[RAISED], active=[RAISED]))
    assert registry_of(RunMetrics(table)).get_sample_value(*ACTIVE) == 1
    assert findings.counts()[("straggler", "compute", "warning")] == 3  # r1, r2, r1 again


def test_a_job_that_stops_reporting_ends_with_the_ttl() -> None:
    now = [0.0]
    findings = FindingLog(clock=lambda: now[0])
    table = RankTable(max_ranks=8, findings=findings, default_node="n0", rank_ttl_seconds=30,
                      clock=lambda: now[0])
    table.ingest(_window(40, findings=[RAISED], active=[RAISED]))
    now[0] = 31.0
    assert _active(table) is None
    [episode] = findings.recent()
    assert "ended_at" in episode


def test_active_and_end_on_the_wire() -> None:
    report = decode_datagram(_window(40, active=[RAISED]))
    assert report.active == [RAISED] and not report.end
    assert decode_datagram(_window(40, end=True)).end
    plain = WindowReport(step=1, world_size=4).encode()
    assert b"active" not in plain and b"end" not in plain  # an older agent sees what it knew
    for bad, reason in (
            ({"active": [{**RAISED, "cleared": True}]}, "schema"),
            ({"active": [RAISED] * (MAX_REPORT_FINDINGS + 1)}, "schema"),
            ({"active": [{**RAISED, "rank": 4}]}, "range"),
            ({"active": "x"}, "schema"),
            ({"end": 1}, "schema")):
        doc = {"v": 1, "type": "window", "step": 1, "world_size": 4, **bad}
        with pytest.raises(RecordError) as caught:
            decode_datagram(json.dumps(doc).encode())
        assert caught.value.reason == reason, bad


def test_a_restarted_run_ends_the_old_jobs_findings() -> None:
    table, findings = _table()
    table.ingest(_window(400, findings=[RAISED], active=[RAISED]))
    table.ingest(_window(20))  # the step went back: a new job under the same run id
    assert _active(table) is None
    [episode] = findings.recent()
    assert "ended_at" in episode
    table.ingest(_window(40, active=[RAISED]))  # still slow in the new job: held again
    assert _active(table) == 1
    assert [("ended_at" in e, e["count"]) for e in findings.recent()] == [(True, 1), (False, 0)]
