"""Gradient compression on the demo model: bytes, step time, loss parity, codec throughput.

One invocation measures, with the demo's byte-level transformer (``laggard.demo.model.ByteLM``, its
``load_stdlib_text`` data and ``BUCKET_CAP_MB`` DDP buckets, AdamW at the demo's 3e-3):

1. **Training, every arm in one job.** W gloo ranks (``torch.distributed.run``); each rank holds
   one DDP copy of the model per arm (DDP's built-in all-reduce, each compressor), all from the
   same seed and reading the same batches, trained in blocks of ``--block`` steps that rotate
   over the arms, so load that drifts on a shared machine falls on every arm alike. Per arm:
   bytes sent per rank per step and their ratio to an fp32 ring all-reduce (from the hook's
   CommTimer), step time against ``none``, collective / exposed / hidden time, and the mean loss
   of the last window against ``none``'s. ``none`` against the built-in all-reduce is the hook
   overhead (``--baselines builtin,torch-hook`` adds torch's own Python ``allreduce_hook``, to
   separate the cost of any Python hook from laggard's).
2. **Codec throughput** (``compression_codecs.py``), in this process on a one-rank gloo group:
   each whole hook on a bucket holding the model and on a 25 MB bucket (DDP's default), and the
   codecs alone on the 25 MB bucket at W=4 chunks, in CPU time against ``y.copy_(x)`` into a
   preallocated buffer, alternated in the same loop. With one rank the collectives move nothing.
3. **Bytes by world size**: per compressor, bytes per rank per step for W = 2 ... 64 on the
   model's real DDP buckets (captured after DDP's rebuild), from the payload tensors each
   algorithm builds; the W-rank column is checked against what the training run reported.
4. **A model of the step time at 1, 10 and 100 Gbit/s**: ``t(B) = (step - exposed) + bytes*8/B``,
   the measured step time without its exposed communication plus the measured bytes at link rate
   B, fully exposed (an upper bound: no overlap, no latency). A model, not a measurement: on
   loopback compression cannot show a speed-up (``benchmarks/cluster_compression.py`` runs on
   rate-limited links).

Usage::

    python benchmarks/compression.py [--world-size 4] [--steps 300] [--warmup 50]
        [--baselines builtin,torch-hook] [--markdown out.md]
        [--compressors none,topk:momentum,powersgd:momentum]   # NAME:momentum: momentum=True
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from compression_codecs import BUCKET_25MB, codec_only, codec_throughput  # noqa: E402

COMPRESSORS = ("none", "fp16", "sign", "topk", "powersgd", "onebit_adam")
RATES_GBIT = (1, 10, 100)
WORLD_SIZES = (2, 4, 8, 16, 32, 64)
#: Targets of issues 4 and 16.
LOSS_TOLERANCE = 0.03
MIN_CODEC_VS_COPY = 0.25
MIN_SIGN_VS_COPY = 0.5
MAX_NONE_OVERHEAD = 0.02


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--world-size", type=int, default=4, help="gloo ranks of the training job")
    p.add_argument("--steps", type=int, default=300, help="training steps per compressor")
    p.add_argument("--window", type=int, default=20, help="steps per statistics window")
    p.add_argument("--seed", type=int, default=0, help="model and data seed (every arm)")
    p.add_argument("--compressors", default=",".join(COMPRESSORS),
                   help="comma-separated arms: compressor names, or NAME:momentum / "
                        "NAME:rawmomentum for momentum=True with or without preconditioning")
    p.add_argument("--baselines", default="builtin",
                   help="arms without laggard: builtin (DDP's C++ all-reduce), torch-hook")
    p.add_argument("--block", type=int, default=10, help="steps per arm before rotating")
    p.add_argument("--topk-ratio", type=float, default=0.01, help="topk's ratio (k / N)")
    p.add_argument("--topk-algorithm", default="auto", choices=("auto", "allgather", "scatter"),
                   help="topk's exchange")
    p.add_argument("--powersgd-rank", type=int, default=4, help="PowerSGD's rank")
    p.add_argument("--codec-only", action="store_true",
                   help="only the codec throughput table, no training job: the whole hooks "
                        "of --compressors, then the codecs alone (always fp16, both sign "
                        "codecs and topk)")
    p.add_argument("--warmup", type=int, default=0,
                   help="plain all-reduce steps before compressing (warmup_steps)")
    p.add_argument("--reps", type=int, default=15, help="codec: timed calls per compressor")
    p.add_argument("--no-codec", action="store_true", help="skip the codec throughput part")
    p.add_argument("--markdown", default="", help="also write the tables to this file")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--arms", default="", help=argparse.SUPPRESS)
    p.add_argument("--out", default="", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def launch(module_args: list[str], world: int) -> None:
    """Run ``python -m torch.distributed.run`` on this machine; raise on failure."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           "--nproc_per_node", str(world), *module_args]
    proc = subprocess.run(cmd, env={**os.environ, "OMP_NUM_THREADS": "1"},
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stdout[-3000:]}")


# ------------------------------------------------------------- 1-2. training, interleaved
def worker(args: argparse.Namespace) -> None:
    """One rank: one DDP copy of the demo model per arm, trained in rotating blocks.

    Every arm starts from the same weights (seed) and reads the same batches (its own
    ``ByteBatches`` with the same seed), so the arms differ only by their communication hook.
    Blocks of ``--block`` steps go round the arms, the order rotating by one each round, so
    machine load that drifts during the run falls on every arm alike. Rank 0 writes each rank's
    per-arm statistics.
    """
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel

    from laggard.compression import make_hook
    from laggard.demo.model import (
        BUCKET_CAP_MB,
        ByteBatches,
        ByteLM,
        load_stdlib_text,
    )

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    text = load_stdlib_text()
    arms: dict[str, dict[str, Any]] = {}
    for name in args.arms.split(","):
        compressor, _, variant = name.partition(":")
        torch.manual_seed(args.seed)
        model = ByteLM()
        ddp = DistributedDataParallel(model, bucket_cap_mb=BUCKET_CAP_MB)
        state, opt = None, None
        if name == "torch-hook":  # torch's own Python all-reduce hook: the cost of any hook
            from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import (
                allreduce_hook,
            )

            ddp.register_comm_hook(None, allreduce_hook)
        elif name != "builtin":
            options: dict[str, Any] = {"warmup_steps": args.warmup}
            if name in ("none", "fp16"):
                options = {}
            elif compressor == "topk":
                options.update(ratio=args.topk_ratio, algorithm=args.topk_algorithm)
            elif compressor == "powersgd":
                options["rank"] = args.powersgd_rank
            elif name == "onebit_adam":  # brings its optimizer: AdamW for the warm-up
                options = {"warmup_steps": max(1, args.warmup), "lr": 3e-3}
            if variant in ("momentum", "rawmomentum"):  # 1-bit Adam's recipe, another codec
                options.update(momentum=True, warmup_steps=max(1, args.warmup), lr=3e-3,
                               preconditioned=variant == "momentum")
            state, hook = make_hook(compressor, model=model, **options)
            ddp.register_comm_hook(state, hook)
            opt = getattr(state, "optimizer", None)
        arms[name] = {"ddp": ddp, "state": state,
                      "opt": opt or torch.optim.AdamW(model.parameters(), lr=3e-3),
                      "batches": ByteBatches(text, 8, 64, seed=args.seed * 1000 + rank),
                      "step": [], "exposed": [], "collective": [], "bytes": [], "raw": [],
                      "loss": []}

    def step(arm: dict[str, Any]) -> None:
        x, y = arm["batches"].next()
        start = time.perf_counter()
        loss = F.cross_entropy(arm["ddp"](x).flatten(0, 1), y.flatten())
        loss.backward()
        arm["opt"].step()
        arm["opt"].zero_grad(set_to_none=True)
        arm["step"].append(time.perf_counter() - start)
        arm["loss"].append(loss.item())
        if arm["state"] is not None:
            comm = arm["state"].timer.take_step()
            arm["exposed"].append(comm.exposed_seconds)
            arm["collective"].append(comm.total_seconds)
            arm["bytes"].append(comm.bytes)
            arm["raw"].append(comm.raw_bytes)

    names = list(arms)
    for round_index in range(math.ceil(args.steps / args.block)):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            for _ in range(min(args.block, args.steps - round_index * args.block)):
                step(arms[name])
    skip = max(args.window, args.warmup)  # start-up, DDP's bucket rebuild, warm-up
    stats = {}
    for name, arm in arms.items():
        tail = arm["loss"][-args.window:]
        stats[name] = {
            "step": statistics.median(arm["step"][skip:]),
            "exposed": statistics.median(arm["exposed"][skip:]) if arm["exposed"] else 0.0,
            "collective": (statistics.median(arm["collective"][skip:])
                           if arm["collective"] else 0.0),
            "bytes": statistics.median(arm["bytes"][skip:]) if arm["bytes"] else 0,
            "raw": statistics.median(arm["raw"][skip:]) if arm["raw"] else 0,
            "loss": sum(tail) / len(tail),
            "first_loss": arm["loss"][0],
        }
        if arm["state"] is not None:
            arm["state"].close()
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, stats)
    if rank == 0:
        Path(args.out).write_text(json.dumps(gathered))
    dist.barrier()
    dist.destroy_process_group()


def interleaved(args: argparse.Namespace, arms: list[str], tmp: Path) -> dict[str, dict]:
    """Run the worker job; per arm, the median over ranks of each statistic (loss: mean)."""
    out = tmp / "runs.json"
    launch([__file__, "--worker", "--arms", ",".join(arms), "--steps", str(args.steps),
            "--block", str(args.block), "--window", str(args.window), "--seed", str(args.seed),
            "--warmup", str(args.warmup), "--topk-ratio", str(args.topk_ratio),
            "--topk-algorithm", args.topk_algorithm,
            "--powersgd-rank", str(args.powersgd_rank), "--out", str(out)], args.world_size)
    ranks = json.loads(out.read_text())
    return {arm: {key: (statistics.mean if key in ("loss", "first_loss") else statistics.median)(
                      r[arm][key] for r in ranks) for key in ranks[0][arm]}
            for arm in arms}


# ---------------------------------------------------------- 3-4. in-process: codec, bytes
def one_rank_group() -> None:
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)


def demo_buckets() -> list[list[Any]]:
    """The demo model's DDP buckets after the rebuild (parameters per bucket, in order)."""
    import torch
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel

    from laggard.demo.model import BUCKET_CAP_MB, ByteBatches, ByteLM

    torch.manual_seed(0)
    ddp = DistributedDataParallel(ByteLM(), bucket_cap_mb=BUCKET_CAP_MB)
    seen: dict[int, list[Any]] = {}

    def record(state: None, bucket):  # type: ignore[no-untyped-def]
        seen[bucket.index()] = list(bucket.parameters())
        fut: torch.futures.Future = torch.futures.Future()
        fut.set_result(bucket.buffer())
        return fut

    ddp.register_comm_hook(None, record)
    text = torch.randint(0, 256, (10_000,), dtype=torch.uint8)
    batches = ByteBatches(text, 2, 64, seed=0)
    for _ in range(2):  # iteration 0, then the rebuilt buckets
        seen.clear()
        x, y = batches.next()
        F.cross_entropy(ddp(x).flatten(0, 1), y.flatten()).backward()
    return [seen[i] for i in sorted(seen)]


def bytes_by_world_size(buckets: list[list[Any]], ratio: float, rank: int) -> dict[str, dict]:
    """Bytes per rank per step, per compressor and world size, from the real payload sizes."""
    import torch

    from laggard.compression import make_hook
    from laggard.compression.bucket import FlatBucket
    from laggard.compression.residuals import BucketLayout
    from laggard.compression.signcodec import chunk_elements, chunk_lengths, compress_rows
    from laggard.integrations.collective_bytes import (
        allgather_bytes,
        alltoall_bytes,
        ring_allreduce_bytes,
    )

    powersgd, _ = make_hook("powersgd", rank=rank)
    plans = [powersgd.plan(i, BucketLayout.of(FlatBucket(i, params)))
             for i, params in enumerate(buckets)]
    powersgd.close()
    names = [*COMPRESSORS, "topk (all-gather)"]
    table: dict[str, dict] = {name: {} for name in names}
    for w in WORLD_SIZES:
        totals = dict.fromkeys(names, 0)
        for params, plan in zip(buckets, plans, strict=True):
            n = sum(p.numel() for p in params)
            totals["none"] += ring_allreduce_bytes(4 * n, w)
            totals["fp16"] += ring_allreduce_bytes(2 * n, w)
            c = chunk_elements(n, w)
            row = compress_rows(torch.zeros(w, c), chunk_lengths(n, w))[0]  # one chunk's payload
            totals["sign"] += alltoall_bytes(row.numel(), w) + allgather_bytes(row.numel(), w)
            k = max(1, math.ceil(ratio * n))
            gathered = allgather_bytes(torch.empty(2 * k, dtype=torch.int32).numel() * 4, w)
            totals["topk (all-gather)"] += gathered
            # the sparse reduce-scatter: k_r entries per region, W regions of ceil(n / W)
            kr = min(-(-n // w), -(-k // w))
            scattered = alltoall_bytes(8 * kr, w) + allgather_bytes(8 * kr, w)
            totals["topk"] += gathered if w <= 2 else scattered  # algorithm="auto"
            totals["powersgd"] += (ring_allreduce_bytes(4 * plan.stage1, w)
                                   + ring_allreduce_bytes(4 * plan.stage2, w))
        totals["onebit_adam"] = onebit_bytes(sum(sum(p.numel() for p in b) for b in buckets), w)
        for name in names:
            table[name][w] = totals[name]
    return table


def onebit_bytes(numel: int, w: int) -> int:
    """1-bit Adam's bytes per rank per compressed step: the whole model's momentum as one flat
    vector in the two-stage compressed all-reduce, from the payload its codec builds."""
    import torch

    from laggard.compression.signcodec import chunk_elements, chunk_lengths, encode_rows
    from laggard.integrations.collective_bytes import allgather_bytes, alltoall_bytes

    c = chunk_elements(numel, w)
    row = encode_rows(torch.zeros(1, c), chunk_lengths(numel, w)[:1])[0][0]
    return alltoall_bytes(row.numel(), w) + allgather_bytes(row.numel(), w)


# ------------------------------------------------------------------------------- report
def codec_table(codec: list[dict]) -> list[str]:
    """The codec throughput table's lines, with the load average it ran under."""
    out = ["### Codec throughput (one rank, one thread; CPU time of hook or codec vs "
           f"`y.copy_(x)`, alternated; load average {os.getloadavg()[0]:.1f})", "",
           "| bucket | compressor | ms | GB/s | copy GB/s | throughput / copy |",
           "|---|---|---|---|---|---|"]
    for row in codec:
        rate, copy = row["bytes"] / row["hook"] / 1e9, row["bytes"] / row["copy"] / 1e9
        out.append(f"| {row['bucket']} | {row['compressor']} | {1e3 * row['hook']:.2f} | "
                   f"{rate:.2f} | {copy:.2f} | {rate / copy:.2f} |")
    verdicts = []
    for label, target in (("sign (1-bit Adam codec)", MIN_SIGN_VS_COPY),
                          ("topk", MIN_CODEC_VS_COPY)):
        ratios = [row["copy"] / row["hook"] for row in codec
                  if row["compressor"] == label and "codec only" in row["bucket"]]
        if ratios:
            verdicts.append(f"{label} codec / copy = {ratios[0]:.2f}, target >= {target}: "
                            f"{'met' if ratios[0] >= target else 'MISSED'}")
    return out + ["", "Rows 'whole hook' time the DDP hook on a one-rank group (collectives move "
                  "nothing); rows 'codec only' the encode and decode alone. "
                  + "; ".join(verdicts) + "."]


def report(args: argparse.Namespace, runs: dict[str, dict], codec: list[dict],
           by_world: dict[str, dict], n_buckets: int) -> str:
    w = args.world_size
    base, builtin, torch_hook = runs.get("none"), runs.get("builtin"), runs.get("torch-hook")
    out = [f"### Training: {w} ranks (gloo, loopback), {args.steps} steps per arm, blocks of "
           f"{args.block} rotating over the arms in one job, seed {args.seed}, warm-up "
           f"{args.warmup} steps, top-k ratio {args.topk_ratio:g}, PowerSGD rank "
           f"{args.powersgd_rank}; medians per step after step {max(args.window, args.warmup)}",
           "",
           "| arm | bytes/rank/step | vs fp32 all-reduce | step ms | step vs none | "
           "collective ms | exposed ms | hidden | loss (mean of last "
           f"{args.window}) | loss vs none |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in runs.items():
        ratio = f"{r['raw'] / r['bytes']:.1f}x" if r["bytes"] else "-"
        hidden = f"{1 - r['exposed'] / r['collective']:.0%}" if r["collective"] else "-"
        vs_none = f"{r['step'] / base['step']:.3f}" if base else "-"
        loss_vs = f"{r['loss'] / base['loss'] - 1:+.1%}" if base else "-"
        label = {"builtin": "DDP built-in (no hook)",
                 "torch-hook": "torch `allreduce_hook` (Python hook, untimed)"}.get(name, name)
        out.append(f"| {label} | {r['bytes']:,.0f} | {ratio} | {1e3 * r['step']:.1f} | "
                   f"{vs_none} | {1e3 * r['collective']:.1f} | {1e3 * r['exposed']:.1f} | "
                   f"{hidden} | {r['loss']:.4f} | {loss_vs} |")
    notes = [f"Loss target: every compressor within {LOSS_TOLERANCE:.0%} of `none`."]
    if base and builtin:
        notes.append(f"Hook overhead: `none` / DDP built-in step time = "
                     f"{base['step'] / builtin['step']:.3f} (target <= "
                     f"{1 + MAX_NONE_OVERHEAD:.2f}).")
    if torch_hook and builtin:
        notes.append(f"torch's own `allreduce_hook` / DDP built-in = "
                     f"{torch_hook['step'] / builtin['step']:.3f}.")
    out += ["", " ".join(notes), "", *codec_table(codec), "",
            f"### Bytes per rank per step by world size (demo model, {n_buckets} DDP buckets; "
            "fp32 ring all-reduce = 1x)", "",
            "| compressor | " + " | ".join(f"W={x}" for x in WORLD_SIZES) + " |",
            "|---|" + "---|" * len(WORLD_SIZES)]
    for name in by_world:
        cells = [f"{b:,} ({by_world['none'][x] / b:.1f}x)" for x, b in by_world[name].items()]
        out.append(f"| {name} | " + " | ".join(cells) + " |")
    checked = [f"{name}: {'matches' if runs[name]['bytes'] == by_world[name].get(w) else 'DIFFERS'}"
               f" ({runs[name]['bytes']:,.0f} measured)" for name in runs
               if name in COMPRESSORS and w in WORLD_SIZES]
    out += ["", f"W={w} against the training runs' reported bytes: " + "; ".join(checked), "",
            "### Model (not a measurement): step time at link rate B, "
            "t(B) = (step - exposed) + bytes * 8 / B", "",
            "| compressor | " + " | ".join(f"{b} Gbit/s ms (vs none)" for b in RATES_GBIT)
            + " |", "|---|" + "---|" * len(RATES_GBIT)]
    modeled = {name: [r["step"] - r["exposed"] + r["bytes"] * 8 / (b * 1e9) for b in RATES_GBIT]
               for name, r in runs.items() if name in COMPRESSORS}
    for name, times in modeled.items():
        cells = [f"{1e3 * t:.1f} ({modeled['none'][i] / t:.2f}x)" if "none" in modeled
                 else f"{1e3 * t:.1f}" for i, t in enumerate(times)]
        out.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    names = [n for n in args.compressors.split(",") if n]
    unknown = {n.split(":")[0] for n in names} - set(COMPRESSORS)
    if unknown:
        print(f"unknown compressors: {', '.join(sorted(unknown))}", file=sys.stderr)
        return 2
    if args.codec_only:
        one_rank_group()
        codec = codec_throughput([n for n in names if ":" not in n], args.reps)
        print("\n".join(codec_table(codec + codec_only(BUCKET_25MB, args.reps))))
        return 0
    arms = [*filter(None, args.baselines.split(",")), *names]
    print(f"training {', '.join(arms)}, interleaved ...", file=sys.stderr, flush=True)
    with tempfile.TemporaryDirectory(prefix="laggard-compression-") as tmp:
        runs = interleaved(args, arms, Path(tmp))
    print("codec throughput and bytes by world size ...", file=sys.stderr, flush=True)
    one_rank_group()
    codec = [] if args.no_codec else (
        codec_throughput([n for n in names if ":" not in n], args.reps)
        + codec_only(BUCKET_25MB, args.reps))
    buckets = demo_buckets()
    by_world = bytes_by_world_size(buckets, args.topk_ratio, args.powersgd_rank)
    text = report(args, runs, codec, by_world, len(buckets))
    print(text)
    if args.markdown:
        Path(args.markdown).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
