"""One rank of ``laggard demo``: a small decoder-only transformer language model trained with DDP
on gloo, timed by TrainingMonitor, one rank optionally slowed.

Launched by ``laggard demo`` through PyTorch's own launcher::

    python -m torch.distributed.run --standalone --nproc_per_node 4 \\
        -m laggard.demo.worker --steps 300 --slow-rank 2 --slowdown 1.25 ...

The text is the Python standard library's own source (found with ``sysconfig``), as bytes: a
vocabulary of 256 tokens, no tokenizer to download. Each rank samples its own batches.

The slowdown is extra real compute inside the slowed rank's backward pass, as a throttled GPU
would add: matrix multiplies worth ``(slowdown - 1)`` times the rank's own forward+backward CPU
time, measured before training (see :class:`Throttle` for why backward). Phases are timed in
each rank's thread CPU time, the stand-in for GPU time when W ranks share fewer cores; step and
collective times stay wall time. Rank 0 prints progress and, at the end, writes what the demo's
report needs to ``--result``.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import math
import os
import sys
import time
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from laggard.demo.model import BUCKET_CAP_MB, ByteBatches, ByteLM, load_stdlib_text
from laggard.detectors.straggler import StragglerDetector
from laggard.integrations.comm_timing import CommTimer
from laggard.integrations.compression.wire import ring_allreduce_bytes
from laggard.integrations.monitor import STAT_NAMES, TrainingMonitor

log = logging.getLogger("laggard.demo")

#: Smallest slowdown the demo's detector names. Ranks sharing a CPU's caches with each other and
#: with other processes differ by up to ~3% in CPU time for the same work (2.3% seen here), so
#: the detector's default floor of 2% (made for GPUs of one model) would name one now and then.
MIN_SLOWDOWN = 0.05
#: Whole-job slowdown the demo reports. Four ranks on two cores: the slowed rank's extra compute
#: competes for the cores and caches the others use, which raises every rank's CPU time by
#: 10-12% (seen here), an artefact of the emulation that a GPU job does not have.
JOB_SLOWDOWN_THRESHOLD = 0.25
#: AdamW's learning rate in the demo (and 1-bit Adam's, which runs AdamW for its warm-up).
LEARNING_RATE = 3e-3
#: Forward+backward passes timed before training to calibrate the injected slowdown, the first
#: few of them (allocator and cache warm-up) left out.
CALIBRATION_STEPS, CALIBRATION_WARMUP = 8, 3




# -------------------------------------------------------------------------------- training
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--window", type=int, default=20)
    p.add_argument("--slow-rank", type=int, default=-1)
    p.add_argument("--slowdown", type=float, default=1.0)
    p.add_argument("--slow-from", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--intake-address", default="")
    p.add_argument("--result", default="")
    p.add_argument("--print-every", type=int, default=20)
    p.add_argument("--compression", default="none")
    p.add_argument("--inject-bitflip", default="")
    return p.parse_args(argv)


def comm_hook(name: str, timer: CommTimer, model: torch.nn.Module) -> tuple[Any, Any]:
    """The DDP communication hook for ``--compression NAME`` and its state.

    Every name, ``none`` (the plain averaging all-reduce) included, comes from
    ``laggard.integrations.compression.make_hook``, so bytes are counted the same way for all:
    bytes this rank sends under the collective's algorithm, next to an fp32 all-reduce's.
    """
    from laggard.integrations.compression import make_hook

    return make_hook(name, timer=timer, **hook_options(name, model))


def hook_options(name: str, model: torch.nn.Module) -> dict[str, Any]:
    """``make_hook`` options: the model, and 1-bit Adam's learning rate (it owns the optimizer)."""
    return {"model": model, **({"lr": LEARNING_RATE} if name == "onebit_adam" else {})}


def make_optimizer(state: Any, model: torch.nn.Module) -> torch.optim.Optimizer:
    """AdamW, or the optimizer a hook brings (1-bit Adam: AdamW for its warm-up, then the
    frozen-variance steps on the momentum the hook all-reduces)."""
    own = getattr(state, "optimizer", None)
    if own is not None:
        return own
    return torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE)


def integrity_hook(ddp: DistributedDataParallel, name: str, timer: CommTimer,
                   flip: str) -> tuple[Any, Any]:
    """With ``--inject-bitflip``: the compressor's hook with every gradient-integrity check
    (its payloads fingerprinted by the compressor, its result by ``with_integrity``), registered;
    returns ``(hook state, GradientIntegrity)``. Without: ``(None, None)``, nothing registered.
    """
    if not flip:
        return None, None
    from laggard.integrations.compression import make_hook
    from laggard.integrations.faults import BitFlipInjector
    from laggard.integrations.integrity import (
        GradientIntegrity,
        IntegrityHookState,
        with_integrity,
    )

    integrity = GradientIntegrity(GradientIntegrity.Config(replica_every=10),
                                  injector=BitFlipInjector.parse(flip))
    state, hook = make_hook(name, timer=timer, integrity=integrity,
                            **hook_options(name, ddp.module))
    ddp.register_comm_hook(IntegrityHookState(integrity, state), with_integrity(hook))
    return state, integrity


def calibrate(model: DistributedDataParallel, batches: ByteBatches) -> float:
    """Median forward+backward CPU seconds of this rank, measured without gradient sync."""
    times = []
    with model.no_sync():
        for _ in range(CALIBRATION_STEPS):
            x, y = batches.next()
            start = time.thread_time()
            F.cross_entropy(model(x).flatten(0, 1), y.flatten()).backward()
            times.append(time.thread_time() - start)
    model.zero_grad(set_to_none=True)
    return float(np.median(times[CALIBRATION_WARMUP:]))


def global_mean(value: float) -> float:
    t = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(t)
    return t.item() / dist.get_world_size()


def train(args: argparse.Namespace) -> dict[str, Any]:
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed)  # same initial weights everywhere (DDP also broadcasts them)
    model = ByteLM()
    batches = ByteBatches(load_stdlib_text(), batch_size=8, seq_len=64,
                          seed=args.seed * 1000 + rank)
    # Small buckets (the model has ~0.3 M parameters): several all-reduces per step, so
    # communication can overlap backward as in a large job with 25 MB buckets.
    ddp = DistributedDataParallel(model, bucket_cap_mb=BUCKET_CAP_MB)
    timer = CommTimer()
    state, integrity = integrity_hook(ddp, args.compression, timer, args.inject_bitflip)
    if integrity is None:
        state, hook = comm_hook(args.compression, timer, model)
        ddp.register_comm_hook(state, hook)
    optimizer = make_optimizer(state, model)
    slowed = rank == args.slow_rank and args.slowdown > 1.0
    own_seconds = calibrate(ddp, batches)
    extra = (args.slowdown - 1.0) * own_seconds if slowed else 0.0
    monitor = TrainingMonitor(
        # CPU time of each rank's thread stands in for GPU time: the ranks share this
        # machine's cores (with each other and with whatever else runs), and wall time would
        # mostly measure the scheduler.
        TrainingMonitor.Config(agent_address=args.intake_address, window_steps=args.window,
                               integrity=integrity, phase_clock="thread_cpu",
                               straggler=StragglerDetector.Config(
                                   min_slowdown=MIN_SLOWDOWN,
                                   job_slowdown_threshold=JOB_SLOWDOWN_THRESHOLD)),
        comm_timer=timer,
    )
    losses: dict[int, float] = {}
    local_losses: list[float] = []
    step_times: list[float] = []
    for step in range(args.steps):
        model.throttle_seconds = extra if step >= args.slow_from else 0.0
        start = time.perf_counter()
        with monitor.step():
            with monitor.phase("data"):
                x, y = batches.next()
            with monitor.phase("forward"):
                loss = F.cross_entropy(ddp(x).flatten(0, 1), y.flatten())
            with monitor.phase("backward"):
                loss.backward()
            with monitor.phase("optimizer"):
                if integrity is None or integrity.end_step(ddp):
                    optimizer.step()
                optimizer.zero_grad(set_to_none=True)
        step_times.append(time.perf_counter() - start)
        local_losses.append(loss.item())
        if step == 0 or step == args.steps - 1:
            losses[step] = global_mean(loss.item())  # same call on every rank
        if rank == 0 and (step % args.print_every == 0 or step == args.steps - 1):
            recent = step_times[-args.print_every:]
            print(f"step {step:5d}/{args.steps}  loss {loss.item():6.3f}  "
                  f"step {1e3 * float(np.median(recent)):6.1f} ms", flush=True)
    monitor.close()
    state.close()  # a two-stage hook's worker thread and second group
    tail = local_losses[-args.window:]
    grad_bytes = 4 * sum(p.numel() for p in model.parameters())
    return {
        "rank": rank,
        "world_size": world,
        "steps": args.steps,
        "calibrated_compute_seconds": own_seconds,
        "injected_extra_seconds_per_step": extra,
        "loss": {"first": losses.get(0), "last": losses.get(args.steps - 1),
                 "last_window_mean": global_mean(sum(tail) / len(tail))},
        # what an fp32 ring all-reduce of the gradients sends per rank per step
        "fp32_allreduce_bytes": ring_allreduce_bytes(grad_bytes, world),
        "stat_names": list(STAT_NAMES),
        "windows": [{"step": w.step, "medians": _json_floats(w.medians.tolist())}
                    for w in monitor.windows],
        "findings": [f.to_dict() for f in monitor.findings]
        + ([f.to_dict() for f in integrity.findings] if integrity is not None else []),
        "cleared": [f.to_dict() for f in monitor.cleared],
        "monitor": {
            "records_sent": monitor.stats.records_sent,
            "send_dropped": monitor.stats.send_dropped,
            "send_errors": monitor.stats.send_errors,
            "windows": monitor.stats.windows,
            "internal_errors": monitor.stats.internal_errors,
        },
    }


def _json_floats(rows: list[list[float]]) -> list[list[float | None]]:
    return [[v if math.isfinite(v) else None for v in row] for row in rows]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s", stream=sys.stdout)
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    try:
        result = train(args)
        # DDP's reducer holds the process group through reference cycles: free it now rather
        # than during interpreter shutdown.
        gc.collect()
        # Every rank past its last step before rank 0 declares the run complete and before any
        # rank tears down: gloo aborts a rank whose peer vanished mid-collective.
        dist.barrier()
        if dist.get_rank() == 0 and args.result:
            tmp = f"{args.result}.tmp"
            with open(tmp, "w") as f:
                json.dump(result, f)
            os.replace(tmp, args.result)
    finally:
        dist.destroy_process_group()
    # Everything is written and torn down: leave without C++ static destructors. gloo's
    # transport threads can still be alive then, and a rank aborts now and then with "terminate
    # called without an active exception" (1 run in 6 here under load) after a complete run.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
