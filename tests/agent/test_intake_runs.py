"""RankTable with many runs on one agent: runs kept apart, fair budget, moves, GPU join."""

from support import registry_of

from laggard.agent.context import FindingLog
from laggard.agent.gpu_index import GpuIndex
from laggard.agent.run_metrics import RunMetrics
from laggard.agent.run_state import RANK_DETAIL_SAMPLES
from laggard.agent.run_state import RANK_SAMPLES as DEFAULT_RANK_SAMPLES
from laggard.agent.run_table import RankTable
from laggard.agent.sender import SenderIdentity
from laggard.nvml.fake import FakeNvml
from laggard.nvml.library import NvmlLibrary
from laggard.wire import StepRecord, WindowReport

#: A rank's cost in the tables here, which keep each rank's histograms (--intake.rank-histograms).
RANK_SAMPLES = DEFAULT_RANK_SAMPLES + RANK_DETAIL_SAMPLES


class _Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def _step(run, rank, world, step, **kw):
    return StepRecord(run=run, rank=rank, world_size=world, step=step, **kw).encode()


def _flag(rank, kind="compute", cleared=False):
    return {"detector": "straggler", "kind": kind, "severity": "warning", "rank": rank,
            "step": 40, "message": "slow", "evidence": {}, **({"cleared": True} if cleared else {})}


def test_rank_zero_of_two_runs_are_two_ranks_and_world_sizes_do_not_restart_each_other():
    table = RankTable(rank_histograms=True, max_ranks=64, findings=FindingLog(), default_node="n0")
    for step in range(5):
        for rank in range(4):
            table.ingest(_step("a", rank, 4, step, phases={"forward": 0.01}))
        for rank in range(2):
            table.ingest(_step("b", rank, 2, step, phases={"forward": 0.05}))
    r = registry_of(RunMetrics(table))
    assert r.get_sample_value("laggard_intake_runs") == 2
    assert r.get_sample_value("laggard_intake_ranks") == 6
    assert r.get_sample_value("laggard_steps_total", {"run": "a", "rank": "0"}) == 5
    assert r.get_sample_value("laggard_steps_total", {"run": "b", "rank": "0"}) == 5
    # a reason's series appears with its first count
    assert r.get_sample_value("laggard_intake_ranks_forgotten_total", {"reason": "restart"}) is None
    assert abs(r.get_sample_value("laggard_step_phase_seconds_sum",
                                  {"run": "b", "rank": "0", "phase": "forward"}) - 0.25) < 1e-9


def test_an_old_sender_without_a_run_is_run_empty_string():
    table = RankTable(rank_histograms=True, max_ranks=8, findings=FindingLog(), default_node="n0")
    table.ingest(StepRecord(rank=0, world_size=1, step=0).encode())
    r = registry_of(RunMetrics(table))
    assert r.get_sample_value("laggard_steps_total", {"run": "", "rank": "0"}) == 1


def test_window_reports_of_two_runs_flag_only_their_own_ranks():
    findings = FindingLog()
    table = RankTable(rank_histograms=True, max_ranks=64, findings=findings, default_node="n0")
    table.ingest(WindowReport(run="a", step=40, world_size=4, scores={3: 0.4},
                              findings=[_flag(3)]).encode())
    table.ingest(WindowReport(run="b", step=40, world_size=2, scores={1: 0.0}).encode())
    # b restarts (world size 3 now): a's flag and score stay.
    table.ingest(WindowReport(run="b", step=2, world_size=3, scores={1: 0.0}).encode())
    r = registry_of(RunMetrics(table))
    assert r.get_sample_value("laggard_straggler_active",
                              {"run": "a", "rank": "3", "kind": "compute"}) == 1
    assert r.get_sample_value("laggard_straggler_active",
                              {"run": "b", "rank": "3", "kind": "compute"}) is None
    assert r.get_sample_value("laggard_straggler_score", {"run": "a", "rank": "3"}) == 0.4
    assert r.get_sample_value("laggard_intake_job_resets_total", {"reason": "restart"}) == 1
    assert r.get_sample_value("laggard_straggler_report_timestamp_seconds", {"run": "a"}) > 0
    assert findings.recent()[0]["run"] == "a"


def test_a_restart_is_per_run():
    table = RankTable(rank_histograms=True, max_ranks=64, findings=FindingLog(), default_node="n0")
    for step in range(3):
        table.ingest(_step("a", 0, 2, step))
        table.ingest(_step("b", 0, 2, step))
    table.ingest(_step("b", 0, 2, 0))  # b resumed from step 0
    r = registry_of(RunMetrics(table))
    assert r.get_sample_value("laggard_steps_total", {"run": "a", "rank": "0"}) == 3
    assert r.get_sample_value("laggard_steps_total", {"run": "b", "rank": "0"}) == 1
    assert r.get_sample_value("laggard_intake_ranks_forgotten_total", {"reason": "restart"}) == 1


def test_ten_thousand_runs_from_one_sender_are_refused_and_counted_never_another_runs_data():
    table = RankTable(rank_histograms=True,
                      max_ranks=4096, findings=FindingLog(), default_node="n0", max_runs=16)
    for step in range(3):
        table.ingest(_step("victim", 0, 1, step, phases={"forward": 0.01}))
    for i in range(10_000):
        table.ingest(_step(f"flood-{i}", 0, 1, 0, phases={"forward": 0.01}))
    table.ingest(_step("victim", 0, 1, 3, phases={"forward": 0.01}))
    r = registry_of(RunMetrics(table))
    assert r.get_sample_value("laggard_intake_runs") == 16
    assert r.get_sample_value("laggard_intake_rejected_total", {"reason": "run_limit"}) \
        == 10_000 - 15
    assert r.get_sample_value("laggard_steps_total", {"run": "victim", "rank": "0"}) == 4
    assert table.series <= table._max_series


def test_ten_thousand_runs_from_one_pid_move_its_rank_and_leave_the_rest_alone():
    table = RankTable(rank_histograms=True,
                      max_ranks=4096, findings=FindingLog(), default_node="n0", max_runs=16)
    other = SenderIdentity(pid=7)
    table.ingest(_step("victim", 0, 1, 0), other)
    flooder = SenderIdentity(pid=666)
    for i in range(10_000):
        table.ingest(_step(f"flood-{i}", 0, 1, 0), flooder)
    r = registry_of(RunMetrics(table))
    # One rank, one run at a time for the flooder: each new run takes its rank away from the last.
    assert r.get_sample_value("laggard_intake_runs") == 2
    assert r.get_sample_value("laggard_intake_ranks_forgotten_total", {"reason": "moved"}) \
        == 9_999
    assert r.get_sample_value("laggard_intake_runs_forgotten_total", {"reason": "empty"}) \
        == 9_999
    assert r.get_sample_value("laggard_steps_total", {"run": "victim", "rank": "0"}) == 1
    assert r.get_sample_value("laggard_steps_total", {"run": "flood-9999", "rank": "0"}) == 1
    assert len(table._senders) == 2


def test_a_rank_that_changes_run_mid_way_moves_and_is_counted():
    table = RankTable(rank_histograms=True, max_ranks=64, findings=FindingLog(), default_node="n0")
    sender = SenderIdentity(pid=1234, uid=1000, gid=1000, labels={"slurm_job_id": "77"})
    for step in range(5):
        table.ingest(_step("a", 1, 2, step), sender)
        # The kernel names every socket sender's uid: rank 0 is the same user's process.
        table.ingest(_step("a", 0, 2, step), SenderIdentity(pid=1233, uid=1000, gid=1000))
    for step in range(2):
        table.ingest(_step("b", 1, 4, step), sender)
    r = registry_of(RunMetrics(table))
    assert r.get_sample_value("laggard_steps_total", {"run": "a", "rank": "1"}) is None
    assert r.get_sample_value("laggard_steps_total", {"run": "a", "rank": "0"}) == 5
    assert r.get_sample_value("laggard_steps_total", {"run": "b", "rank": "1"}) == 2
    assert r.get_sample_value("laggard_intake_ranks_forgotten_total", {"reason": "moved"}) == 1
    info = {"run": "b", "rank": "1", "local_rank": "", "node": "n0", "gpu": "", "uuid": "",
            "pci_bus_id": "", "world_size": "4", "slurm_job_id": "77"}
    assert r.get_sample_value("laggard_rank_info", info) == 1
    # The workload label is on the info series only.
    assert r.get_sample_value("laggard_steps_total",
                              {"run": "b", "rank": "1", "slurm_job_id": "77"}) is None


def test_a_run_over_its_fair_share_gives_ranks_back_when_another_run_needs_room():
    budget = 40 * RANK_SAMPLES
    table = RankTable(rank_histograms=True,
                      max_ranks=4096, findings=FindingLog(), default_node="n0",
                      max_series=budget)
    for rank in range(100):
        table.ingest(_step("greedy", rank, 100, 0))
    assert table.run_series()["greedy"] == budget  # alone, it may use it all
    for rank in range(20):
        table.ingest(_step("small", rank, 20, 0))
    r = registry_of(RunMetrics(table))
    series = table.run_series()
    assert series["small"] == 20 * RANK_SAMPLES
    assert series["greedy"] == 20 * RANK_SAMPLES
    assert table.series <= budget
    # Highest ranks first; the rest of the greedy run is untouched.
    assert r.get_sample_value("laggard_steps_total", {"run": "greedy", "rank": "19"}) == 1
    assert r.get_sample_value("laggard_steps_total", {"run": "greedy", "rank": "39"}) is None
    assert r.get_sample_value("laggard_intake_ranks_forgotten_total", {"reason": "budget"}) == 20
    # The greedy run cannot take its ranks back while the small one holds its share.
    table.ingest(_step("greedy", 39, 100, 1))
    assert table.run_series() == series
    assert r.get_sample_value("laggard_intake_rejected_total", {"reason": "series_limit"}) >= 61


def test_runs_expire_with_their_ranks():
    clock = _Clock()
    table = RankTable(rank_histograms=True, max_ranks=64, findings=FindingLog(), default_node="n0",
                      rank_ttl_seconds=60, clock=clock)
    table.ingest(_step("a", 0, 1, 0))
    table.ingest(WindowReport(run="a", step=0, world_size=1).encode())
    clock.now += 30
    table.ingest(_step("b", 0, 1, 0))
    clock.now += 40
    r = registry_of(RunMetrics(table))
    assert r.get_sample_value("laggard_intake_runs") == 1
    assert r.get_sample_value("laggard_intake_runs_forgotten_total", {"reason": "stale"}) == 1
    assert r.get_sample_value("laggard_steps_total", {"run": "b", "rank": "0"}) == 1
    assert table.series == RANK_SAMPLES


def test_rank_info_names_the_gpu_from_the_uuid_or_the_pci_bus_id():
    nvml = FakeNvml(4)
    table = RankTable(rank_histograms=True, max_ranks=64, findings=FindingLog(), default_node="n0",
                      gpu_resolver=GpuIndex(NvmlLibrary(nvml)))
    table.ingest(_step("a", 0, 3, 0, local_rank=0, uuid="GPU-fa4e0000-0000-0000-0000-000000000002",
                       pci_bus_id="00000000:38:00.0"))
    table.ingest(_step("a", 1, 3, 0, local_rank=1, pci_bus_id="00000000:48:00.0"))
    # A PCI id NVML does not know: gpu="" and counted, the rank's other series as usual.
    table.ingest(_step("a", 2, 3, 0, local_rank=2, pci_bus_id="00000000:EE:00.0"))
    table.ingest(_step("a", 2, 3, 1, local_rank=2, pci_bus_id="00000000:EE:00.0"))
    r = registry_of(RunMetrics(table))
    base = {"run": "a", "node": "n0", "world_size": "3"}
    assert r.get_sample_value("laggard_rank_info", {
        **base, "rank": "0", "local_rank": "0", "gpu": "2",
        "uuid": "GPU-fa4e0000-0000-0000-0000-000000000002", "pci_bus_id": "0000:38:00"}) == 1
    assert r.get_sample_value("laggard_rank_info", {
        **base, "rank": "1", "local_rank": "1", "gpu": "3", "uuid": "",
        "pci_bus_id": "0000:48:00"}) == 1
    assert r.get_sample_value("laggard_rank_info", {
        **base, "rank": "2", "local_rank": "2", "gpu": "", "uuid": "",
        "pci_bus_id": "0000:ee:00"}) == 1
    assert r.get_sample_value("laggard_intake_gpu_unresolved_total",
                              {"reason": "unknown_device"}) == 1
    assert r.get_sample_value("laggard_steps_total", {"run": "a", "rank": "2"}) == 2


def test_without_nvml_the_gpu_label_is_empty_and_counted_once():
    nvml = FakeNvml(1, driver="no_driver")
    table = RankTable(rank_histograms=True, max_ranks=64, findings=FindingLog(), default_node="n0",
                      gpu_resolver=GpuIndex(NvmlLibrary(nvml)))
    for step in range(3):
        table.ingest(_step("a", 0, 1, step, uuid="GPU-x"))
    r = registry_of(RunMetrics(table))
    assert r.get_sample_value("laggard_intake_gpu_unresolved_total", {"reason": "no_nvml"}) == 1
    assert r.get_sample_value("laggard_steps_total", {"run": "a", "rank": "0"}) == 3


def test_bad_sender_labels_never_reach_the_exposition():
    table = RankTable(rank_histograms=True, max_ranks=64, findings=FindingLog(), default_node="n0")
    labels = {"run": "forged", "pod_uid": "p\x00\n" + "u" * 500, "Bad-Name": "x",
              **{f"z{i}": "v" for i in range(20)}}
    table.ingest(_step("a", 0, 1, 0), SenderIdentity(pid=1, labels=labels))
    r = registry_of(RunMetrics(table))
    samples = [s for m in r.collect() if m.name == "laggard_rank_info" for s in m.samples]
    (sample,) = samples
    assert sample.labels["run"] == "a"
    assert "Bad-Name" not in sample.labels
    assert sample.labels["pod_uid"] == "p" + "u" * 127
    assert len(sample.labels) <= 8 + 8
