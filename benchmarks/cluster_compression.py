"""Gradient compression across emulated nodes: step time against the uncompressed all-reduce on
1 and 10 Gbit/s links, and the bytes each link carried against the hooks' own accounting.

Run as root (network namespaces)::

    python benchmarks/cluster_compression.py                  # 2 nodes x 1 rank, both rates
    python benchmarks/cluster_compression.py --rates 1gbit --compressors none,sign

For each link rate it builds an :class:`~laggard.demo.netns.EmulatedCluster`, then for each
compressor launches one job across the nodes (``torch.distributed.run`` on gloo, one rank per
node, so each rank's traffic is exactly its node's link): the demo's byte-level transformer
(``laggard.demo.model.ByteLM``) at a width where the gradient all-reduce dominates the step at
1 Gbit/s, the same seed and data for every compressor. Each rank times ``--steps`` steps after
``--warmup``, reads its own ``eth0`` transmit counter before and after them (``/sys`` inside its
namespace), and sums the bytes its hook said it sent (``CommTimer``). Printed per compressor:
median step time, speed-up over ``none`` in the same cluster, mean loss of the last steps
against ``none``'s, and link bytes against hook bytes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

COMPRESSORS = ("none", "fp16", "sign", "topk", "powersgd", "onebit_adam")
MASTER_PORT = 29511


# ------------------------------------------------------------------------------ worker side
def worker(args: argparse.Namespace) -> int:
    """One rank: train, time, count bytes; rank r writes ``{out}/rank{r}.json``."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel

    from laggard.compression import make_hook
    from laggard.demo.model import ByteBatches, ByteLM, load_stdlib_text
    from laggard.integrations.comm_timing import CommTimer

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = ByteLM(dim=args.dim, heads=4, layers=args.layers, seq_len=64)
    batches = ByteBatches(load_stdlib_text(), batch_size=args.batch, seq_len=args.seq, seed=rank)
    ddp = DistributedDataParallel(model, bucket_cap_mb=25)
    timer = CommTimer()
    # 1-bit Adam brings its optimizer; its AdamW warm-up is the job's untimed warm-up
    options = {"warmup_steps": args.warmup, "lr": 1e-3} if args.compressor == "onebit_adam" \
        else {}
    state, hook = make_hook(args.compressor, model=model, timer=timer, **options)
    ddp.register_comm_hook(state, hook)
    optimizer = getattr(state, "optimizer", None) or torch.optim.AdamW(model.parameters(),
                                                                        lr=1e-3)
    tx = Path("/sys/class/net/eth0/statistics/tx_bytes")
    step_seconds, losses, hook_bytes, raw_bytes = [], [], 0, 0
    for step in range(args.warmup + args.steps):
        if step == args.warmup:
            dist.barrier()
            tx_before = int(tx.read_text())
        x, y = batches.next()
        start = time.perf_counter()
        loss = F.cross_entropy(ddp(x).flatten(0, 1), y.flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        elapsed = time.perf_counter() - start
        comm = timer.take_step()
        if step >= args.warmup:
            step_seconds.append(elapsed)
            losses.append(loss.item())
            hook_bytes += comm.bytes
            raw_bytes += comm.raw_bytes
    tx_after = int(tx.read_text())  # before the barrier below: only the measured steps' bytes
    dist.barrier()
    state.close()
    dist.barrier()
    dist.destroy_process_group()
    doc = {"rank": rank, "step_seconds": step_seconds, "losses": losses,
           "hook_bytes": hook_bytes, "raw_bytes": raw_bytes,
           "link_tx_bytes": tx_after - tx_before,
           "params": sum(p.numel() for p in model.parameters())}
    Path(args.out, f"rank{rank}.json").write_text(json.dumps(doc))
    return 0


# ------------------------------------------------------------------------------ CPU model
def cpu_model(args: argparse.Namespace, compressors: list[str], rate_bps: float) -> None:
    """Model, not a measurement: the step at ``rate_bps`` if every rank had a core to itself.

    One process, a one-rank gloo group (the collectives move nothing): per compressor, the median
    *CPU time* of the process per step (forward, backward, the hook's codec on both stages, the
    optimizer; ``time.process_time``, so time spent waiting for a core on a shared machine is
    not counted), plus the bytes one rank of a ``--nodes``-rank job sends per step (the hooks'
    formulas for that world size) at the link rate, fully exposed.
    """
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel

    from laggard.compression import make_hook
    from laggard.demo.model import ByteBatches, ByteLM, load_stdlib_text

    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    w = args.nodes
    print(f"\n# model: CPU time per step (one process, one thread) + bytes of a {w}-rank job "
          f"at {rate_bps / 1e9:g} Gbit/s; load average {os.getloadavg()[0]:.1f}")
    print("| compressor | CPU ms / step | bytes / rank / step | modelled step ms | vs none |")
    print("|---|---:|---:|---:|---:|")
    base = None
    for name in compressors:
        torch.manual_seed(0)
        model = ByteLM(dim=args.dim, heads=4, layers=args.layers, seq_len=64)
        ddp = DistributedDataParallel(model, bucket_cap_mb=25)
        options = {"warmup_steps": 1, "lr": 1e-3} if name == "onebit_adam" else {}
        state, hook = make_hook(name, model=model, **options)
        sizes: dict[int, int] = {}  # bucket index -> elements, as DDP cut them

        def recording(state, bucket, hook=hook, sizes=sizes):  # type: ignore[no-untyped-def]
            sizes[bucket.index()] = bucket.buffer().numel()
            return hook(state, bucket)

        ddp.register_comm_hook(state, recording)
        optimizer = getattr(state, "optimizer", None) or torch.optim.AdamW(model.parameters(),
                                                                            lr=1e-3)
        batches = ByteBatches(load_stdlib_text(), batch_size=args.batch, seq_len=args.seq,
                              seed=0)
        seconds = []
        for step in range(args.warmup + args.steps):
            x, y = batches.next()
            start = time.process_time()
            F.cross_entropy(ddp(x).flatten(0, 1), y.flatten()).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if step >= args.warmup:
                seconds.append(time.process_time() - start)
        state.close()
        sent = wire_bytes(name, list(sizes.values()), w)
        modelled = statistics.median(seconds) + sent * 8 / rate_bps
        base = base or modelled
        print(f"| {name} | {1e3 * statistics.median(seconds):.1f} | {sent:,} | "
              f"{1e3 * modelled:.1f} | {base / modelled:.2f}x |", flush=True)
    dist.destroy_process_group()


def wire_bytes(name: str, buckets: list[int], w: int) -> int:
    """Bytes one rank of a ``w``-rank job sends per step, for buckets of these sizes (the
    formulas the hooks report with; ``topk`` as ``auto`` picks, ratio 1%)."""
    import math

    from laggard.integrations.collective_bytes import (
        allgather_bytes,
        alltoall_bytes,
        ring_allreduce_bytes,
    )

    if name == "none":
        return sum(ring_allreduce_bytes(4 * n, w) for n in buckets)
    if name in ("onebit_adam", "sign"):  # 1-bit Adam: the whole model as one vector
        chunks = [sum(buckets)] if name == "onebit_adam" else buckets
        rows = [8 * math.ceil(n / (8 * w)) // 8 + 8 for n in chunks]
        return sum(alltoall_bytes(r, w) + allgather_bytes(r, w) for r in rows)
    if name == "topk":
        total = 0
        for n in buckets:
            k = max(1, math.ceil(0.01 * n))
            kr = min(-(-n // w), -(-k // w))
            total += allgather_bytes(8 * k, w) if w <= 2 else 2 * alltoall_bytes(8 * kr, w)
        return total
    raise ValueError(f"no byte model for {name!r} here")


# ------------------------------------------------------------------------- orchestrator side
def run_job(cluster, compressor: str, args: argparse.Namespace, out: Path) -> list[dict]:  # type: ignore[no-untyped-def]
    """One job across every node of ``cluster``; the per-rank result documents."""
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "eth0",
           "TORCH_CPP_LOG_LEVEL": "ERROR", "LOGLEVEL": "WARNING"}
    procs = []
    for node in cluster.nodes:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes",
               str(len(cluster.nodes)), "--node_rank", str(node.index), "--nproc_per_node", "1",
               "--master_addr", cluster.nodes[0].address, "--master_port", str(MASTER_PORT),
               "--max_restarts", "0", __file__, "--worker", "--compressor", compressor,
               "--out", str(out), "--dim", str(args.dim), "--layers", str(args.layers),
               "--batch", str(args.batch), "--seq", str(args.seq), "--steps", str(args.steps),
               "--warmup", str(args.warmup)]
        log = open(out / f"{node.name}.log", "w")  # noqa: SIM115 - closed below
        procs.append((cluster.popen(node, cmd, stdout=log, stderr=subprocess.STDOUT, env=env),
                      log, node))
    deadline = time.monotonic() + args.job_timeout
    for proc, log, node in procs:
        try:
            code = proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            code = None
        log.close()
        if code != 0:
            tail = (out / f"{node.name}.log").read_text()[-1500:]
            raise RuntimeError(f"{compressor}: job on {node.name} ended {code}:\n{tail}")
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(len(procs))]


def summarize(docs: list[dict], tail: int) -> dict:
    steps = [statistics.median(d["step_seconds"]) for d in docs]
    return {
        # The job moves at its slowest rank's pace: take the slowest rank's median.
        "step_s": max(steps),
        "loss": statistics.mean(statistics.mean(d["losses"][-tail:]) for d in docs),
        "hook_bytes": sum(d["hook_bytes"] for d in docs),
        "raw_bytes": sum(d["raw_bytes"] for d in docs),
        "link_bytes": sum(d["link_tx_bytes"] for d in docs),
        "params": docs[0]["params"],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--compressor", default="none", help=argparse.SUPPRESS)
    p.add_argument("--out", default="", help=argparse.SUPPRESS)
    p.add_argument("--nodes", type=int, default=2)
    p.add_argument("--rates", default="1gbit,10gbit")
    p.add_argument("--compressors", default=",".join(COMPRESSORS))
    p.add_argument("--dim", type=int, default=384, help="model width (default 384: ~7.3 M "
                                                        "parameters, 29 MB of fp32 gradients)")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--seq", type=int, default=16, help="tokens per sequence (at most 64); few "
                   "tokens keep compute small beside the all-reduce, as in a comm-bound job")
    p.add_argument("--steps", type=int, default=20, help="measured steps per job")
    p.add_argument("--warmup", type=int, default=4)
    p.add_argument("--loss-tail", type=int, default=10, help="last steps averaged for the loss")
    p.add_argument("--job-timeout", type=float, default=240.0)
    p.add_argument("--cpu-model", action="store_true",
                   help="instead: the CPU-time model of the step (no root, no namespaces)")
    args = p.parse_args(argv)
    if args.worker:
        return worker(args)
    if args.cpu_model:
        from laggard.demo.cluster import parse_rate

        cpu_model(args, [c for c in args.compressors.split(",") if c],
                  parse_rate(args.rates.split(",")[0]))
        return 0

    import tempfile

    from laggard.demo.cluster import parse_rate
    from laggard.demo.netns import EmulatedCluster, LinkShape, NamespaceError

    rates = [parse_rate(r) for r in args.rates.split(",")]
    compressors = [c for c in args.compressors.split(",") if c]
    if compressors[0] != "none":
        compressors.insert(0, "none")  # the baseline, measured in the same cluster
    print(f"# {args.nodes} nodes x 1 rank, ByteLM dim {args.dim} x {args.layers} layers, batch "
          f"{args.batch} x {args.seq} tokens, {args.steps} measured steps after {args.warmup}; "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print("| link | compressor | step ms | speed-up vs none | loss (vs none) | hook MB | "
          "link MB | link / hook | load average (1 min) |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    try:
        with tempfile.TemporaryDirectory(prefix="laggard-bench-") as tmp:
            for rate in rates:
                with EmulatedCluster(args.nodes, LinkShape(rate_bps=rate)) as cluster:
                    link = cluster.link.describe()
                    if cluster.shapes[cluster.nodes[0].name].not_applied:
                        link += " (no delay: no netem)"
                    base = None
                    for name in compressors:
                        s = summarize(run_job(cluster, name, args, Path(tmp, f"{rate}-{name}")),
                                      args.loss_tail)
                        base = base or s
                        print(f"| {link} | {name} | {1e3 * s['step_s']:.1f} | "
                              f"{base['step_s'] / s['step_s']:.2f}x | {s['loss']:.3f} "
                              f"({100 * (s['loss'] / base['loss'] - 1):+.1f}%) | "
                              f"{s['hook_bytes'] / 1e6:.1f} | {s['link_bytes'] / 1e6:.1f} | "
                              f"{s['link_bytes'] / max(1, s['hook_bytes']):.3f} | "
                              f"{os.getloadavg()[0]:.1f} |", flush=True)
    except NamespaceError as exc:
        print(f"cluster_compression: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
