"""The healthcheck's rules on plain data: each cause, its threshold, and what is not a problem."""

from __future__ import annotations

import pytest

from laggard.actions.verdict import OK, PROBLEM, UNKNOWN, Rules, judge, parse_rfc3339
from laggard.agent.context import rfc3339
from laggard.parsers.exposition import Sample

NOW = 1_796_200_000.0
AGENT = Sample("laggard_agent_info", {"node": "gpu-07"}, 1.0)
GPU = Sample("laggard_gpu_info", {"gpu": "0", "pci_bus_id": "0000:18:00"}, 1.0)


def finding(detector: str, kind: str, severity: str = "warning", *, first: float = NOW,
            last: float = NOW, **fields: object) -> dict:
    return {"detector": detector, "kind": kind, "severity": severity, "message": "m",
            "first_seen": rfc3339(first), "last_seen": rfc3339(last), "count": 1, **fields}


def kinds(verdict) -> list[tuple[str, str]]:
    return [(p.kind, p.subject) for p in verdict.problems]


def test_a_node_with_nothing_wrong_is_ok_and_says_what_it_checked() -> None:
    verdict = judge([AGENT, GPU], [], Rules(), NOW)
    assert verdict.status == OK
    assert verdict.message == "node gpu-07 healthy (1 GPUs checked)"


def test_a_cpu_node_without_gpus_is_healthy_for_what_it_has() -> None:
    failing = Sample("laggard_collector_success", {"collector": "nvml"}, 0.0)
    verdict = judge([AGENT, failing], [], Rules(), NOW)
    assert (verdict.status, verdict.message) == (OK, "node gpu-07 healthy (no GPU)")


def test_metrics_without_the_agent_info_are_unknown_not_healthy() -> None:
    verdict = judge([GPU], [], Rules(), NOW)
    assert verdict.status == UNKNOWN
    assert "not a laggard agent" in verdict.message


def test_a_lost_gpu_by_index_or_by_pci_address() -> None:
    samples = [AGENT, Sample("laggard_gpu_lost", {"gpu": "1", "pci_bus_id": ""}, 1.0),
               Sample("laggard_gpu_lost", {"gpu": "", "pci_bus_id": "0000:91:00"}, 1.0),
               Sample("laggard_gpu_lost", {"gpu": "0", "pci_bus_id": ""}, 0.0)]
    verdict = judge(samples, [], Rules(), NOW)
    assert verdict.status == PROBLEM
    assert kinds(verdict) == [("gpu_lost", "gpu1"), ("gpu_lost", "0000:91:00")]
    assert verdict.message == "GPU 1 lost (+1 more)"


def test_only_a_recent_critical_xid_that_holds_is_a_problem() -> None:
    critical = finding("xid", "xid", "critical", gpu=0, last=NOW - 120,
                       evidence={"xid": 48, "pci_bus_id": "0000:18:00", "action": "reset_gpu"})
    old = finding("xid", "xid", "critical", gpu=1, last=NOW - 7200, evidence={"xid": 94})
    warning = finding("xid", "xid", "warning", gpu=2, evidence={"xid": 13})
    verdict = judge([AGENT], [critical, old, warning], Rules(), NOW)
    assert kinds(verdict) == [("xid", "48/gpu0")]
    assert verdict.message == "critical Xid 48 on gpu0 (reset_gpu)"
    assert judge([AGENT], [critical], Rules(xid_max_age_seconds=60), NOW).status == OK


def test_memory_faults_need_a_reset() -> None:
    samples = [AGENT,
               Sample("laggard_gpu_row_remap_pending", {"gpu": "0"}, 1.0),
               Sample("laggard_gpu_row_remap_failure", {"gpu": "1"}, 1.0),
               Sample("laggard_gpu_ecc_errors_total", {"gpu": "2", "type": "uncorrected"}, 2.0),
               Sample("laggard_gpu_ecc_errors_total", {"gpu": "2", "type": "corrected"}, 900.0),
               Sample("laggard_gpu_row_remap_pending", {"gpu": "3"}, 0.0)]
    verdict = judge(samples, [], Rules(), NOW)
    assert kinds(verdict) == [("row_remap_failure", "gpu1"), ("row_remap_pending", "gpu0"),
                              ("ecc_uncorrected", "gpu2")]


def test_a_clock_event_counts_once_held_for_the_threshold_and_active_now() -> None:
    active = Sample("laggard_gpu_clock_event_active", {"gpu": "1", "reason": "hw_slowdown"}, 1.0)
    idle = Sample("laggard_gpu_clock_event_active", {"gpu": "2", "reason": "gpu_idle"}, 1.0)
    held = finding("throttle", "throttle", gpu=1, first=NOW - 3600, last=NOW - 400)
    idle_finding = finding("throttle", "throttle", gpu=2, last=NOW - 4000)
    verdict = judge([AGENT, active, idle], [held, idle_finding], Rules(), NOW)
    assert kinds(verdict) == [("clock_event", "gpu1")]
    assert verdict.message == "GPU 1 clocks held by hw_slowdown for 7 min"
    # Held 400 s, not 600 s; and no longer active: not a problem.
    assert judge([AGENT, active], [held], Rules(clock_event_seconds=600), NOW).status == OK
    assert judge([AGENT], [held], Rules(), NOW).status == OK
    # Only the reasons a site counts (power capped by policy: sw_power_cap left out).
    capped = Sample("laggard_gpu_clock_event_active", {"gpu": "1", "reason": "sw_power_cap"}, 1.0)
    thermal_only = Rules(clock_event_reasons=frozenset({"sw_thermal", "hw_thermal"}))
    assert judge([AGENT, active, capped], [held], thermal_only, NOW).status == OK
    with pytest.raises(ValueError, match="gpu_idle"):
        Rules(clock_event_reasons=frozenset({"gpu_idle"}))


def test_a_straggler_rank_of_this_node_held_long_enough() -> None:
    mine = finding("straggler", "compute", rank=3, node="gpu-07", first=NOW - 900, last=NOW)
    other_node = finding("straggler", "compute", rank=9, node="gpu-08", first=NOW - 900)
    short = finding("straggler", "data", rank=4, node="gpu-07", first=NOW - 60)
    ended = finding("straggler", "compute", rank=5, node="gpu-07", first=NOW - 900,
                    ended_at=rfc3339(NOW))
    job = finding("straggler", "job_slowdown", node="gpu-07", first=NOW - 900)
    verdict = judge([AGENT], [mine, other_node, short, ended, job], Rules(), NOW)
    assert kinds(verdict) == [("straggler", "rank3")]
    assert verdict.message == "rank 3 (compute) a straggler for 15 min"


def test_a_rank_stalled_past_the_threshold_is_hung() -> None:
    stalled = Sample("laggard_rank_stalled_seconds", {"rank": "2", "run": "r1"}, 700.0)
    fine = Sample("laggard_rank_stalled_seconds", {"rank": "1", "run": "r1"}, 0.0)
    assert kinds(judge([AGENT, stalled, fine], [], Rules(), NOW)) == [("hung", "rank2")]
    assert judge([AGENT, stalled], [], Rules(hung_seconds=800), NOW).status == OK


def test_problems_come_in_the_order_of_their_kinds_and_bad_entries_are_skipped() -> None:
    samples = [AGENT, Sample("laggard_rank_stalled_seconds", {"rank": "2", "run": "r"}, 900.0),
               Sample("laggard_gpu_lost", {"gpu": "1", "pci_bus_id": ""}, 1.0)]
    junk = ["x", None, {"detector": "xid", "kind": "xid", "severity": "critical",
                        "last_seen": "not a time"}]
    assert [p.kind for p in judge(samples, junk, Rules(), NOW).problems] == ["gpu_lost", "hung"]


@pytest.mark.parametrize("value", [-1, float("nan"), float("inf")])
def test_rules_refuse_a_threshold_that_is_not_a_finite_non_negative_number(value) -> None:
    with pytest.raises(ValueError, match="hung_seconds"):
        Rules(hung_seconds=value)


def test_rfc3339_round_trips_the_agents_format() -> None:
    assert parse_rfc3339(rfc3339(NOW)) == NOW
    assert parse_rfc3339("2026-12-01T21:42:55Z") == 1_796_161_375.0
    assert parse_rfc3339("yesterday") is None and parse_rfc3339(None) is None


def _rank(run: str, rank: int, stalled: float, groups: dict[str, tuple[int, int]],
          gpu: str = "") -> list[Sample]:
    labels = {"run": run, "rank": str(rank)}
    out = [Sample("laggard_rank_stalled_seconds", labels, stalled),
           Sample("laggard_rank_info", {**labels, "gpu": gpu, "world_size": "16"}, 1.0)]
    for group, (issued, completed) in groups.items():
        out += [Sample("laggard_rank_collective_issued", {**labels, "group": group}, issued),
                Sample("laggard_rank_collective_completed", {**labels, "group": group},
                       completed)]
    return out


def test_of_a_hung_job_only_the_rank_holding_it_up_counts_not_its_victims() -> None:
    # Both ranks of this node stalled: rank 0 waits in collective 101 of g0, which rank 1 never
    # issued (stuck in its own work).
    samples = [AGENT, *_rank("r", 0, 900, {"g0[0,1]": (101, 100)}),
               *_rank("r", 1, 900, {"g0[0,1]": (100, 100)})]
    verdict = judge(samples, [], Rules(), NOW)
    assert kinds(verdict) == [("hung", "rank1")]
    assert verdict.message == "rank 1 of run r stalled for 15 min, holding its job up"


def test_a_rank_waiting_on_another_nodes_member_is_a_victim_here() -> None:
    samples = [AGENT, *_rank("r", 0, 900, {"g0[0,8]": (101, 100)})]
    assert judge(samples, [], Rules(), NOW).status == OK


def test_a_rank_stuck_on_the_device_in_a_collective_its_peer_completed_counts() -> None:
    # GPU job: rank 0 completed collective 101 and waits in 102; rank 1 issued 101 and never
    # completed it (its kernel never finished).
    samples = [AGENT, *_rank("r", 0, 900, {"g0[0,1]": (102, 101)}, gpu="0"),
               *_rank("r", 1, 900, {"g0[0,1]": (101, 100)}, gpu="1")]
    assert kinds(judge(samples, [], Rules(), NOW)) == [("hung", "rank1")]
