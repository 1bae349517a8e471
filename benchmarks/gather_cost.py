"""The window gather's cost: ``all_gather`` (a list of R tensors, what the monitor did) against
``gather`` to rank 0 and ``all_gather_into_tensor`` (one (R, W) tensor), on gloo, in real
``torchrun`` jobs of 4, 8 and 16 CPU ranks; and the bytes per rank per window at 65,536 ranks
from :class:`~laggard.detectors.window.WindowLayout` (issue 31, part 4).

Usage::

    python benchmarks/gather_cost.py [--ranks 4 8 16] [--iterations 60] [--words 16 177]

Per job, each method runs ``--iterations`` times, the methods interleaved (round robin, so a
change in the host's load falls on all three alike), each call after a barrier; a rank times
its own call. Printed per method: the median over calls of rank 0's seconds and of the slowest
other rank's, and the ratio to ``all_gather`` measured in the same job (the baseline). Then,
in-process, the training thread's Python cost of the receive buffers at 65,536 ranks (R tensor
objects and a stack, against one (R, W) tensor), and the bytes table. ``uptime`` is printed
beside every figure: the cost swings with the host's load.

Words per rank: 16 with the monitor's step columns alone; 177 with a tracer (its 8 groups x
K = 20 block) and the link probe's column.
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

METHODS = ("all_gather", "gather", "all_gather_into_tensor")
#: What main() measures, in order (``--parts``).
PARTS = ("jobs", "buffers", "handover", "bytes")
#: Ranks the bytes table is written for (issue 31's target scale).
SCALE_RANKS = 65_536


def _load() -> str:
    return f"load {os.getloadavg()[0]:.1f}"


# ------------------------------------------------------------------------ one rank of a job
def _call(method: str, local, world: int, rank: int):  # type: ignore[no-untyped-def]
    import torch
    import torch.distributed as dist

    if method == "all_gather":  # the monitor's call before issue 31 (window_gather.py)
        out = [torch.empty_like(local) for _ in range(world)]
        dist.all_gather(out, local)
        return torch.stack(out)
    if method == "gather":
        out = [torch.empty_like(local) for _ in range(world)] if rank == 0 else None
        dist.gather(local, out, dst=0)
        return torch.stack(out) if out is not None else None
    # gloo wants the output flat: (R * W,) for a (W,) input
    flat = torch.empty(world * local.numel(), dtype=local.dtype)
    dist.all_gather_into_tensor(flat, local)
    return flat.view(world, local.numel())


def worker(out_dir: Path, iterations: int, words: int) -> None:
    """One rank: every method ``iterations`` times, interleaved; rank 0 writes the medians."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    local = torch.full((words,), float(rank), dtype=torch.float64)
    times: dict[str, list[float]] = {m: [] for m in METHODS}
    errors: dict[str, str] = {}
    for i in range(iterations + 3):  # 3 warm-up rounds
        for method in METHODS:
            if method in errors:
                continue
            dist.barrier()
            start = time.perf_counter()
            try:
                table = _call(method, local, world, rank)
            except Exception as exc:  # noqa: BLE001 - a method gloo lacks is reported
                errors[method] = repr(exc)
                continue
            elapsed = time.perf_counter() - start
            if i >= 3:
                times[method].append(elapsed)
            if table is not None:  # the rows arrived where they should
                assert torch.equal(table[:, 0], torch.arange(world, dtype=torch.float64))
    medians = {m: statistics.median(v) if v else None for m, v in times.items()}
    gathered: list[object] = [None] * world
    dist.all_gather_object(gathered, medians)
    if rank == 0:
        doc = {m: {"rank0": gathered[0][m],  # type: ignore[index]
                   "others_max": max((g[m] for g in gathered[1:]  # type: ignore[index]
                                      if g[m] is not None), default=None)}  # type: ignore[index]
               for m in METHODS}
        (out_dir / f"gather-{world}-{words}.json").write_text(json.dumps(
            {"methods": doc, "errors": errors}))
    dist.barrier()
    dist.destroy_process_group()


# ------------------------------------------------------------------------------- the driver
def run_job(ranks: int, iterations: int, words: int, out: Path) -> dict:
    """Launch one ``torchrun --standalone`` job of ``ranks`` CPU ranks; its rank 0's doc."""
    subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
         str(ranks), __file__, "--worker", str(out), "--iterations", str(iterations),
         "--words", str(words)],
        env={**os.environ, "OMP_NUM_THREADS": "1"}, check=True, timeout=900,
        capture_output=True, text=True)
    return json.loads((out / f"gather-{ranks}-{words}.json").read_text())


def buffer_cost(ranks: int, words: int, repeats: int = 5) -> tuple[float, float]:
    """Seconds (median of ``repeats``) to make the receive buffers of one window at ``ranks``
    and stack them (``all_gather``'s list), against one ``(ranks, words)`` tensor."""
    import torch

    local = torch.zeros(words, dtype=torch.float64)
    listed, single = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        torch.stack([torch.empty_like(local) for _ in range(ranks)]).numpy()
        listed.append(time.perf_counter() - start)
        start = time.perf_counter()
        torch.empty((ranks, words), dtype=torch.float64).numpy()
        single.append(time.perf_counter() - start)
    return statistics.median(listed), statistics.median(single)


def handover_cost(ranks: int, windows: int = 6) -> tuple[float, float, float, str]:
    """Rank 0's training thread after the gather, at ``ranks``: the unpack of the (R, W)
    buffer and the hand-over to the analysis thread (median seconds over ``windows``
    synthetic windows, one rank 10% slow), against the analysis itself on the thread
    (median) and ``monitor.analyse`` on the calling thread (median), what the training thread
    did before issue 31; and what rank 0 keeps of them (``monitor.windows``)."""
    import numpy as np

    from laggard.detectors.window import WindowRecord
    from laggard.integrations.monitor import TrainingMonitor

    monitor = TrainingMonitor(TrainingMonitor.Config(
        agent_address="", heartbeat_seconds=0, hang_store_seconds=0, gc_timing=False),
        rank=0, world_size=ranks)
    rng = np.random.default_rng(0)
    names = [c.name for c in monitor.layout.columns]
    hand, thread, inline = [], [], []
    for w in range(2 * windows):
        table = np.full((ranks, monitor.layout.size), np.nan)
        compute = 0.1 * (1 + 0.01 * rng.standard_normal(ranks))
        compute[ranks // 2] *= 1.1
        for name, values in (("compute_seconds", compute), ("data_seconds", 0.001),
                             ("collective_wait_seconds", 0.12 - compute),
                             ("step_seconds", 0.121)):
            table[:, names.index(name)] = values
        start = time.perf_counter()
        record = WindowRecord(step=20 * w + 19, columns=monitor.layout.unpack(table),
                              ranks=np.arange(ranks), world_size=ranks)
        if w < windows:
            before = monitor.stats.analysis_seconds
            monitor._hand_over(record)  # noqa: SLF001 - the gather's path, after the collective
            hand.append(time.perf_counter() - start)
            monitor.wait_analysed()
            thread.append(monitor.stats.analysis_seconds - before)
        else:
            monitor.analyse(record)
            inline.append(time.perf_counter() - start)
    monitor.close()
    kept = (f"{len(monitor.windows)} of {2 * windows} windows kept in full "
            f"({monitor._history.nbytes / 1e6:.1f} MB), "  # noqa: SLF001
            f"{len(monitor.window_summaries)} summaries")
    return statistics.median(hand), statistics.median(thread), statistics.median(inline), kept


def bytes_table(words: int, ranks: int = SCALE_RANKS) -> list[tuple[str, int, int]]:
    """Per method: (name, bytes a non-root rank sends and receives per window, bytes it
    holds in its receive buffer). gloo's allgather is a ring: every rank passes on R - 1
    vectors and receives R - 1; its gather sends one vector to the root."""
    vector = 8 * words
    ring = 2 * (ranks - 1) * vector
    return [("all_gather", ring, ranks * vector),
            ("gather (to rank 0)", vector, 0),
            ("all_gather_into_tensor", ring, ranks * vector)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[4, 8, 16])
    parser.add_argument("--iterations", type=int, default=60)
    parser.add_argument("--words", type=int, nargs="+", default=[16, 177])
    parser.add_argument("--parts", nargs="+", default=list(PARTS), choices=PARTS,
                        help="what to measure (default: all)")
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker is not None:
        worker(args.worker, args.iterations, args.words[0])
        return 0
    if "jobs" in args.parts:
        jobs(args)
    if "buffers" in args.parts:
        print(f"\ntraining thread's receive buffers at {SCALE_RANKS:,} ranks (in-process), "
              f"median of 5 (the monitor makes rank 0's once and keeps them):")
        for words in args.words:
            listed, single = buffer_cost(SCALE_RANKS, words)
            print(f"- {words} words: {SCALE_RANKS:,} tensors + stack {1e3 * listed:.1f} ms, "
                  f"one (R, W) tensor {1e3 * single:.3f} ms (ratio {listed / single:,.0f}), "
                  f"{_load()}")
    if "handover" in args.parts:
        hand, thread, inline, kept = handover_cost(SCALE_RANKS)
        print(f"\nrank 0 at {SCALE_RANKS:,} ranks, 16 words, one peer group, median of 6 "
              f"windows: training thread (unpack + hand-over) {1e3 * hand:.1f} ms; the "
              f"analysis on its thread {1e3 * thread:.0f} ms; analyse() on the training "
              f"thread (before) {1e3 * inline:.0f} ms (ratio {inline / hand:.0f}); {kept}; "
              f"{_load()}")
    if "bytes" in args.parts:
        print(f"\nbytes per non-root rank per window at {SCALE_RANKS:,} ranks (arithmetic):")
        print("| words/rank | method | sent + received | receive buffer held |")
        print("|---|---|---|---|")
        for words in args.words:
            for name, moved, held in bytes_table(words):
                print(f"| {words} | {name} | {_bytes(moved)} | {_bytes(held)} |")
    return 0


def _bytes(n: int) -> str:
    return f"{n / 1e6:,.1f} MB" if n >= 1e6 else f"{n:,} B"


def jobs(args: argparse.Namespace) -> None:
    """The gloo jobs: every method, every rank count and width; a markdown table."""
    print(f"gloo window gather, {args.iterations} calls per method, interleaved; "
          f"median seconds per call (rank 0 / slowest other rank); ratio to all_gather")
    print("| ranks | words/rank | method | rank 0 ms | other ranks ms | ratio (rank 0) | "
          "load |")
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for words in args.words:
            for ranks in args.ranks:
                doc = run_job(ranks, args.iterations, words, Path(tmp))
                base = doc["methods"]["all_gather"]["rank0"]
                for method in METHODS:
                    m = doc["methods"][method]
                    if m["rank0"] is None:
                        print(f"| {ranks} | {words} | {method} | unsupported: "
                              f"{doc['errors'].get(method, '?')[:60]} | | | {_load()} |")
                        continue
                    print(f"| {ranks} | {words} | {method} | {1e3 * m['rank0']:.2f} | "
                          f"{1e3 * m['others_max']:.2f} | {m['rank0'] / base:.2f} | "
                          f"{_load()} |")


if __name__ == "__main__":
    sys.exit(main())
