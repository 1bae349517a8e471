"""RankTable under abuse: the series budget, label vocabularies, staleness and job restarts."""

import re

from prometheus_client import generate_latest
from support import registry_of

from laggard.agent.context import FindingLog
from laggard.agent.run_metrics import RunMetrics
from laggard.agent.run_table import RankTable
from laggard.detectors import (
    blame_detector,
    causes,
    integrity,
    link,
    moving,
    node_verdict,
    stage_balance,
    straggler,
)
from laggard.detectors.finding import JOB_FINDING_KINDS
from laggard.wire import CollectiveTiming, StepRecord, WindowReport

# Families whose samples the series budget covers (per rank, per name, per flagged rank).
_BUDGETED = re.compile(
    r"^laggard_(rank_info|steps_total|rank_last_step|rank_last_seen_timestamp_seconds|"
    r"step_phase_seconds_\w+|step_seconds_\w+|collective_seconds_\w+|collective_bytes_total|"
    r"comm_\w+_total|straggler_score|straggler_active)\{")


class _Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def _long(prefix, i):
    return f"{prefix}{i:03d}_" + "x" * 58  # 64 characters, the longest name accepted


def test_long_names_from_many_ranks_stay_within_the_series_budget():
    table = RankTable(rank_histograms=True,
                      max_ranks=4096, findings=FindingLog(), default_node="n0", max_series=2000)
    for rank in range(200):
        table.ingest(StepRecord(
            rank=rank, world_size=4096, step=0, step_seconds=0.1,
            phases={_long("p", i): 0.01 for i in range(16)},
            collectives=[CollectiveTiming(_long("o", i), 0.01, 10) for i in range(16)],
            comm={"bytes": 1.0, "raw_bytes": 4.0, "total_seconds": 0.1, "exposed_seconds": 0.1},
        ).encode())
    text = generate_latest(registry_of(RunMetrics(table))).decode()
    budgeted = [line for line in text.splitlines() if _BUDGETED.match(line)]
    # The accounting is exact or conservative, never short.
    assert len(budgeted) <= table.series <= 2000
    r = registry_of(RunMetrics(table))
    assert r.get_sample_value("laggard_intake_series") == table.series
    assert r.get_sample_value("laggard_intake_rejected_total", {"reason": "series_limit"}) > 0
    # Names past the budget dropped (phases or ops: whichever the budget ran out on).
    assert sum(r.get_sample_value("laggard_intake_dropped_total", {"what": what}) or 0
               for what in ("phase", "op")) > 0
    ranks = r.get_sample_value("laggard_intake_ranks")
    assert r.get_sample_value("laggard_intake_datagrams_total") == ranks
    assert (r.get_sample_value("laggard_intake_rejected_total", {"reason": "series_limit"})
            == 200 - ranks)


def test_findings_with_fresh_label_strings_add_no_series():
    findings = FindingLog()
    table = RankTable(rank_histograms=True, max_ranks=8, findings=findings, default_node="n0")
    for i in range(3000):
        finding = {"detector": f"d{i}", "kind": f"k{i}", "severity": f"s{i}", "rank": 1}
        table.ingest(WindowReport(step=i, world_size=4, findings=[finding]).encode())
    assert findings.counts() == {("other", "other", "other"): 3000}
    r = registry_of(RunMetrics(table))
    assert r.get_sample_value("laggard_intake_dropped_total", {"what": "finding_label"}) == 3000
    # Known detector, unknown kind: the detector stays, the kind becomes other, and no flag.
    table.ingest(WindowReport(step=4000, world_size=4, findings=[
        {"detector": "straggler", "kind": "zzz", "severity": "warning", "rank": 1}]).encode())
    assert findings.counts()[("straggler", "other", "warning")] == 1
    assert registry_of(RunMetrics(table)).get_sample_value(
        "laggard_straggler_active", {"run": "", "rank": "1", "kind": "other"}) is None
    # /findings keeps what was sent, beside the labels it was counted under.
    assert findings.recent()[-1]["labels_as_sent"] == ["straggler", "zzz", "warning"]


def test_the_vocabulary_holds_every_kind_the_in_job_detectors_send():
    link_kinds = set(re.findall(r'kind="(\w+)"', open(link.__file__).read()))
    assert link_kinds == {"link"}
    assert (set(straggler.SIGNAL_KINDS)
            | {"job_slowdown", stage_balance.KIND, causes.GC_KIND, causes.LOAD_KIND,
               blame_detector.KIND, moving.KIND, node_verdict.KIND}
            == JOB_FINDING_KINDS["straggler"])
    assert link_kinds == JOB_FINDING_KINDS[link.DETECTOR] and link.DETECTOR == "link"
    source = open(integrity.__file__).read()
    kinds = set(re.findall(r'kind="(\w+)"', source)) | set(re.findall(r'"(\w+_mismatch)"', source))
    assert kinds == JOB_FINDING_KINDS["integrity"]


def test_a_link_finding_is_exported_as_straggler_active_kind_link():
    findings = FindingLog()
    table = RankTable(rank_histograms=True, max_ranks=8, findings=findings, default_node="n0")
    flag = {"detector": "link", "kind": "link", "severity": "warning", "rank": 1,
            "node": "node1"}
    table.ingest(WindowReport(step=0, world_size=3, findings=[flag]).encode())
    text = generate_latest(registry_of(RunMetrics(table))).decode()
    assert 'laggard_straggler_active{kind="link",rank="1",run=""} 1.0' in text
    assert findings.counts() == {("link", "link", "warning"): 1}  # laggard_findings_total


def test_a_gc_or_load_imbalance_finding_is_exported_by_its_cause_and_clears_with_it():
    findings = FindingLog()
    table = RankTable(rank_histograms=True, max_ranks=8, findings=findings, default_node="n0")
    raised = [{"detector": "straggler", "kind": kind, "severity": "warning", "rank": rank}
              for rank, kind in ((1, "gc"), (2, "load_imbalance"))]
    table.ingest(WindowReport(step=0, world_size=4, findings=raised).encode())
    text = generate_latest(registry_of(RunMetrics(table))).decode()
    assert 'laggard_straggler_active{kind="gc",rank="1",run=""} 1.0' in text
    assert 'laggard_straggler_active{kind="load_imbalance",rank="2",run=""} 1.0' in text
    assert findings.counts() == {("straggler", "gc", "warning"): 1,
                                 ("straggler", "load_imbalance", "warning"): 1}
    table.ingest(WindowReport(step=20, world_size=4, findings=[
        {**raised[0], "cleared": True}]).encode())
    text = generate_latest(registry_of(RunMetrics(table))).decode()
    assert 'kind="gc"' not in text.split("laggard_straggler_active", 1)[1].split("# HELP")[0]
    assert 'laggard_straggler_active{kind="load_imbalance",rank="2",run=""} 1.0' in text


def test_a_rank_unseen_for_the_ttl_is_forgotten_with_its_score_and_flags():
    clock = _Clock()
    table = RankTable(rank_histograms=True, max_ranks=8, findings=FindingLog(), default_node="n0",
                      rank_ttl_seconds=60, clock=clock)
    for rank in range(2):
        table.ingest(StepRecord(rank=rank, world_size=2, step=0, phases={"forward": 0.1}
                                ).encode())
    flag = {"detector": "straggler", "kind": "compute", "severity": "warning", "rank": 1}
    table.ingest(WindowReport(step=0, world_size=2, scores={0: 0.0, 1: 3.0},
                              findings=[flag]).encode())
    clock.now += 40
    table.ingest(StepRecord(rank=0, world_size=2, step=1).encode())
    table.ingest(WindowReport(step=1, world_size=2, scores={0: 0.0}).encode())
    clock.now += 30  # rank 1 last seen 70 s ago, rank 0 and the job 30 s ago
    r = registry_of(RunMetrics(table))
    assert r.get_sample_value("laggard_intake_ranks") == 1
    assert r.get_sample_value("laggard_steps_total", {"run": "", "rank": "1"}) is None
    assert r.get_sample_value("laggard_straggler_active",
                              {"run": "", "rank": "1", "kind": "compute"}) is None
    assert r.get_sample_value("laggard_straggler_score", {"run": "", "rank": "1"}) is None
    assert r.get_sample_value("laggard_straggler_score", {"run": "", "rank": "0"}) == 0.0
    assert r.get_sample_value("laggard_intake_ranks_forgotten_total", {"reason": "stale"}) == 1
    clock.now += 31  # now everything is stale: nothing left, the budget back to zero
    r = registry_of(RunMetrics(table))
    assert r.get_sample_value("laggard_intake_ranks") == 0
    assert r.get_sample_value("laggard_straggler_score", {"run": "", "rank": "0"}) is None
    assert r.get_sample_value("laggard_straggler_report_timestamp_seconds") is None
    assert r.get_sample_value("laggard_intake_job_resets_total", {"reason": "stale"}) == 1
    assert table.series == 0


def test_a_flag_of_a_rank_on_another_node_expires_with_the_job_reports():
    clock = _Clock()
    table = RankTable(rank_histograms=True, max_ranks=8, findings=FindingLog(), default_node="n0",
                      rank_ttl_seconds=60, clock=clock)
    flag = {"detector": "straggler", "kind": "data", "severity": "warning", "rank": 7}
    table.ingest(WindowReport(step=20, world_size=8, findings=[flag]).encode())
    clock.now += 59
    assert registry_of(RunMetrics(table)).get_sample_value(
        "laggard_straggler_active", {"run": "", "rank": "7", "kind": "data"}) == 1
    clock.now += 2
    assert registry_of(RunMetrics(table)).get_sample_value(
        "laggard_straggler_active", {"run": "", "rank": "7", "kind": "data"}) is None


def test_bogus_ranks_expire_and_let_real_ones_in():
    clock = _Clock()
    table = RankTable(rank_histograms=True, max_ranks=4, findings=FindingLog(), default_node="n0",
                      rank_ttl_seconds=60, clock=clock)
    for rank in range(4):
        table.ingest(StepRecord(rank=100 + rank, world_size=4096, step=0).encode())
    table.ingest(StepRecord(rank=0, world_size=2, step=0).encode())
    assert table.rejected["rank_limit"] == 1
    clock.now += 61
    table.ingest(StepRecord(rank=0, world_size=2, step=1).encode())
    r = registry_of(RunMetrics(table))
    assert r.get_sample_value("laggard_steps_total", {"run": "", "rank": "0"}) == 1
    assert r.get_sample_value("laggard_intake_ranks") == 1


def test_a_job_restart_resets_the_rank_and_the_job_state():
    table = RankTable(rank_histograms=True, max_ranks=8, findings=FindingLog(), default_node="n0")
    flag = {"detector": "straggler", "kind": "compute", "severity": "warning", "rank": 1}
    for step in range(100, 103):
        table.ingest(StepRecord(rank=1, world_size=4, step=step, phases={"forward": 0.1}
                                ).encode())
    table.ingest(WindowReport(step=102, world_size=4, scores={1: 5.0}, findings=[flag]).encode())
    # The job restarts from a checkpoint: steps go back; the old flag and counts go.
    table.ingest(StepRecord(rank=1, world_size=4, step=50).encode())
    r = registry_of(RunMetrics(table))
    assert r.get_sample_value("laggard_steps_total", {"run": "", "rank": "1"}) == 1
    assert r.get_sample_value("laggard_straggler_active",
                              {"run": "", "rank": "1", "kind": "compute"}) is None
    assert r.get_sample_value("laggard_intake_ranks_forgotten_total", {"reason": "restart"}) == 1
    # A new world size is a new job, for ranks and for the detector's reports.
    flag0 = {**flag, "rank": 0}
    table.ingest(WindowReport(step=60, world_size=4, findings=[flag0]).encode())
    table.ingest(WindowReport(step=61, world_size=2, scores={1: 0.1}).encode())
    table.ingest(StepRecord(rank=1, world_size=2, step=51).encode())
    r = registry_of(RunMetrics(table))
    assert r.get_sample_value("laggard_straggler_active",
                              {"run": "", "rank": "0", "kind": "compute"}) is None
    assert r.get_sample_value("laggard_intake_job_resets_total", {"reason": "restart"}) == 2
    assert r.get_sample_value("laggard_rank_info", {
        "run": "", "rank": "1", "node": "n0", "local_rank": "", "world_size": "2", "gpu": "",
        "uuid": "", "pci_bus_id": ""}) == 1


def test_an_unexpected_error_costs_one_datagram_not_the_intake(monkeypatch):
    table = RankTable(rank_histograms=True, max_ranks=8, findings=FindingLog(), default_node="n0")

    def broken(record):
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(table, "_apply_step", broken)
    table.ingest(StepRecord(rank=0, world_size=1, step=0).encode())
    monkeypatch.undo()
    table.ingest(StepRecord(rank=0, world_size=1, step=1).encode())
    assert table.rejected["internal_error"] == 1
    assert table.accepted == 1
