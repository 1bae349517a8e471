"""Profiler (Kineto) traces: the per-step breakdown on a trace whose
answer is worked out by hand, the wait-least straggler rule, and ``laggard analyze`` on
GPU-form sets (``laggard.demo.traces``, synthesised: no GPU here) and on a real gloo job's
CPU-form traces (``kineto_gloo_worker.py``)."""

from __future__ import annotations

import gzip
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
from kineto_events import document, x
from support import REPO, analyze_json, budget, free_port

from laggard.demo.traces import synthesize_gpu_traces
from laggard.detectors.kineto import RankTrace, StepBreakdown, find_straggler

HERE = Path(__file__).resolve().parent


def trace_of(events) -> RankTrace:
    trace = RankTrace("t")
    for e in events:
        trace.add(e)
    return trace


def test_cpu_breakdown_worked_out_by_hand():
    # step 0..100: compute 0-40 and (nested) 10-20 and 60-70 on another thread; gloo 30-80
    (step,) = trace_of([
        x("ProfilerStep#4", 0, 100, cat="user_annotation"),
        x("aten::linear", 0, 40), x("aten::addmm", 10, 10), x("aten::mm", 60, 10, tid=2),
        x("gloo:all_reduce", 30, 50, cat="user_annotation", tid=3),
        x("c10d::allreduce_", 35, 2),
        x("Optimizer.step#SGD.step", 85, 10, cat="user_annotation"),  # a label, not compute
        x("aten::add_", 150, 5),  # outside the step
    ]).breakdown()
    assert step == StepBreakdown(step=4, duration=100, compute=50, communication=50, memory=0,
                                 overlap=20, exposed_communication=30, idle=20)


def test_gpu_breakdown_uses_kernels_placed_by_their_launch():
    trace = trace_of([
        x("ProfilerStep#1", 0, 50, cat="user_annotation"),
        x("cudaLaunchKernel", 1, 1, cat="cuda_runtime", correlation=7),
        x("cudaLaunchKernel", 2, 1, cat="cuda_runtime", correlation=8),
        x("cudaLaunchKernel", 3, 1, cat="cuda_runtime", correlation=9),
        x("sm90_gemm", 100, 30, cat="kernel", correlation=7),
        x("ncclDevKernel_AllReduce", 120, 40, cat="kernel", correlation=8,
          **{"Process Group Name": "3"}),
        x("Memcpy DtoH", 165, 5, cat="gpu_memcpy", correlation=9),
        x("aten::mm", 0, 45),  # CPU ops do not count in the GPU form
    ])
    (step,) = trace.breakdown()
    assert (step.duration, step.compute, step.communication, step.memory) == (70, 30, 40, 5)
    assert (step.overlap, step.exposed_communication, step.idle) == (10, 30, 5)
    assert trace.comm_groups == {"3": 1}


def steps(comm: list[float], duration: float = 100.0) -> list[StepBreakdown]:
    return [StepBreakdown(step=i, duration=duration, compute=duration - c, communication=c,
                          memory=0, overlap=0, exposed_communication=c, idle=0)
            for i, c in enumerate(comm)]


def test_wait_least_rule():
    slow = {0: steps([40, 42, 38, 41, 40]), 1: steps([5, 6, 4, 50, 7]),
            2: steps([39, 40, 44, 43, 41])}
    found = find_straggler(slow)
    assert found is not None and found.rank == 1 and found.least_in == (0, 1, 2, 4)
    # least in 3 of 5 steps only: nobody
    slow[1] = steps([5, 6, 50, 50, 7])
    assert find_straggler(slow) is None
    # the least communication rotates among ranks: nobody
    assert find_straggler({0: steps([10, 30, 31]), 1: steps([30, 11, 29]),
                           2: steps([29, 30, 12])}) is None
    # always least, but by a hair: nobody
    assert find_straggler({0: steps([30, 30, 30]), 1: steps([29, 29.5, 29])}) is None
    assert find_straggler({0: steps([40, 42]), 1: steps([1, 1])}) is None  # too few steps


@pytest.mark.parametrize("world, slow", [(3, 0), (4, 1), (4, 3), (8, 5), (2, 1)])
def test_gpu_form_sets_name_the_slow_rank_and_its_group(tmp_path, world, slow):
    synthesize_gpu_traces(str(tmp_path), world=world, slow_rank=slow, seed=world + slow,
                          gz=slow % 2 == 1)
    rc, found = analyze_json(str(tmp_path))
    (straggler,) = [f for f in found if f["kind"] == "straggler"]
    assert straggler["subject"] == f"rank {slow}"
    assert (straggler["evidence"]["pg"], straggler["evidence"]["pg_desc"]) == ("0", "default_pg")
    (breakdown,) = [f for f in found if f["kind"] == "step_breakdown"]
    assert breakdown["evidence"]["form"] == "GPU kernels"
    assert set(breakdown["evidence"]["median_per_step"]) == {str(r) for r in range(world)}


@pytest.mark.parametrize("seed", range(5))
def test_gpu_form_clean_sets_name_nobody(tmp_path, seed):
    synthesize_gpu_traces(str(tmp_path), world=4, slow_rank=None, seed=seed)
    _, found = analyze_json(str(tmp_path))
    assert [f["kind"] for f in found] == ["step_breakdown"]


def test_bad_traces_each_get_a_message_and_the_rest_is_analysed(tmp_path):
    synthesize_gpu_traces(str(tmp_path / "job"), world=3, slow_rank=2)
    whole = (tmp_path / "job" / "rank0.pt.trace.json").read_bytes()
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "rank0.pt.trace.json.gz").write_bytes(gzip.compress(whole)[:4000])  # truncated
    (bad / "rank1.pt.trace.json").write_text(json.dumps(document(
        [x("aten::mm", 0, 5)], rank=1)))  # no steps
    (bad / "rank2.pt.trace.json").write_bytes(whole[: len(whole) // 2])  # cut JSON
    other = tmp_path / "job" / "rank1_other_job.pt.trace.json"
    other.write_text(json.dumps(document([x("ProfilerStep#1", 0, 10, cat="user_annotation")],
                                         rank=5, world=8)))
    import contextlib

    from laggard.cli import main

    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        rc = main(["analyze", str(tmp_path)])
    text = err.getvalue()
    assert rc == 2
    assert "rank0.pt.trace.json.gz: cannot read" in text
    assert "rank1.pt.trace.json: a profiler trace with no ProfilerStep ranges" in text
    assert "rank2.pt.trace.json: not a valid kineto_trace: the trace ends" in text
    assert "rank1_other_job.pt.trace.json: skipped: rank 5 of 8" in text
    assert "Traceback" not in text
    _, found = analyze_json(str(tmp_path / "job"))
    assert [f["subject"] for f in found if f["kind"] == "straggler"] == ["rank 2"]


@pytest.mark.slow
def test_real_gloo_job_with_a_slow_rank_cpu_form(tmp_path):
    proc = subprocess.run([sys.executable, str(HERE / "kineto_gloo_worker.py"), str(tmp_path),
                           "3", "1", str(free_port()), "0.08", "1"], capture_output=True,
                          text=True, timeout=budget(280), cwd=REPO,
                          env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    rc, found = analyze_json(str(tmp_path))
    (breakdown,) = [f for f in found if f["kind"] == "step_breakdown"]
    assert breakdown["evidence"]["form"] == "CPU ranges"
    assert len(breakdown["evidence"]["steps"]["0"]) == 6
    assert [f["subject"] for f in found if f["kind"] == "straggler"] == ["rank 1"]
