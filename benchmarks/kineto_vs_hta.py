"""laggard's Kineto breakdown beside Holistic Trace Analysis' on the same GPU-form traces.

HTA (``HolisticTraceAnalysis``, optional: ``pip install -c constraints.txt
HolisticTraceAnalysis==0.5.0`` with ``torch==2.13.0`` in the constraints) needs GPU kernels;
this machine has no GPU, so the traces are synthesised (``laggard.demo.traces``) in whole
microseconds (HTA rounds Kineto's nanosecond fractions down). For each rank it prints, from
both: compute time, non-compute time (communication and memory kernels not overlapped by
compute), idle time, and the share of communication overlapped by compute; then the straggler
each names (HTA's ``get_straggler_...`` z-score rule is left out: it needs its own config).

HTA's window is the first kernel to the last kernel end, without the last profiler step;
laggard's steps run from a step's first kernel to the next step's first kernel, so over the
same steps laggard also counts the one gap after the last kept step as idle: that gap is
printed, and the idle figures compared with it taken out. Usage::

    python benchmarks/kineto_vs_hta.py [--world 4] [--steps 10] [--slow-rank 2]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import warnings

from laggard.analyze.filetype import open_text
from laggard.analyze.traces import read_trace
from laggard.demo.traces import synthesize_gpu_traces
from laggard.detectors.kineto import find_straggler


def _laggard(directory: str, world: int) -> tuple[dict[int, dict[str, float]], object]:
    out, per_rank = {}, {}
    for rank in range(world):
        path = os.path.join(directory, f"rank{rank}.pt.trace.json")
        with open_text(path) as f:
            trace = read_trace(f, path)
        kept = trace.steps[:-1]  # HTA drops the last profiler step
        per_rank[rank] = trace.steps
        total = sum(s.duration for s in kept)
        idle = sum(s.idle for s in kept)
        compute = sum(s.compute for s in kept)
        comm = sum(s.communication for s in kept)
        out[rank] = {"compute": compute, "non_compute": total - idle - compute, "idle": idle,
                     "overlap_pct": 100 * sum(s.overlap for s in kept) / comm if comm else 0.0,
                     "total": total}
    return out, find_straggler(per_rank)


def _hta(directory: str) -> dict[int, dict[str, float]] | None:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from hta.trace_analysis import TraceAnalysis  # optional dependency
    except ImportError:
        return None
    analysis = TraceAnalysis(trace_dir=directory)
    breakdown = analysis.get_temporal_breakdown(visualize=False)
    overlap = analysis.get_comm_comp_overlap(visualize=False)
    out = {}
    for _, row in breakdown.iterrows():
        out[int(row["rank"])] = {"compute": float(row["compute_time(us)"]),
                                 "non_compute": float(row["non_compute_time(us)"]),
                                 "idle": float(row["idle_time(us)"]),
                                 "total": float(row["kernel_time(us)"])}
    for _, row in overlap.iterrows():
        out[int(row["rank"])]["overlap_pct"] = float(row["comp_comm_overlap_pctg"])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--world", type=int, default=4)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--slow-rank", type=int, default=2)
    args = parser.parse_args()
    directory = tempfile.mkdtemp(prefix="laggard-hta-")
    synthesize_gpu_traces(directory, world=args.world, steps=args.steps,
                          slow_rank=args.slow_rank, whole_microseconds=True)
    mine, straggler = _laggard(directory, args.world)
    theirs = _hta(directory)
    print(f"{args.world} ranks x {args.steps} steps, slow rank {args.slow_rank}; load average "
          f"{os.getloadavg()[0]:.1f}")
    if theirs is None:
        print("HTA is not installed: laggard's figures only")
    worst = 0.0
    for rank in range(args.world):
        m = mine[rank]
        gap = m["total"] - (theirs[rank]["total"] if theirs else m["total"])
        line = [f"rank {rank}:"]
        for key in ("compute", "non_compute", "idle", "overlap_pct"):
            ours = m[key] - (gap if key == "idle" else 0.0)
            if theirs:
                ref = theirs[rank][key]
                diff = abs(ours - ref) / ref * 100 if ref else 0.0
                worst = max(worst, diff)
                line.append(f"{key} {ours:.1f} vs HTA {ref:.1f} ({diff:.2f}%)")
            else:
                line.append(f"{key} {ours:.1f}")
        print("  ".join(line) + (f"  [trailing gap {gap:.0f} us]" if theirs else ""))
    if theirs:
        print(f"largest difference: {worst:.2f}% (target 1%)")
    print(f"laggard straggler (wait-least): "
          f"{'rank ' + str(straggler.rank) if straggler else 'none'}")


if __name__ == "__main__":
    main()
