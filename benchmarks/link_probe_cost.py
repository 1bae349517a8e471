"""The link probe's cost per window on the gloo path: wall and CPU time of one ``LinkProbe.run()``.

Launches a W-rank gloo job on this host with PyTorch's launcher; each rank builds the probe the
monitor builds (``laggard.integrations.link_probe.LinkProbe``, 256 KiB by default, best of
``REPEATS``) over the default gloo group and calls ``run()`` once per "window", ``--windows``
times after ``--warmup``, as the monitor does once per window. Reported per rank: the median and
90th percentile of the training thread's wall time inside ``run()`` (what a window pays) and its
CPU time, and the probe's own round trip. The NCCL path (events on a CUDA tensor over the
default group) needs GPUs and is not run here.

Usage::

    python benchmarks/link_probe_cost.py [--world-size 3] [--windows 50] [--bytes 262144]
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


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--world-size", type=int, default=3)
    p.add_argument("--windows", type=int, default=50)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--bytes", type=int, default=256 << 10)
    p.add_argument("--worker", metavar="OUT", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def worker(args: argparse.Namespace) -> None:
    import torch.distributed as dist

    from laggard.integrations.link_probe import LinkProbe

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    probe = LinkProbe(None, rank, world, args.bytes)
    for _ in range(args.warmup):
        probe.run()
    walls, cpus, trips = [], [], []
    for _ in range(args.windows):
        dist.barrier()  # windows start together, as after the monitor's gather
        w0, c0 = time.perf_counter(), time.thread_time()
        trips.append(probe.run())
        walls.append(time.perf_counter() - w0)
        cpus.append(time.thread_time() - c0)
    out = {"rank": rank, "wall_ms": _stats(walls), "cpu_ms": _stats(cpus),
           "round_trip_ms": _stats(trips)}
    Path(args.worker, f"rank{rank}.json").write_text(json.dumps(out))
    dist.destroy_process_group()


def _stats(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {"median": 1e3 * statistics.median(ordered),
            "p90": 1e3 * ordered[int(0.9 * (len(ordered) - 1))]}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    with tempfile.TemporaryDirectory() as out:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc_per_node", str(args.world_size), __file__, "--worker", out,
               "--windows", str(args.windows), "--warmup", str(args.warmup),
               "--bytes", str(args.bytes)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                              env={**os.environ, "OMP_NUM_THREADS": "1"})
        if proc.returncode != 0:
            print(proc.stderr[-3000:], file=sys.stderr)
            return 1
        ranks = [json.loads(Path(out, f"rank{r}.json").read_text())
                 for r in range(args.world_size)]
    load = os.getloadavg()[0]
    print(f"link probe, gloo, {args.world_size} ranks on one host, {args.bytes} B, "
          f"{args.windows} windows, load {load:.1f}")
    print("| rank | wall per window, median (p90) ms | CPU per window, median (p90) ms "
          "| round trip kept, median ms |")
    print("|---|---|---|---|")
    for r in ranks:
        print(f"| {r['rank']} | {r['wall_ms']['median']:.2f} ({r['wall_ms']['p90']:.2f}) | "
              f"{r['cpu_ms']['median']:.2f} ({r['cpu_ms']['p90']:.2f}) | "
              f"{r['round_trip_ms']['median']:.2f} |")
    print(json.dumps(ranks))
    return 0


if __name__ == "__main__":
    sys.exit(main())
