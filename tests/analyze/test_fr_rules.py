"""Cross-rank flight-recorder rules on dump sets made here: real gloo jobs with one rank held
up (``fr_gloo_worker.py``; gloo records collectives but not point-to-point operations, and
leaves every state ``scheduled``), and NCCL dumps written to PyTorch's dump schema
(``fr_schema.py``) for what gloo cannot show: pending device work, stuck kernels, pipeline
send/receive pairs. Every culprit of every set must be named, with its group and collective."""

from __future__ import annotations

import pickle
import re
import subprocess
import sys
from pathlib import Path

import pytest
from fr_schema import Rank, write
from support import REPO, analyze_json, budget, free_port

from laggard.detectors.flight_recorder import analyze_dumps
from laggard.parsers.flight_recorder import load_dump

HERE = Path(__file__).resolve().parent


def dumps_in(directory: Path):
    return [load_dump(str(p)) for p in sorted(directory.iterdir()) if not p.name.startswith(".")]


def groups(world: int) -> dict[str, tuple[str, list[int]]]:
    half = world // 2
    return {"0": ("default_pg", list(range(world))),
            "5": ("DATA_PARALLEL_GROUP", list(range(0, world, 2))),
            "9": ("PIPELINE_MODEL_PARALLEL_GROUP", list(range(world))),
            "12": ("TENSOR_MODEL_PARALLEL_GROUP", list(range(half)))}


def steps(ranks: list[Rank], n: int) -> None:
    for r in ranks:
        for _ in range(n):
            r.collective("0", "all_reduce")
            if r.rank % 2 == 0:
                r.collective("5", "_reduce_scatter_base", sizes=((4096,),))


@pytest.mark.parametrize("world", [4, 8])
def test_hung_cpu_rank_with_no_pending_work(tmp_path, world):
    for culprit in range(world):
        ranks = [Rank(r, groups(world)) for r in range(world)]
        steps(ranks, 6)
        for r in ranks:
            if r.rank != culprit:
                r.collective("0", "all_reduce", state="scheduled")
        analysis = analyze_dumps(dumps_in(write(ranks, tmp_path / f"hung{world}_{culprit}")))
        lag = next(lag for lag in analysis.lagging if lag.pg == "0")
        assert (lag.seq, lag.op, lag.missing, lag.hung_cpu) == (7, "all_reduce", (culprit,),
                                                               (culprit,))
        assert lag.pg_desc == "default_pg" and analysis.stragglers == (culprit,)
        assert analysis.stuck == []


@pytest.mark.parametrize("world", [4, 8])
def test_missing_rank_with_work_still_on_its_device(tmp_path, world):
    for culprit in range(0, world, 2):  # a member of the data-parallel group too
        ranks = [Rank(r, groups(world)) for r in range(world)]
        steps(ranks, 4)
        for r in ranks:
            if r.rank == culprit:
                r.collective("0", "all_reduce", state="started")
                continue
            for state in ("completed", "scheduled", "scheduled"):
                r.collective("0", "all_reduce", state=state)
        analysis = analyze_dumps(dumps_in(write(ranks, tmp_path / f"miss{world}_{culprit}")))
        (lag,) = analysis.lagging
        assert (lag.pg, lag.seq, lag.missing, lag.hung_cpu) == ("0", 6, (culprit,), ())
        assert analysis.stragglers == (culprit,)


@pytest.mark.parametrize("world", [4, 8])
def test_rank_stuck_on_the_device(tmp_path, world):
    for culprit in range(world):
        ranks = [Rank(r, groups(world)) for r in range(world)]
        steps(ranks, 3)
        for r in ranks:
            states = (["started", "scheduled", "scheduled"] if r.rank == culprit
                      else ["completed", "completed", "scheduled"])
            for state in states:
                r.collective("0", "all_gather", sizes=((8, 512),), state=state)
        analysis = analyze_dumps(dumps_in(write(ranks, tmp_path / f"stuck{world}_{culprit}")))
        assert analysis.lagging == []
        (stuck,) = analysis.stuck
        assert (stuck.pg, stuck.pg_desc, stuck.seq, stuck.op, stuck.stuck) == (
            "0", "default_pg", 4, "all_gather", (culprit,))
        assert stuck.completed_by == tuple(r for r in range(world) if r != culprit)
        assert analysis.stragglers == (culprit,)


@pytest.mark.parametrize("world", [4, 8])
def test_pipeline_send_recv_pairs_name_the_stalled_stage(tmp_path, world):
    for culprit in range(world):
        ranks = [Rank(r, groups(world)) for r in range(world)]
        steps(ranks, 2)
        for microbatch in range(4):
            last = microbatch == 3
            for r in ranks:
                s = r.rank
                if last and s == culprit:
                    continue
                if s > 0:
                    # everyone after the culprit waits for its predecessor's send
                    r.p2p_op("9", "recv", s - 1, state="scheduled" if last and s > culprit
                             else "completed")
                if s < world - 1 and not (last and s > culprit):
                    r.p2p_op("9", "send", s + 1, state="scheduled" if last else "completed")
        analysis = analyze_dumps(dumps_in(write(ranks, tmp_path / f"pp{world}_{culprit}")))
        assert {stall.stalled for stall in analysis.p2p} == {culprit}, culprit
        assert all(stall.pg_desc == "PIPELINE_MODEL_PARALLEL_GROUP" for stall in analysis.p2p)
        pairs = {(stall.sender, stall.receiver) for stall in analysis.p2p}
        assert pairs == ({(culprit - 1, culprit)} if culprit else set()) | (
            {(culprit, culprit + 1)} if culprit < world - 1 else set())
        assert analysis.stragglers == (culprit,)


def test_nvrx_16_rank_set_names_pg72_all_to_all_and_ranks_9_14_through_the_cli():
    rc, found = analyze_json(str(REPO / "tests/fixtures/analyze/fr_nvrx_gpu_error_2nd"))
    first = found[0]
    ev = first["evidence"]
    assert (first["kind"], first["subject"], ev["pg"], ev["pg_desc"], ev["op"], ev["seq"]) == (
        "collective_timeout", "ranks 9, 14", "72", "EXPERT_MODEL_PARALLEL_GROUP", "all_to_all",
        44791)
    # work their peers completed is still pending on both: stuck on the device (GPU_ERROR)
    assert ev["verdicts"] == {"9": "device", "14": "device"}
    named = {int(r) for f in found if f["severity"] == "critical"
             for r in re.findall(r"\d+", f["subject"])}
    assert named == {9, 14}


def test_dumps_with_unknown_fields_and_a_newer_version_are_read_with_a_note(tmp_path):
    ranks = [Rank(r, groups(4), version="3.1") for r in range(4)]
    steps(ranks, 3)
    for r in ranks[1:]:
        r.collective("0", "broadcast", state="scheduled")
    for r in ranks:
        for e in r.entries:
            e["new_per_entry_field"] = {"x": 1}
    write(ranks, tmp_path, future_section={"a": [1, 2]})
    dumps = dumps_in(tmp_path)
    assert any("newer" in n for n in dumps[0].notes)
    assert any("future_section" in n for n in dumps[0].notes)
    (lag,) = analyze_dumps(dumps).lagging
    assert lag.hung_cpu == (0,)


def run_gloo(out: Path, scenario: str) -> Path:
    proc = subprocess.run([sys.executable, str(HERE / "fr_gloo_worker.py"), str(out), scenario,
                           str(free_port())], capture_output=True, text=True, timeout=budget(240),
                          cwd=REPO, env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out


@pytest.mark.slow
@pytest.mark.parametrize("scenario, pg, desc, op, culprit", [
    ("hung_cpu", "0", "default_pg", "all_reduce", 2),
    ("subgroup", "1", "EXPERT_GROUP", "all_gather", 3),
])
def test_real_gloo_job_with_one_rank_held_up(tmp_path, scenario, pg, desc, op, culprit):
    directory = run_gloo(tmp_path / scenario, scenario)
    dumps = dumps_in(directory)
    assert sorted(d.rank for d in dumps) == [0, 1, 2, 3]
    assert {e.state for d in dumps for e in d.entries} == {"scheduled"}  # gloo's way
    analysis = analyze_dumps(dumps)
    (lag,) = analysis.lagging
    assert (lag.pg, lag.pg_desc, lag.op, lag.missing, lag.hung_cpu) == (
        pg, desc, op, (culprit,), (culprit,))
    assert analysis.stragglers == (culprit,) and analysis.stuck == []
    rc, found = analyze_json(str(directory))
    assert rc == 1 and found[0]["subject"] == f"rank {culprit}"
    assert "no pending work" in found[0]["message"]
    # the same set, pickled by torch itself, holds builtin types only
    raw = pickle.loads((directory / f"rank_{culprit}").read_bytes())
    assert raw["version"] == "2.10"


def test_dumps_of_two_jobs_in_one_directory_are_told_apart(tmp_path):
    job_a = [Rank(r, groups(4)) for r in range(4)]
    steps(job_a, 3)
    for r in job_a[:3]:
        r.collective("0", "all_reduce", state="scheduled")
    write(job_a, tmp_path)
    job_b = [Rank(r, groups(8)) for r in (4, 5)]
    steps(job_b, 9)
    write(job_b, tmp_path)
    (tmp_path / "nccl_trace_rank_1.old").write_bytes((tmp_path / "nccl_trace_rank_1")
                                                     .read_bytes())
    import contextlib
    import io

    from laggard.cli import main

    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        rc = main(["analyze", str(tmp_path)])
    assert rc == 1
    text = err.getvalue()
    assert "rank_4: skipped: its default group has 8 ranks" in text
    assert "rank_1.old: skipped: rank 1 was already read" in text
    _, found = analyze_json(str(tmp_path))
    assert [f["subject"] for f in found if f["severity"] == "critical"] == ["rank 3"]
