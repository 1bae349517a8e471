"""The hang rules on dump sets of real gloo jobs with several groups (``fr_hang_job.py``: 8 ranks,
TP=2 x PP=2 x DP=2, P2P between the stages), one fault each, and on multi-group NCCL dumps
written to PyTorch's schema (``fr_schema.py``) for what gloo cannot show: a rank stuck on the
device (a gloo collective cannot complete at the peers without every rank), P2P entries listed
out of completion order. Each set must be named exactly: the faulty ranks and kinds, no other
rank."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from fr_schema import Rank, write
from support import analyze_json, budget, free_port

from laggard.detectors.flight_recorder import analyze_dumps, hang_states
from laggard.parsers.flight_recorder import load_dump

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from fr_hang_job import FAULT_STEP, SCENARIOS  # noqa: E402


def dumps_in(directory: Path):
    return [load_dump(str(p)) for p in sorted(directory.iterdir()) if not p.name.startswith(".")]


@pytest.fixture(scope="session")
def gloo_sets(tmp_path_factory) -> dict[str, Path]:
    """Every scenario's dump set, generated once per session, the jobs side by side."""
    root = tmp_path_factory.mktemp("fr_hang_sets")
    jobs = {name: subprocess.Popen(
        [sys.executable, str(HERE / "fr_hang_job.py"), str(root / name), name, str(free_port())],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        for name in SCENARIOS}
    failed = {}
    for name, job in jobs.items():
        try:
            _, err = job.communicate(timeout=budget(300))
        except subprocess.TimeoutExpired:
            job.kill()
            _, err = job.communicate()
        if job.returncode != 0:
            failed[name] = err[-1500:]
    assert not failed, failed
    return {name: root / name for name in SCENARIOS}


def named(found: list[dict]) -> set[int]:
    """Every rank the critical findings name as their subject."""
    return {int(r) for f in found if f["severity"] == "critical"
            for r in re.findall(r"\d+", f["subject"])}


def by_rank(analysis) -> dict[int, set[str]]:
    kinds: dict[int, set[str]] = {}
    for c in analysis.verdict.culprits:
        kinds.setdefault(c.rank, set()).add(c.kind)
    return kinds


# scenario -> (culprit -> kind); a culprit's groups: (desc, seq of the collective it never issued)
EXPECTED = {
    "python": {1: "missing"}, "data": {6: "missing"}, "skip": {2: "missing"},
    "two": {1: "missing", 6: "missing"}, "clean": {},
}


@pytest.mark.slow
@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_each_generated_set_names_exactly_its_faulty_ranks(gloo_sets, scenario):
    dumps = dumps_in(gloo_sets[scenario])
    assert sorted(d.rank for d in dumps) == list(range(8))
    assert not any(e.state == "completed" for d in dumps for e in d.entries)  # gloo's way
    analysis = analyze_dumps(dumps)
    expected = EXPECTED[scenario]
    assert {r: kinds for r, kinds in by_rank(analysis).items()} == {
        r: {k} for r, k in expected.items()}
    assert analysis.stragglers == tuple(sorted(expected))
    assert analysis.stuck == [] and analysis.mismatches == []
    # every other rank waits on someone (the victims), none is named
    assert set(analysis.verdict.waiting) == (set(range(8)) - set(expected) if expected
                                             else set())
    rc, found = analyze_json(str(gloo_sets[scenario]))
    assert named(found) == set(expected)
    assert rc == (1 if expected else 0)


@pytest.mark.slow
def test_python_hang_names_the_collective_and_pair_rank_1_never_issued(gloo_sets):
    analysis = analyze_dumps(dumps_in(gloo_sets["python"]))
    held = {c.desc: c for c in analysis.verdict.culprits}
    # rank 1 spun after its forward of step FAULT_STEP: its tp partner waits in the backward
    # all-reduce, its pipeline peer in the gradient send
    assert (held["tp"].op, held["tp"].seq, held["tp"].waiting) == ("all_reduce",
                                                                  2 * FAULT_STEP, (0,))
    assert held["tp"].issued == held["tp"].completed == 2 * FAULT_STEP - 1
    assert (held["pp"].peer, held["pp"].op) == (5, "send 1->0")
    assert held["dp"].seq == FAULT_STEP and held["dp"].waiting == (3,)
    lag = next(lag for lag in analysis.lagging if lag.pg_desc == "tp")
    assert lag.hung_cpu == (1,) and lag.present == (0,)
    _, found = analyze_json(str(gloo_sets["python"]))
    tp = next(f for f in found if f["evidence"].get("pg_desc") == "tp")
    assert (tp["subject"], tp["evidence"]["op"], tp["evidence"]["seq"]) == (
        "rank 1", "all_reduce", 2 * FAULT_STEP)
    assert tp["evidence"]["verdicts"] == {"1": "hung_cpu"}


@pytest.mark.slow
def test_blocked_data_loader_is_behind_in_every_group_with_nothing_pending(gloo_sets):
    states = hang_states(dumps_in(gloo_sets["data"]))
    culprit = states[6]
    assert all(g.issued == g.completed and not g.pending for g in culprit.groups)
    held = {c.desc: c for c in analyze_dumps(dumps_in(gloo_sets["data"])).verdict.culprits}
    # it never started step FAULT_STEP: the forward all-reduce of tp, its half of the
    # activation transfer, and dp's all-reduce of that step
    assert held["tp"].seq == 2 * FAULT_STEP - 1 and held["tp"].waiting == (7,)
    assert held["pp"].peer == 2 and held["dp"].seq == FAULT_STEP


@pytest.mark.slow
def test_skipped_collective_is_found_by_breaking_the_wait_cycle(gloo_sets):
    analysis = analyze_dumps(dumps_in(gloo_sets["skip"]))
    verdict = analysis.verdict
    # rank 0 waits in dp for rank 2, which skipped it and waits in the default group for 0
    assert verdict.cycle
    (culprit,) = verdict.culprits
    assert (culprit.rank, culprit.desc, culprit.op, culprit.seq, culprit.waiting) == (
        2, "dp", "all_reduce", FAULT_STEP, (0,))


@pytest.mark.slow
def test_two_culprits_in_different_groups_are_both_named_apart(gloo_sets):
    verdict = analyze_dumps(dumps_in(gloo_sets["two"])).verdict
    groups: dict[int, set[str]] = {}
    for c in verdict.culprits:
        groups.setdefault(c.rank, set()).add(c.group)
    assert verdict.ranks == (1, 6) and not groups[1] & groups[6]
    assert not verdict.cycle


# --- hand-built NCCL dumps: what gloo cannot show ------------------------------------------

def megatron_groups() -> dict[str, tuple[str, list[int]]]:
    """8 ranks, TP=2 x PP=2 x DP=2 (rank = 4 * stage + 2 * dp + tp), as Megatron names them."""
    groups = {"0": ("default_pg", list(range(8)))}
    layouts = [("TENSOR_MODEL_PARALLEL_GROUP", [[0, 1], [2, 3], [4, 5], [6, 7]]),
               ("DATA_PARALLEL_GROUP", [[0, 2], [1, 3], [4, 6], [5, 7]]),
               ("PIPELINE_MODEL_PARALLEL_GROUP", [[0, 4], [1, 5], [2, 6], [3, 7]])]
    uid = 1
    for desc, layout in layouts:
        for members in layout:
            groups[str(uid)] = (desc, members)
            uid += 1
    return groups


def group_of(groups, desc: str, rank: int) -> str:
    return next(n for n, (d, m) in groups.items() if d == desc and rank in m)


def megatron_steps(ranks: list[Rank], groups, n: int) -> None:
    for _ in range(n):
        for r in ranks:
            tp = group_of(groups, "TENSOR_MODEL_PARALLEL_GROUP", r.rank)
            dp = group_of(groups, "DATA_PARALLEL_GROUP", r.rank)
            pp = group_of(groups, "PIPELINE_MODEL_PARALLEL_GROUP", r.rank)
            peer = next(m for m in groups[pp][1] if m != r.rank)
            r.collective(tp, "all_reduce")
            r.p2p_op(pp, "send" if r.rank < 4 else "recv", peer)
            r.p2p_op(pp, "recv" if r.rank < 4 else "send", peer)
            r.collective(dp, "all_reduce")


def test_device_stuck_rank_in_a_multi_group_job_is_the_only_one_named(tmp_path):
    groups = megatron_groups()
    ranks = [Rank(r, groups) for r in range(8)]
    megatron_steps(ranks, groups, 3)
    culprit = 5
    dp = group_of(groups, "DATA_PARALLEL_GROUP", culprit)
    # its dp all-reduce finished at its peer, never on it; then everyone who needs it waits:
    # its dp partner in the next tp all-reduce's consequences, its tp partner, its stage-0 peer
    for r in ranks:
        if r.rank == culprit:
            r.collective(dp, "all_reduce", state="started")
        elif r.rank in groups[dp][1]:
            r.collective(dp, "all_reduce")
    for r in ranks:
        if r.rank == culprit:
            continue
        tp = group_of(groups, "TENSOR_MODEL_PARALLEL_GROUP", r.rank)
        r.collective(tp, "all_reduce", state="scheduled")
    analysis = analyze_dumps(dumps_in(write(ranks, tmp_path)))
    assert by_rank(analysis) == {culprit: {"device"}}
    (stuck,) = analysis.stuck
    assert (stuck.pg, stuck.pg_desc, stuck.seq, stuck.stuck, stuck.completed_by) == (
        dp, "DATA_PARALLEL_GROUP", 4, (culprit,), (7,))
    _, found = analyze_json(str(tmp_path))
    assert named(found) == {culprit}


def test_old_listed_p2p_entries_are_not_stuck_when_later_ones_of_the_pair_completed(tmp_path):
    groups = megatron_groups()
    ranks = [Rank(r, groups) for r in range(8)]
    megatron_steps(ranks, groups, 4)
    # NCCL completes sends out of order: an old send of every stage-0 rank is still listed
    for r in ranks[:4]:
        old = next(e for e in r.entries if e["profiling_name"].startswith("nccl:send"))
        old.update(state="scheduled", retired=False)
    analysis = analyze_dumps(dumps_in(write(ranks, tmp_path / "level")))
    assert analysis.verdict.culprits == [] and analysis.p2p == []
    # and with a real CPU hang on rank 3 on top, only rank 3 is named
    for r in ranks:
        if r.rank != 3:
            tp = group_of(groups, "TENSOR_MODEL_PARALLEL_GROUP", r.rank)
            r.collective(tp, "all_reduce", state="scheduled")
    analysis = analyze_dumps(dumps_in(write(ranks, tmp_path / "hung")))
    assert by_rank(analysis) == {3: {"missing"}}


def test_nvrx_set_ties_loose_pg_uids_in_creation_order():
    nvrx = HERE.parent / "fixtures" / "analyze" / "fr_nvrx_gpu_error_2nd"
    dumps = dumps_in(nvrx)
    rank0 = next(d for d in dumps if d.rank == 0)
    assert "12" not in {e.pg_id for e in rank0.entries}  # uid 12 has no entry on rank 0
    states = hang_states(dumps)
    ep = {g.group: g for g in states[0].groups}["71"]  # EXPERT_MODEL_PARALLEL_GROUP, 0-7
    assert (ep.issued, ep.completed, ep.desc) == (44796, 44796, "EXPERT_MODEL_PARALLEL_GROUP")
    analysis = analyze_dumps(dumps)
    assert analysis.unmapped_status == 0
    assert by_rank(analysis) == {9: {"device"}, 14: {"device"}}
    # the pipeline groups and the default group (which carries sends here) are P2P-counted:
    # never compared across members, so no rank of them is read as stuck or behind
    assert all(not (c.group in ("0", "42", "57") and c.peer is None)
               for c in analysis.verdict.culprits)


def test_bad_counters_and_broken_entries_are_counted_not_raised(tmp_path):
    groups = megatron_groups()
    ranks = [Rank(r, groups) for r in range(8)]
    megatron_steps(ranks, groups, 2)
    for r in ranks:
        r.entries = [e for e in r.entries if not e["profiling_name"].startswith("nccl:all")]
        for e in r.entries:
            e["record_id"] += 1000  # a wrapped ring buffer: pg_status is what counts
    write(ranks, tmp_path)
    import pickle

    broken = pickle.loads((tmp_path / "nccl_trace_rank_3").read_bytes())
    for status in broken["pg_status"].values():
        status["last_enqueued_collective"] = -7  # impossible
    broken["entries"].append({"collective_seq_id": "x", "profiling_name": None})
    (tmp_path / "nccl_trace_rank_3").write_bytes(pickle.dumps(broken))
    analysis = analyze_dumps(dumps_in(tmp_path))
    assert analysis.verdict.bad_states >= 1
    assert analysis.verdict.culprits == []


def test_a_member_without_a_dump_is_silent_even_where_nobody_waits_on_it(tmp_path):
    groups = megatron_groups()
    ranks = [Rank(r, groups) for r in range(8)]
    megatron_steps(ranks, groups, 2)
    write([r for r in ranks if r.rank != 3], tmp_path)
    analysis = analyze_dumps(dumps_in(tmp_path))
    assert by_rank(analysis) == {3: {"silent"}}
    _, found = analyze_json(str(tmp_path))
    assert [(f["kind"], f["subject"]) for f in found] == [("rank_silent", "rank 3")]
