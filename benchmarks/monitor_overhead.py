"""TrainingMonitor's overhead on the demo model's training step, measured in one run.

Launches a W-rank gloo job with PyTorch's launcher (``torch.distributed.run``). Every rank
builds the demo's byte-level transformer three times from the same seed and wraps each copy in DDP:

* baseline: DDP's built-in all-reduce, no monitor;
* hook: the timing all-reduce hook (CommTimer), no monitor;
* monitored: the timing hook and a TrainingMonitor timing four phases, sending one StepRecord
  per step to a UDP sink in this process and gathering a window every ``--window`` steps
  (straggler detector on rank 0).

The arms run in blocks of ``--block`` steps, in a rotating order (every permutation in turn, so
a drift in machine load falls on all), and the medians of their step times are compared: the
ratio monitored / baseline is the overhead, and the hook arm says how much of it is the
hook's. The CPU time of each step (``time.process_time``, all threads of the rank) is compared
the same way: other jobs on the machine stretch wall time far more than CPU time. The monitor's
own time per step is also measured directly, in the same run, by running its step/phase calls
around no work. Usage::

    python benchmarks/monitor_overhead.py [--world-size 2] [--blocks 24] [--block 20]

Target: overhead under 1% of the step.
"""

from __future__ import annotations

import argparse
import itertools
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
#: baseline: DDP's built-in all-reduce; hook: the timing all-reduce hook (CommTimer) alone;
#: monitored: the hook and a TrainingMonitor.
ARMS = ("baseline", "hook", "monitored")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--blocks", type=int, default=24, help="rounds (one block per arm each)")
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
    from torch.nn.parallel import DistributedDataParallel

    from laggard.demo.model import (
        BUCKET_CAP_MB,
        ByteBatches,
        ByteLM,
        load_stdlib_text,
    )
    from laggard.integrations.comm_timing import CommTimer, allreduce_timing_hook
    from laggard.integrations.monitor import TrainingMonitor

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    text = load_stdlib_text()
    arms = {}
    for name in ARMS:
        torch.manual_seed(0)
        model = ByteLM()
        ddp = DistributedDataParallel(model, bucket_cap_mb=BUCKET_CAP_MB)
        timer = monitor = None
        if name != "baseline":
            timer = CommTimer()
            ddp.register_comm_hook(timer, allreduce_timing_hook)
        if name == "monitored":
            monitor = TrainingMonitor(
                TrainingMonitor.Config(agent_address=args.sink, window_steps=args.window),
                comm_timer=timer)
        arms[name] = (ddp, torch.optim.AdamW(model.parameters(), lr=1e-3), timer, monitor,
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

    def step(name: str) -> tuple[float, float]:
        """One step of an arm: (wall seconds, CPU seconds of this process, all threads)."""
        ddp, opt, timer, m, batches = arms[name]
        start, start_cpu = time.perf_counter(), time.process_time()
        if m is not None:
            monitored_step(ddp, opt, batches, m)
        else:
            plain_step(ddp, opt, batches)
            if timer is not None:
                timer.take_step()
        return time.perf_counter() - start, time.process_time() - start_cpu

    times: dict[str, list[float]] = {name: [] for name in ARMS}
    cpu: dict[str, list[float]] = {name: [] for name in ARMS}
    for name in ARMS:  # warm-up: DDP's bucket rebuild, allocator
        for _ in range(args.window):
            step(name)
    orders = list(itertools.permutations(ARMS))  # every order in turn: drift falls on all arms
    for block in range(args.blocks):
        for name in orders[block % len(orders)]:
            for _ in range(args.block):
                wall, used = step(name)
                times[name].append(wall)
                cpu[name].append(used)

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
        monitor = arms["monitored"][3]
        Path(args.out).write_text(json.dumps({
            "times": times, "cpu": cpu, "own": own, "world_size": dist.get_world_size(),
            "records_sent": monitor.stats.records_sent, "windows": monitor.stats.windows,
            "send_errors": monitor.stats.send_errors,
        }))
    arms["monitored"][3].close()
    dist.barrier()
    dist.destroy_process_group()


def paired_ratios(arm: list[float], baseline: list[float], block: int) -> list[float]:
    """Ratio of block medians, arm over baseline, for each round."""
    return [statistics.median(arm[i:i + block]) / statistics.median(baseline[i:i + block])
            for i in range(0, len(baseline), block)]


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
    times = result["times"]
    base = statistics.median(times["baseline"])
    own = statistics.median(result["own"])
    print(f"world size {result['world_size']}, {len(times['baseline'])} steps per arm in "
          f"{args.blocks} rounds of {args.block}-step blocks, arms in rotating order")
    labels = {"baseline": "DDP built-in all-reduce, no monitor",
              "hook": "timing all-reduce hook (CommTimer), no monitor",
              "monitored": "timing hook + TrainingMonitor"}
    for name in ARMS:
        med, mean = statistics.median(times[name]), statistics.fmean(times[name])
        print(f"{name:>9} ({labels[name]}): median {1e3 * med:.2f} ms, mean {1e3 * mean:.2f} ms,"
              f" median ratio to baseline {med / base:.4f}")
    ratio = statistics.median(times["monitored"]) / base
    print(f"overhead (monitored / baseline, medians): {100 * (ratio - 1):+.2f}% "
          f"(target < {100 * TARGET_OVERHEAD:.0f}%)")
    cpu = result["cpu"]
    cpu_base = statistics.median(cpu["baseline"])
    print("CPU time per step (this process, all threads; less sensitive to other jobs): "
          + ", ".join(f"{name} {1e3 * statistics.median(cpu[name]):.2f} ms "
                      f"({statistics.median(cpu[name]) / cpu_base:.4f})" for name in ARMS))
    # Paired per round (the arms' blocks of one round ran back to back): the spread of these
    # ratios is the noise floor of this machine during the run.
    for name in ("hook", "monitored"):
        per_round = paired_ratios(times[name], times["baseline"], args.block)
        q1, q2, q3 = statistics.quantiles(per_round, n=4)
        print(f"per-round {name} / baseline block-median ratios: median {q2:.4f}, "
              f"quartiles {q1:.4f} .. {q3:.4f} ({len(per_round)} rounds)")
    print(f"monitor's own cost per step (4 phases, record sent): median {1e6 * own:.1f} us = "
          f"{100 * own / base:.3f}% of the baseline step")
    print(f"records sent by rank 0: {result['records_sent']}, windows gathered: "
          f"{result['windows']}, send errors: {result['send_errors']}; datagrams received "
          f"by the sink (all ranks, and the 2000 of the own-cost probe): {received[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
