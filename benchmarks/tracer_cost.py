"""CollectiveTracer's cost on the demo model's step, DDP and FSDP2, tracer on vs off in one run.

Launches a W-rank gloo job with PyTorch's launcher. Every rank trains the demo's byte-level
transformer twice: wrapped in DDP with the timing hook (``CommTimer``), and sharded with FSDP2
(``fully_shard`` per block and root, timed all-gather and reduce-scatter). For each, blocks of
``--block`` steps alternate between tracer **off** (DDP: ``CommTimer(tracer=None)``; FSDP2: the
default comms) and **on** (DDP: the CommTimer hands every bucket to a tracer; FSDP2: the comms
wrapped by ``instrument_fsdp``), each followed by ``take_step``, as the monitor does, in rotating
order. Compared: the median CPU time per step of all the rank's threads (``time.process_time``;
wall time on a shared machine measures the scheduler), and the tracer's own calls measured
directly (begin/end or record, and take_step, around no work) times the collectives per step.
Then FSDP2 prefetch on vs off the same way (the tracer on), in wall time per step: what turning
prefetch off costs on this machine.
Usage::

    python benchmarks/tracer_cost.py [--world-size 2] [--blocks 20] [--block 10]

Target: the tracer's cost under 1 % of the step's CPU time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET = 0.01


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--blocks", type=int, default=20, help="rounds (one block per arm each)")
    p.add_argument("--block", type=int, default=10, help="steps per block")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", default="", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def _run_blocks(step: object, toggle: object, args: argparse.Namespace,
                clock: object = time.process_time) -> dict[str, list]:
    times: dict[str, list[float]] = {"off": [], "on": []}
    for b in range(args.blocks):
        for arm in (("off", "on") if b % 2 == 0 else ("on", "off")):
            toggle(arm == "on")  # type: ignore[operator]
            for _ in range(args.block):
                start = clock()  # type: ignore[operator]
                step()  # type: ignore[operator]
                times[arm].append(clock() - start)  # type: ignore[operator]
    return times


def _own_cost(tracer: object, collectives: int, rounds: int = 2000) -> float:
    """Seconds per step of the tracer's own calls for ``collectives`` timed calls."""
    start = time.process_time()
    for _ in range(rounds):
        for _ in range(collectives):
            tracer.end(tracer.begin("allgather", None, 1000, blocking=True))  # type: ignore
        tracer.take_step()  # type: ignore[attr-defined]
    return (time.process_time() - start) / rounds


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel

    from laggard.demo.fsdp import shard
    from laggard.demo.model import BUCKET_CAP_MB, ByteBatches, ByteLM, load_stdlib_text
    from laggard.integrations.comm_timing import CommTimer, allreduce_timing_hook
    from laggard.integrations.tracer import CollectiveTracer

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    batches = ByteBatches(load_stdlib_text(), batch_size=8, seq_len=64, seed=rank)
    tracer = CollectiveTracer()
    results = {}

    torch.manual_seed(0)
    timer = CommTimer()
    ddp = DistributedDataParallel(ByteLM(), bucket_cap_mb=BUCKET_CAP_MB)
    ddp.register_comm_hook(timer, allreduce_timing_hook)

    def ddp_step() -> None:
        x, y = batches.next()
        F.cross_entropy(ddp(x).flatten(0, 1), y.flatten()).backward()
        timer.take_step()
        tracer.take_step()
        ddp.zero_grad(set_to_none=True)

    def ddp_toggle(on: bool) -> None:
        timer.tracer = tracer if on else None

    results["ddp"] = _run_blocks(ddp_step, ddp_toggle, args)
    results["ddp_collectives"] = 4

    torch.manual_seed(0)
    model = ByteLM()
    shard(model, tracer)
    from torch.distributed.fsdp import FSDPModule

    units = [m for m in model.modules() if isinstance(m, FSDPModule)]
    timed = [(m, g._all_gather_comm, g._reduce_scatter_comm) for m in units
             for g in m._get_fsdp_state()._fsdp_param_groups]

    def fsdp_step() -> None:
        x, y = batches.next()
        F.cross_entropy(model(x).flatten(0, 1), y.flatten()).backward()
        tracer.take_step()
        model.zero_grad(set_to_none=True)

    def fsdp_toggle(on: bool) -> None:
        for m, ag, rs in timed:
            m.set_custom_all_gather(ag if on else ag.inner)
            m.set_custom_reduce_scatter(rs if on else rs.inner)

    results["fsdp"] = _run_blocks(fsdp_step, fsdp_toggle, args)
    fsdp_toggle(True)
    blocks = list(model.blocks)

    def prefetch_toggle(on: bool) -> None:
        for i, block in enumerate(blocks):
            block.set_modules_to_forward_prefetch(blocks[i + 1: i + 2] if on else [])
            block.set_modules_to_backward_prefetch(blocks[i - 1: i] if on and i else [])

    results["prefetch"] = _run_blocks(fsdp_step, prefetch_toggle, args, time.perf_counter)
    fsdp_step()
    results["fsdp_collectives"] = 3 * len(units)  # all-gather fwd, bwd; reduce-scatter
    results["own_ddp"] = _own_cost(CollectiveTracer(), results["ddp_collectives"])
    results["own_fsdp"] = _own_cost(CollectiveTracer(), results["fsdp_collectives"])
    if rank == 0:
        Path(args.out).write_text(json.dumps(results))
    dist.barrier()
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.json"
        subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
             str(args.world_size), __file__, "--worker", "--out", str(out),
             "--blocks", str(args.blocks), "--block", str(args.block)],
            check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        r = json.loads(out.read_text())
    print(f"load average {os.getloadavg()[0]:.1f}; {args.world_size} gloo ranks, "
          f"{args.blocks} rounds x {args.block} steps per arm")
    print(f"{'job':>5}  {'off (ms CPU)':>12}  {'on (ms CPU)':>11}  {'on/off':>7}  "
          f"{'own calls/step':>15}  {'own/step':>9}")
    ok = True
    for job in ("ddp", "fsdp"):
        off = statistics.median(r[job]["off"])
        on = statistics.median(r[job]["on"])
        own = r[f"own_{job}"]
        ok &= own / off < TARGET
        print(f"{job:>5}  {1e3 * off:12.2f}  {1e3 * on:11.2f}  {on / off:7.3f}  "
              f"{1e6 * own:12.1f} us  {100 * own / off:8.3f}%")
    pf_on, pf_off = (statistics.median(r["prefetch"][k]) for k in ("on", "off"))
    print(f"FSDP2 prefetch (wall time per step, same run): on {1e3 * pf_on:.1f} ms, off "
          f"{1e3 * pf_off:.1f} ms, off/on {pf_off / pf_on:.3f}")
    print(f"target: the tracer's own calls < {100 * TARGET:.0f}% of the step's CPU time: "
          + ("met" if ok else "NOT met"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
