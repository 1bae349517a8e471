"""Rank 0 at scale: the straggler analysis of one window at 1,024 to 65,536 ranks (issue 31).

The real rank-0 path on synthetic gathered windows: each rank's row (its window values in the
monitor's :class:`~laggard.detectors.window.WindowLayout`) stacked as ``torch.stack`` stacks
the ``all_gather`` output, unpacked by the layout into a :class:`~laggard.detectors.window.
WindowRecord` (as :class:`~laggard.integrations.window_gather.WindowGather` does), then
``TrainingMonitor.analyse`` (no agent, no windows file, no dist: a monitor built with
``rank=0, world_size=R``). Each job has 1 or 64 peer groups of consecutive ranks (a
pipeline's stages) and one rank 10% slower in compute from window ``--onset``; every rank of a
group waits in its group's collective for the group's slowest.

Sections (a function each, so a section can be added or run alone):

- :func:`analysis_section`: analysis time per window (median, p95), the window the slow rank
  is named at and any other rank named, per (ranks, groups); ratio against 1,024 ranks of the
  same groups, measured in the same run.
- :func:`rss_section`: rank 0's RSS growth (psutil) over ``--rss-windows`` windows (300 in
  the full run) at the largest size, with the growth of the first window as the baseline.
- :func:`baseline_section`: the same windows through one ``StragglerDetector`` per peer group
  (the per-group objects the vectorised detector replaced, each fed its rows), at the sizes
  where that is affordable: time per window and the window the rank is named at, against
  the vectorised path in the same run.
- :func:`training_thread_section`: the training thread's time per window apart from the
  gather, against the analysis it no longer waits for (``gather_cost.handover_cost``).
- :func:`store_round_section`: one heartbeat store round at 2,048 and 8,192 simulated nodes,
  one key per node against one per rank, on a real TCPStore (``hang_round.hang_rounds``).

Usage::

    python benchmarks/scale.py            # 1,024 .. 65,536 ranks, 300 windows of RSS
    python benchmarks/scale.py --quick    # 1,024 and 4,096 ranks, 20 windows: CI size

Targets: analysis <= 1 s per window (median) at 65,536 ranks x 64 groups; RSS growth <= 256 MB
there over 300 windows; the slow rank named at the first window after the warm-up (the
detector's ``persistence_windows`` + ``min_windows``), and no other rank.
"""
from __future__ import annotations

import argparse
import gc
import logging
import multiprocessing
import os
import statistics
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import psutil
import torch

from laggard.detectors.group_straggler import window_rows
from laggard.detectors.straggler import RankWindow, StragglerDetector
from laggard.detectors.window import WindowLayout, WindowRecord
from laggard.integrations.monitor import TrainingMonitor

#: The slow rank's compute, x the others'.
SLOWDOWN = 1.10
MB = 1 << 20


@dataclass(slots=True)
class Job:
    """A synthetic job: ``ranks`` ranks in ``groups`` peer groups of consecutive ranks, one
    rank (``slow_rank``) ``SLOWDOWN`` x slower in compute from window ``onset``."""

    ranks: int
    groups: int
    onset: int
    seed: int = 0

    @property
    def slow_rank(self) -> int:
        return self.ranks // 2 + 3

    def peer_groups(self) -> list[list[int]] | None:
        size = self.ranks // self.groups
        return None if self.groups == 1 else [
            list(range(g * size, (g + 1) * size)) for g in range(self.groups)]

    def columns(self, window: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
        """Window ``window``'s per-rank medians (seconds), (R,) float64 by column name."""
        r = self.ranks
        compute = 0.100 * rng.lognormal(0, 0.02, r)
        if window >= self.onset:
            compute[self.slow_rank] *= SLOWDOWN
        data = 0.005 * rng.lognormal(0, 0.02, r)
        work = (compute + data).reshape(self.groups, -1)
        wait = (work.max(axis=1, keepdims=True) - work).ravel() + 0.002
        transfer = 0.020 * rng.lognormal(0, 0.02, r)
        step = np.full(r, float(work.max()) + 0.025)
        # the blame sums (detectors/blame.py) of K = 20 steps, so the blame detector runs too
        steps = 20
        return {"compute_seconds": compute, "data_seconds": data,
                "collective_wait_seconds": wait, "transfer_seconds": transfer,
                "step_seconds": step,
                # a generator of its own: the medians' draws stay those of the job before
                "wait_sum_seconds": steps * wait * np.random.default_rng(
                    (self.seed, window)).lognormal(0, 0.05, r),
                "step_sum_seconds": steps * step, "steps_count": np.full(r, float(steps)),
                "wait_spike_count": np.zeros(r), "wait_spike_seconds": np.zeros(r),
                "work_spike_count": np.zeros(r), "work_spike_seconds": np.zeros(r),
                "monitor_cpu_seconds": np.zeros(r)}


def gathered_rows(layout: WindowLayout, columns: dict[str, np.ndarray], ranks: int,
                  ) -> list[torch.Tensor]:
    """What ``all_gather`` leaves on rank 0: one (size,) float64 tensor per rank, each its
    :meth:`WindowLayout.pack` (columns not given NaN, int64 columns 0)."""
    matrix = np.full((ranks, layout.size), np.nan)
    offset = 0
    for column in layout.columns:
        where = slice(offset, offset + column.width)
        if column.dtype == "int64":
            matrix[:, where] = 0.0  # the bits of int64 0
        elif column.name in columns:
            matrix[:, where] = columns[column.name][:, None]
        offset += column.width
    return list(torch.from_numpy(matrix).unbind(0))


def node_names(ranks: int) -> list[str]:
    """Each rank's host name, 8 ranks a node (WindowGather gathers them once, at the first
    window, and gives every record a new list of the same strings)."""
    return [f"node{r // 8:05d}" for r in range(ranks)]


def unpacked(layout: WindowLayout, gathered: list[torch.Tensor], step: int,
             nodes: list[str]) -> WindowRecord:
    """WindowGather.gather's record from the gathered tensors."""
    ranks = len(nodes)
    return WindowRecord(step=step, columns=layout.unpack(torch.stack(gathered).numpy()),
                        ranks=np.arange(ranks, dtype=np.int64), world_size=ranks,
                        nodes=list(nodes), local_ranks=np.arange(ranks, dtype=np.int64) % 8)


def monitor_for(job: Job, history_windows: int = 256) -> TrainingMonitor:
    """Rank 0's monitor of ``job``: no agent, no heartbeat, no dist; ``history_windows`` the
    window records it keeps (``Config.history_windows``, 256 by default); its findings are
    not logged (they are counted here)."""
    logging.getLogger("laggard").setLevel(logging.ERROR)
    config = TrainingMonitor.Config(agent_address="", heartbeat_seconds=0,
                                    hang_store_seconds=0, gc_timing=False,
                                    history_windows=history_windows,
                                    peer_groups=job.peer_groups(), node="node00000")
    return TrainingMonitor(config, rank=0, world_size=job.ranks)


@dataclass(slots=True)
class Result:
    """One run: analysis seconds per window (wall, and this thread's CPU: on a loaded host
    the wall time also counts the waits for a core), the window the slow rank was named at
    (None: never), other ranks named, RSS growth (bytes) after each window."""

    seconds: list[float]
    cpu_seconds: list[float]
    named_at: int | None
    others: set[int]
    rss_growth: list[int]

    def median_ms(self) -> float:
        return 1e3 * statistics.median(self.seconds)

    def p95_ms(self) -> float:
        return 1e3 * float(np.percentile(self.seconds, 95))

    def cpu_ms(self) -> float:
        return 1e3 * statistics.median(self.cpu_seconds)


def run_monitor(job: Job, windows: int, history_windows: int = 256) -> Result:
    """``windows`` windows through the real rank-0 path; the stack + unpack + analyse timed."""
    monitor = monitor_for(job, history_windows)
    nodes = node_names(job.ranks)
    rng = np.random.default_rng(job.seed)
    process = psutil.Process()
    gc.collect()
    rss0 = process.memory_info().rss
    seconds, cpu, growth, named_at, others = [], [], [], None, set()
    for w in range(windows):
        gathered = gathered_rows(monitor.layout, job.columns(w, rng), job.ranks)
        start, start_cpu = time.perf_counter(), time.thread_time()
        record = unpacked(monitor.layout, gathered, 20 * w + 19, nodes)
        findings = monitor.analyse(record)
        seconds.append(time.perf_counter() - start)
        cpu.append(time.thread_time() - start_cpu)
        del gathered, record
        for f in findings:
            if f.rank is None or f.cleared:
                continue
            if f.rank == job.slow_rank and named_at is None:
                named_at = w
            elif f.rank != job.slow_rank:
                others.add(f.rank)
        growth.append(process.memory_info().rss - rss0)
    monitor.close()
    return Result(seconds, cpu, named_at, others, growth)


def run_per_group_objects(job: Job, windows: int) -> Result:
    """The same windows through one ``StragglerDetector`` per peer group, each fed its rows
    (what :class:`~laggard.detectors.group_straggler.PeerGroupStraggler` did before the
    vectorised detector); the monitor's layout, stack and unpack as in :func:`run_monitor`."""
    monitor = monitor_for(job)
    layout = monitor.layout
    monitor.close()
    base = StragglerDetector.Config()
    detectors = [StragglerDetector(StragglerDetector.Config(
        false_alarm_windows=base.false_alarm_windows * job.groups)) for _ in range(job.groups)]
    size = job.ranks // job.groups
    nodes = node_names(job.ranks)
    rng = np.random.default_rng(job.seed)
    seconds, cpu, named_at, others = [], [], None, set()
    for w in range(windows):
        gathered = gathered_rows(layout, job.columns(w, rng), job.ranks)
        start, start_cpu = time.perf_counter(), time.thread_time()
        record = unpacked(layout, gathered, 20 * w + 19, nodes)
        window = RankWindow.from_record(record)
        findings = []
        for g, detector in enumerate(detectors):
            rows = np.arange(g * size, (g + 1) * size)
            findings += detector.update(window_rows(window, rows))
        seconds.append(time.perf_counter() - start)
        cpu.append(time.thread_time() - start_cpu)
        for f in findings:
            if f.rank == job.slow_rank and not f.cleared and named_at is None:
                named_at = w
            elif f.rank is not None and f.rank != job.slow_rank and not f.cleared:
                others.add(f.rank)
    return Result(seconds, cpu, named_at, others, [])


def load() -> str:
    one, five, _ = os.getloadavg()
    return f"{one:.1f} / {five:.1f}"


def sizes(quick: bool, only: str = "") -> Iterator[tuple[int, int]]:
    if only:  # "RxG,RxG": those sizes alone
        for size in only.split(","):
            ranks, groups = size.lower().split("x")
            yield int(ranks), int(groups)
        return
    for ranks in (1024, 4096) if quick else (1024, 4096, 16384, 65536):
        for groups in (1, 64):
            yield ranks, groups


def analysis_section(args: argparse.Namespace) -> dict[tuple[int, int], Result]:
    print("\n## Analysis per window: stack + unpack + TrainingMonitor.analyse on rank 0\n")
    print(f"{args.windows} windows each, slow rank {SLOWDOWN:.2f}x from window {args.onset} "
          f"(named at window {args.onset + 2} at the earliest: min_windows = 3)\n")
    print("| ranks | peer groups | median ms | p95 ms | CPU median ms | x 1,024 ranks "
          "(median) | slow rank named at window | other ranks named | load 1/5 min |")
    print("|---|---|---|---|---|---|---|---|---|")
    results: dict[tuple[int, int], Result] = {}
    for ranks, groups in sizes(args.quick, args.sizes):
        job = Job(ranks, groups, args.onset)
        result = results[(ranks, groups)] = run_monitor(job, args.windows)
        base = results[(1024, groups)]
        print(f"| {ranks:,} | {groups} | {result.median_ms():.0f} | {result.p95_ms():.0f} | "
              f"{result.cpu_ms():.0f} | {result.median_ms() / base.median_ms():.1f} | "
              f"{result.named_at} | {sorted(result.others) or 'none'} | {load()} |", flush=True)
    return results


def rss_section(args: argparse.Namespace) -> None:
    print(f"\n## Rank 0 RSS growth over {args.rss_windows} windows, 64 groups\n")
    print("With the kept history (Config.history_windows = 256: full records only within "
          "Config.history_full_bytes, 32 MiB, and a ~1 KB summary for each of the rest), and "
          "without it (history_windows = 0: the detectors' share).\n")
    print("| ranks | kept windows | after window 1 MB | after the last MB | x 1,024 ranks "
          "| analysis median ms | slow rank named at | load 1/5 min |")
    print("|---|---|---|---|---|---|---|---|")
    baseline = None
    largest = 4096 if args.quick else 65536
    for ranks, kept in ((1024, 256), (largest, 256), (largest, 0)):
        # each in a fresh process: the heap that earlier runs freed would hide new pages
        with multiprocessing.get_context("spawn").Pool(1) as pool:
            result = pool.apply(run_monitor, (Job(ranks, 64, args.onset), args.rss_windows,
                                              kept))
        first, last = result.rss_growth[0], result.rss_growth[-1]
        baseline = baseline or max(last, MB)  # at least 1 MB: RSS moves in pages
        print(f"| {ranks:,} | {kept} | {first / MB:.0f} | {last / MB:.0f} | "
              f"{last / baseline:.1f} | {result.median_ms():.0f} | {result.named_at} | "
              f"{load()} |", flush=True)


def baseline_section(args: argparse.Namespace,
                     results: dict[tuple[int, int], Result]) -> None:
    print("\n## Against one StragglerDetector object per peer group (the old path)\n")
    print("| ranks | peer groups | per-group objects median ms (CPU) | vectorised (monitor) "
          "median ms (CPU) | ratio (wall) | named at (objects / vectorised) | load 1/5 min |")
    print("|---|---|---|---|---|---|---|")
    for ranks in (1024,) if args.quick else (1024, 4096):
        job = Job(ranks, 64, args.onset)
        old = run_per_group_objects(job, args.windows)
        new = results[(ranks, 64)]
        print(f"| {ranks:,} | 64 | {old.median_ms():.0f} ({old.cpu_ms():.0f}) | "
              f"{new.median_ms():.0f} ({new.cpu_ms():.0f}) | "
              f"{old.median_ms() / new.median_ms():.1f} | {old.named_at} / {new.named_at} | "
              f"{load()} |", flush=True)


def training_thread_section(args: argparse.Namespace) -> None:
    """The training thread's time per window apart from the gather (issue 31 part 1): the
    unpack and the hand-over to rank 0's analysis thread, against the analysis on that thread
    and ``monitor.analyse`` on the training thread as before issue 31, at the largest size, one
    peer group (``benchmarks/gather_cost.handover_cost``)."""
    from gather_cost import handover_cost

    ranks = 4_096 if args.quick else 65_536
    hand, thread, inline, kept = handover_cost(ranks, windows=4 if args.quick else 6)
    print(f"\n## Training thread per window, the gather apart ({ranks:,} ranks, 1 group)\n\n"
          "| training thread (unpack + hand-over) | analysis on its thread | analyse() on the "
          "training thread (before) | ratio | kept | load |\n|---|---|---|---|---|---|\n"
          f"| {1e3 * hand:.1f} ms | {1e3 * thread:.0f} ms | {1e3 * inline:.0f} ms | "
          f"{inline / hand:.0f} | {kept} | {load()} |", flush=True)


def store_round_section(args: argparse.Namespace) -> None:
    """One heartbeat store round at 2,048 and 8,192 simulated nodes of 8 ranks (issue 31 part
    5): one key per node against one key per rank, on a real TCPStore
    (``benchmarks/hang_round.hang_rounds``); 256 nodes with ``--quick``."""
    from hang_round import hang_rounds, table

    nodes = (256,) if args.quick else (2_048, 8_192)
    rows = hang_rounds(nodes, writers=4 if args.quick else 16)
    print("\n## Heartbeat store round\n\n" + table(rows, load()), flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="1,024 and 4,096 ranks only, fewer windows (CI size)")
    parser.add_argument("--windows", type=int, default=None,
                        help="windows per size (default 20; 14 with --quick)")
    parser.add_argument("--rss-windows", type=int, default=None,
                        help="windows of the RSS run (default 300; 30 with --quick)")
    parser.add_argument("--analysis-only", action="store_true",
                        help="the analysis section alone")
    parser.add_argument("--sizes", default="", metavar="RxG[,RxG]",
                        help="the analysis section at these ranks x groups only "
                             "(e.g. 65536x64)")
    parser.add_argument("--onset", type=int, default=6,
                        help="first slowed window (after the 5 warm-up windows)")
    args = parser.parse_args(argv)
    args.windows = args.windows or (14 if args.quick else 20)
    args.rss_windows = args.rss_windows or (30 if args.quick else 300)
    if args.windows < args.onset + 4:
        parser.error("--windows must leave 4 windows after --onset")
    print(f"# benchmarks/scale.py{' --quick' if args.quick else ''}: python "
          f"{sys.version.split()[0]}, numpy {np.__version__}, torch {torch.__version__}, "
          f"{os.cpu_count()} CPUs, load {load()}")
    results = analysis_section(args)
    if args.analysis_only:
        return 0
    baseline_section(args, results)
    rss_section(args)
    training_thread_section(args)
    store_round_section(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
