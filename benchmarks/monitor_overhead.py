"""TrainingMonitor's overhead on the demo model's training step, measured in one run.

Launches a W-rank gloo job with PyTorch's launcher (``torch.distributed.run``). Every rank
builds the demo's byte-level transformer twice from the same seed and wraps each copy in DDP:

* baseline: DDP's built-in all-reduce, no monitor;
* monitored: the timing all-reduce hook (CommTimer) and a TrainingMonitor timing four phases,
  sending one StepRecord per step to a UDP sink in this process and gathering a window every
  ``--window`` steps (straggler detector on rank 0).

The two arms run in alternating blocks of ``--block`` steps (ABBA order, so a drift in machine
load falls on both), and the medians of their step times are compared: the ratio is the
overhead. The monitor's own CPU time per step is also measured directly, in the same run, by
running its step/phase calls around no work. Usage::

    python benchmarks/monitor_overhead.py [--world-size 2] [--blocks 24] [--block 20]

Target: overhead under 1% of the step.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

TARGET_OVERHEAD = 0.01


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--blocks", type=int, default=24, help="blocks per arm")
    p.add_argument("--block", type=int, default=20, help="steps per block")
    p.add_argument("--window", type=int, default=20, help="monitor window K")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--sink", default="", help=argparse.SUPPRESS)
    p.add_argument("--out", default="", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def worker(args: argparse.Namespace) -> None:
    """One rank: alternate blocks of baseline and monitored steps; rank 0 writes timings."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from laggard.integrations.comm_timing import CommTimer, allreduce_timing_hook
    from laggard.integrations.demo_worker import (
        BUCKET_CAP_MB,
        ByteBatches,
        ByteLM,
        load_stdlib_text,
    )
    from laggard.integrations.monitor import TrainingMonitor
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    text = load_stdlib_text()
    arms = {}
    for name in ("baseline", "monitored"):
        torch.manual_seed(0)
        model = ByteLM()
        ddp = DistributedDataParallel(model, bucket_cap_mb=BUCKET_CAP_MB)
        monitor = None
        if name == "monitored":
            timer = CommTimer()
            ddp.register_comm_hook(timer, allreduce_timing_hook)
            monitor = TrainingMonitor(
                TrainingMonitor.Config(agent_address=args.sink, window_steps=args.window),
                comm_timer=timer)
        arms[name] = (ddp, torch.optim.AdamW(model.parameters(), lr=1e-3), monitor,
                      ByteBatches(text, batch_size=8, seq_len=64, seed=rank))

    def plain_step(ddp, opt, batches) -> None:
        x, y = batches.next()
        F.cross_entropy(ddp(x).flatten(0, 1), y.flatten()).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    def monitored_step(ddp, opt, batches, m) -> None:
        with m.step():
            with m.phase("data"):
                x, y = batches.next()
            with m.phase("forward"):
                loss = F.cross_entropy(ddp(x).flatten(0, 1), y.flatten())
            with m.phase("backward"):
                loss.backward()
            with m.phase("optimizer"):
                opt.step()
                opt.zero_grad(set_to_none=True)

    def step(name: str) -> float:
        ddp, opt, m, batches = arms[name]
        start = time.perf_counter()
        if m is None:
            plain_step(ddp, opt, batches)
        else:
            monitored_step(ddp, opt, batches, m)
        return time.perf_counter() - start

    times: dict[str, list[float]] = {"baseline": [], "monitored": []}
    for name in ("baseline", "monitored"):  # warm-up: DDP's bucket rebuild, allocator
        for _ in range(args.window):
            step(name)
    for block in range(2 * args.blocks):
        # ABBA: baseline, monitored, monitored, baseline, ...
        name = ("baseline", "monitored", "monitored", "baseline")[block % 4]
        times[name] += [step(name) for _ in range(args.block)]

    # The monitor's own cost per step, alone: its calls around no work (no window gather, so
    # no collective: rank 0 only).
    own = []
    if rank == 0:
        probe = TrainingMonitor(TrainingMonitor.Config(agent_address=args.sink, detect=False),
                                comm_timer=CommTimer())
        for _ in range(2000):
            start = time.perf_counter()
            with probe.step():
                for phase in ("data", "forward", "backward", "optimizer"):
                    with probe.phase(phase):
                        pass
            own.append(time.perf_counter() - start)
        probe.close()
        monitor = arms["monitored"][2]
        Path(args.out).write_text(json.dumps({
            "times": times, "own": own, "world_size": dist.get_world_size(),
            "records_sent": monitor.stats.records_sent, "windows": monitor.stats.windows,
            "send_errors": monitor.stats.send_errors,
        }))
    arms["monitored"][2].close()
    dist.barrier()
    dist.destroy_process_group()


def main() -> int:
    args = parse_args()
    if args.worker:
        worker(args)
        return 0
    sink = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sink.bind(("127.0.0.1", 0))
    sink.settimeout(0.2)
    received = [0]
    stop = threading.Event()

    def drain() -> None:  # an agent's intake stand-in: receive and count
        while not stop.is_set():
            try:
                sink.recv(65536)
                received[0] += 1
            except TimeoutError:
                pass

    drainer = threading.Thread(target=drain, daemon=True)
    drainer.start()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc_per_node", str(args.world_size), os.path.abspath(__file__), "--worker",
               "--blocks", str(args.blocks), "--block", str(args.block),
               "--window", str(args.window), "--sink", f"127.0.0.1:{sink.getsockname()[1]}",
               "--out", str(out)]
        proc = subprocess.run(cmd, env={**os.environ, "OMP_NUM_THREADS": "1"})
        stop.set()
        if proc.returncode != 0:
            print(f"benchmark job failed: exit status {proc.returncode}", file=sys.stderr)
            return 1
        result = json.loads(out.read_text())
    base = statistics.median(result["times"]["baseline"])
    mon = statistics.median(result["times"]["monitored"])
    own = statistics.median(result["own"])
    ratio = mon / base
    print(f"world size {result['world_size']}, {len(result['times']['baseline'])} steps per arm "
          f"in {args.blocks} interleaved blocks of {args.block}")
    print(f"baseline step (DDP all-reduce, no monitor): median {1e3 * base:.2f} ms")
    print(f"monitored step (timing hook + TrainingMonitor): median {1e3 * mon:.2f} ms")
    print(f"ratio monitored / baseline: {ratio:.4f} (overhead {100 * (ratio - 1):+.2f}%, "
          f"target < {100 * TARGET_OVERHEAD:.0f}%)")
    print(f"monitor's own cost per step (4 phases, record sent): median {1e6 * own:.1f} us = "
          f"{100 * own / base:.3f}% of the baseline step")
    print(f"records sent by rank 0: {result['records_sent']}, windows gathered: "
          f"{result['windows']}, send errors: {result['send_errors']}; datagrams received "
          f"by the sink from all ranks: {received[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
