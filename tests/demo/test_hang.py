"""``laggard demo --inject``: hangs named by rank 0's monitor in real gloo jobs, the job stopped
and nothing left behind; clean and long-checkpoint runs with no hang reported; the flag's errors.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from support import budget, wait_for

from laggard.cli import main as laggard_main
from laggard.demo.hang import (
    EXPECTED_KIND,
    HANG_KINDS,
    CheckpointInjection,
    HangInjection,
    hang_outcome,
    parse_inject,
)

psutil = pytest.importorskip("psutil")

#: Short runs: 3 ranks, 10-step windows, the hang at step 15 (after a step time is known).
SHORT = ["--world-size", "3", "--window", "10", "--steps", "300"]
#: Seconds a real run may take in all (start, 15 steps, the hang, its name, the stop) on an idle
#: machine, ``budget``-ed by the load; the demo's own bound on naming is --hang-bound (60 s).
RUN_TIMEOUT = 240


# ------------------------------------------------------------------------------ the flag
def test_hang_and_checkpoint_specs_parse_in_any_order() -> None:
    assert parse_inject("hang=rank:2,step:30,kind:data") == HangInjection(2, 30, "data")
    assert parse_inject(" hang=kind:skip, step:5 ,rank:1") == HangInjection(1, 5, "skip")
    assert parse_inject("checkpoint=step:40,factor:20") == CheckpointInjection(40, 20.0)
    for kind in HANG_KINDS:
        injection = HangInjection(1, 3, kind)
        assert parse_inject(injection.spec()) == injection
        assert injection.expected_kind == EXPECTED_KIND[kind]


@pytest.mark.parametrize(("spec", "message"), [
    ("hang=rank:1,step:5,kind:gpu", "unknown hang kind 'gpu' (kinds: python, spin, data, "
                                    "skip, device)"),
    ("hang=rank:1,step:0,kind:data", "step 0 must be >= 1"),
    ("hang=rank:-1,step:5,kind:data", "rank -1 must be >= 0"),
    ("hang=rank:1,kind:data", "hang: missing step (keys: rank, step, kind)"),
    ("hang=rank:1,step:five,kind:data", "hang: step must be int, got 'five'"),
    ("hang=rank:1,step:5,kind:data,node:2", "hang: unknown key 'node' (keys: rank, step, kind)"),
    ("hang=rank:1,rank:2,step:5,kind:data", "hang: rank given twice"),
    ("hang=rank=1,step:5,kind:data", "hang: expected key:value, got 'rank=1'"),
    ("checkpoint=step:5,factor:1", "factor 1 must be in (1, 1000]"),
    ("stall=rank:1", "expected hang=rank:R,step:S,kind:K or checkpoint=step:S,factor:F"),
])
def test_a_bad_spec_is_refused_in_one_line(spec: str, message: str) -> None:
    with pytest.raises(ValueError) as err:
        parse_inject(spec)
    assert message in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(("flags", "message"), [
    (["--inject", "hang=rank:3,step:5,kind:data"],
     "--inject hang=rank:3,step:5,kind:data: rank 3 outside the world of 3 ranks (0-2)"),
    (["--inject", "hang=rank:1,step:300,kind:data"], "step 300 not before --steps 300"),
    (["--inject", "hang=rank:1,step:5,kind:device"],
     "kind device needs --device emulated-async"),
    (["--inject", "hang=rank:0,step:5,kind:python"],
     "kind python on rank 0 stops rank 0's own heartbeat thread"),
    (["--inject", "hang=rank:1,step:5,kind:skip", "--parallel", "fsdp"],
     "kind skip acts in the DDP communication hook: use --parallel ddp"),
    (["--inject", "hang=rank:1,step:5,kind:data", "--inject", "hang=rank:2,step:5,kind:data"],
     "--inject: one injection of each kind at most"),
    (["--inject", "hang=rank:1,step:5,kind:data", "--hang-bound", "0"],
     "--hang-bound must be a positive number of seconds"),
    (["--inject", "hang=rank:1,step:5,kind:nap"], "--inject: unknown hang kind 'nap'"),
])
def test_the_demo_refuses_a_bad_injection_before_starting_anything(
        flags: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    status = laggard_main(["demo", *SHORT, *flags])
    captured = capsys.readouterr()
    assert status == 2
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("laggard demo: "), captured.err
    assert message in lines[0]
    assert captured.out == ""  # no agent, no launcher


# ------------------------------------------------------------------ judging rank 0's report
def _report(at: float, *culprits: tuple[int, str]) -> dict[str, Any]:
    return {"time": at, "report": {"verdict": {"culprits": [
        {"rank": r, "kind": k, "group": "g0[0,1,2]", "op": "allreduce", "seq": 7}
        for r, k in culprits]}, "message": "hung"}}


def test_the_first_report_after_the_hang_is_judged_against_the_injected_rank_and_kind() -> None:
    hang = HangInjection(2, 15, "data")
    marker = {"time": 100.0}
    right = hang_outcome(hang, marker, [_report(104.5, (2, "missing"))], 60)
    assert right["named"] and right["correct"] and right["seconds_to_name"] == 4.5
    assert right["culprits"][0]["op"] == "allreduce"
    other_rank = hang_outcome(hang, marker, [_report(104.5, (1, "missing"))], 60)
    assert other_rank["named"] and not other_rank["correct"]
    one_more = hang_outcome(hang, marker, [_report(104.5, (2, "missing"), (0, "missing"))], 60)
    assert not one_more["correct"]  # the injected rank, and another: not named exactly
    wrong_kind = hang_outcome(hang, marker, [_report(104.5, (2, "device")),
                                             _report(106.0, (2, "missing"))], 60)
    assert not wrong_kind["correct"]  # the first report counts, not a later one
    late = hang_outcome(hang, marker, [_report(161.0, (2, "missing"))], 60)
    assert not late["named"] and late["correct"] is False


def test_a_report_before_the_hang_or_in_a_clean_run_is_false() -> None:
    before = hang_outcome(HangInjection(2, 15, "data"), {"time": 100.0},
                          [_report(90.0, (1, "missing")), _report(103.0, (2, "missing"))], 60)
    assert before["correct"] and len(before["false_reports"]) == 1
    clean = hang_outcome(None, None, [_report(50.0, (1, "silent"))], 60)
    assert clean["injected"] is None and clean["correct"] is None
    assert len(clean["false_reports"]) == 1
    assert hang_outcome(None, None, [], 60)["false_reports"] == []


# ----------------------------------------------------------------------------- real runs
def _demo(tmp_path: Path, *flags: str) -> tuple[subprocess.CompletedProcess[str],
                                                dict[str, Any], float]:
    """Run ``laggard demo`` with its temporary files under ``tmp_path/tmp``; returns the
    finished process, its ``--report`` JSON and its wall seconds. Asserts that it left no
    process and no file behind."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    report = tmp_path / "report.json"
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "laggard.cli", "demo", *SHORT, *flags, "--report", str(report)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "TMPDIR": str(tmp)})
    children: dict[int, Any] = {}
    while proc.poll() is None:  # who it started, to check that none outlives it
        try:
            for child in psutil.Process(proc.pid).children(recursive=True):
                children.setdefault(child.pid, child)
        except psutil.Error:
            pass
        time.sleep(0.5)
        if time.monotonic() - started > budget(RUN_TIMEOUT):
            proc.kill()
            pytest.fail(f"the demo ran past {budget(RUN_TIMEOUT):.0f} s")
    out = proc.stdout.read() if proc.stdout else ""
    done = subprocess.CompletedProcess(proc.args, proc.returncode, out, "")
    _, alive = psutil.wait_procs(list(children.values()), timeout=budget(10))
    assert alive == [], (alive, out[-3000:])
    assert list(tmp.iterdir()) == [], out[-3000:]  # its temp dir and the launcher's, removed
    doc = json.loads(report.read_text()) if report.exists() else {}
    return done, doc, time.monotonic() - started


@pytest.mark.slow
@pytest.mark.parametrize(("kind", "rank", "device"), [
    ("data", 1, "cpu"), ("spin", 2, "cpu"), ("python", 1, "cpu"), ("skip", 2, "cpu"),
    ("device", 1, "emulated-async")])
def test_each_injected_hang_is_named_by_rank_0_and_the_job_stopped(
        tmp_path: Path, kind: str, rank: int, device: str) -> None:
    done, doc, _ = _demo(tmp_path, "--inject", f"hang=rank:{rank},step:15,kind:{kind}",
                         "--device", device)
    hang = doc.get("hang", {})
    assert done.returncode == 0, done.stdout[-4000:]
    assert hang["named"] and hang["correct"], done.stdout[-4000:]
    assert {c["rank"] for c in hang["culprits"]} == {rank}
    assert {c["kind"] for c in hang["culprits"]} == {EXPECTED_KIND[kind]}
    assert 0 < hang["seconds_to_name"] <= budget(30)
    assert hang["stopped"] == "named"
    assert f"named by rank 0 after {hang['seconds_to_name']:.1f} s: rank {rank}" in done.stdout


@pytest.mark.slow
def test_a_hang_not_named_within_the_bound_stops_the_job_with_status_1(tmp_path: Path) -> None:
    done, doc, seconds = _demo(tmp_path, "--inject", "hang=rank:1,step:10,kind:data",
                               "--hang-bound", "0.5")
    assert done.returncode == 1, done.stdout[-3000:]
    assert doc["hang"]["stopped"] == "bound" and not doc["hang"]["named"]
    assert "NOT named within 0.5 s of the hang" in done.stdout or "not checked" in done.stdout
    assert seconds < budget(RUN_TIMEOUT)


@pytest.mark.slow
@pytest.mark.parametrize("inject", [[], ["--inject", "checkpoint=step:20,factor:20"]],
                         ids=["clean", "checkpoint"])
def test_no_hang_is_reported_in_a_clean_run_nor_in_a_long_checkpoint(
        tmp_path: Path, inject: list[str]) -> None:
    done, doc, _ = _demo(tmp_path, "--steps", "60", "--slowdown", "1.0", *inject)
    assert done.returncode == 0, done.stdout[-3000:]
    assert doc["hang"]["checked"], done.stdout[-3000:]
    assert doc["hang"]["false_reports"] == [], done.stdout[-3000:]
    assert "hangs: none reported by rank 0's monitor" in done.stdout


@pytest.mark.slow
def test_ctrl_c_while_a_rank_holds_the_gil_stops_everything_and_removes_the_files(
        tmp_path: Path) -> None:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-m", "laggard.cli", "demo", *SHORT, "--inject",
         "hang=rank:1,step:10,kind:python", "--hang-bound", "120"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "TMPDIR": str(tmp)})
    assert proc.stdout is not None
    started, ceiling, lines = time.monotonic(), budget(RUN_TIMEOUT), []
    for line in proc.stdout:  # training under way: the hang comes 10 steps later
        lines.append(line)
        if line.startswith("step "):
            break
        assert time.monotonic() - started < ceiling, "".join(lines)
    # the demo's hang marker (in its temp dir) is written as rank 1 enters the hang: from then
    # on it holds its interpreter lock (waiting on the event, not on a guess of the step time)
    assert wait_for(lambda: any(tmp.rglob("hang-marker.json")), timeout=RUN_TIMEOUT), (
        "".join(lines))
    children = psutil.Process(proc.pid).children(recursive=True)
    assert len(children) >= 5, children  # the agent, the launcher, 3 ranks
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=budget(60))
    assert proc.returncode == 128 + signal.SIGINT, "".join(lines) + out
    _, alive = psutil.wait_procs(children, timeout=budget(10))
    assert alive == [], alive
    assert list(tmp.iterdir()) == []
