"""The wait-least straggler rule on real profiler traces of gloo jobs: named in slowed runs,
nobody in clean ones.

Runs ``tests/analyze/kineto_gloo_worker.py`` (3-4 ranks of gloo DDP under ``torch.profiler``,
6 traced steps) ``--slowed`` times with one rank waiting ``--delay`` seconds for each batch
(the slowed rank and world size vary by run) and ``--clean`` times with none, then
``laggard analyze`` on each set. Prints, per run, the rank named and the evidence, then the
counts. ``--reuse DIR`` analyses sets already written there (``set<i>_w<world>_slow<rank>``,
rank -1 for clean) instead of running jobs. Usage::

    python benchmarks/kineto_straggler.py [--slowed 5] [--clean 3] [--delay 0.08] [--reuse DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from laggard.demo.harness import free_port

REPO = Path(__file__).resolve().parent.parent
WORKER = REPO / "tests" / "analyze" / "kineto_gloo_worker.py"
SPECS = [(4, 2), (3, 0), (4, 3), (3, 1), (4, 0), (3, 2), (4, 1)]


def _named(directory: Path) -> tuple[list[str], list[dict]]:
    proc = subprocess.run([sys.executable, "-m", "laggard.cli", "analyze", "--json",
                           str(directory)], capture_output=True, text=True, check=False)
    found = json.loads(proc.stdout or "[]")
    stragglers = [f for f in found if f["kind"] == "straggler"]
    return [f["subject"] for f in stragglers], [f["evidence"] for f in stragglers]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--slowed", type=int, default=5)
    parser.add_argument("--clean", type=int, default=3)
    parser.add_argument("--delay", type=float, default=0.08)
    parser.add_argument("--reuse")
    args = parser.parse_args()
    root = Path(args.reuse or tempfile.mkdtemp(prefix="laggard-kineto-runs-"))
    if not args.reuse:
        runs = [SPECS[i % len(SPECS)] for i in range(args.slowed)] + \
            [(4 - i % 2, -1) for i in range(args.clean)]
        for i, (world, slow) in enumerate(runs, 1):
            out = root / f"set{i}_w{world}_slow{slow}"
            subprocess.run([sys.executable, str(WORKER), str(out), str(world), str(slow),
                            str(free_port()), str(args.delay), str(i % 2)], check=True,
                           capture_output=True, timeout=600,
                           env={**os.environ, "OMP_NUM_THREADS": "1"})
    hits = misses = false_alarms = clean = 0
    sets = [(int(m.group(1)), p, m) for p in root.iterdir()
            if (m := re.fullmatch(r"set(\d+)_w(\d+)_slow(-?\d+)", p.name))]
    for _, directory, m in sorted(sets, key=lambda item: item[0]):
        slow = int(m.group(3))
        named, evidence = _named(directory)
        summary = "; ".join(f"least in {len(e['least_communication_in'])}/{len(e['steps'])} "
                            f"steps, gap {e['gap_ms']:g} of {e['median_step_ms']:g} ms"
                            for e in evidence)
        print(f"{directory.name}: named {named or 'nobody'} {summary}")
        if slow < 0:
            clean += 1
            false_alarms += bool(named)
        elif named == [f"rank {slow}"]:
            hits += 1
        else:
            misses += 1
    print(f"slowed runs: {hits} named right, {misses} not; clean runs: {false_alarms} of "
          f"{clean} named someone; load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
