"""The fast sign codec against its torch reference, and the new paths' bad input (a bucket of
zeros, NaN/Inf gradients, one rank, k beyond the bucket, a resume into another world size), on a
real one-rank gloo group in this process."""

from __future__ import annotations

import io

import pytest
import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from laggard.compression import make_hook
from laggard.compression.bucket import FlatBucket
from laggard.compression.onebit_adam import OneBitAdam
from laggard.compression.signcodec import (
    accumulate_rows,
    decode_rows,
    encode_rows,
    encode_rows_torch,
    scales,
)
from laggard.compression.topk import select_topk


# ------------------------------------------------------------------------------ sign codec
def test_numpy_codec_equals_the_torch_reference_and_keeps_what_it_drops() -> None:
    g = torch.randn(3, 8 * 40_000, generator=torch.Generator().manual_seed(0))
    g[1, 5] = -0.0  # the sign bit decides: -0.0 is sent as negative
    lengths = torch.tensor([320_000.0, 320_000.0, 100_000.0])
    fast, reference = g.clone(), g.clone()
    payload, finite = encode_rows(fast, lengths)
    expected, _ = encode_rows_torch(reference, lengths)
    assert finite.all()
    assert torch.equal(payload[:, :-8], expected[:, :-8])  # the packed signs, bit for bit
    torch.testing.assert_close(scales(payload), scales(expected), rtol=1e-5, atol=0)
    torch.testing.assert_close(fast, reference, rtol=0, atol=1e-5)
    # error feedback's identity: what was sent plus what was kept is the input
    torch.testing.assert_close(decode_rows(payload) + fast, g, rtol=0, atol=1e-5)
    assert float(scales(payload)[0]) == pytest.approx(float(g[0].abs().mean()), rel=1e-5)
    # the server's mean of rows, decoded without the (R, c) matrix
    mean = accumulate_rows(payload, torch.zeros(g.shape[1]), 1 / 3)
    torch.testing.assert_close(mean, decode_rows(payload).mean(0), rtol=0, atol=1e-6)


def test_codec_flags_rows_that_are_not_finite_and_zero_rows_stay_zero() -> None:
    rows = torch.randn(3, 64, generator=torch.Generator().manual_seed(1))
    rows[1, 3], rows[2, 9] = float("nan"), float("inf")
    rows[0] = 0
    payload, finite = encode_rows(rows.clone(), torch.full((3,), 64.0))
    assert finite.tolist() == [True, False, False]
    assert torch.isnan(scales(payload)[1:]).all() and not payload[1:, :-8].any()
    decoded = decode_rows(payload)
    assert torch.equal(decoded[0], torch.zeros(64)) and torch.isnan(decoded[1:]).all()


def test_codec_refuses_what_it_cannot_pack() -> None:
    with pytest.raises(ValueError, match="c % 8 == 0"):
        encode_rows(torch.zeros(2, 12), torch.ones(2))
    with pytest.raises(ValueError, match="float32"):
        encode_rows(torch.zeros(2, 16, dtype=torch.float64), torch.ones(2))


def test_topk_of_a_mostly_zero_bucket_needs_no_sort() -> None:
    values = torch.zeros(1 << 18)
    values[[5, 70_000, 200_000]] = torch.tensor([1.0, -2.0, 3.0])
    chosen = select_topk(values, 100, torch.Generator().manual_seed(0))
    assert chosen.numel() == 100 == chosen.unique().numel()
    assert {5, 70_000, 200_000} <= set(chosen.tolist())


# ------------------------------------------------------------------------------ top-k hook
def bucket_params() -> list[torch.nn.Parameter]:
    return [torch.nn.Parameter(torch.zeros(300, 400)), torch.nn.Parameter(torch.zeros(7))]


@pytest.mark.parametrize("algorithm", ["allgather", "scatter"])
def test_topk_bad_input(one_rank_group: None, algorithm: str) -> None:
    params = bucket_params()
    state, hook = make_hook("topk", model=None, algorithm=algorithm)
    assert state.algorithm == algorithm
    # a bucket of zeros: a valid, all-zero result and nothing owed
    zeros = hook(state, FlatBucket(0, params, torch.zeros(120_007))).wait()
    assert torch.equal(zeros, torch.zeros(120_007))
    g = torch.randn(120_007, generator=torch.Generator().manual_seed(2))
    hook(state, FlatBucket(0, params, g.clone())).wait()
    residual = state.residuals.flat(0, state_layout(params)).clone()
    # NaN and Inf: counted, sent as a flag (every rank's result is NaN), residual untouched
    for bad in (float("nan"), float("inf")):
        poisoned = g.clone()
        poisoned[17] = bad
        result = hook(state, FlatBucket(0, params, poisoned)).wait()
        assert torch.isnan(result).all()
        assert torch.equal(state.residuals.flat(0, state_layout(params)), residual)
    assert state.nonfinite_buckets == 2
    # one rank: nothing crosses a wire, and the bytes say so
    assert state.timer.take_step().bytes == 0
    state.close()


def state_layout(params: list[torch.nn.Parameter]):  # type: ignore[no-untyped-def]
    from laggard.compression.residuals import BucketLayout

    return BucketLayout.of(FlatBucket(0, params))


@pytest.mark.parametrize("algorithm", ["allgather", "scatter"])
def test_topk_never_sends_more_than_the_bucket(one_rank_group: None, algorithm: str) -> None:
    # ratio 1: k is the whole bucket, exactly; and a 1-element bucket still sends 1
    state, hook = make_hook("topk", ratio=1.0, algorithm=algorithm)
    g = torch.randn(120_007, generator=torch.Generator().manual_seed(3))
    assert torch.equal(hook(state, FlatBucket(0, bucket_params(), g.clone())).wait(), g)
    tiny = [torch.nn.Parameter(torch.zeros(1))]
    assert state.k(1) == 1
    assert hook(state, FlatBucket(1, tiny, torch.tensor([3.0]))).wait().tolist() == [3.0]
    state.close()
    with pytest.raises(ValueError, match="algorithm 'ring'"):
        make_hook("topk", algorithm="ring")


# ------------------------------------------------------------------------------ PowerSGD
def test_powersgd_bad_input_on_one_rank(one_rank_group: None) -> None:
    # the 2-rank case (the flag reaching the other rank, the stages staying paired) is in
    # test_compression_ddp.py
    module = torch.nn.ParameterList(bucket_params())
    (state, hook), (clean, clean_hook) = make_hook("powersgd", model=module), \
        make_hook("powersgd", model=module)
    grads = [torch.randn(120_007, generator=torch.Generator().manual_seed(s)) for s in (4, 5)]
    for h, s in ((hook, state), (clean_hook, clean)):
        zeros = h(s, FlatBucket(0, list(module), torch.zeros(120_007))).wait()
        assert torch.equal(zeros, torch.zeros(120_007))
        h(s, FlatBucket(0, list(module), grads[0].clone())).wait()
    saved = state.state_dict()
    assert saved["residuals"]["0"].abs().sum() > 0
    # NaN and Inf: counted, the result is NaN, residuals and the warm-start Q untouched
    for bad in (float("nan"), float("inf")):
        poisoned = grads[1].clone()
        poisoned[17] = bad
        assert torch.isnan(hook(state, FlatBucket(0, list(module), poisoned)).wait()).all()
        now = state.state_dict()
        for key in ("residuals", "q"):
            assert all(torch.equal(now[key][name], saved[key][name]) for name in saved[key])
    assert state.nonfinite_buckets == 2 and clean.nonfinite_buckets == 0
    # the next finite step is the step of a run that never saw the bad ones
    after = hook(state, FlatBucket(0, list(module), grads[1].clone())).wait()
    assert torch.equal(after, clean_hook(clean, FlatBucket(0, list(module),
                                                           grads[1].clone())).wait())
    assert state.timer.take_step().bytes == 0  # one rank: nothing on a wire
    state.close()
    clean.close()


# ---------------------------------------------------------------------------- 1-bit Adam
def small_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(16, 32, generator=torch.Generator().manual_seed(step))
    return x, torch.tanh(x[:, :4])


def train(ddp: DistributedDataParallel, optimizer: torch.optim.Optimizer, steps: range,
          poison: int = -1) -> None:
    for step in steps:
        x, y = batch(step)
        if step == poison:
            x[0, 0] = float("nan")
        F.mse_loss(ddp(x), y).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def test_onebit_adam_warmup_is_adamw_then_compresses(one_rank_group: None) -> None:
    model, reference = small_model(), small_model()
    ddp = DistributedDataParallel(model, bucket_cap_mb=0.001)
    state, hook = make_hook("onebit_adam", model=model, warmup_steps=3, lr=3e-3)
    ddp.register_comm_hook(state, hook)
    adamw = torch.optim.AdamW(reference.parameters(), lr=3e-3)
    train(ddp, state.optimizer, range(3))
    train(DistributedDataParallel(reference, bucket_cap_mb=0.001), adamw, range(3))
    # the warm-up is AdamW, bit for bit
    pairs = zip(model.parameters(), reference.parameters(), strict=True)
    assert all(torch.equal(a, b) for a, b in pairs)
    assert state.optimizer.frozen and not isinstance(adamw, OneBitAdam)
    train(ddp, state.optimizer, range(3, 6))
    assert state.state_dict()["worker_error"].abs().sum() > 0
    state.close()


def test_onebit_adam_skips_a_step_whose_momentum_is_not_finite(one_rank_group: None) -> None:
    model = small_model()
    ddp = DistributedDataParallel(model, bucket_cap_mb=0.001)
    state, hook = make_hook("onebit_adam", model=model, warmup_steps=2, lr=3e-3)
    ddp.register_comm_hook(state, hook)
    train(ddp, state.optimizer, range(4))
    before = [p.detach().clone() for p in model.parameters()]
    saved = state.state_dict()
    train(ddp, state.optimizer, range(4, 5), poison=4)
    after = state.state_dict()
    assert state.nonfinite_steps == 1 == state.optimizer.nonfinite_steps
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    for key in ("worker_error", "server_error"):
        assert torch.equal(saved[key], after[key])  # no garbage in either error buffer
    train(ddp, state.optimizer, range(5, 7))  # and training goes on
    assert all(torch.isfinite(p).all() for p in model.parameters())
    state.close()


def test_onebit_adam_refuses_what_it_cannot_resume_or_run(one_rank_group: None) -> None:
    model = small_model()
    state, _ = make_hook("onebit_adam", model=model, warmup_steps=2)
    blob = io.BytesIO()
    torch.save(state.state_dict(), blob)
    blob.seek(0)
    checkpoint = torch.load(blob)
    state.load_state_dict(checkpoint)  # its own checkpoint loads
    with pytest.raises(ValueError, match="rank 0 of 4, this is rank 0 of 1"):
        state.load_state_dict({**checkpoint, "world_size": 4})
    with pytest.raises(ValueError, match="another model"):
        state.load_state_dict({**checkpoint, "numel": 3})
    state.close()
    with pytest.raises(ValueError, match="needs model="):
        make_hook("onebit_adam")
    with pytest.raises(ValueError, match="warmup_steps >= 1"):
        make_hook("onebit_adam", model=model, warmup_steps=0)
    with pytest.raises(ValueError, match="takes no option ratio"):
        make_hook("onebit_adam", model=model, ratio=0.1)


@pytest.mark.parametrize("name", ["topk", "powersgd"])
def test_momentum_compression_is_adamw_then_compresses_the_momentum(one_rank_group: None,
                                                                     name: str) -> None:
    model, reference = small_model(), small_model()
    ddp = DistributedDataParallel(model, bucket_cap_mb=0.001)
    state, hook = make_hook(name, model=model, momentum=True, warmup_steps=3, lr=3e-3)
    ddp.register_comm_hook(state, hook)
    adamw = torch.optim.AdamW(reference.parameters(), lr=3e-3)
    train(ddp, state.optimizer, range(3))
    train(DistributedDataParallel(reference, bucket_cap_mb=0.001), adamw, range(3))
    pairs = zip(model.parameters(), reference.parameters(), strict=True)
    assert all(torch.equal(a, b) for a, b in pairs)  # the warm-up is AdamW
    train(ddp, state.optimizer, range(3, 6))
    assert state.timer.take_step().raw_bytes == 0  # one rank: nothing on a wire, either way
    before = [p.detach().clone() for p in model.parameters()]
    train(ddp, state.optimizer, range(6, 7), poison=6)  # NaN: the step is skipped
    assert state.optimizer.nonfinite_steps == 1
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    checkpoint = state.state_dict()
    assert checkpoint["momentum"] and "optimizer" in checkpoint
    state.load_state_dict(checkpoint)
    with pytest.raises(ValueError, match="without momentum=True"):
        state.load_state_dict({**checkpoint, "momentum": False})
    state.close()
    with pytest.raises(ValueError, match="need momentum=True"):
        make_hook(name, model=model, lr=0.1)
    with pytest.raises(ValueError, match="not 'fp16'"):
        make_hook("fp16", model=model, momentum=True)


def test_momentum_compression_selects_by_the_preconditioned_momentum(one_rank_group: None) -> None:
    """Top-k on the momentum picks the coordinates of largest update ``m / (sqrt(v_hat) + eps)``,
    not of largest raw momentum (``preconditioned=True``, the default)."""
    model = small_model()
    ddp = DistributedDataParallel(model)  # one bucket: one k for the whole model
    state, hook = make_hook("topk", model=model, momentum=True, warmup_steps=3, lr=3e-3,
                            ratio=0.05)
    ddp.register_comm_hook(state, hook)
    train(ddp, state.optimizer, range(3))
    params = list(model.parameters())
    # the local momentum the hook will compress at step 3, computed independently
    shadow = small_model()
    shadow.load_state_dict(model.state_dict())
    x, y = batch(3)
    F.mse_loss(shadow(x), y).backward()
    beta1 = state.optimizer.param_groups[0]["betas"][0]
    momentum = torch.cat([(beta1 * state.optimizer.state[p]["exp_avg"]
                           + (1 - beta1) * q.grad).view(-1)
                          for p, q in zip(params, shadow.parameters(), strict=True)])
    update = momentum / torch.cat([state.optimizer.frozen_denominator(p).view(-1)
                                   for p in params])
    F.mse_loss(ddp(x), y).backward()
    sent = torch.cat([p.grad.view(-1) for p in params]).nonzero().view(-1)
    k = state.inner.k(momentum.numel())
    by_update = set(update.abs().topk(k).indices.tolist())
    by_momentum = set(momentum.abs().topk(k).indices.tolist())
    assert by_update != by_momentum  # the two rules differ on this model
    assert set(sent.tolist()) == by_update
    state.optimizer.step()
    state.close()


def test_wrongly_typed_options_and_a_momentum_checkpoint_are_clear_errors(
        one_rank_group: None) -> None:
    model = small_model()
    with pytest.raises(ValueError, match="ratio must be a number"):
        make_hook("topk", ratio="0.1")
    with pytest.raises(ValueError, match="betas must be two numbers"):
        make_hook("onebit_adam", model=model, betas=(0.9,))
    with pytest.raises(ValueError, match="lr must be a number"):
        make_hook("topk", model=model, momentum=True, lr="fast")
    with pytest.raises(ValueError, match="model must be the torch.nn.Module"):
        make_hook("topk", model="model")
    with pytest.raises(ValueError, match="timer must be a laggard CommTimer"):
        make_hook("topk", timer=object())
    with pytest.raises(ValueError, match="momentum must be True or False"):
        make_hook("topk", model=model, momentum="yes")
    with pytest.raises(ValueError, match="rank must be an integer"):
        make_hook("powersgd", rank=True)
    onebit, _ = make_hook("onebit_adam", model=model, warmup_steps=2)
    onebit_checkpoint = onebit.state_dict()
    onebit.close()
    topk_momentum, _ = make_hook("topk", model=model, momentum=True, warmup_steps=2)
    with pytest.raises(ValueError, match="compressor 'onebit_adam', this hook is 'topk'"):
        topk_momentum.load_state_dict(onebit_checkpoint)
    topk_momentum.close()
    state, _ = make_hook("powersgd", model=model, momentum=True, warmup_steps=2, lr=1e-3)
    checkpoint = state.state_dict()
    assert state.nonfinite_buckets == 0 and state.nonfinite_steps == 0
    state.close()
    plain, _ = make_hook("powersgd", model=model)
    with pytest.raises(ValueError, match="taken with momentum=True"):
        plain.load_state_dict(checkpoint)
    plain.close()
