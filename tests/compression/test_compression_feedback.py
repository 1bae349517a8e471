"""Error feedback over many steps, on a real one-rank gloo group in this process: what compression
drops is carried in the residual (the sum of what was sent is the sum of the gradients minus the
residual), and the residual stays bounded, where without feedback the dropped error grows with
the number of steps."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from laggard.compression import make_hook
from laggard.compression.bucket import FlatBucket

STEPS = 300


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(48, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))


def gradients(numel: int) -> Iterator[torch.Tensor]:
    """A persistent direction plus noise: a biased compressor without feedback drifts on it.

    The direction's entries share one magnitude (random signs), the regime of the error-feedback
    bound, which needs every p = g + e to keep delta = |p|_1^2 / (n |p|_2^2) away from 0: with
    a few entries persistently far larger than the rest, sign compression starves them and the
    residual grows (as sqrt(steps) here), though far slower than without feedback.
    """
    g = torch.Generator().manual_seed(1)
    mean = torch.randint(0, 2, (numel,), generator=g).float() * 2 - 1
    for _ in range(STEPS):
        yield mean + 0.5 * torch.randn(numel, generator=g)


def total_residual(state) -> torch.Tensor:  # type: ignore[no-untyped-def]
    residuals = state.state_dict()["residuals"]
    return torch.cat([residuals[name].reshape(-1).double() for name in sorted(residuals)])


def run(name: str, options: dict, feedback: bool) -> tuple[list[float], float, float]:
    """Norms of the residual per step, the max gradient norm, and |sum(g) - sum(sent) - e|."""
    net = model()
    names = [name for name, _ in net.named_parameters()]
    params = list(net.parameters())
    # one bucket in named_parameters order, so the flat buffer and sorted names line up below
    order = sorted(range(len(names)), key=names.__getitem__)
    bucket_params = [params[i] for i in order]
    state, hook = make_hook(name, model=net, **options)
    empty = state.state_dict()
    numel = sum(p.numel() for p in params)
    grad_sum = torch.zeros(numel, dtype=torch.float64)
    sent_sum = torch.zeros(numel, dtype=torch.float64)
    norms, max_grad = [], 0.0
    for g in gradients(numel):
        if not feedback:
            state.load_state_dict(empty)
        bucket = FlatBucket(0, bucket_params, g.clone())
        sent = hook(state, bucket).wait()
        grad_sum += g.double()
        sent_sum += sent.double()
        max_grad = max(max_grad, float(g.norm()))
        norms.append(float(total_residual(state).norm()))
    drift = float((grad_sum - sent_sum - total_residual(state)).norm())
    state.close()
    if not feedback:
        norms[-1] = float((grad_sum - sent_sum).norm())  # the error dropped, accumulated
    return norms, max_grad, drift


def ef_bound(delta: float) -> float:
    """Bound on |e_t| / max|g| for a compressor with |x - C(x)|^2 <= (1 - delta) |x|^2:
    |e|^2 <= 4 (1 - delta) / delta^2 max|g|^2 (Karimireddy et al. 2019, Lemma 3)."""
    return 2 * (1 - delta) ** 0.5 / delta


# delta: sign, |p|_1^2 / (n |p|_2^2), about 0.5 here (2/pi for Gaussian entries), taken as 0.4;
# top-k, k/n; PowerSGD, r / min(n, m) of its squarest matrix (64 x 48) if the power iteration
# found the best rank-r subspace (Eckart-Young), which warm start approaches.
CASES = [
    ("sign", {}, ef_bound(0.4)),
    ("topk", {"ratio": 0.05}, ef_bound(0.05)),
    ("powersgd", {"rank": 2}, ef_bound(2 / 48)),
]


@pytest.mark.parametrize("name,options,bound", CASES)
def test_error_feedback_keeps_the_residual_bounded(
    one_rank_group: None, name: str, options: dict, bound: float,
) -> None:
    norms, max_grad, drift = run(name, options, feedback=True)
    # nothing is lost: what was not sent is exactly the residual
    assert drift <= 1e-3 * max_grad
    assert max(norms) <= bound * max_grad
    # and it does not grow: the last third is no larger than the middle third (+10%)
    third = STEPS // 3
    assert max(norms[-third:]) <= 1.1 * max(norms[third : 2 * third])
    # without feedback the dropped error accumulates past that bound
    lost, _, _ = run(name, options, feedback=False)
    assert lost[-1] > bound * max_grad


@pytest.mark.parametrize("name,options,message", [
    ("topk", {"ratio": 0.0}, "ratio must be a number in"),
    ("topk", {"ratio": 1.5}, "ratio must be a number in"),
    ("topk", {"ratio": float("nan")}, "ratio must be a number in"),
    ("powersgd", {"rank": 0}, "rank must be an integer"),
])
def test_out_of_range_options_are_refused_at_set_up(
    one_rank_group: None, name: str, options: dict, message: str,
) -> None:
    with pytest.raises(ValueError, match=message):
        make_hook(name, **options)


def test_top_k_ratio_one_sends_everything(one_rank_group: None) -> None:
    net = model()
    state, hook = make_hook("topk", ratio=1.0, model=net)
    g = torch.randn(sum(p.numel() for p in net.parameters()))
    sent = hook(state, FlatBucket(0, list(net.parameters()), g.clone())).wait()
    assert torch.equal(sent, g)


def test_warmup_steps_all_reduce_uncompressed_then_compress(one_rank_group: None) -> None:
    net = model()
    params = list(net.parameters())
    state, hook = make_hook("sign", model=net, warmup_steps=2)
    ops = []
    for _ in range(3):
        g = torch.randn(sum(p.numel() for p in params))
        sent = hook(state, FlatBucket(0, params, g.clone())).wait()
        ops.append([c.op for c in state.timer.take_step().collectives])
        if len(ops) <= 2:
            assert torch.equal(sent, g)  # one rank: the all-reduce average is the gradient
    state.close()
    assert ops == [["allreduce"], ["allreduce"], ["alltoall", "allgather"]]
    with pytest.raises(ValueError, match="warmup_steps"):
        make_hook("topk", warmup_steps=-1)
