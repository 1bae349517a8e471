"""RankTable: per-rank series from records, bounded memory, counted rejections."""

from support import registry_of

from laggard.agent.context import FindingLog
from laggard.agent.run_metrics import RunMetrics
from laggard.agent.run_table import RankTable
from laggard.wire import StepRecord, WindowReport


def test_step_records_become_per_rank_histograms_and_counters():
    table = RankTable(max_ranks=8, findings=FindingLog(), default_node="n0")
    for step in range(3):
        for rank in range(2):
            table.ingest(StepRecord(rank=rank, world_size=2, step=step,
                                    phases={"forward": 0.02 * (rank + 1)},
                                    collective_wait_seconds=0.003, step_seconds=0.05,
                                    comm={"bytes": 1000, "raw_bytes": 4000}).encode())
    r = registry_of(RunMetrics(table))
    assert r.get_sample_value("laggard_steps_total", {"run": "", "rank": "1"}) == 3
    assert r.get_sample_value("laggard_step_phase_seconds_count",
                              {"run": "", "rank": "1", "phase": "forward"}) == 3
    assert abs(r.get_sample_value("laggard_step_phase_seconds_sum",
                                  {"run": "", "rank": "1", "phase": "forward"}) - 0.12) < 1e-9
    # 0.02 s falls in the le=0.025 bucket, 0.04 s does not.
    assert r.get_sample_value("laggard_step_phase_seconds_bucket",
                              {"run": "", "rank": "0", "phase": "forward", "le": "0.025"}) == 3
    assert r.get_sample_value("laggard_step_phase_seconds_bucket",
                              {"run": "", "rank": "1", "phase": "forward", "le": "0.025"}) == 0
    assert r.get_sample_value("laggard_step_phase_seconds_count",
                              {"run": "", "rank": "0", "phase": "collective_wait"}) == 3
    assert r.get_sample_value("laggard_comm_uncompressed_bytes_total",
                              {"run": "", "rank": "0"}) == 12000
    assert r.get_sample_value("laggard_rank_info", {
        "run": "", "rank": "0", "node": "n0", "local_rank": "", "world_size": "2", "gpu": "",
        "uuid": "", "pci_bus_id": ""}) == 1


def test_rank_cap_bounds_memory_and_counts_the_excess():
    table = RankTable(max_ranks=4, findings=FindingLog(), default_node="n0")
    for rank in range(100):
        table.ingest(StepRecord(rank=rank, world_size=100, step=0).encode())
    r = registry_of(RunMetrics(table))
    assert r.get_sample_value("laggard_intake_ranks") == 4
    assert r.get_sample_value("laggard_intake_rejected_total", {"reason": "rank_limit"}) == 96
    assert r.get_sample_value("laggard_intake_datagrams_total") == 4


def test_phase_names_past_the_per_rank_cap_are_dropped_and_counted():
    table = RankTable(max_ranks=4, findings=FindingLog(), default_node="n0")
    for i in range(40):
        table.ingest(StepRecord(rank=0, world_size=1, step=i, phases={f"p{i}": 0.1}).encode())
    r = registry_of(RunMetrics(table))
    # The records still count (steps, last step); only the names past the cap are dropped.
    assert r.get_sample_value("laggard_intake_datagrams_total") == 40
    assert r.get_sample_value("laggard_intake_dropped_total", {"what": "phase"}) == 40 - 16
    assert r.get_sample_value("laggard_step_phase_seconds_count",
                              {"run": "", "rank": "0", "phase": "p15"})
    assert r.get_sample_value("laggard_step_phase_seconds_count",
                              {"run": "", "rank": "0", "phase": "p16"}) is None


def test_window_report_sets_scores_flags_and_findings_until_cleared():
    findings = FindingLog()
    table = RankTable(max_ranks=8, findings=findings, default_node="n0")
    raised = {"detector": "straggler", "kind": "compute", "severity": "warning", "rank": 2,
              "step": 40, "message": "rank 2 slow", "evidence": {}}
    table.ingest(WindowReport(step=40, world_size=4, scores={2: 9.0, 1: 0.2},
                              findings=[raised]).encode())
    r = registry_of(RunMetrics(table))
    assert r.get_sample_value("laggard_straggler_score", {"run": "", "rank": "2"}) == 9.0
    assert r.get_sample_value("laggard_straggler_active",
                              {"run": "", "rank": "2", "kind": "compute"}) == 1
    assert findings.counts() == {("straggler", "compute", "warning"): 1}
    cleared = {**raised, "cleared": True}
    table.ingest(WindowReport(step=80, world_size=4, scores={2: 0.1},
                              findings=[cleared]).encode())
    r = registry_of(RunMetrics(table))
    assert r.get_sample_value("laggard_straggler_active",
                              {"run": "", "rank": "2", "kind": "compute"}) is None
    assert findings.counts() == {("straggler", "compute", "warning"): 1}


def test_job_slowdown_is_a_job_level_flag_not_a_rank():
    table = RankTable(max_ranks=8, findings=FindingLog(), default_node="n0")
    r = registry_of(RunMetrics(table))
    assert r.get_sample_value("laggard_job_slowdown_active", {"run": ""}) is None
    raised = {"detector": "straggler", "kind": "job_slowdown", "severity": "warning",
              "step": 40, "message": "whole job slower", "evidence": {"slowdown": 0.3}}
    table.ingest(WindowReport(step=40, world_size=4, findings=[raised]).encode())
    assert registry_of(RunMetrics(table)).get_sample_value("laggard_job_slowdown_active",
                                                           {"run": ""}) == 1
    # only the finding's own "cleared" ends it (Finding.cleared), not a word in its evidence
    in_evidence = {**raised, "evidence": {"cleared": True}}
    table.ingest(WindowReport(step=60, world_size=4, findings=[in_evidence]).encode())
    assert registry_of(RunMetrics(table)).get_sample_value("laggard_job_slowdown_active",
                                                           {"run": ""}) == 1
    cleared = {**raised, "cleared": True}
    table.ingest(WindowReport(step=80, world_size=4, findings=[cleared]).encode())
    assert registry_of(RunMetrics(table)).get_sample_value("laggard_job_slowdown_active",
                                                           {"run": ""}) == 0


def test_detector_input_counters_are_exported_as_reported():
    table = RankTable(max_ranks=8, findings=FindingLog(), default_node="n0")
    assert "laggard_straggler_detector_inputs" not in {m.name for m in RunMetrics(table).collect()}
    table.ingest(WindowReport(step=9, world_size=4, detector_stats={
        "windows": 2, "missing_rank_reports": 1, "invalid_durations": 0}).encode())
    r = registry_of(RunMetrics(table))
    assert r.get_sample_value("laggard_straggler_detector_inputs_total",
                              {"run": "", "kind": "windows"}) == 2
    assert r.get_sample_value("laggard_straggler_detector_inputs_total",
                              {"run": "", "kind": "missing_rank_reports"}) == 1


def test_every_comm_key_the_table_sums_is_rendered():
    from laggard.agent.run_metrics import _COMM_COUNTERS
    from laggard.agent.run_state import COMM_KEYS

    assert tuple(_COMM_COUNTERS) == COMM_KEYS
