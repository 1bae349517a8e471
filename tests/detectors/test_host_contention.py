"""What the job's hosts showed during a window, and the whole-job slowdown that says it before
it guesses (pure: plain window records and findings)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from laggard.detectors.finding import Finding, Severity
from laggard.detectors.gpu_state import GPU_STATE_COLUMN_NAMES, SOURCE_NVML, reason_column
from laggard.detectors.host_contention import (
    HOST_CONTEXT_COLUMN_NAMES,
    MIN_CPU_PRESSURE_RATIO,
    describe_host_contention,
    with_host_cause,
)
from laggard.detectors.straggler import RankWindow, StragglerDetector
from laggard.detectors.window import WindowRecord

NAN = math.nan


def _record(rows: list[dict[str, float]], nodes: list[str] | None = None,
            extra: tuple[str, ...] = ()) -> WindowRecord:
    names = HOST_CONTEXT_COLUMN_NAMES + extra
    columns = {name: np.array([row.get(name, NAN) for row in rows]) for name in names}
    return WindowRecord(step=99, columns=columns, ranks=np.arange(len(rows)),
                        world_size=len(rows), nodes=nodes)


def _host(load: float, pressure: float = NAN, steal: float = 0.0,
          switches: float = 5.0) -> dict[str, float]:
    return {"host_load1_per_cpu": load, "host_cpu_pressure_some_ratio": pressure,
            "host_cpu_steal_ratio": steal, "rank_involuntary_switches_per_second": switches}


def _job_slowdown() -> Finding:
    """A real whole-job slowdown: the straggler detector on 16 ranks all 30% slower from
    window 10 (the message is the detector's own, whatever its wording)."""
    detector = StragglerDetector()
    rng = np.random.default_rng(3)
    for i in range(24):
        factor = 1.3 if i >= 10 else 1.0
        compute = 0.1 * factor * rng.lognormal(0, 0.01, (16, 20))  # (ranks, steps)
        window = RankWindow(step=20 * i + 19, ranks=np.arange(16), compute_seconds=compute,
                            data_seconds=np.full((16, 20), 0.002),
                            collective_wait_seconds=0.01 + compute.max(axis=0) - compute,
                            transfer_seconds=np.full((16, 20), 0.01), world_size=16)
        for finding in detector.update(window):
            if finding.kind == "job_slowdown":
                return finding
    raise AssertionError("the detector raised no job_slowdown")


def test_a_record_without_the_host_columns_says_nothing():
    bare = WindowRecord(step=0, columns={"compute_seconds": np.ones(4)}, ranks=np.arange(4))
    assert describe_host_contention(bare) is None


def test_idle_hosts_say_nothing():
    record = _record([_host(0.3, 0.01)] * 8, nodes=["a"] * 4 + ["b"] * 4)
    assert describe_host_contention(record) is None


def test_cpu_pressure_on_one_of_two_nodes_is_named_per_node_not_per_rank():
    rows = [_host(3.1, 0.62, switches=140.0)] * 4 + [_host(0.4, 0.02, switches=2.0)] * 4
    text, evidence = describe_host_contention(_record(rows, nodes=["n1"] * 4 + ["n2"] * 4))
    assert text == ("the hosts were CPU-bound: 1 of 2 nodes (n1), load 3.1 per CPU, CPU "
                    "pressure 62% (PSI some), ranks preempted 71/s (median): other processes "
                    "compete with the ranks for CPU")
    assert evidence["nodes"] == 2 and evidence["cpu_bound_nodes"] == 1
    assert evidence["named"] == ["n1"] and evidence["cpu_pressure_some_ratio_max"] == 0.62


def test_a_high_load_with_low_pressure_is_not_cpu_bound_psi_comes_first():
    # Linux's load counts tasks in uninterruptible (I/O) sleep too; PSI is CPU-only
    record = _record([_host(4.0, 0.02)] * 4, nodes=["n1"] * 4)
    assert describe_host_contention(record) is None


def test_without_psi_the_load_per_cpu_decides():
    record = _record([_host(2.5)] * 2 + [_host(0.5)] * 2, nodes=["n1", "n1", "n2", "n2"])
    text, evidence = describe_host_contention(record)
    assert text.startswith("the hosts were CPU-bound: 1 of 2 nodes (n1), load 2.5 per CPU, "
                           "ranks preempted")
    assert "PSI" not in text and evidence["cpu_pressure_some_ratio_max"] is None


def test_steal_alone_blames_the_hypervisor():
    record = _record([_host(0.5, 0.01, steal=0.25)] * 3, nodes=["vm1", "vm2", "vm3"])
    text, evidence = describe_host_contention(record)
    assert "3 of 3 nodes (vm1, vm2, vm3)" in text and "steal up to 25%" in text
    assert text.endswith("the hypervisor gives their CPUs to other guests")
    assert evidence["steal_ratio_max"] == 0.25


def test_without_node_names_each_rank_is_a_host_of_its_own():
    text, _ = describe_host_contention(_record([_host(0.5, 0.3)] * 2 + [_host(0.5, 0.0)] * 2))
    assert "2 of 4 ranks' hosts" in text and "up to 30%" in text


def test_the_threshold_is_inclusive_and_nan_is_not_measured():
    at = _record([_host(NAN, MIN_CPU_PRESSURE_RATIO)], nodes=["n1"])
    assert describe_host_contention(at) is not None
    unmeasured = _record([_host(NAN, NAN, steal=NAN, switches=NAN)], nodes=["n1"])
    assert describe_host_contention(unmeasured) is None


def _gpu(reason: str | None) -> dict[str, float]:
    row = {"gpu_state_source": SOURCE_NVML, **_host(0.2, 0.0)}
    for name in GPU_STATE_COLUMN_NAMES:
        if name.endswith("_ratio") and name.startswith("gpu_") and name != "gpu_sm_clock_ratio":
            row[name] = 0.0
    if reason:
        row[reason_column(reason)] = 1.0
    return row


def test_every_gpu_throttled_is_said_and_one_free_gpu_says_nothing():
    throttled = _record([_gpu("sw_power_cap")] * 3 + [_gpu("hw_thermal")],
                        nodes=["n1"] * 4, extra=GPU_STATE_COLUMN_NAMES)
    text, evidence = describe_host_contention(throttled)
    assert text == "every GPU was throttled (sw_power_cap on 3 of 4, hw_thermal on 1 of 4 GPUs)"
    assert evidence["gpus_throttled"] == {"gpus": 4, "reasons": {"sw_power_cap": 3,
                                                                "hw_thermal": 1}}
    one_free = _record([_gpu("sw_power_cap")] * 3 + [_gpu(None)], nodes=["n1"] * 4,
                       extra=GPU_STATE_COLUMN_NAMES)
    assert describe_host_contention(one_free) is None
    idle_only = _record([_gpu("gpu_idle")] * 4, nodes=["n1"] * 4, extra=GPU_STATE_COLUMN_NAMES)
    assert describe_host_contention(idle_only) is None  # idle is not a limit


def test_a_job_slowdown_names_its_cpu_bound_hosts_before_the_generic_guess():
    finding = _job_slowdown()
    assert "not one rank: check shared storage" in finding.message
    record = _record([_host(3.1, 0.62)] * 4, nodes=["node07"] * 4)
    named = with_host_cause(finding, record)
    head, guess = named.message.split("; else check ")
    assert head.endswith("not one rank: the hosts were CPU-bound: 1 of 1 nodes (node07), load "
                         "3.1 per CPU, CPU pressure 62% (PSI some), ranks preempted 5/s "
                         "(median): other processes compete with the ranks for CPU")
    assert guess.startswith("shared storage, the network fabric")
    assert named.evidence["host"]["cpu_bound_nodes"] == 1
    assert named.evidence["slowdown"] == finding.evidence["slowdown"]


def test_other_findings_cleared_ones_and_quiet_hosts_are_untouched():
    busy = _record([_host(3.1, 0.62)] * 4, nodes=["node07"] * 4)
    compute = Finding(detector="straggler", kind="compute", severity=Severity.WARNING,
                      message="rank 2: compute 30% slower", rank=2)
    assert with_host_cause(compute, busy) is compute
    finding = _job_slowdown()
    cleared = finding.clear(step=999, reason="recovered", message="whole job recovered")
    assert with_host_cause(cleared, busy) is cleared
    quiet = _record([_host(0.2, 0.0)] * 4, nodes=["node07"] * 4)
    assert with_host_cause(finding, quiet) is finding


def test_a_message_without_the_generic_guess_gets_the_text_appended():
    finding = Finding(detector="straggler", kind="job_slowdown", severity=Severity.WARNING,
                      message="whole job 20% slower")
    named = with_host_cause(finding, _record([_host(NAN, 0.5)], nodes=["n1"]))
    assert named.message.startswith("whole job 20% slower; the hosts were CPU-bound: 1 of 1")


@pytest.mark.parametrize("k", [4, 12])
def test_many_bound_nodes_are_counted_and_a_few_named(k):
    nodes = [f"n{i:02d}" for i in range(16)]
    rows = [_host(2.0, 0.5)] * k + [_host(0.1, 0.0)] * (16 - k)
    text, evidence = describe_host_contention(_record(rows, nodes=nodes))
    assert f"{k} of 16 nodes, load up to 2.0" in text  # too many to list in the sentence
    assert evidence["named"] == nodes[:min(k, 8)]


def test_a_node_running_more_ranks_than_it_has_cpus_is_said_so():
    rows = [{**_host(1.9, 0.99, switches=48.0), "host_cpus": 2.0}] * 4
    text, evidence = describe_host_contention(_record(rows, nodes=["vm"] * 4))
    assert text == ("the hosts were CPU-bound: 1 of 1 nodes (vm), load 1.9 per CPU, CPU pressure "
                    "99% (PSI some), 4 ranks on 2 CPUs, ranks preempted 48/s (median): the job "
                    "runs more ranks than its hosts have CPUs")
    assert evidence["oversubscribed_nodes"] == 1
    # a run queue longer than the ranks: more than the ranks run there
    crowded = [{**_host(3.5, 0.99), "host_cpus": 2.0}] * 4
    assert describe_host_contention(_record(crowded, nodes=["vm"] * 4))[0].endswith(
        "more ranks than its hosts have CPUs, and other processes compete with them")
    roomy = [{**_host(2.4, 0.99), "host_cpus": 64.0}] * 4
    assert describe_host_contention(_record(roomy, nodes=["vm"] * 4))[0].endswith(
        "other processes compete with the ranks for CPU")
