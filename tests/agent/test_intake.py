"""RankTable: per-rank series from records, bounded memory, counted rejections."""

import pytest
from support import registry_of

from laggard.agent.context import FindingLog
from laggard.agent.run_metrics import RunMetrics
from laggard.agent.run_state import RANK_SAMPLES, RUN_COMM_SAMPLES, RUN_HISTOGRAM_SAMPLES
from laggard.agent.run_table import RankTable
from laggard.wire import CollectiveTiming, StepRecord, WindowReport


def test_step_records_become_per_rank_histograms_and_counters():
    table = RankTable(rank_histograms=True, max_ranks=8, findings=FindingLog(), default_node="n0")
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
    table = RankTable(rank_histograms=True, max_ranks=4, findings=FindingLog(), default_node="n0")
    for rank in range(100):
        table.ingest(StepRecord(rank=rank, world_size=100, step=0).encode())
    r = registry_of(RunMetrics(table))
    assert r.get_sample_value("laggard_intake_ranks") == 4
    assert r.get_sample_value("laggard_intake_rejected_total", {"reason": "rank_limit"}) == 96
    assert r.get_sample_value("laggard_intake_datagrams_total") == 4


def test_phase_names_past_the_per_rank_cap_are_dropped_and_counted():
    table = RankTable(rank_histograms=True, max_ranks=4, findings=FindingLog(), default_node="n0")
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
    table = RankTable(rank_histograms=True, max_ranks=8, findings=findings, default_node="n0")
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
    table = RankTable(rank_histograms=True, max_ranks=8, findings=FindingLog(), default_node="n0")
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
    table = RankTable(rank_histograms=True, max_ranks=8, findings=FindingLog(), default_node="n0")
    assert "laggard_straggler_detector_inputs" not in {m.name for m in RunMetrics(table).collect()}
    table.ingest(WindowReport(step=9, world_size=4, detector_stats={
        "windows": 2, "missing_rank_reports": 1, "invalid_durations": 0}).encode())
    r = registry_of(RunMetrics(table))
    assert r.get_sample_value("laggard_straggler_detector_inputs_total",
                              {"run": "", "kind": "windows"}) == 2
    assert r.get_sample_value("laggard_straggler_detector_inputs_total",
                              {"run": "", "kind": "missing_rank_reports"}) == 1


def test_a_ranks_medians_wait_for_half_its_window_of_steps():
    """Warm-up steps alone are not a median: none before MIN_MEDIAN_STEPS records, then each."""
    from laggard.agent.run_state import MIN_MEDIAN_STEPS

    table = RankTable(max_ranks=8, findings=FindingLog(), default_node="n0")
    r = registry_of(RunMetrics(table))
    for step in range(MIN_MEDIAN_STEPS):
        assert r.get_sample_value("laggard_rank_phase_median_seconds",
                                  {"run": "a", "rank": "0", "phase": "compute"}) is None
        assert r.get_sample_value("laggard_rank_step_median_seconds",
                                  {"run": "a", "rank": "0"}) is None
        warm_up = 4.0 if step == 0 else 1.0  # the first step, 4x: not the median of 8
        table.ingest(StepRecord(rank=0, world_size=2, step=step, run="a",
                                phases={"forward": 0.01 * warm_up}, collective_wait_seconds=0.0,
                                step_seconds=0.1 * warm_up).encode())
    assert r.get_sample_value("laggard_rank_phase_median_seconds",
                              {"run": "a", "rank": "0", "phase": "compute"}) == pytest.approx(0.01)
    assert r.get_sample_value("laggard_rank_step_median_seconds",
                              {"run": "a", "rank": "0"}) == pytest.approx(0.1)


def test_every_comm_key_the_table_sums_is_rendered():
    from laggard.agent.run_metrics import _COMM_COUNTERS
    from laggard.agent.run_state import COMM_KEYS

    assert tuple(_COMM_COUNTERS) == COMM_KEYS


def test_by_default_a_rank_has_window_medians_and_its_run_the_histograms():
    """Issue 34's default set: per rank the medians of its last 16 steps (compute: every phase
    but data and optimizer), per run one histogram per phase for the node's ranks together."""
    table = RankTable(max_ranks=8, findings=FindingLog(), default_node="n0")
    # 20 steps: the window keeps the last 16 (steps 4..19), whose medians these are.
    for step in range(20):
        for rank in range(2):
            slow = 2.0 if step < 4 else 1.0  # slow first steps fall out of the window
            table.ingest(StepRecord(
                rank=rank, world_size=2, step=step, run="a",
                phases={"data": 0.004, "forward": 0.01 * (rank + 1) * slow,
                        "backward": 0.02 * (rank + 1) * slow, "optimizer": 0.5},
                collective_wait_seconds=0.001 * step, step_seconds=0.1 + 0.001 * step,
                collectives=[CollectiveTiming("allreduce", 0.02, 1000)],
                comm={"bytes": 1000, "raw_bytes": 4000}).encode())
    r = registry_of(RunMetrics(table))

    def median(rank, phase):
        return r.get_sample_value("laggard_rank_phase_median_seconds",
                                  {"run": "a", "rank": str(rank), "phase": phase})

    assert median(1, "compute") == pytest.approx(0.06)  # forward + backward, no optimizer
    assert median(0, "compute") == pytest.approx(0.03)
    assert median(0, "data") == pytest.approx(0.004)
    assert median(0, "collective_wait") == pytest.approx(0.0115)  # steps 4..19: (11+12)/2 ms
    assert r.get_sample_value("laggard_rank_step_median_seconds",
                              {"run": "a", "rank": "0"}) == pytest.approx(0.1115)
    # The run's histograms: both ranks' 20 steps in one, decade buckets.
    assert r.get_sample_value("laggard_run_step_phase_seconds_count",
                              {"run": "a", "phase": "forward"}) == 40
    assert r.get_sample_value("laggard_run_step_phase_seconds_bucket",
                              {"run": "a", "phase": "forward", "le": "0.01"}) == 16
    assert r.get_sample_value("laggard_run_step_phase_seconds_sum",
                              {"run": "a", "phase": "optimizer"}) == pytest.approx(20.0)
    assert r.get_sample_value("laggard_run_collective_bytes_total",
                              {"run": "a", "op": "allreduce"}) == 40_000
    assert r.get_sample_value("laggard_run_comm_uncompressed_bytes_total", {"run": "a"}) \
        == 160_000
    # Nothing per rank beyond the default set, and the budget charged what is exported.
    assert r.get_sample_value("laggard_steps_total", {"run": "a", "rank": "0"}) is None
    assert r.get_sample_value("laggard_step_phase_seconds_count",
                              {"run": "a", "rank": "0", "phase": "forward"}) is None
    assert table.series == 2 * RANK_SAMPLES + 5 * RUN_HISTOGRAM_SAMPLES \
        + (RUN_HISTOGRAM_SAMPLES + 1) + RUN_COMM_SAMPLES


def test_a_reasons_counter_appears_with_its_first_count():
    table = RankTable(max_ranks=1, findings=FindingLog(), default_node="n0")
    r = registry_of(RunMetrics(table))
    assert r.get_sample_value("laggard_intake_rejected_total", {"reason": "not_json"}) is None
    assert r.get_sample_value("laggard_intake_datagrams_total") == 0  # always there
    table.ingest(b"{")
    r = registry_of(RunMetrics(table))
    assert r.get_sample_value("laggard_intake_rejected_total", {"reason": "not_json"}) == 1
