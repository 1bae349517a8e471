"""What one ``laggard healthcheck`` costs the node: wall time and CPU of the process NPD or slurmd
starts every interval, against the interpreter's own start measured in the same run.

A real ``laggard agent`` (``--gpus`` fake GPUs, a kernel log holding an Xid 79, so the verdict is
a problem and the whole path runs) on loopback; then, ``--runs`` times each, interleaved:
``python -c pass`` (the floor), ``laggard --version`` (the CLI's import), and
``laggard healthcheck`` (import, two HTTP requests, parse, judge). Medians of wall seconds and of
child CPU seconds (user + system, ``RUSAGE_CHILDREN``), and the healthcheck's ratios to the
floor. The load average is printed beside the figures.

Usage: ``python benchmarks/healthcheck_cost.py [--runs 15] [--gpus 8]``
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from laggard.demo.harness import free_port, wait_until_ready


def _timed(cmd: list[str]) -> tuple[float, float, int]:
    """(wall seconds, child CPU seconds, exit status) of one run of ``cmd``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, done.returncode


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--gpus", type=int, default=8)
    args = parser.parse_args()
    laggard = shutil.which("laggard") or str(Path(sys.executable).parent / "laggard")
    tmp = Path(tempfile.mkdtemp(prefix="laggard-hc-bench-"))
    kmsg = tmp / "kern.log"
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S+0000", time.gmtime(time.time() - 30))
    kmsg.write_text(f"{stamp} node01 kernel: NVRM: Xid (PCI:0000:91:00): 79, pid='<unknown>', "
                    "name=<unknown>, GPU has fallen off the bus.\n")
    port = free_port()
    agent = subprocess.Popen(
        [laggard, "agent", "--web.listen-address", f"127.0.0.1:{port}", "--intake.socket", "",
         "--path.kmsg", str(kmsg), "--collector.nvml.fake-gpus", str(args.gpus),
         "--collector.nvml.fake-gpus-scenario", "steady"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until_ready(f"http://127.0.0.1:{port}/metrics", timeout=30, what="agent",
                         procs=[agent])
        time.sleep(2)  # the first collector rounds
        commands = {
            "python -c pass": [sys.executable, "-c", "pass"],
            "laggard --version": [laggard, "--version"],
            "laggard healthcheck": [laggard, "healthcheck", "--agent",
                                    f"http://127.0.0.1:{port}"],
        }
        results: dict[str, list[tuple[float, float, int]]] = {name: [] for name in commands}
        for _ in range(args.runs):
            for name, cmd in commands.items():
                results[name].append(_timed(cmd))
    finally:
        agent.terminate()
        agent.wait()
        shutil.rmtree(tmp, ignore_errors=True)
    statuses = {r[2] for r in results["laggard healthcheck"]}
    print(f"load average {os.getloadavg()[0]:.2f} (1 min), {os.cpu_count()} CPUs, "
          f"{args.runs} runs each, {args.gpus} fake GPUs, healthcheck exit statuses {statuses}")
    floor_wall = statistics.median(r[0] for r in results["python -c pass"])
    floor_cpu = statistics.median(r[1] for r in results["python -c pass"])
    for name, runs in results.items():
        wall = statistics.median(r[0] for r in runs)
        cpu = statistics.median(r[1] for r in runs)
        print(f"{name:22s} wall {1e3 * wall:7.1f} ms ({wall / floor_wall:4.1f}x)  "
              f"cpu {1e3 * cpu:7.1f} ms ({cpu / floor_cpu:4.1f}x)")
    return 0 if statuses == {1} else 1


if __name__ == "__main__":
    sys.exit(main())
