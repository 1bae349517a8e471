"""Gradient-integrity benchmark: detection matrix, false positives, fingerprint throughput, step
overhead. ``python benchmarks/integrity.py [--trials 1000] [--clean-steps 10000] [--parts ...]``.

Everything runs on **real gradients of the demo model** (``laggard demo``'s ByteLM on standard-
library bytes), computed for ``W = 4`` simulated ranks (each its own batches, the model trained a
few steps between gradient sets), in one process, through the same functions the hooks call
(:mod:`laggard.integrations.integrity`) and the same detector every rank runs. The all-reduce is
simulated as the network does it: element-wise sums of the ``W`` payloads in float32, in a random
order per element (gloo and NCCL rings reduce each chunk starting from a different rank).

1. **Detection matrix**: per float32 bit position (0-22 mantissa, 23-30 exponent, 31 sign) and
   per ``where``, ``--trials`` random flips (random gradient set, bucket, rank, element):
   ``after_reduce`` (one rank's reduced bucket), ``param`` (one rank's parameters), ``before_send``
   on the uncompressed all-reduce (the float64 sum check), on ``topk`` (int32 payload of values
   and indices through an all-gather: every bit of the int32 words) and on ``sign`` (uint8 packed
   signs and float64 scales through the all-to-all: bits 0-7 of each byte). A trial counts as
   detected when the detector reports corruption *and* names the flipped rank where the target
   requires it. bfloat16 is not used by the demo model, so it has no row.
   A second cell forces the flips that turn a float32 into Inf or NaN (bit 30 of a value in
   [1, 2)), which real gradients of the demo almost never offer at random.
2. **False positives**: ``--clean-steps`` steps of every bucket's records, reduction orders
   redrawn each step, through the detector; any finding is a false positive.
3. **Throughput**: :func:`fingerprint` and the full per-bucket record (hash, float64 sums, NaN/Inf)
   against ``dst.copy_(src)`` of the same buffer, in the same run.
4. **Step overhead**: demo-model training steps under DDP on 4 gloo ranks with the ``none``
   hook, with and without every integrity check, alternating blocks on the same ranks.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from laggard.compression.signcodec import chunk_elements, chunk_lengths, compress_rows
from laggard.demo.model import ByteBatches, ByteLM, load_stdlib_text
from laggard.detectors.integrity import (
    OPS,
    RECORD_WORDS,
    IntegrityDetector,
    bits_of,
    chunk_sums,
    encode_window,
    sum_tolerance,
)
from laggard.integrations.faults import flip_bit
from laggard.integrations.integrity import GradientIntegrity
from laggard.integrations.integrity_fingerprints import (
    fingerprint,
    float64_sums,
    nonfinite_counts,
    row_fingerprints,
)

W = 4
BUCKET_ELEMENTS = 65536  # the demo's 0.25 MB buckets
U32 = 2.0**-24


@dataclass
class GradientSet:
    """One step's per-rank payloads (already divided by W), split into buckets."""

    payloads: list[torch.Tensor]  # per bucket: (W, n) float32
    sent: list[list[tuple[float, float]]]  # per bucket, per rank: (sum, abs sum)


def gradient_sets(count: int, seed: int = 0) -> tuple[list[GradientSet], ByteLM]:
    torch.manual_seed(seed)
    model = ByteLM()
    text = load_stdlib_text(1 << 20)
    batches = [ByteBatches(text, 8, 64, seed=1000 + r) for r in range(W)]
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    sets = []
    for _ in range(count):
        grads = []
        for r in range(W):
            model.zero_grad()
            x, y = batches[r].next()
            F.cross_entropy(model(x).flatten(0, 1), y.flatten()).backward()
            grads.append(torch.cat([p.grad.reshape(-1) for p in model.parameters()]) / W)
        stacked = torch.stack(grads)
        payloads = list(stacked.split(BUCKET_ELEMENTS, dim=1))
        payloads = [p.contiguous() for p in payloads]
        sent = [[float64_sums(p[r]) for r in range(W)] for p in payloads]
        sets.append(GradientSet(payloads, sent))
        model.zero_grad()
        for p in model.parameters():  # a real update, so the sets differ like training steps
            p.grad = stacked.sum(0)[_offset(model, p):_offset(model, p) + p.numel()].view_as(p)
        opt.step()
    return sets, model


def _offset(model: torch.nn.Module, param: torch.Tensor) -> int:
    offset = 0
    for p in model.parameters():
        if p is param:
            return offset
        offset += p.numel()
    raise KeyError


def reduce_random_order(payloads: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Float32 element-wise sum of the W rows, each element in its own random order."""
    order = torch.rand(payloads.shape, generator=generator).argsort(dim=0)
    terms = payloads.gather(0, order)
    out = terms[0].clone()
    for r in range(1, W):
        out += terms[r]
    return out


def record(op: str, bucket: int, numel: int, **f: int) -> list[int]:
    from laggard.detectors.integrity import RECORD_FIELDS

    row = [0] * RECORD_WORDS
    row[1], row[3], row[4], row[5] = bucket, OPS[op], 1, numel
    for name, value in f.items():
        row[RECORD_FIELDS.index(name)] = value
    return row


def check(rows_per_rank: list[list[list[int]]]) -> list:
    windows = [encode_window(r, W, rows, 8) for r, rows in enumerate(rows_per_rank)]
    return IntegrityDetector().update(windows)


def allreduce_rows(gs: GradientSet, b: int, results: list[torch.Tensor]) -> list[list[list[int]]]:
    seen: dict[int, dict[str, int]] = {}  # ranks holding the same tensor: fingerprint it once
    out = []
    for r in range(W):
        total, magnitude = gs.sent[b][r]
        res = results[r]
        if id(res) not in seen:
            nan, inf = nonfinite_counts(res)
            seen[id(res)] = dict(recv_a=fingerprint(res), recv_b=bits_of(float64_sums(res)[0]),
                                 nan_recv=nan, inf_recv=inf)
        out.append([record("allreduce", b, res.numel(), sent_a=bits_of(total),
                           sent_b=bits_of(magnitude), **seen[id(res)])])
    return out


# ------------------------------------------------------------------------ detection matrix
def matrix_after_reduce(sets: list[GradientSet], trials: int, rng: random.Random,
                        gen: torch.Generator) -> dict[int, tuple[int, int]]:
    reductions = {(k, b): reduce_random_order(p, gen)
                  for k, gs in enumerate(sets) for b, p in enumerate(gs.payloads)}
    out = {}
    for bit in range(32):
        hit = 0
        for _ in range(trials):
            k = rng.randrange(len(sets))
            gs = sets[k]
            b = rng.randrange(len(gs.payloads))
            reduced = reductions[(k, b)]
            victim, element = rng.randrange(W), rng.randrange(reduced.numel())
            corrupt = reduced.clone()
            flip_bit(corrupt, element, bit)
            results = [corrupt if r == victim else reduced for r in range(W)]
            findings = check(allreduce_rows(gs, b, results))
            hit += any(f.kind == "result_mismatch" and f.rank == victim for f in findings)
        out[bit] = (hit, trials)
    return out


def matrix_param(model: torch.nn.Module, trials: int, rng: random.Random) -> dict[int, tuple]:
    params = [p.detach().reshape(-1).clone() for p in model.parameters()]
    hashes = [fingerprint(p) for p in params]

    def combined(hs: list[int]) -> int:
        from laggard.detectors.integrity import to_int64

        return to_int64(sum((2 * i + 1) * (h & ((1 << 64) - 1)) for i, h in enumerate(hs)))

    clean = combined(hashes)
    out = {}
    for bit in range(32):
        hit = 0
        for _ in range(trials):
            victim, k = rng.randrange(W), rng.randrange(len(params))
            p = params[k].clone()
            flip_bit(p, rng.randrange(p.numel()), bit)
            bad = combined(hashes[:k] + [fingerprint(p)] + hashes[k + 1:])
            rows = [[record("replica", 0, 0, recv_a=bad if r == victim else clean)]
                    for r in range(W)]
            hit += any(f.kind == "replica_mismatch" and f.rank == victim for f in check(rows))
        out[bit] = (hit, trials)
    return out


def matrix_before_send(sets: list[GradientSet], trials: int, rng: random.Random,
                       gen: torch.Generator) -> dict[int, dict[str, int]]:
    """Uncompressed all-reduce: the flip is in one rank's payload after its sums were taken."""
    reductions = {(k, b): reduce_random_order(p, gen)
                  for k, gs in enumerate(sets) for b, p in enumerate(gs.payloads)}
    out = {}
    for bit in range(32):
        c = dict(trials=0, detected=0, nonfinite=0, nonfinite_detected=0, above_tau=0,
                 above_tau_detected=0, above_2tau=0, above_2tau_detected=0, undetected_above=0)
        for _ in range(trials):
            k = rng.randrange(len(sets))
            gs = sets[k]
            b = rng.randrange(len(gs.payloads))
            payloads = gs.payloads[b]
            victim, element = rng.randrange(W), rng.randrange(payloads.shape[1])
            column = payloads[:, element].clone()
            old, new = flip_bit(column, victim, bit)
            # only the flipped element's reduction changes: redo it in a random order
            reduced = reductions[(k, b)].clone()
            acc = torch.zeros((), dtype=torch.float32)
            for r in rng.sample(range(W), W):
                acc = acc + column[r]
            reduced[element] = acc
            findings = check(allreduce_rows(gs, b, [reduced] * W))
            detected = any(f.kind in ("sum_mismatch", "nonfinite") for f in findings)
            tau = sum_tolerance(sum(m for _, m in gs.sent[b]), payloads.shape[1], W, U32)
            change = abs(float(new) - float(old)) if math.isfinite(new) else math.inf
            c["trials"] += 1
            c["detected"] += detected
            if not math.isfinite(new):
                c["nonfinite"] += 1
                c["nonfinite_detected"] += detected
            if change > tau:
                c["above_tau"] += 1
                c["above_tau_detected"] += detected
                c["undetected_above"] += not detected
            if change > 2 * tau:
                c["above_2tau"] += 1
                c["above_2tau_detected"] += detected
        out[bit] = c
    return out


def matrix_topk(sets: list[GradientSet], trials: int, rng: random.Random) -> dict[int, tuple]:
    """Top-k payloads (int32: k float32 values as bits, then k indices), all-gathered."""
    payloads = []
    for gs in sets:
        for bucket in gs.payloads:
            k = max(1, math.ceil(0.01 * bucket.shape[1]))
            rows = []
            for r in range(W):
                idx = torch.topk(bucket[r].abs(), k, sorted=False).indices
                rows.append(torch.cat([bucket[r][idx].view(torch.int32), idx.to(torch.int32)]))
            payloads.append(torch.stack(rows))
    return _matrix_gather(payloads, 32, trials, rng)


def matrix_sign(sets: list[GradientSet], trials: int, rng: random.Random) -> dict[int, tuple]:
    """Sign payloads (uint8 rows: packed signs + float64 scale), stage 1 all-to-all."""
    payloads = []
    for gs in sets:
        for bucket in gs.payloads:
            per_rank = []
            for r in range(W):
                n = bucket.shape[1]
                c = chunk_elements(n, W)
                work = torch.zeros(W * c)
                work[:n] = bucket[r]
                per_rank.append(compress_rows(work.view(W, c), chunk_lengths(n, W)))
            payloads.append(torch.stack(per_rank))  # (sender, receiver, bytes)
    out = {}
    for bit in range(8):
        hit = 0
        for _ in range(trials):
            p = rng.choice(payloads).clone()
            sender, receiver = rng.randrange(W), rng.randrange(W)
            clean_sent = [row_fingerprints(p[j]).tolist() for j in range(W)]
            flip_bit(p[sender, receiver], rng.randrange(p.shape[2]), bit)
            rows = []
            for j in range(W):
                wrap, plain, by_receiver = chunk_sums(clean_sent[j])
                got = chunk_sums(row_fingerprints(p[:, j]).tolist())
                rows.append([record("alltoall", 0, p.shape[2], sent_a=wrap, sent_b=by_receiver,
                                    sent_c=plain, recv_a=got[0], recv_b=got[1], recv_c=got[2])])
            findings = check(rows)
            hit += any(f.kind == "payload_mismatch" and f.evidence.get("sender") == sender
                       and f.evidence.get("receiver") == receiver for f in findings)
        out[bit] = (hit, trials)
    return out


def _matrix_gather(payloads: list[torch.Tensor], bits: int, trials: int,
                   rng: random.Random) -> dict[int, tuple]:
    out = {}
    for bit in range(bits):
        hit = 0
        for _ in range(trials):
            p = rng.choice(payloads)
            sent = row_fingerprints(p).tolist()
            victim = rng.randrange(W)
            got = p.clone()
            flip_bit(got[victim], rng.randrange(got.shape[1]), bit)
            received = chunk_sums(row_fingerprints(got).tolist())
            rows = [[record("allgather", 0, p.shape[1], sent_a=sent[r], recv_a=received[0],
                            recv_b=received[1], recv_c=received[2])] for r in range(W)]
            hit += any(f.kind == "payload_mismatch" and f.rank == victim for f in check(rows))
        out[bit] = (hit, trials)
    return out


# -------------------------------------------------------------------------- false positives
def false_positives(sets: list[GradientSet], steps: int, gen: torch.Generator) -> tuple:
    detector = IntegrityDetector()
    alarms = records = 0
    # the 24 orders of 4 terms, precomputed per bucket; each element draws one per step
    from itertools import permutations

    orders = list(permutations(range(W)))
    sums = []
    for gs in sets:
        per_bucket = []
        for p in gs.payloads:
            variants = []
            for order in orders:
                acc = p[order[0]].clone()
                for r in order[1:]:
                    acc += p[r]
                variants.append(acc)
            per_bucket.append(torch.stack(variants))
        sums.append(per_bucket)
    for step in range(steps):
        k = step % len(sets)
        gs = sets[k]
        rows: list[list[list[int]]] = [[] for _ in range(W)]
        for b, variants in enumerate(sums[k]):
            pick = torch.randint(len(orders), (variants.shape[1],), generator=gen)
            reduced = variants.gather(0, pick.unsqueeze(0))[0]
            total = bits_of(float64_sums(reduced)[0])
            h = fingerprint(reduced)
            for r in range(W):
                s, m = gs.sent[b][r]
                rows[r].append(record("allreduce", b, reduced.numel(), sent_a=bits_of(s),
                                      sent_b=bits_of(m), recv_a=h, recv_b=total))
            records += 1
        windows = [encode_window(r, W, rows[r], len(rows[r])) for r in range(W)]
        alarms += len(detector.update(windows))
    return alarms, records, detector.stats.sum_checks


# ------------------------------------------------------------------------------ throughput
def median_seconds(fn, repeat: int = 7) -> float:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def throughput() -> list[tuple]:
    rows = []
    for label, n in (("demo bucket 0.25 MB", 65536), ("DDP default 25 MB", 25 << 18),
                     ("100 MB", 25 << 20)):
        src = torch.randn(n)
        dst = torch.empty_like(src)
        copy = median_seconds(lambda src=src, dst=dst: dst.copy_(src))
        hashing = median_seconds(lambda src=src: fingerprint(src))

        def full(src: torch.Tensor = src) -> None:  # an all-reduce record: before and after
            float64_sums(src)
            fingerprint(src)
            float64_sums(src, magnitude=False)

        record_s = median_seconds(full)
        gb = n * 4 / 1e9
        rows.append((label, gb / copy, gb / hashing, copy / hashing, gb / record_s,
                     copy / record_s))
    return rows


# ------------------------------------------------------------------------- step overhead
def step_overhead(steps: int, blocks: int, world: int = 4) -> dict[str, float]:
    """Per-step cost of the checks on the demo model under DDP on ``world`` real gloo ranks
    (spawned processes, the demo's 0.25 MB buckets, each rank its own batches):
    ``make_hook("none")`` against ``integrity_allreduce_hook`` (the same timed all-reduce with
    every check; the replica check every 100 steps; every 20 steps the window vector gathered
    and checked, as in the monitor's window). Alternating blocks of steps on the same ranks.

    Returns:
        Rank-0 medians in seconds: ``wall_base``, ``wall_checked``, ``cpu_base``,
        ``cpu_checked`` (CPU time of the process: training and gloo threads).
    """
    import tempfile

    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        out = f"{tmp}/overhead.json"
        port = 29500 + random.Random().randrange(2000)
        mp.spawn(_overhead_rank, args=(world, port, steps, blocks, out), nprocs=world)
        with open(out) as f:
            import json

            return json.load(f)


def _timed(fn, spent: list[float]):  # type: ignore[no-untyped-def]
    def wrapper(*args, **kwargs):  # type: ignore[no-untyped-def]
        start = time.thread_time()
        try:
            return fn(*args, **kwargs)
        finally:
            spent.append(time.thread_time() - start)
    return wrapper


def _overhead_rank(rank: int, world: int, port: int, steps: int, blocks: int, out: str) -> None:
    import json

    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from laggard.compression import make_hook
    from laggard.demo.model import BUCKET_CAP_MB
    from laggard.integrations.integrity_hooks import IntegrityHookState, integrity_allreduce_hook

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    batches = ByteBatches(load_stdlib_text(1 << 20), 8, 64, seed=rank)
    runs = []
    for checked in (False, True):
        torch.manual_seed(0)
        ddp = DistributedDataParallel(ByteLM(), bucket_cap_mb=BUCKET_CAP_MB)
        integrity = GradientIntegrity() if checked else None
        state, hook = make_hook("none")
        if integrity is None:
            ddp.register_comm_hook(state, hook)
        else:  # the same averaging all-reduce, timed by the same CommTimer, with every check
            ddp.register_comm_hook(IntegrityHookState(integrity, timer=state.timer),
                                   integrity_allreduce_hook)
        runs.append((ddp, torch.optim.AdamW(ddp.parameters(), lr=3e-3), integrity))
    # Direct accounting: CPU time of the calling thread inside every recorder entry point (the
    # hooks' records and the replica check all pass through _guard), whatever the contention.
    spent: list[float] = []
    checked_integrity = runs[1][2]
    for name in ("_guard", "check_window", "window_vector"):
        setattr(checked_integrity, name, _timed(getattr(checked_integrity, name), spent))

    def step(run: tuple) -> tuple[float, float]:
        ddp, opt, integrity = run
        wall, cpu = time.perf_counter(), time.process_time()
        x, y = batches.next()
        F.cross_entropy(ddp(x).flatten(0, 1), y.flatten()).backward()
        if integrity is None or integrity.end_step(ddp):
            opt.step()
        opt.zero_grad()
        if integrity is not None and integrity.step % 20 == 0:
            local = integrity.window_vector()
            gathered = torch.empty(world * local.numel(), dtype=torch.int64)
            dist.all_gather_single(gathered, local)
            integrity.check_window(gathered.view(world, -1))
        return time.perf_counter() - wall, time.process_time() - cpu

    times: list[list[tuple[float, float]]] = [[], []]
    for _ in range(3):
        step(runs[0]), step(runs[1])
    spent.clear()
    for _ in range(blocks):
        for k in (0, 1):
            times[k] += [step(runs[k]) for _ in range(steps)]
    assert not runs[1][2].findings, runs[1][2].findings  # a clean run raises nothing
    if rank == 0:
        result = {f"{kind}_{name}": statistics.median(t[i] for t in times[k])
                  for k, name in enumerate(("base", "checked"))
                  for i, kind in enumerate(("wall", "cpu"))}
        result["integrity_cpu_per_step"] = sum(spent) / len(times[1])
        with open(out, "w") as f:
            json.dump(result, f)
    dist.barrier()
    dist.destroy_process_group()


def pct(hit: int, n: int) -> str:
    return f"{100 * hit / n:.1f}%" if n else "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=1000)
    parser.add_argument("--clean-steps", type=int, default=10_000)
    parser.add_argument("--sets", type=int, default=8, help="real gradient sets (steps)")
    parser.add_argument("--overhead-steps", type=int, default=20)
    parser.add_argument("--parts", default="matrix,nonfinite,clean,costs",
                        help="comma-separated subset of matrix,nonfinite,clean,costs")
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    torch.set_num_threads(1)
    if "costs" in parts:
        costs(args.overhead_steps)
    if not parts - {"costs"}:
        return
    rng, gen = random.Random(0), torch.Generator().manual_seed(0)
    t0 = time.perf_counter()
    sets, model = gradient_sets(args.sets)
    buckets = len(sets[0].payloads)
    print(f"# {args.sets} real gradient sets of the demo model, W={W}, {buckets} buckets of "
          f"<= {BUCKET_ELEMENTS} float32 ({time.perf_counter() - t0:.0f} s)")
    if "matrix" in parts:
        print_matrix(sets, model, args.trials, rng, gen)
    if "nonfinite" in parts:
        hit, n = nonfinite_flips(sets, args.trials, rng, gen)
        print(f"\n## Flips that make Inf or NaN (before_send, all-reduce): {hit}/{n} detected")
    if "clean" in parts:
        t1 = time.perf_counter()
        alarms, records, sum_checks = false_positives(sets, args.clean_steps, gen)
        print(f"\n## False positives: {alarms} findings over {args.clean_steps} clean steps "
              f"({records} bucket records, {sum_checks} sum checks; "
              f"{time.perf_counter() - t1:.0f} s)")


def nonfinite_flips(sets: list[GradientSet], trials: int, rng: random.Random,
                    gen: torch.Generator) -> tuple[int, int]:
    """Bit 30 of a float32 in [1, 2) (exponent 0x7F) makes the exponent 0xFF: Inf or NaN.
    Real gradients of the demo (divided by W) hold almost no such values, so each trial first
    scales one real element into [1, 2) on the victim rank, before the sums are taken."""
    hit = 0
    for _ in range(trials):
        gs = rng.choice(sets)
        b = rng.randrange(len(gs.payloads))
        payloads = gs.payloads[b].clone()
        victim, element = rng.randrange(W), rng.randrange(payloads.shape[1])
        payloads[victim, element] = math.copysign(1 + rng.random(),
                                                  float(payloads[victim, element]) or 1.0)
        sent = [float64_sums(payloads[r]) for r in range(W)]
        flip_bit(payloads[victim], element, 30)
        reduced = reduce_random_order(payloads, gen)
        findings = check(allreduce_rows(GradientSet([payloads], [sent]), 0,
                                        [reduced] * W))
        hit += any(f.kind == "nonfinite" and f.evidence["check"] == "nonfinite_received"
                   for f in findings)
    return hit, trials


def print_matrix(sets: list[GradientSet], model: torch.nn.Module, trials: int,
                 rng: random.Random, gen: torch.Generator) -> None:

    after = matrix_after_reduce(sets, trials, rng, gen)
    param = matrix_param(model, trials, rng)
    topk = matrix_topk(sets, trials, rng)
    before = matrix_before_send(sets, trials, rng, gen)
    sign = matrix_sign(sets, trials, rng)
    print("\n## Detection (rank named), per float32 bit; trials per cell:", trials)
    print("| bit | field | after_reduce | param | before_send topk | before_send all-reduce "
          "| flips > tau | detected of > tau | flips > 2 tau | detected of > 2 tau "
          "| Inf/NaN flips detected |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for bit in range(31, -1, -1):
        field = "sign" if bit == 31 else "exponent" if bit >= 23 else "mantissa"
        c = before[bit]
        print(f"| {bit} | {field} | {pct(*after[bit])} | {pct(*param[bit])} | {pct(*topk[bit])} "
              f"| {pct(c['detected'], c['trials'])} | {pct(c['above_tau'], c['trials'])} "
              f"| {pct(c['above_tau_detected'], c['above_tau'])} "
              f"| {pct(c['above_2tau'], c['trials'])} "
              f"| {pct(c['above_2tau_detected'], c['above_2tau'])} "
              f"| {c['nonfinite_detected']}/{c['nonfinite']} |")
    print("\n## sign payload (uint8 bytes: packed signs and float64 scales), before_send on the "
          "all-to-all, link named")
    print("| bit of byte | detected |\n|---|---|")
    for bit in range(7, -1, -1):
        print(f"| {bit} | {pct(*sign[bit])} |")


def costs(overhead_steps: int) -> None:
    print("\n## Throughput (GB/s, one thread)")
    print("| buffer | copy_ | fingerprint | fingerprint / copy speed | all-reduce record | "
          "record / copy speed |\n|---|---|---|---|---|---|")
    for label, copy, fp, ratio, rec, rec_ratio in throughput():
        print(f"| {label} | {copy:.2f} | {fp:.2f} | {ratio:.2f}x | {rec:.2f} | {rec_ratio:.2f}x |")
    r = step_overhead(overhead_steps, 5)
    print(f"\n## Step overhead (demo model, DDP on {4} gloo ranks, rank 0, medians)")
    for kind in ("wall", "cpu"):
        base, checked = r[f"{kind}_base"], r[f"{kind}_checked"]
        print(f"- {kind}: {1e3 * base:.1f} ms -> {1e3 * checked:.1f} ms per step, "
              f"{100 * (checked / base - 1):+.2f}%")
    spent = r["integrity_cpu_per_step"]
    print(f"- the checks' own CPU time per step (thread CPU inside the recorder): "
          f"{1e3 * spent:.2f} ms = {100 * spent / r['wall_base']:.2f}% of the unchecked step's "
          f"wall time, {100 * spent / r['cpu_base']:.2f}% of its CPU time")


if __name__ == "__main__":
    main()
