"""One rank of a real 2-rank gloo job exercising the compression hooks; started by
``test_compression_ddp.py`` with RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT in the environment.

``python ddp_worker.py MODE OUT_DIR``, MODE ``all`` (each of these in turn, one job) or one of:

* ``reference``: each hook once on a hand-made bucket of random gradients; saves this rank's
  input and the hook's output to ``reference-rank<R>.pt`` for the test to check against float64.
* ``train``: per compressor, 8 SGD steps of DDP on a small MLP cut into several buckets (DDP
  rebuilds them after iteration 0); writes losses, whether the parameters are bitwise equal on
  every rank, the bytes the hook reported and the bytes the tensors handed to ``torch.distributed``
  really hold, to ``train-rank<R>.json``.
* ``resume``: per compressor with state, 3 steps, ``state_dict()`` through ``torch.save``, a
  fresh DDP and hook loading it, 3 more steps; writes the residual norms to ``resume-rank<R>.json``.
* ``nonfinite``: PowerSGD on two hand-made buckets, where bucket 0 holds NaN on rank 0 at step 1
  and Inf on rank 1 at step 2, against a run that never saw those two steps for bucket 0; saves
  the results, states, counters and bytes to ``nonfinite-rank<R>.pt``.
* ``flagged``: sign, topk (both exchanges) and 1-bit Adam on one bucket, rank 0's gradients NaN
  at step 1; saves per step the result's finiteness, the counters and the state to
  ``flagged-rank<R>.pt``.
"""

from __future__ import annotations

import io
import json
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from laggard.compression import COMPRESSORS, make_hook
from laggard.compression.bucket import FlatBucket
from laggard.integrations.collective_bytes import (
    allgather_bytes,
    alltoall_bytes,
    ring_allreduce_bytes,
)

STEPS = 8
STATEFUL = ("sign", "topk", "powersgd", "onebit_adam")
#: Training arms: label -> (compressor, options). 1-bit Adam brings its own optimizer.
ARMS = {name: (name, {}) for name in COMPRESSORS}
# the scatter variant's result holds at most k entries (the all-gather's up to W k): 2% here
ARMS["topk_scatter"] = ("topk", {"algorithm": "scatter", "ratio": 0.02})
# 1-bit Adam's recipe with top-k: AdamW for 3 steps, then the momentum through top-k
ARMS["topk_momentum"] = ("topk", {"momentum": True, "warmup_steps": 3, "lr": 5e-3})
ONEBIT = {"warmup_steps": 3, "lr": 5e-3}
#: Resumed at step 3: the momentum compression has run for one step, so the errors are not 0.
ONEBIT_RESUME = {"warmup_steps": 2, "lr": 5e-3}


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(32, 128), torch.nn.LayerNorm(128), torch.nn.ReLU(),
        torch.nn.Linear(128, 128), torch.nn.ReLU(), torch.nn.Linear(128, 4),
    )


def batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A fixed regression task: targets from a fixed random linear map plus a nonlinearity."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(64, 32, generator=g)
    teacher = torch.randn(32, 4, generator=torch.Generator().manual_seed(7))
    return x, torch.tanh(x @ teacher)


class WireCounter:
    """Counts the bytes of the tensors handed to torch.distributed collectives while enabled,
    converted to bytes sent per rank by the same per-algorithm rules the hooks use."""

    def __init__(self, world: int) -> None:
        self.world, self.enabled, self.bytes = world, False, 0
        self._orig = {name: getattr(dist, name)
                      for name in ("all_reduce", "all_gather_single", "all_to_all_single")}
        dist.all_reduce = self._wrap("all_reduce", lambda a: ring_allreduce_bytes(nb(a[0]), world))
        dist.all_gather_single = self._wrap("all_gather_single",
                                            lambda a: allgather_bytes(nb(a[1]), world))
        dist.all_to_all_single = self._wrap(
            "all_to_all_single", lambda a: alltoall_bytes(nb(a[1]) // world, world))

    def _wrap(self, name, count):  # type: ignore[no-untyped-def]
        orig = self._orig[name]

        def wrapped(*args, **kwargs):  # type: ignore[no-untyped-def]
            if self.enabled:
                self.bytes += count(args)
            return orig(*args, **kwargs)

        return wrapped


def nb(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def hook_and_optimizer(name: str, model: torch.nn.Module, options: dict | None = None,
                       momentum: float = 0.9, onebit: dict = ONEBIT) -> tuple:
    """``make_hook`` and the optimizer to train with: 1-bit Adam's own, else SGD."""
    if name == "onebit_adam":
        state, hook = make_hook(name, model=model, **onebit)
        return state, hook, state.optimizer
    state, hook = make_hook(name, model=model, **(options or {}))
    own = getattr(state, "optimizer", None)  # momentum=True brings its optimizer
    return state, hook, own or torch.optim.SGD(model.parameters(), lr=0.1, momentum=momentum)


def train(label: str, rank: int, world: int, counter: WireCounter) -> dict:
    name, options = ARMS[label]
    model = make_model()
    ddp = DistributedDataParallel(model, bucket_cap_mb=0.01)
    state, hook, opt = hook_and_optimizer(name, model, options)
    layouts: dict[int, list[int]] = {}

    def recording_hook(state, bucket):  # type: ignore[no-untyped-def]
        layouts.setdefault(step, []).append(len(bucket.parameters()))
        return hook(state, bucket)

    ddp.register_comm_hook(state, recording_hook)
    losses, reported, counted, raw = [], [], [], []
    for step in range(STEPS):
        x, y = batch(rank, step)
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        counter.bytes, counter.enabled = 0, True
        loss.backward()
        counter.enabled = False
        comm = state.timer.take_step()
        reported.append(comm.bytes)
        raw.append(comm.raw_bytes)
        counted.append(counter.bytes)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    gathered = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(gathered, flat)
    state.close()
    return {"losses": losses, "identical": all(torch.equal(g, flat) for g in gathered),
            "reported_bytes": reported, "counted_bytes": counted, "raw_bytes": raw,
            "buckets_per_step": {str(k): v for k, v in layouts.items()},
            "grad_bytes": sum(nb(p) for p in model.parameters())}


def reference(rank: int) -> dict:
    """Each hook on one hand-made bucket (two matrices and a vector) of random gradients."""
    out = {}
    for name in COMPRESSORS:
        if name == "onebit_adam":  # compresses the optimizer's momentum: checked in training
            continue
        params = [torch.nn.Parameter(torch.zeros(48, 40)), torch.nn.Parameter(torch.zeros(40)),
                  torch.nn.Parameter(torch.zeros(40, 24))]
        grads = torch.randn(sum(p.numel() for p in params),
                            generator=torch.Generator().manual_seed(rank + 10))
        state, hook = make_hook(name, **({"ratio": 0.05} if name == "topk" else {}))
        bucket = FlatBucket(0, params, grads.clone())
        result = hook(state, bucket).wait()
        state.close()
        out[name] = {"grads": grads, "result": result.clone()}
    return out


def run_steps(name: str, rank: int, steps: range, model_state: dict | None = None,
              compression_state: dict | None = None) -> tuple[torch.nn.Module, object]:
    """Train ``steps`` with a fresh DDP and hook, optionally restoring model and hook state."""
    model = make_model()
    if model_state is not None:
        model.load_state_dict(model_state)
    ddp = DistributedDataParallel(model, bucket_cap_mb=0.01)
    # SGD without momentum: nothing else to restore (1-bit Adam's optimizer is in its state)
    state, hook, opt = hook_and_optimizer(name, model, momentum=0.0, onebit=ONEBIT_RESUME)
    if compression_state is not None:
        state.load_state_dict(compression_state)
    ddp.register_comm_hook(state, hook)
    for step in steps:
        x, y = batch(rank, step)
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return model, state


def flat_params(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def max_diff(a: torch.nn.Module, b: torch.nn.Module) -> float:
    return float((flat_params(a) - flat_params(b)).abs().max())


def errors(state: dict) -> dict[str, torch.Tensor]:
    """The error-feedback buffers of a compressor's ``state_dict``, by name."""
    if state["compressor"] == "onebit_adam":
        return {"server_error": state["server_error"], "worker_error": state["worker_error"]}
    return state["residuals"]


def lose_errors(name: str, state: dict) -> dict | None:
    """The checkpoint without its error buffers (1-bit Adam keeps its optimizer state)."""
    if name != "onebit_adam":
        return None
    return {**state, "worker_error": torch.zeros_like(state["worker_error"]),
            "server_error": torch.zeros_like(state["server_error"])}


def resume(rank: int) -> dict:
    """Uninterrupted 6 steps against 3 + checkpoint (torch.save/load) + 3, and against 3 + 3
    with the compressor's state lost."""
    out = {}
    for name in STATEFUL:
        straight, state = run_steps(name, rank, range(6))
        state.close()
        first, state = run_steps(name, rank, range(3))
        blob = io.BytesIO()
        torch.save({"model": first.state_dict(), "compression": state.state_dict()}, blob)
        saved = errors(state.state_dict())
        state.close()
        blob.seek(0)
        checkpoint = torch.load(blob)
        resumed, state = run_steps(name, rank, range(3, 6), checkpoint["model"],
                                   checkpoint["compression"])
        state.close()
        restored_probe = hook_and_optimizer(name, make_model(), onebit=ONEBIT_RESUME)[0]
        restored_probe.load_state_dict(checkpoint["compression"])
        restored = errors(restored_probe.state_dict())
        restored_probe.close()
        lost, state = run_steps(name, rank, range(3, 6), checkpoint["model"],
                                lose_errors(name, checkpoint["compression"]))
        state.close()
        out[name] = {
            "saved_norm": float(torch.cat([v.reshape(-1) for v in saved.values()]).norm()),
            "restored_equal": saved.keys() == restored.keys()
            and all(torch.equal(saved[k], restored[k]) for k in saved),
            "resumed_vs_straight": max_diff(resumed, straight),
            "lost_vs_straight": max_diff(lost, straight),
            "names": sorted(saved),
        }
    return out


#: nonfinite(): bucket 0 gets this value on this rank at this step
POISON = {1: (0, float("nan")), 2: (1, float("inf"))}


def nonfinite(rank: int, counter: WireCounter) -> dict:
    """PowerSGD with a NaN/Inf bucket next to a finite one, each step's two hooks in flight
    together as DDP runs them (so their two stages must pair up across ranks)."""
    module = torch.nn.ParameterList([torch.nn.Parameter(torch.zeros(shape)) for shape in
                                     ((48, 40), (40,), (40, 24), (32, 32))])
    buckets = [list(module)[:3], list(module)[3:]]
    clean, poisoned = make_hook("powersgd", model=module), make_hook("powersgd", model=module)

    def step(hooked: tuple, number: int, indices: tuple[int, ...] = (0, 1)) -> dict:
        state, hook = hooked
        counter.bytes, counter.enabled = 0, True
        futures = []
        for b in indices:
            grads = torch.randn(sum(p.numel() for p in buckets[b]),
                                generator=torch.Generator().manual_seed(100 * number + 10 * b
                                                                        + rank))
            if b == 0 and POISON.get(number, (-1,))[0] == rank:
                grads[5] = POISON[number][1]
            futures.append(hook(state, FlatBucket(b, buckets[b], grads)))
        results = [f.wait().clone() for f in futures]
        counter.enabled = False
        return {"results": results, "reported": state.timer.take_step().bytes,
                "counted": counter.bytes, "state": state.state_dict(),
                "nonfinite_buckets": state.nonfinite_buckets}

    out = {"poisoned": [step(poisoned, n) for n in range(4)],
           "clean": [step(clean, 0), step(clean, 1, (1,)), step(clean, 2, (1,)), step(clean, 3)]}
    clean[0].close()
    poisoned[0].close()
    return out


#: flagged(): the hooks whose NaN flag is checked on every rank; label -> (name, options)
FLAGGED = {"sign": ("sign", {}), "topk": ("topk", {"algorithm": "allgather"}),
           "topk_scatter": ("topk", {"algorithm": "scatter"}),
           "onebit_adam": ("onebit_adam", {"warmup_steps": 1})}


def flagged(rank: int) -> dict:
    """Each stateful hook on one bucket for 4 steps, rank 0's gradients NaN at step 1: per step,
    whether the result is finite, the counters and the whole state (``state_dict``)."""
    out = {}
    for label, (name, options) in FLAGGED.items():
        module = torch.nn.ParameterList([torch.nn.Parameter(torch.zeros(shape))
                                         for shape in ((300, 200), (200,))])
        state, hook = make_hook(name, model=module, **options)
        if name == "onebit_adam":  # one AdamW step freezes the variance
            for p in module:
                p.grad = torch.randn(p.shape, generator=torch.Generator().manual_seed(7))
            state.optimizer.step()
        steps = []
        for number in range(4):
            grads = torch.randn(60_200, generator=torch.Generator().manual_seed(10 * number
                                                                                + rank))
            if number == 1 and rank == 0:
                grads[17] = float("nan")
            result = hook(state, FlatBucket(0, list(module), grads)).wait()
            if name == "onebit_adam":  # it counts a step when it skips it
                state.optimizer.step()
            steps.append({"finite": bool(torch.isfinite(result).all()),
                          "all_nan": bool(torch.isnan(result).all()),
                          "nonfinite": getattr(state, "nonfinite_buckets",
                                               getattr(state, "nonfinite_steps", None)),
                          "state": {k: (v.clone() if isinstance(v, torch.Tensor) else v)
                                    for k, v in state.state_dict().items()
                                    if k != "optimizer"}})
        state.close()
        out[label] = steps
    return out


def main(mode: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    modes = ("reference", "train", "resume", "nonfinite", "flagged") if mode == "all" \
        else (mode,)
    counter = WireCounter(world)
    if "reference" in modes:
        result = reference(rank)
        # a group without this rank: make_hook must refuse it at set-up
        only_rank0 = dist.new_group(ranks=[0])
        if rank != 0:
            try:
                make_hook("sign", only_rank0)
                result["non_member"] = "accepted"
            except ValueError as exc:
                result["non_member"] = str(exc)
        torch.save(result, os.path.join(out_dir, f"reference-rank{rank}.pt"))
    if "train" in modes:
        trained = {label: train(label, rank, world, counter) for label in ARMS}
        with open(os.path.join(out_dir, f"train-rank{rank}.json"), "w") as f:
            json.dump(trained, f)
    if "resume" in modes:
        with open(os.path.join(out_dir, f"resume-rank{rank}.json"), "w") as f:
            json.dump(resume(rank), f)
    if "nonfinite" in modes:
        torch.save(nonfinite(rank, counter), os.path.join(out_dir, f"nonfinite-rank{rank}.pt"))
    if "flagged" in modes:
        torch.save(flagged(rank), os.path.join(out_dir, f"flagged-rank{rank}.pt"))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
    sys.stdout.flush()  # torn down: now skip the C++ static destructors, where gloo's
    os._exit(0)  # threads abort a rank 1 run in 20 (ENVIRONMENT.md; demo/worker.py)
