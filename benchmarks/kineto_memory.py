"""``laggard analyze`` on a large set of profiler (Kineto) traces: peak memory and speed.

Writes a GPU-form trace set (``laggard.demo.traces``, one file per rank) of about ``--gib``
GiB in all, then, each in a child process so that its peak resident set is its own:

* baseline: ``json.load`` of the largest single file (what a reader that loads the document
  does, before any analysis);
* ``laggard analyze --json`` on the whole set (streamed reader, per-step reduction).

Prints the set's size, each peak RSS (``getrusage(RUSAGE_CHILDREN).ru_maxrss``), the ratio of
the two, analyze's CPU time and MB/s, and the load average (the machine is shared). Usage::

    python benchmarks/kineto_memory.py [--gib 1.0] [--ranks 4] [--keep DIR] [--reuse DIR]
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

from laggard.demo.traces import synthesize_gpu_traces

# bytes of trace per profiler step per rank with 40 kernels (measured: 21 MiB for 4 x 300)
_BYTES_PER_STEP = 17_500


def _child(code: list[str]) -> tuple[float, float, str]:
    """Run a child; return (peak RSS MiB, CPU seconds, stdout tail)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(code, capture_output=True, text=True, check=False)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    if proc.returncode not in (0, 1):
        raise SystemExit(f"{code[:3]} failed: {proc.stderr[-800:]}")
    return after.ru_maxrss / 1024.0, cpu, proc.stdout[-300:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gib", type=float, default=1.0)
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--keep", help="write the set here and keep it")
    parser.add_argument("--reuse", help="a set written before with --keep: analyse it only")
    args = parser.parse_args()
    directory = args.reuse or args.keep or tempfile.mkdtemp(prefix="laggard-kineto-")
    steps = int(args.gib * (1 << 30) / args.ranks / _BYTES_PER_STEP)
    try:
        t0 = time.time()
        if args.reuse:
            paths = [os.path.join(directory, n) for n in sorted(os.listdir(directory))]
        else:
            paths = synthesize_gpu_traces(directory, world=args.ranks, steps=steps,
                                          slow_rank=1)
        size = sum(os.path.getsize(p) for p in paths)
        print(f"trace set: {len(paths)} files, {size / (1 << 20):.0f} MiB "
              f"(written in {time.time() - t0:.0f} s); load average "
              f"{os.getloadavg()[0]:.1f}", flush=True)
        largest = max(paths, key=os.path.getsize)
        # ru_maxrss of RUSAGE_CHILDREN is the largest child so far: run the smaller one first
        t1 = time.time()
        rss_analyze, cpu, out = _child([sys.executable, "-m", "laggard.cli", "analyze",
                                        "--json", directory])
        wall = time.time() - t1
        rss_load, cpu_load, _ = _child([sys.executable, "-c",
                                        f"import json; json.load(open({largest!r}))"])
        print(f"baseline json.load of one {os.path.getsize(largest) / (1 << 20):.0f} MiB "
              f"file: peak RSS {rss_load:.0f} MiB, {cpu_load:.1f} CPU s")
        print(f"laggard analyze of all {size / (1 << 20):.0f} MiB: peak RSS "
              f"{rss_analyze:.0f} MiB ({rss_analyze / rss_load:.2f} x the baseline's), "
              f"{cpu:.1f} CPU s, {size / (1 << 20) / cpu:.1f} MiB/s")
        print(f"analyze wall time {wall:.0f} s; its output ends: ...{out[-120:]!r}")
        print(f"load average after: {os.getloadavg()[0]:.1f}")
    finally:
        if not (args.keep or args.reuse):
            shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
