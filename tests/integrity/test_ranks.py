"""Integrity checks on real gloo process groups: 4 ranks (and 2), DDP with two buckets, every
check with an injected bit flip and a clean run, each policy, each exchange (all-reduce,
all-gather, all-to-all). One spawn per world size runs every scenario (see rank_worker.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import AgentProcess, budget, free_port, start_agent, stop_agent

# every test spawns rank_worker.py, a torch.distributed (gloo) job
pytest.importorskip("torch", reason="the rank workers need torch (pip install 'laggard[torch]')")

WORKER = Path(__file__).with_name("rank_worker.py")
FLIP_RANK, FLIP_STEP = 2, 2
SCENARIOS_4 = [
    "allreduce:warn:none:0", "allgather:warn:none:0", "alltoall:warn:none:0",
    "allreduce:warn:after_reduce:3", "allreduce:warn:before_send:30",
    "allreduce:warn:param:0", "allgather:warn:before_send:5", "allgather:warn:after_reduce:0",
    "alltoall:warn:before_send:5", "nan:warn:none:0", "garbage:warn:none:0",
    "allreduce:skip_step:after_reduce:10", "allreduce:raise:before_send:30",
    "monitor:warn:after_reduce:7",
]
SCENARIOS_2 = ["allreduce:warn:none:0", "allreduce:warn:after_reduce:30"]

pytestmark = pytest.mark.slow


def spawn(world: int, scenarios: list[str], tmp_path: Path, intake: str = "") -> list[dict]:
    out = tmp_path / f"w{world}.json"
    proc = subprocess.run(
        [sys.executable, str(WORKER), str(world), str(out), str(free_port()), *scenarios],
        capture_output=True, text=True, timeout=budget(900),
        env={**os.environ, "OMP_NUM_THREADS": "1", "LAGGARD_TEST_INTAKE": intake})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads(Path(f"{out}.{r}").read_text()) for r in range(world)]


@pytest.fixture(scope="module")
def agent() -> Iterator[AgentProcess]:
    """A real node agent; the ``monitor`` scenario's rank 0 reports to its intake."""
    process = start_agent()
    yield process
    stop_agent(process)


@pytest.fixture(scope="module")
def four(tmp_path_factory: pytest.TempPathFactory, agent: AgentProcess) -> list[dict]:
    return spawn(4, SCENARIOS_4, tmp_path_factory.mktemp("ranks4"),
                 intake=f"127.0.0.1:{agent.intake_port}")


def kinds(results: list[dict], scenario: str) -> set[tuple]:
    """(kind, rank, step) of the corruption findings, the same on every rank."""
    per_rank = [{(f["kind"], f["rank"], f["step"]) for f in r[scenario]["findings"]}
                for r in results]
    assert all(p == per_rank[0] for p in per_rank), "ranks reached different verdicts"
    return per_rank[0]


@pytest.mark.parametrize("scenario", [s for s in SCENARIOS_4 if ":none:" in s and "nan" not in s
                                      and "garbage" not in s])
def test_clean_runs_raise_nothing(four: list[dict], scenario: str) -> None:
    assert kinds(four, scenario) == set()
    assert len({r[scenario]["param_hash"] for r in four}) == 1  # replicas bitwise equal
    assert all(r[scenario]["errors"] == 0 for r in four)


def test_after_reduce_mantissa_flip_names_the_rank(four: list[dict]) -> None:
    # bit 3: a change of 8 units in the last place, far below any sum check's reach
    found = kinds(four, "allreduce:warn:after_reduce:3")
    assert ("result_mismatch", FLIP_RANK, FLIP_STEP) in found
    assert four[FLIP_RANK]["allreduce:warn:after_reduce:3"]["fired"]


def test_before_send_exponent_flip_fails_the_sum_check(four: list[dict]) -> None:
    found = kinds(four, "allreduce:warn:before_send:30")
    assert ("sum_mismatch", None, FLIP_STEP) in found
    # every rank received the same corrupt sum: no rank's result differs from the others
    assert not any(kind == "result_mismatch" for kind, _, _ in found)


def test_param_flip_is_named_by_the_replica_check(four: list[dict]) -> None:
    found = kinds(four, "allreduce:warn:param:0")
    assert ("replica_mismatch", FLIP_RANK, FLIP_STEP) in found
    assert not any(kind == "sum_mismatch" for kind, _, _ in found)


def test_allgather_payload_flip_names_the_sender(four: list[dict]) -> None:
    found = kinds(four, "allgather:warn:before_send:5")
    assert ("payload_mismatch", FLIP_RANK, FLIP_STEP) in found
    found = kinds(four, "allgather:warn:after_reduce:0")
    assert ("result_mismatch", FLIP_RANK, FLIP_STEP) in found


def test_alltoall_payload_flip_names_the_link(four: list[dict]) -> None:
    (finding,) = [f for f in four[0]["alltoall:warn:before_send:5"]["findings"]
                  if f["kind"] == "payload_mismatch"]
    assert finding["rank"] == FLIP_RANK and finding["step"] == FLIP_STEP
    assert finding["evidence"]["sender"] == FLIP_RANK
    assert finding["evidence"]["receiver"] == 37 // 8 % 4  # element 37 of 4 rows of ceil(n/4)


def test_nan_gradient_names_its_rank(four: list[dict]) -> None:
    found = kinds(four, "nan:warn:none:0")
    assert ("nonfinite", 1, FLIP_STEP) in found


def test_garbage_message_is_a_check_fault_not_corruption(four: list[dict]) -> None:
    findings = four[0]["garbage:warn:none:0"]["findings"]
    assert [(f["kind"], f["rank"], f["severity"]) for f in findings] == [
        ("check_fault", 1, "warning")]


def test_skip_step_drops_the_update_on_every_rank(four: list[dict]) -> None:
    scenario = "allreduce:skip_step:after_reduce:10"
    expected = [True] * 4
    expected[FLIP_STEP] = False
    assert [r[scenario]["applied"] for r in four] == [expected] * 4
    assert len({r[scenario]["param_hash"] for r in four}) == 1  # replicas stayed equal
    assert not any(kind == "replica_mismatch" for kind, _, _ in kinds(four, scenario))


def test_raise_stops_every_rank_at_the_same_step(four: list[dict]) -> None:
    raised = [r["allreduce:raise:before_send:30"]["raised"] for r in four]
    assert all(x is not None and x["step"] == FLIP_STEP for x in raised)
    assert "rounding bound" in raised[0]["message"]


def test_fingerprints_ride_in_the_monitor_window_gather(four: list[dict],
                                                        agent: AgentProcess) -> None:
    found = kinds(four, "monitor:warn:after_reduce:7")
    assert ("result_mismatch", FLIP_RANK, FLIP_STEP) in found
    # rank 0 sent them to its node agent, which counts them
    text = agent.scrape()
    assert ('laggard_findings_total{detector="integrity",kind="result_mismatch",'
            'severity="critical"}') in text


def test_two_ranks_name_the_corrupt_one_through_the_sum_check(tmp_path: Path) -> None:
    two = spawn(2, SCENARIOS_2, tmp_path)
    assert kinds(two, "allreduce:warn:none:0") == set()
    found = kinds(two, "allreduce:warn:after_reduce:30")
    assert ("result_mismatch", FLIP_RANK % 2, FLIP_STEP) in found


COMPRESSORS = ("none", "fp16", "sign", "topk", "powersgd", "onebit_adam")
SCENARIOS_3 = [f"compress-{c}:warn:{where}:{bit}" for c in COMPRESSORS
               for where, bit in (("none", 0), ("after_reduce", 0))] + [
    "compress-none:warn:before_send:30", "compress-powersgd:warn:before_send:30",
    "compress-topk:warn:before_send:5", "compress-sign:warn:before_send:5",
    "compress-onebit_adam:warn:before_send:5"]


@pytest.fixture(scope="module")
def three(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    return spawn(3, SCENARIOS_3, tmp_path_factory.mktemp("ranks3"))


@pytest.mark.parametrize("compressor", COMPRESSORS)
def test_every_compressor_clean_and_after_reduce(three: list[dict], compressor: str) -> None:
    clean = f"compress-{compressor}:warn:none:0"
    assert kinds(three, clean) == set()
    assert len({r[clean]["param_hash"] for r in three}) == 1
    assert all(r[clean]["errors"] == 0 for r in three)
    found = kinds(three, f"compress-{compressor}:warn:after_reduce:0")
    assert ("result_mismatch", FLIP_RANK, FLIP_STEP) in found


@pytest.mark.parametrize("compressor, kind, rank", [
    ("none", "sum_mismatch", None), ("powersgd", "sum_mismatch", None),
    ("topk", "payload_mismatch", FLIP_RANK), ("sign", "payload_mismatch", FLIP_RANK),
    # 3 ranks: top-k's sparse reduce-scatter and 1-bit Adam both start with an all-to-all
    ("onebit_adam", "payload_mismatch", FLIP_RANK)])
def test_compressed_payload_flips(three: list[dict], compressor: str, kind: str,
                                  rank: int | None) -> None:
    found = kinds(three, f"compress-{compressor}:warn:before_send:{30 if rank is None else 5}")
    assert (kind, rank, FLIP_STEP) in found
