"""benchmarks/shape_detection.py scores saved demo reports without running a demo.

The scoring is checked two ways: on event lists written out here (each rule: named, windows to
name, wrong ranks, flaps, ``job_slowdown`` while a rank is named, a node, a moving slowness),
and on a real pair saved by the benchmark (``tests/fixtures/shape_detection``: an injected demo
and its concurrent clean twin, reports and windows), re-scored with ``--replay`` and checked
against what the demo's own report says it named and when.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import shape_detection as bench  # noqa: E402

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "shape_detection"


def _event(event: str, step: int, rank: int | None = None, *, node: str | None = None,
           kind: str = "waited_for", detector: str = "straggler") -> dict[str, Any]:
    return {"event": event, "step": step, "rank": rank, "node": node, "kind": kind,
            "detector": detector}


def _report(events: list[dict[str, Any]], *, shape: str = "stall", ranks: list[int] | None = None,
            node: str | None = None, injection: str = "stall=rank:1,every:25,seconds:0.1",
            effect: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    ranks = [1] if ranks is None else ranks
    return {"world_size": 4, "steps": 600, "finding_events": events,
            "injected": {"from_step": 200, "ranks": ranks, "node": node,
                         "shapes": [{"shape": shape, "injection": injection, "from_step": 200,
                                     "ranks": ranks, "node": node, "effect": effect or []}]}}


def test_a_rank_named_after_onset_counts_its_windows() -> None:
    # onset 200 starts a window (K = 20); the window ending at step 259 is the 3rd
    score = bench.score_run(_report([_event("raised", 259, 1)]), window=20)
    assert score["named"] and score["named_step"] == 259 and score["windows"] == 3
    assert score["wrong_ranks"] == [] and score["flaps"] == 0 and score["early"] == 0


def test_wrong_ranks_early_findings_and_nothing_named() -> None:
    events = [_event("raised", 99, 1), _event("raised", 119, 3), _event("raised", 419, 2)]
    score = bench.score_run(_report(events), window=20)
    assert not score["named"] and score["windows"] is None
    assert score["wrong_ranks"] == [2, 3]  # before the onset or after: no injection on them
    assert score["early"] == 1


def test_a_flap_is_cleared_while_on_and_raised_again() -> None:
    events = [_event("raised", 259, 1), _event("cleared", 359, 1), _event("raised", 419, 1)]
    score = bench.score_run(_report(events), window=20)
    assert score["flaps"] == 1 and score["cleared_while_on"] == 1
    # cleared for good (not raised again): cleared while on, not a flap
    score = bench.score_run(_report(events[:2]), window=20)
    assert score["flaps"] == 0 and score["cleared_while_on"] == 1


def test_job_slowdown_raised_while_the_rank_is_named() -> None:
    events = [_event("raised", 259, 1), _event("raised", 279, None, kind="job_slowdown")]
    assert bench.score_run(_report(events), window=20)["job_while_named"] == 1
    events = [_event("raised", 179, None, kind="job_slowdown"), _event("raised", 259, 1)]
    assert bench.score_run(_report(events), window=20)["job_while_named"] == 0


def test_two_ranks_are_named_when_both_are() -> None:
    events = [_event("raised", 259, 1, kind="compute"), _event("raised", 299, 3)]
    score = bench.score_run(_report(events, shape="ranks", ranks=[1, 3]), window=20)
    assert score["named"] and score["named_step"] == 299 and score["windows"] == 5
    score = bench.score_run(_report(events[:1], shape="ranks", ranks=[1, 3]), window=20)
    assert not score["named"]


def test_a_node_by_its_finding_or_all_its_ranks() -> None:
    node_report = {"shape": "node", "ranks": [2, 3], "node": "node-1",
                   "injection": "node=node:node-1,factor:1.25"}
    by_node = [_event("raised", 279, None, node="node-1", kind="node")]
    assert bench.score_run(_report(by_node, **node_report), window=20)["named_step"] == 279
    by_ranks = [_event("raised", 259, 2), _event("raised", 319, 3)]
    assert bench.score_run(_report(by_ranks, **node_report), window=20)["named_step"] == 319
    other = [_event("raised", 279, None, node="node-0", kind="node")]
    score = bench.score_run(_report(other, **node_report), window=20)
    assert not score["named"] and score["wrong_ranks"] == ["node-0"]


def test_a_moving_slowness_clears_on_a_rank_it_left_without_flapping() -> None:
    moving = {"shape": "moving", "ranks": [1, 2, 3, 0],
              "injection": "moving=every:100,factor:1.25,rank:1"}
    # rank 1 slowed on 200-299, rank 2 on 300-399: rank 1 cleared at 359 is no flap
    events = [_event("raised", 259, 1), _event("cleared", 359, 1), _event("raised", 519, 1)]
    score = bench.score_run(_report(events, **moving), window=20)
    assert score["named_step"] == 259 and score["flaps"] == 0
    # cleared during its own turn and raised again: a flap
    events = [_event("raised", 219, 1), _event("cleared", 259, 1), _event("raised", 279, 1)]
    assert bench.score_run(_report(events, **moving), window=20)["flaps"] == 1


def test_the_cost_is_the_others_extra_wait_over_the_clean_step() -> None:
    # 16 stalls of 0.5 s beyond the usual 0.1 s wait, over 400 steps of a 0.2 s clean step
    effect = [{"rank": 1, "steps": 16, "others_wait_seconds_on": 0.6,
               "others_wait_seconds_off": 0.1}]
    report = _report([], effect=effect)
    assert bench.lost_share(report, 0.2) == pytest.approx(16 * 0.5 / 400 / 0.2)
    assert bench.lost_share(report, None) is None


@pytest.mark.parametrize(("name", "kind", "percent"),
                         [("stall10", "stall", 10.0), ("two", "two", 25.0),
                          ("sleep2.5", "sleep", 2.5)])
def test_shape_names(name: str, kind: str, percent: float) -> None:
    assert bench.Shape.parse(name) == bench.Shape(name, kind, percent)


@pytest.mark.parametrize("name", ["stal10", "stall0", "stall200", ""])
def test_a_bad_shape_name_is_refused(name: str) -> None:
    with pytest.raises(ValueError, match="shape"):
        bench.Shape.parse(name)


def test_the_shapes_are_sized_to_the_cost() -> None:
    cal = bench.Calibration(step_seconds=0.2, work_cpu_seconds=0.02, extra_wall_per_cpu=2.0)
    periods = bench.Periods(stall_every=25, burst_steps=10, burst_every=60)

    def plan(name: str) -> dict[str, Any]:
        return bench.shape_flags(bench.Shape.parse(name), cal, periods, run=0, world_size=4)[3]

    # 10% of a 0.2 s step, every 25 steps: 0.5 s once in 25 steps, asleep or 0.25 CPU s
    assert plan("sleep10")["stall_wall_seconds"] == pytest.approx(0.5)
    assert "stall=rank:1,every:25,seconds:0.5000,mode:sleep" in plan("sleep10")["flags"]
    assert plan("stall10")["stall_seconds"] == pytest.approx(0.25)
    # a burst: 10 of 60 steps lose 0.12 s each (6x the 0.02 s average)
    assert plan("burst10")["burst_factor"] == pytest.approx(1 + 0.1 * 0.2 * 6 / 0.04)
    # a steady 10% of compute costs the job 0.1 * 0.02 * 2 / 0.2 = 2% of its time
    assert plan("steady10")["expected_cost"] == pytest.approx(0.02)
    assert "--slowdown 1.5" in plan("steadycost10")["flags"]
    assert plan("steadycost10")["expected_cost"] == pytest.approx(0.1)


def test_the_calibration_reads_the_clean_step_and_the_probe_stall() -> None:
    clean = {"ranks": [{"step_seconds_median": s, "compute_seconds_median": 0.02,
                        "data_seconds_median": 0.001} for s in (0.1, 0.12, 0.11, 0.3)]}
    probe = _report([], effect=[{"rank": 1, "steps": 12, "injected_seconds": 0.05,
                                 "others_wait_seconds_on": 0.15,
                                 "others_wait_seconds_off": 0.05}])
    cal = bench.Calibration.from_reports(clean, probe)
    assert cal == bench.Calibration(pytest.approx(0.115), pytest.approx(0.021),
                                    pytest.approx(2.0))
    with pytest.raises(ValueError, match="probe"):
        bench.Calibration.from_reports(clean, _report([]))


def test_the_running_calibration_follows_the_latest_pairs() -> None:
    running = bench.RunningCalibration(bench.Calibration(0.1, 0.02, 2.0), keep=2)
    clean = {"ranks": [{"step_seconds_median": 0.3, "compute_seconds_median": 0.02,
                        "data_seconds_median": 0.0}] * 4}
    stall = _report([], effect=[{"rank": 1, "steps": 12, "injected_seconds": 0.1,
                                 "others_wait_seconds_on": 0.45,
                                 "others_wait_seconds_off": 0.05}])
    sleep = _report([], injection="stall=rank:1,every:25,seconds:0.1,mode:sleep",
                    effect=[{"rank": 1, "steps": 12, "injected_seconds": 0.1,
                             "others_wait_seconds_on": 0.15, "others_wait_seconds_off": 0.05}])
    running.add(sleep, clean)  # a sleep's seconds are wall seconds: no rho from it
    assert running.current == bench.Calibration(pytest.approx(0.2), pytest.approx(0.02), 2.0)
    running.add(stall, clean)
    running.add(None, None)  # a failed pair adds nothing
    assert running.current == bench.Calibration(pytest.approx(0.3), pytest.approx(0.02),
                                                pytest.approx(3.0))


def test_replay_rescores_a_saved_real_pair(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    saved = tmp_path / "runs"
    shutil.copytree(FIXTURE, saved)
    assert bench.main(["--replay", str(saved)]) == 0
    runs = json.loads((saved / "shapes.json").read_text())
    assert runs, "no run scored"
    for run in runs:
        report = json.loads((saved / f"{run['stem']}.json").read_text())
        [own] = report["injected"]["shapes"]  # the demo's own scoring of the same run
        assert run["named"] == own["hit"]
        assert run["named_step"] == own["first_named_step"]
        assert run["windows"] == own["windows_to_name"]
        assert run["wrong_ranks"] == own["wrong_ranks"]
        assert run["clean_findings"] is not None  # the clean twin's report was read
        assert run["cost"] is not None and run["cost"] > 0
        assert run["job_slower"] is not None
    table = capsys.readouterr().out
    assert f"| {runs[0]['shape']} |" in table
