"""The compression hooks in real 2-rank gloo jobs (``ddp_worker.py``, one process per rank)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from support import budget, free_port

from laggard.integrations.collective_bytes import ring_allreduce_bytes

pytestmark = pytest.mark.slow

WORKER = Path(__file__).with_name("ddp_worker.py")
WORLD = 2


def run_ranks(mode: str, out: Path) -> None:
    port = free_port()
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), mode, str(out)],
            env={**os.environ, "RANK": str(r), "WORLD_SIZE": str(WORLD),
                 "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"},
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for r in range(WORLD)
    ]
    outputs = []
    for proc in procs:
        try:
            outputs.append(proc.communicate(timeout=budget(240))[0])
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            raise
    for proc, output in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, output[-3000:]


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One 2-rank job doing all three parts (a process start costs seconds here)."""
    out = tmp_path_factory.mktemp("ddp")
    run_ranks("all", out)
    return out


@pytest.fixture(scope="module")
def reference(job: Path) -> list[dict]:
    return [torch.load(job / f"reference-rank{r}.pt") for r in range(WORLD)]


def inputs(reference: list[dict], name: str) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Each rank's float64 gradients and the hook's result (the same on every rank)."""
    results = [ranks[name]["result"] for ranks in reference]
    assert all(torch.equal(results[0], r) for r in results[1:])
    return [ranks[name]["grads"].double() for ranks in reference], results[0].double()


SHAPES = [(48, 40), (40,), (40, 24)]


def split(flat: torch.Tensor) -> list[torch.Tensor]:
    out, start = [], 0
    for shape in SHAPES:
        n = math.prod(shape)
        out.append(flat[start : start + n].view(shape))
        start += n
    return out


def test_none_is_the_exact_mean(reference: list[dict]) -> None:
    grads, result = inputs(reference, "none")
    mean = sum(grads) / WORLD
    assert torch.allclose(result, mean, rtol=0, atol=1e-6)


def test_fp16_is_within_fp16_rounding_of_the_mean(reference: list[dict]) -> None:
    grads, result = inputs(reference, "fp16")
    mean = sum(grads) / WORLD
    # cast and divide per rank (2 roundings of |g|/W), sum, cast back: unit roundoff 2**-11
    bound = 2**-11 * (2 * sum(g.abs() for g in grads) / WORLD + 2 * mean.abs()) + 2**-24
    assert ((result - mean).abs() <= bound).all()
    assert (result - mean).abs().max() > 0  # it did go through fp16


def sign_compress(x: torch.Tensor) -> torch.Tensor:
    scale = x.abs().sum() / x.numel()
    return torch.where(x >= 0, scale, -scale)


def test_sign_matches_the_two_stage_algorithm_in_float64(reference: list[dict]) -> None:
    grads, result = inputs(reference, "sign")
    n = grads[0].numel()
    c = 8 * math.ceil(n / (8 * WORLD))  # chunk size, whole bytes
    expected = torch.empty(n, dtype=torch.float64)
    for j in range(WORLD):
        chunk = slice(j * c, min(n, (j + 1) * c))
        average = sum(sign_compress(g[chunk]) for g in grads) / WORLD  # stage 1, rank j
        expected[chunk] = sign_compress(average)  # stage 2, server residual 0 at step 0
    # the scales are fp32 sums over ~1500 elements: relative error up to ~n * 2**-24
    assert torch.allclose(result, expected, rtol=1e-4, atol=1e-7)


def test_topk_is_the_mean_of_each_rank_s_exact_top_k(reference: list[dict]) -> None:
    grads, result = inputs(reference, "topk")
    k = math.ceil(0.05 * grads[0].numel())
    expected = torch.zeros_like(grads[0])
    for g in grads:
        keep = torch.topk(g.abs(), k).indices
        expected[keep] += g[keep] / WORLD
    assert torch.allclose(result, expected, rtol=1e-6, atol=1e-7)
    assert int((result != 0).sum()) <= WORLD * k


def test_powersgd_is_one_warm_started_power_iteration_in_float64(reference: list[dict]) -> None:
    grads, result = inputs(reference, "powersgd")
    mean = split(sum(grads) / WORLD)
    got = split(result)
    assert torch.allclose(got[1], mean[1], atol=1e-6)  # the vector goes uncompressed
    for i in (0, 2):
        m = mean[i]
        q0 = torch.randn(m.shape[1], 4, generator=torch.Generator().manual_seed(0)).double()
        p = torch.linalg.qr(m @ q0).Q
        expected = p @ (m.T @ p).T
        assert torch.allclose(got[i], expected, rtol=1e-4, atol=1e-5)
        # a projection of the mean: no worse than dropping it, no better than Eckart-Young
        sigma = torch.linalg.svdvals(m)
        error = torch.linalg.norm(got[i] - m)
        assert sigma[4:].square().sum().sqrt() - 1e-5 <= error <= torch.linalg.norm(m)


def test_a_group_without_this_rank_is_refused_at_set_up(reference: list[dict]) -> None:
    assert "not a member" in reference[1]["non_member"]


@pytest.fixture(scope="module")
def trained(job: Path) -> list[dict]:
    return [json.loads((job / f"train-rank{r}.json").read_text()) for r in range(WORLD)]


@pytest.mark.parametrize("name", ["none", "fp16", "sign", "topk", "powersgd", "onebit_adam",
                                  "topk_scatter", "topk_momentum"])
def test_training_converges_with_replicas_identical(trained: list[dict], name: str) -> None:
    for rank in trained:
        run = rank[name]
        assert run["identical"], "parameters differ across ranks"
        losses = run["losses"]
        if name in ("onebit_adam", "topk_momentum"):
            # 3 warm-up steps are far fewer than 1-bit Adam wants (its variance is frozen from
            # them), and a step can spike; the trend still has to be down
            assert sorted(losses[-4:])[1] < 0.85 * sum(losses[:2]) / 2, losses
        else:
            assert sum(losses[-2:]) < 0.85 * sum(losses[:2]), losses
        buckets = run["buckets_per_step"]
        # DDP rebuilt its buckets after iteration 0, and there are several
        assert buckets["0"] != buckets["1"] and len(buckets["1"]) >= 2
        assert buckets["1"] == buckets[str(len(losses) - 1)]


ONEBIT_WARMUP = 3  # ddp_worker.ONEBIT: plain all-reduce steps before the momentum compression


@pytest.mark.parametrize("name,min_ratio,max_ratio", [
    ("none", 1, 1), ("fp16", 2, 2), ("sign", 25, 32), ("topk", 45, 1 / (WORLD * 0.01)),
    ("powersgd", 4, 100), ("onebit_adam", 25, 32),
    # the sparse reduce-scatter: N / (2k) at any world size, a little less for rounding
    ("topk_scatter", 22, 1 / (2 * 0.02)), ("topk_momentum", 45, 1 / (WORLD * 0.01)),
])
def test_reported_bytes_are_the_bytes_handed_to_the_collectives(
    trained: list[dict], name: str, min_ratio: float, max_ratio: float,
) -> None:
    for rank in trained:
        run = rank[name]
        assert run["reported_bytes"] == run["counted_bytes"]
        fp32 = 2 * (WORLD - 1) * run["grad_bytes"] // WORLD
        assert all(raw == fp32 for raw in run["raw_bytes"])
        compressed = run["reported_bytes"]
        if name in ("onebit_adam", "topk_momentum"):  # the warm-up: the plain fp32 all-reduce
            assert compressed[:ONEBIT_WARMUP] == [fp32] * ONEBIT_WARMUP
            compressed = compressed[ONEBIT_WARMUP:]
        for sent in compressed:
            assert min_ratio <= fp32 / sent <= max_ratio + 1e-9, fp32 / sent


@pytest.fixture(scope="module")
def resumed(job: Path) -> list[dict]:
    return [json.loads((job / f"resume-rank{r}.json").read_text()) for r in range(WORLD)]


@pytest.mark.parametrize("name", ["sign", "topk", "powersgd", "onebit_adam"])
def test_state_dict_round_trip_keeps_the_residuals(resumed: list[dict], name: str) -> None:
    for rank in resumed:
        run = rank[name]
        assert run["restored_equal"] and run["saved_norm"] > 0
        if name == "onebit_adam":
            # both error buffers and the optimizer state: the same next steps, exactly,
            # though DDP's buckets after the restart are laid out as at iteration 0
            assert run["names"] == ["server_error", "worker_error"]
            assert run["resumed_vs_straight"] == 0.0 < run["lost_vs_straight"]
            continue
        assert run["names"] == ["0.bias", "0.weight", "1.bias", "1.weight", "3.bias",
                                "3.weight", "5.bias", "5.weight"]
        # resuming from the checkpoint tracks the uninterrupted run better than losing the state
        assert run["resumed_vs_straight"] < run["lost_vs_straight"]
        if name == "powersgd":  # per-matrix, so independent of the bucket layout: exact
            assert run["resumed_vs_straight"] == 0.0


@pytest.fixture(scope="module")
def nonfinite(job: Path) -> list[dict]:
    """Per rank: PowerSGD's ``poisoned`` run (bucket 0 NaN on rank 0 at step 1, Inf on rank 1 at
    step 2) and the ``clean`` run that skipped bucket 0 at those steps (``ddp_worker.POISON``)."""
    return [torch.load(job / f"nonfinite-rank{r}.pt") for r in range(WORLD)]


BUCKET0, BUCKET1 = ("0", "1", "2"), "3"  # parameter names (ddp_worker.nonfinite's buckets)


def test_powersgd_counts_a_nonfinite_bucket_and_every_rank_gets_nan(nonfinite: list[dict]) -> None:
    counts = [[step["nonfinite_buckets"] for step in rank["poisoned"]] for rank in nonfinite]
    assert counts == [[0, 1, 1, 1], [0, 0, 1, 1]]  # on the rank whose bucket held it
    for rank in nonfinite:
        for number, step in enumerate(rank["poisoned"]):
            flagged, beside = step["results"]
            assert torch.isfinite(beside).all()
            if number in (1, 2):
                assert torch.isnan(flagged).all()
            else:
                assert torch.isfinite(flagged).all()


def test_powersgd_keeps_residuals_and_q_through_a_nonfinite_bucket(nonfinite: list[dict]) -> None:
    for rank in nonfinite:
        before, *during = [step["state"] for step in rank["poisoned"][:3]]
        for state in during:
            for name in BUCKET0:
                assert torch.equal(state["residuals"][name], before["residuals"][name])
            for name in ("0", "2"):  # the two matrices' warm-start Q
                assert torch.equal(state["q"][name], before["q"][name])
            # the finite bucket beside it went on
            assert not torch.equal(state["q"][BUCKET1], before["q"][BUCKET1])
        assert before["residuals"]["0"].abs().sum() > 0


def test_powersgd_after_a_nonfinite_bucket_is_as_if_it_never_came(nonfinite: list[dict]) -> None:
    for rank in nonfinite:
        poisoned, clean = rank["poisoned"], rank["clean"]
        assert all(torch.equal(a, b) for a, b in zip(poisoned[3]["results"], clean[3]["results"],
                                                     strict=True))
        for number in (1, 2):  # the finite bucket, in flight beside the NaN one
            assert torch.equal(poisoned[number]["results"][1], clean[number]["results"][0])
        for key in ("residuals", "q"):
            after, expected = poisoned[3]["state"][key], clean[3]["state"][key]
            assert after.keys() == expected.keys()
            assert all(torch.equal(after[name], expected[name]) for name in after)
    assert torch.equal(nonfinite[0]["poisoned"][3]["results"][0],
                       nonfinite[1]["poisoned"][3]["results"][0])


def test_powersgd_bytes_of_a_nonfinite_step_are_stage_one_alone(nonfinite: list[dict]) -> None:
    def ring(elements: int) -> int:
        return ring_allreduce_bytes(4 * elements, WORLD)

    r = 4
    bucket1 = ring(32 * r) + ring(32 * r)  # P, then Q, of the 32 x 32 matrix
    stage1 = ring(40 + 48 * r + 40 * r)  # the vector and both P matrices of bucket 0
    stage2 = ring((40 + 24) * r)
    for rank in nonfinite:
        steps = rank["poisoned"]
        assert [s["reported"] for s in steps] == [s["counted"] for s in steps]
        assert [s["reported"] for s in steps] == [
            stage1 + stage2 + bucket1, stage1 + bucket1, stage1 + bucket1,
            stage1 + stage2 + bucket1]


@pytest.fixture(scope="module")
def flagged(job: Path) -> list[dict]:
    """Per rank and hook: 4 steps on one bucket, rank 0's gradients NaN at step 1
    (``ddp_worker.flagged``)."""
    return [torch.load(job / f"flagged-rank{r}.pt") for r in range(WORLD)]


def _states_equal(a: dict, b: dict) -> bool:
    def flat(state: dict) -> dict:
        out = {}
        for key, value in state.items():
            if isinstance(value, dict):
                out.update({f"{key}.{k}": v for k, v in flat(value).items()})
            else:
                out[key] = value
        return out

    a, b = flat(a), flat(b)
    return a.keys() == b.keys() and all(
        torch.equal(a[k], b[k]) if isinstance(a[k], torch.Tensor) else a[k] == b[k] for k in a)


@pytest.mark.parametrize("label", ["sign", "topk", "topk_scatter", "onebit_adam"])
def test_a_nan_on_one_rank_is_flagged_everywhere_and_poisons_nothing(flagged: list[dict],
                                                                       label: str) -> None:
    ranks = [rank[label] for rank in flagged]
    for steps in ranks:
        assert [s["finite"] for s in steps] == [True, False, True, True]
        # the whole bucket, as an fp32 all-reduce would give (1-bit Adam: the flagged chunk)
        assert steps[1]["all_nan"] or label == "onebit_adam"
        state_tensors = [v for s in steps for v in _tensors(s["state"])]
        assert all(bool(torch.isfinite(t).all()) for t in state_tensors)  # nothing poisoned
    # counted on the rank that held it (1-bit Adam: on every rank, it skips the step everywhere)
    counts = [[s["nonfinite"] for s in steps] for steps in ranks]
    if label == "onebit_adam":
        assert counts == [[0, 1, 1, 1], [0, 1, 1, 1]]
    else:
        assert counts == [[0, 1, 1, 1], [0, 0, 0, 0]]
    # the flagged rank's state is exactly as before the step (1-bit Adam: every rank's)
    assert _states_equal(ranks[0][0]["state"], ranks[0][1]["state"])
    if label == "onebit_adam":
        assert _states_equal(ranks[1][0]["state"], ranks[1][1]["state"])
    if label == "topk":  # the other rank put back what it had selected: it owes e + g exactly
        residual = [torch.cat([s["state"]["residuals"][n].reshape(-1) for n in ("0", "1")])
                    for s in ranks[1][:2]]
        gradient = torch.randn(60_200, generator=torch.Generator().manual_seed(11))
        assert torch.equal(residual[1], residual[0] + gradient)


def _tensors(state: dict) -> list[torch.Tensor]:
    out = []
    for value in state.values():
        if isinstance(value, dict):
            out += _tensors(value)
        elif isinstance(value, torch.Tensor) and value.is_floating_point():
            out.append(value)
    return out
