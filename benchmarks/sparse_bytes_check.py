"""Top-k's bytes per rank in a real W-rank gloo job, against the model and the interface counter.

Run as root (a network namespace keeps the loopback counter to this job alone)::

    python benchmarks/sparse_bytes_check.py [--world-size 8] [--steps 5] [--algorithm auto]

W ranks (``torch.distributed.run`` inside a fresh network namespace whose only interface is
``lo``) each run the ``topk`` hook on a 25 MB bucket of random gradients (one DDP-sized bucket,
6 x 1024 x 1024 fp32). Printed: bytes per rank per step from (1) the model, the formula
``benchmarks/compression.py`` tabulates by world size (``alltoall + allgather`` of ``8 k_r``
bytes per peer for the sparse reduce-scatter, ``(W-1) 8k`` for the all-gather); (2) what the
hooks reported to their ``CommTimer``; (3) the namespace's ``lo`` transmit counter over the
measured steps divided by W and by the steps (every byte a rank sends crosses ``lo`` once;
the counter includes TCP/IP headers and gloo's own framing, and the few bytes of the barriers
around the measured steps).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

NAMESPACE = "laggard-bytes16"
LO = Path("/sys/class/net/lo/statistics/tx_bytes")


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    from laggard.compression import make_hook
    from laggard.compression.bucket import FlatBucket

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, w = dist.get_rank(), dist.get_world_size()
    params = [torch.nn.Parameter(torch.empty(1024, 1024)) for _ in range(6)]
    state, hook = make_hook("topk", algorithm=args.algorithm)
    generator = torch.Generator().manual_seed(rank)
    reported, before, after = [], 0, 0
    for step in range(2 + args.steps):
        if step == 2:
            dist.barrier()
            before = int(LO.read_text())
            state.timer.take_step()
            dist.barrier()
        bucket = FlatBucket(0, params, torch.randn(6 << 20, generator=generator))
        hook(state, bucket).wait()
        if step >= 2:
            reported.append(state.timer.take_step().bytes)
    dist.barrier()
    after = int(LO.read_text())
    state.close()
    gathered: list = [None] * w
    dist.all_gather_object(gathered, {"reported": reported, "lo": after - before,
                                      "algorithm": state.algorithm})
    if rank == 0:
        Path(args.out).write_text(json.dumps(gathered))
    dist.barrier()
    dist.destroy_process_group()


def model_bytes(w: int, algorithm: str, ratio: float = 0.01) -> int:
    """Bytes per rank per step for one bucket of ``6 << 20`` elements (the benchmark's model)."""
    from laggard.integrations.collective_bytes import allgather_bytes, alltoall_bytes

    n = 6 << 20
    k = max(1, math.ceil(ratio * n))
    if algorithm == "allgather":
        return allgather_bytes(8 * k, w)
    kr = min(-(-n // w), -(-k // w))
    return alltoall_bytes(8 * kr, w) + allgather_bytes(8 * kr, w)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--world-size", type=int, default=8)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--algorithm", default="auto")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", default="", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    if os.geteuid() != 0:
        print("needs root (a network namespace)", file=sys.stderr)
        return 2
    subprocess.run(["ip", "netns", "del", NAMESPACE], capture_output=True)
    subprocess.run(["ip", "netns", "add", NAMESPACE], check=True)
    try:
        subprocess.run(["ip", "netns", "exec", NAMESPACE, "ip", "link", "set", "lo", "up"],
                       check=True)
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "ranks.json"
            cmd = ["ip", "netns", "exec", NAMESPACE, sys.executable, "-m",
                   "torch.distributed.run", "--standalone", "--nproc_per_node",
                   str(args.world_size), __file__, "--worker", "--steps", str(args.steps),
                   "--algorithm", args.algorithm, "--out", str(out)]
            proc = subprocess.run(cmd, env={**os.environ, "OMP_NUM_THREADS": "1"},
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            if proc.returncode != 0:
                print(proc.stdout[-3000:], file=sys.stderr)
                return 1
            ranks = json.loads(out.read_text())
    finally:
        subprocess.run(["ip", "netns", "del", NAMESPACE], capture_output=True)
    w, steps = args.world_size, args.steps
    algorithm = ranks[0]["algorithm"]
    model = model_bytes(w, algorithm)
    reported = sum(sum(r["reported"]) for r in ranks) / (w * steps)
    wire = ranks[0]["lo"] / (w * steps)
    fp32 = 2 * (w - 1) * 4 * (6 << 20) // w
    print(f"topk ({algorithm}), W={w}, 25 MB bucket, {steps} steps; bytes per rank per step:")
    print(f"  model     {model:12,.0f}  ({fp32 / model:.1f}x fewer than an fp32 ring all-reduce)")
    print(f"  reported  {reported:12,.0f}  (reported / model = {reported / model:.4f})")
    print(f"  lo        {wire:12,.0f}  (interface / model = {wire / model:.4f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
