"""``laggard demo``'s shapes of a slowness (issue 33): ``--inject stall/burst/node/moving``,
``--nodes``, ``--slow-rank 1,3``; their specs and one-line errors, which rank each slows at
which step, the stall inside the throttle, and the report's expected vs named.

The real runs (``slow``) check that each injection really happened, read from ``--report``'s
per-step measurements; they do not check detection (the detector is not this file's subject).
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from support import budget

from laggard.cli import main as laggard_main
from laggard.demo.injections import (
    BurstInjection,
    MovingInjection,
    NodeInjection,
    NodePlacement,
    SlowSchedule,
    StallInjection,
    parse_injection,
    parse_slow_ranks,
)
from laggard.demo.report import build_report, format_report

#: Short real runs: 10-step windows, the onset at step 20.
SHORT = ["--window", "10", "--slow-from", "20"]


# ------------------------------------------------------------------------------ the specs
def test_every_shape_reads_back_its_own_spec_and_takes_its_defaults() -> None:
    assert parse_injection("stall=rank:1,every:5,seconds:0.3") == StallInjection(1, 5, 0.3)
    assert parse_injection(" stall=seconds:2, mode:sleep ,every:25,rank:0") == \
        StallInjection(0, 25, 2.0, "sleep")
    assert parse_injection("burst=rank:2,steps:5,every:20,factor:2") == \
        BurstInjection(2, 5, 20, 2.0)
    assert parse_injection("node=node:node-1,factor:1.5") == NodeInjection("node-1", 1.5)
    assert parse_injection("moving=every:10,factor:1.5") == MovingInjection(10, 1.5, 1)
    for shape in (StallInjection(3, 1, 0.123456789, "sleep"), BurstInjection(0, 1, 2, 20.0),
                  NodeInjection("node-0", 1.0000001), MovingInjection(7, 3.25, 0)):
        assert parse_injection(shape.spec()) == shape, shape.spec()


@pytest.mark.parametrize(("spec", "message"), [
    ("stall=rank:1,every:0,seconds:1", "every 0 must be >= 1"),
    ("stall=rank:1,every:5,seconds:0", "seconds 0 must be in (0, 60]"),
    ("stall=rank:1,every:5,seconds:nan", "seconds nan must be in (0, 60]"),
    ("stall=rank:1,every:5,seconds:61", "seconds 61 must be in (0, 60]"),
    ("stall=rank:-1,every:5,seconds:1", "rank -1 must be >= 0"),
    ("stall=rank:1,every:5,seconds:1,mode:nap", "mode must be compute or sleep, got 'nap'"),
    ("stall=rank:1,seconds:1", "stall: missing every (keys: rank, every, seconds, mode)"),
    ("stall=rank:1,every:five,seconds:1", "stall: every must be int, got 'five'"),
    ("burst=rank:1,steps:5,every:5,factor:2", "steps 5 must be fewer than every 5"),
    ("burst=rank:1,steps:0,every:5,factor:2", "steps 0 must be >= 1"),
    ("burst=rank:1,steps:2,every:5,factor:1", "factor 1 must be in (1, 20]"),
    ("burst=rank:1,steps:2,every:5,factor:inf", "factor inf must be in (1, 20]"),
    ("node=node:node-1,factor:0.5", "factor 0.5 must be in (1, 20]"),
    ("node=factor:2", "node: missing node (keys: node, factor)"),
    ("moving=every:0,factor:2", "every 0 must be >= 1"),
    ("moving=every:5,factor:2,rank:-2", "rank -2 must be >= 0"),
    ("moving=every:5,factor:2,node:node-0", "moving: unknown key 'node' (keys: every, factor, "
                                            "rank)"),
    ("wobble=rank:1", "stall=rank:R,every:N,seconds:S[,mode:sleep]"),
])
def test_a_bad_shape_is_refused_in_one_line(spec: str, message: str) -> None:
    with pytest.raises(ValueError) as err:
        parse_injection(spec)
    assert message in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(("flags", "message"), [
    (["--inject", "node=node:node-1,factor:2"],
     "--inject node=node:node-1,factor:2: a node slowdown needs emulated nodes: add --nodes N"),
    (["--nodes", "2", "--inject", "node=node:node-2,factor:2"],
     "no node 'node-2': --nodes 2 places the ranks on node-0, node-1"),
    (["--nodes", "3"], "--nodes 3 must divide --world-size 4"),
    (["--nodes", "-1"], "--nodes must be >= 1, got -1"),
    (["--inject", "stall=rank:4,every:5,seconds:1"],
     "--inject stall=rank:4,every:5,seconds:1: rank 4 outside the world of 4 ranks (0-3)"),
    (["--inject", "burst=rank:9,steps:1,every:5,factor:2"], "rank 9 outside the world of 4"),
    (["--inject", "moving=every:5,factor:2,rank:4"], "rank 4 outside the world of 4"),
    (["--inject", "stall=rank:1,every:5,seconds:1",
      "--inject", "stall=rank:2,every:5,seconds:1"],
     "--inject: one injection of each kind at most (hang, checkpoint, gc, tokens, stage, stall, "
     "burst, node, moving)"),
    (["--inject", "burst=rank:1,steps:1,every:1,factor:2"],
     "--inject: steps 1 must be fewer than every 1"),
    (["--slow-rank", "1,1"], "--slow-rank: rank 1 listed twice"),
    (["--slow-rank", "1,,3"], "--slow-rank takes a rank or a comma list of ranks (1,3), got "
                              "'1,,3'"),
    (["--slow-rank", "one"], "--slow-rank takes a rank or a comma list"),
    (["--slow-rank", "1,4"], "--slow-rank must be in [0, 3]"),
    (["--slow-rank", "-1"], "--slow-rank: rank -1 must be >= 0"),
])
def test_the_demo_refuses_a_bad_shape_flag_before_starting_anything(
        flags: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    status = laggard_main(["demo", "--world-size", "4", "--steps", "60", "--window", "10",
                           *flags])
    captured = capsys.readouterr()
    assert status == 2
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("laggard demo: "), captured.err
    assert message in lines[0]
    assert captured.out == ""  # no agent, no launcher


def test_slow_rank_takes_one_rank_or_a_list() -> None:
    assert parse_slow_ranks("2") == [2] and parse_slow_ranks(2) == [2]
    assert parse_slow_ranks(" 1, 3") == [1, 3] and parse_slow_ranks([3, 1]) == [3, 1]


# ---------------------------------------------------------------------- who, when, how much
def _schedule(*shapes: Any, world: int = 4, nodes: int = 0, slow: tuple[int, ...] = (),
              slowdown: float = 1.0) -> SlowSchedule:
    return SlowSchedule.of(world_size=world, slow_from=20, slow_ranks=list(slow),
                           slowdown=slowdown, nodes=nodes, injections=list(shapes))


def test_a_stall_is_on_every_nth_step_from_the_onset_on_its_rank_only() -> None:
    stall = StallInjection(1, 5, 0.3, "sleep")
    schedule = _schedule(stall)
    stalled = [s for s in range(60) if schedule.stall(1, s) is not None]
    assert stalled == [20, 25, 30, 35, 40, 45, 50, 55]
    assert all(schedule.stall(r, s) is None for r in (0, 2, 3) for s in range(60))
    assert all(schedule.extra(r, s) == 0 for r in range(4) for s in range(60))  # no factor


def test_a_burst_slows_k_steps_of_every_m() -> None:
    schedule = _schedule(BurstInjection(2, 3, 10, 2.5))
    slowed = [s for s in range(50) if schedule.extra(2, s) > 0]
    assert slowed == [20, 21, 22, 30, 31, 32, 40, 41, 42]
    assert schedule.extra(2, 21) == pytest.approx(1.5)
    assert not any(schedule.extra(r, s) for r in (0, 1, 3) for s in range(50))


def test_a_node_slows_each_of_its_ranks_and_the_nodes_hold_consecutive_ranks() -> None:
    placement = NodePlacement(8, 4)
    assert placement.names == ["node-0", "node-1", "node-2", "node-3"]
    assert [placement.node_of(r) for r in range(8)] == [
        "node-0", "node-0", "node-1", "node-1", "node-2", "node-2", "node-3", "node-3"]
    assert placement.ranks_of("node-2") == [4, 5] and placement.ranks_of("node-9") == []
    assert NodePlacement(4).node_of(1) is None and NodePlacement(4).names == []
    node = NodeInjection("node-1", 2.0)
    schedule = _schedule(node, world=8, nodes=4)
    assert [r for r in range(8) if schedule.extra(r, 20) > 0] == [2, 3]
    assert not any(schedule.extra(r, 19) for r in range(8))
    assert node.ranks(schedule.placement, 100, 20) == [2, 3]
    assert node.check(8, 100, nodes=4) is None


def test_a_moving_slowness_moves_to_the_next_rank_every_n_steps() -> None:
    moving = MovingInjection(10, 2.0)
    schedule = _schedule(moving)
    slowed = [next((r for r in range(4) if schedule.extra(r, s) > 0), None)
              for s in range(15, 75, 5)]
    assert slowed == [None, 1, 1, 2, 2, 3, 3, 0, 0, 1, 1, 2]
    assert moving.ranks(schedule.placement, 60, 20) == [1, 2, 3, 0]
    assert moving.ranks(schedule.placement, 35, 20) == [1, 2]  # 15 steps: two turns


def test_several_slowdowns_on_one_step_add_their_extra_work() -> None:
    schedule = _schedule(BurstInjection(1, 2, 10, 2.0), slow=(1, 3), slowdown=1.25)
    assert schedule.extra(1, 20) == pytest.approx(1.25)  # 0.25 + 1.0
    assert schedule.extra(1, 22) == pytest.approx(0.25)
    assert schedule.extra(3, 20) == pytest.approx(0.25) and schedule.extra(0, 20) == 0
    assert schedule.extra(1, 19) == 0  # before the onset
    unslowed = _schedule(slow=(1,), slowdown=1.0)
    assert unslowed.slow_ranks == () and unslowed.extra(1, 30) == 0


# --------------------------------------------------------------------------- the throttle
def test_a_stall_runs_once_per_step_in_cpu_time_or_asleep() -> None:
    pytest.importorskip("torch")
    from laggard.demo.model import StepThrottle

    throttle = StepThrottle(incremental=True)  # a pipeline's microbatches: several burns
    throttle.stall_seconds, throttle.stall_mode = 0.05, "compute"
    assert throttle.active
    throttle.start_step()
    cpu = time.thread_time()
    throttle.burn_for_step()
    throttle.burn_for_step()  # the next microbatch's burn: no second stall
    assert time.thread_time() - cpu >= 0.05 and not throttle.active
    assert throttle.take_step_injected() >= 0.05
    assert throttle.take_step_injected() == 0.0  # taken: reset

    throttle.stall_seconds, throttle.stall_mode = 0.05, "sleep"
    throttle.start_step()
    cpu, wall = time.thread_time(), time.perf_counter()
    throttle.burn_for_step()
    assert time.perf_counter() - wall >= 0.05
    assert time.thread_time() - cpu < 0.04  # asleep: no CPU time
    assert throttle.take_step_injected() >= 0.05


def test_the_worker_reads_one_slow_rank_a_list_or_none() -> None:
    pytest.importorskip("torch")
    from laggard.demo.worker import parse_args

    assert parse_args(["--slow-rank", "1,3"]).slow_ranks == [1, 3]
    assert parse_args(["--slow-rank", "2"]).slow_ranks == [2]
    assert parse_args(["--slow-rank", "-1"]).slow_ranks == []  # cluster.py's "none"
    assert parse_args([]).slow_ranks == [] and parse_args([]).nodes == 0


# ------------------------------------------------------------------------------ the report
def _result(world: int, steps: int, injections: list[str], trace: list[list[list[float]]],
            findings: list[dict[str, Any]], cleared: list[dict[str, Any]] | None = None,
            nodes: int = 0) -> dict[str, Any]:
    names = ["compute_seconds", "collective_wait_seconds", "step_seconds"]
    return {
        "world_size": world, "steps": steps, "loss": {"first": 5.0, "last": 2.0},
        "stat_names": names,
        "windows": [{"step": s, "medians": [[0.02, 0.01, 0.05]] * world}
                    for s in range(9, steps, 10)],
        "findings": findings, "cleared": cleared or [], "injections": injections,
        "step_trace": {"columns": ["step_seconds", "cpu_seconds", "exposed_wait_seconds",
                                   "injected_seconds"], "ranks": trace},
        "nodes": nodes, "rank_nodes": [],
    }


def _args(**kw: Any) -> argparse.Namespace:
    return argparse.Namespace(**{"slow_rank": 1, "slowdown": 1.0, "slow_from": 20,
                                 "window": 10, "compression": "none", **kw})


def _finding(rank: int | None, step: int, kind: str = "compute", node: str | None = None,
             detector: str = "straggler") -> dict[str, Any]:
    return {"detector": detector, "kind": kind, "severity": "warning", "message": "m",
            "rank": rank, "node": node, "step": step, "evidence": {}}


def _stall_trace(world: int, steps: int, stalled: int, every: int, seconds: float
                 ) -> list[list[list[float]]]:
    """Each rank's steps: 20 ms of CPU, the stalled rank's every N-th step from 20 asleep for
    ``seconds``, which the others wait out."""
    trace = []
    for rank in range(world):
        rows = []
        for step in range(steps):
            on = step >= 20 and (step - 20) % every == 0
            wait = 0.005 if rank == stalled or not on else 0.005 + seconds
            rows.append([0.05 + (seconds if on else 0.0), 0.02, wait,
                         seconds if on and rank == stalled else 0.0])
        trace.append(rows)
    return trace


def test_the_report_says_what_a_stall_did_and_who_was_named_and_when() -> None:
    spec = "stall=rank:2,every:5,seconds:0.3,mode:sleep"
    result = _result(4, 80, [spec], _stall_trace(4, 80, 2, 5, 0.3),
                     [_finding(0, 9), _finding(2, 49), _finding(2, 59), _finding(None, 69,
                                                                                "job_slowdown")],
                     cleared=[{**_finding(2, 79), "cleared": True}])
    report = build_report(result, _args(), "http://x/metrics")
    injected = report["injected"]
    # the old keys, as before
    assert {k: injected[k] for k in ("rank", "slowdown", "from_step")} == {
        "rank": 1, "slowdown": 1.0, "from_step": 20}
    assert injected["shape"] == "stall" and injected["ranks"] == [2]
    assert injected["node"] is None and injected["slow_ranks"] == []
    (stall,) = injected["shapes"]
    assert stall["injection"] == spec and stall["ranks"] == [2] and stall["hit"]
    assert stall["first_named_step"] == 49 and stall["steps_to_name"] == 30
    assert stall["windows_to_name"] == 3  # the windows ending at 29, 39 and 49
    assert stall["wrong_ranks"] == [0] and stall["job_named"]
    assert [n["who"] for n in stall["named"]] == [2, "job"]
    (effect,) = stall["effect"]
    assert effect["steps"] == 12  # 20, 25, ..., 75
    assert effect["injected_seconds"] == pytest.approx(0.3)
    assert effect["cpu_seconds_on"] == pytest.approx(effect["cpu_seconds_off"])  # asleep
    assert effect["others_wait_seconds_on"] - effect["others_wait_seconds_off"] == \
        pytest.approx(0.3)
    assert report["finding_events"][0] == {"event": "raised", "step": 9, "rank": 0,
                                           "node": None, "kind": "compute",
                                           "detector": "straggler"}
    assert report["finding_events"][-1]["event"] == "cleared"
    text = format_report(report)
    line = next(x for x in text.splitlines() if x.startswith(f"injected {spec}"))
    assert "rank 2 stalls 300 ms once every 5 steps (asleep" in line
    assert "measured rank 2 on 12 steps: 300.0 ms injected, CPU 20.0 -> 20.0 ms, the " \
           "others' wait 5.0 -> 305.0 ms per step" in line
    assert "expected rank 2; named: rank 0 (compute, straggler) at step 9" not in line
    assert ("named: rank 2 (compute, straggler) at step 49, job (job_slowdown, straggler) at "
            "step 69, first at step 49 (3 windows from the onset): found, with others named "
            "too; wrong ranks [0]") in line
    json.dumps(report)  # what --report writes


def test_a_node_is_expected_as_the_node_or_all_of_its_ranks() -> None:
    spec = "node=node:node-1,factor:2"
    flat = [[[0.05, 0.02, 0.01, 0.0]] * 60 for _ in range(4)]
    as_node = build_report(_result(4, 60, [spec], flat, [_finding(None, 39, "node", "node-1")],
                                   nodes=2), _args(nodes=2), "http://x/metrics")
    (node,) = as_node["injected"]["shapes"]
    assert as_node["nodes"] == {"node-0": [0, 1], "node-1": [2, 3]}
    assert as_node["injected"]["node"] == "node-1" and as_node["injected"]["ranks"] == [2, 3]
    assert node["hit"] and node["first_named_step"] == 39 and node["named"][0]["who"] == "node-1"
    assert "emulated nodes: node-0: ranks 0, 1; node-1: ranks 2, 3" in format_report(as_node)
    one_rank = build_report(_result(4, 60, [spec], flat, [_finding(2, 39, node="node-1")],
                                    nodes=2), _args(nodes=2), "http://x/metrics")
    assert not one_rank["injected"]["shapes"][0]["hit"]  # rank 3 of the node unnamed
    assert "expected node node-1 (ranks 2, 3)" in format_report(one_rank)


def test_several_slow_ranks_keep_the_old_keys_and_are_each_measured() -> None:
    trace = [[[0.05, 0.03 if r in (1, 3) and s >= 20 else 0.02, 0.01, 0.0] for s in range(60)]
             for r in range(4)]
    result = _result(4, 60, [], trace, [_finding(1, 39), _finding(3, 49)])
    result["stat_names"] = ["compute_seconds", "collective_wait_seconds", "step_seconds"]
    for w in result["windows"]:
        w["medians"] = [[0.03 if r in (1, 3) else 0.02, 0.01, 0.05] for r in range(4)]
    report = build_report(result, _args(slow_rank="1,3", slowdown=1.5), "http://x/metrics")
    injected = report["injected"]
    assert injected["rank"] == 1 and injected["slow_ranks"] == [1, 3]
    assert injected["shape"] == "ranks" and injected["ranks"] == [1, 3]
    assert injected["measured_slowdown"] == pytest.approx(0.5)
    assert injected["measured_slowdowns"] == {"1": pytest.approx(0.5), "3": pytest.approx(0.5)}
    (ranks,) = injected["shapes"]
    assert ranks["hit"] and ranks["first_named_step"] == 39 and ranks["wrong_ranks"] == []
    assert [e["cpu_seconds_on"] / e["cpu_seconds_off"] for e in ranks["effect"]] == [
        pytest.approx(1.5), pytest.approx(1.5)]
    assert report["causes"][0]["expected"] == {"kind": "compute", "ranks": [1, 3]}
    text = format_report(report)
    assert "injected: ranks 1, 3 each 50% slower compute from step 20; measured rank 1 " \
           "50.0%, rank 3 50.0%" in text
    assert "injected slowdown=1.5,rank:1,3: expected compute on ranks 1, 3; named: rank 1 " \
           "(compute), rank 3 (compute): RIGHT" in text
    single = build_report(result, _args(slow_rank=1, slowdown=1.5), "http://x/metrics")
    assert single["injected"]["shape"] == "steady"
    assert "injected: rank 1 50% slower compute from step 20" in format_report(single)


def test_a_moving_slowness_expects_the_ranks_it_visits() -> None:
    flat = [[[0.05, 0.02, 0.01, 0.0]] * 60 for _ in range(4)]
    report = build_report(_result(4, 60, ["moving=every:10,factor:2,rank:3"], flat,
                                  [_finding(0, 49)]), _args(), "http://x/metrics")
    (moving,) = report["injected"]["shapes"]
    assert moving["ranks"] == [3, 0, 1, 2] and moving["hit"]
    assert [e["steps"] for e in moving["effect"]] == [10, 10, 10, 10]
    assert moving["windows_to_name"] == 3


# ------------------------------------------------------------------------- real short runs
def _run(tmp_path: Path, *flags: str) -> tuple[dict[str, Any], str]:
    """Run ``laggard demo FLAGS`` to the end; its report and output."""
    report = tmp_path / "report.json"
    proc = subprocess.run([sys.executable, "-m", "laggard.cli", "demo", *SHORT, *flags,
                           "--report", str(report)], capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=budget(300))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    return json.loads(report.read_text()), out


def _effects(report: dict[str, Any]) -> dict[int, dict[str, Any]]:
    (shape,) = report["injected"]["shapes"]
    return {e["rank"]: e for e in shape["effect"]}


@pytest.mark.slow
def test_a_stall_asleep_holds_every_other_rank_in_its_collective(tmp_path: Path) -> None:
    report, out = _run(tmp_path, "--world-size", "3", "--steps", "100",
                       "--inject", "stall=rank:1,every:5,seconds:0.3,mode:sleep")
    effect = _effects(report)[1]
    assert effect["steps"] == 16  # 20, 25, ..., 95
    assert 0.3 <= effect["injected_seconds"] < 1.0  # slept, measured on the wall clock
    assert effect["cpu_seconds_on"] - effect["cpu_seconds_off"] < 0.1  # no CPU time
    # the others waited it out in their collective, on those steps only
    assert effect["others_wait_seconds_on"] - effect["others_wait_seconds_off"] > 0.15
    assert "rank 1 stalls 300 ms once every 5 steps (asleep" in out


@pytest.mark.slow
def test_a_burst_slows_its_rank_on_its_steps(tmp_path: Path) -> None:
    report, out = _run(tmp_path, "--world-size", "3", "--steps", "100",
                       "--inject", "burst=rank:2,steps:4,every:20,factor:3")
    effect = _effects(report)[2]
    assert effect["steps"] == 16  # 4 of every 20 steps from 20 to 99
    assert effect["cpu_seconds_on"] > 2.0 * effect["cpu_seconds_off"]  # 3x its compute
    assert effect["injected_seconds"] > effect["cpu_seconds_off"]
    assert report["injected"]["shape"] == "burst" and report["injected"]["ranks"] == [2]


@pytest.mark.slow
def test_a_slow_node_slows_each_of_its_ranks_and_the_windows_carry_the_nodes(
        tmp_path: Path) -> None:
    report, out = _run(tmp_path, "--world-size", "4", "--steps", "80", "--nodes", "2",
                       "--inject", "node=node:node-1,factor:2")
    assert report["nodes"] == {"node-0": [0, 1], "node-1": [2, 3]}
    # each rank's TrainingMonitor.Config(node=...), as rank 0's gathered windows carry it
    assert report["rank_nodes"] == ["node-0", "node-0", "node-1", "node-1"]
    effects = _effects(report)
    assert sorted(effects) == [2, 3]
    for effect in effects.values():
        assert effect["steps"] == 60
        assert effect["cpu_seconds_on"] > 1.6 * effect["cpu_seconds_off"]
    table = {r["rank"]: r["compute_seconds_median"] for r in report["ranks"]}
    assert min(table[2], table[3]) > 1.5 * max(table[0], table[1])
    assert "emulated nodes: node-0: ranks 0, 1; node-1: ranks 2, 3" in out


@pytest.mark.slow
def test_a_moving_slowness_slows_each_rank_in_turn(tmp_path: Path) -> None:
    report, _ = _run(tmp_path, "--world-size", "4", "--steps", "100",
                     "--inject", "moving=every:10,factor:2.5")
    effects = _effects(report)
    assert sorted(effects) == [0, 1, 2, 3]
    assert {r: e["steps"] for r, e in effects.items()} == {1: 20, 2: 20, 3: 20, 0: 20}
    for effect in effects.values():
        assert effect["cpu_seconds_on"] > 1.8 * effect["cpu_seconds_off"]


@pytest.mark.slow
def test_two_slow_ranks_are_each_slowed(tmp_path: Path) -> None:
    report, out = _run(tmp_path, "--world-size", "4", "--steps", "80",
                       "--slow-rank", "1,3", "--slowdown", "1.5")
    injected = report["injected"]
    assert injected["rank"] == 1 and injected["slow_ranks"] == [1, 3]
    for rank in ("1", "3"):
        assert 0.3 < injected["measured_slowdowns"][rank] < 0.8, injected
    table = {r["rank"]: r["compute_seconds_median"] for r in report["ranks"]}
    assert min(table[1], table[3]) > 1.3 * max(table[0], table[2])
    assert all(math.isfinite(e["cpu_seconds_on"]) for e in _effects(report).values())
    assert "injected: ranks 1, 3 each 50% slower compute from step 20" in out
