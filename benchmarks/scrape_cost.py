"""A scrape of laggard's agent against one of node_exporter's, side by side in one run.

The agent serves 8 fake GPUs (``--collector.nvml.fake-gpus 8``) and one 8-rank run: 8 ranks'
step records (the demo's phases, an all-reduce each step, 200 steps), a window report with
their straggler scores and one heartbeat per rank, sent to its UDP intake before the
measurement. Debian's ``prometheus-node-exporter`` (its default collectors) runs beside it.
Both are scraped the way Prometheus 2.42 scrapes (its ``Accept`` header, ``Accept-Encoding:
gzip``), alternately, ``--scrapes`` times each, so both see the same machine load.

Per scrape: the median wall time of the request, and the CPU the server process spent on it:
its CPU (``/proc/PID/stat`` utime + stime) over the scraping phase, less its idle CPU rate
(measured for ``--idle`` seconds just before, with nothing scraping) times the phase's length,
divided by the scrapes. The ratios laggard / node_exporter are the figures (issue 34 target:
at most 1.0 for both).

Usage: ``python benchmarks/scrape_cost.py [--scrapes 300] [--idle 10]`` (needs
``prometheus-node-exporter`` on PATH, or ``--node-exporter PATH``)
"""

from __future__ import annotations

import argparse
import gzip
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
import urllib.request

from laggard.demo.harness import free_port
from laggard.wire import CollectiveTiming, Heartbeat, StepRecord, WindowReport

RANKS = 8
GPUS = 8
STEPS = 200
#: What Prometheus 2.42 sends (scrape/scrape.go, acceptHeader; gzip unless disabled).
ACCEPT = ("application/openmetrics-text;version=1.0.0,application/openmetrics-text;"
          "version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1")


def proc_cpu(pid: int) -> float:
    """CPU seconds (user + system) a process has used, from /proc/PID/stat."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def scrape(url: str) -> tuple[float, bytes]:
    """One scrape as Prometheus makes it: (wall seconds, the body unzipped)."""
    request = urllib.request.Request(url, headers={"Accept": ACCEPT,
                                                   "Accept-Encoding": "gzip"})
    start = time.perf_counter()
    with urllib.request.urlopen(request, timeout=10) as response:
        body = response.read()
        zipped = response.headers.get("Content-Encoding") == "gzip"
    elapsed = time.perf_counter() - start
    return elapsed, gzip.decompress(body) if zipped else body


def samples(body: bytes) -> int:
    return sum(1 for line in body.splitlines() if line and not line.startswith(b"#"))


def feed(port: int) -> None:
    """8 ranks of one run: step records, a window report, heartbeats (UDP, loopback)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for step in range(STEPS):
            for rank in range(RANKS):
                slow = 1.1 if rank == 2 else 1.0  # the demo's 10 % straggler
                record = StepRecord(
                    rank=rank, world_size=RANKS, step=step, local_rank=rank, node="bench",
                    run="bench", uuid=f"GPU-fa4e0000-0000-0000-0000-{rank:012d}",
                    phases={"data": 0.002, "forward": 0.010 * slow, "backward": 0.020 * slow,
                            "optimizer": 0.003},
                    collective_wait_seconds=0.008 / slow, step_seconds=0.045,
                    collectives=[CollectiveTiming("allreduce", 0.008, 4 << 20)],
                    comm={"total_seconds": 0.01, "exposed_seconds": 0.008,
                          "bytes": 4 << 20, "raw_bytes": 4 << 20})
                s.sendto(record.encode(), ("127.0.0.1", port))
            if step % 20 == 0:
                time.sleep(0.01)  # the intake's socket buffer: no burst of 1,600 at once
        report = WindowReport(step=STEPS - 1, world_size=RANKS, run="bench",
                              scores={r: 0.1 + (3.0 if r == 2 else 0.0) for r in range(RANKS)},
                              findings=[{"detector": "straggler", "kind": "compute",
                                         "severity": "warning", "rank": 2}],
                              detector_stats={"windows": 10})
        s.sendto(report.encode(), ("127.0.0.1", port))
        for rank in range(RANKS):
            beat = Heartbeat(rank=rank, world_size=RANKS, step=STEPS, pid=os.getpid(),
                             run="bench", phase="forward", phase_seconds=0.01)
            s.sendto(beat.encode(), ("127.0.0.1", port))


def wait_for(url: str, needle: bytes, seconds: float = 30) -> bytes:
    deadline = time.monotonic() + seconds
    while True:
        try:
            body = scrape(url)[1]
            if needle in body:
                return body
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise SystemExit(f"{url} never served {needle!r}")
        time.sleep(0.2)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scrapes", type=int, default=300)
    parser.add_argument("--idle", type=float, default=10.0)
    parser.add_argument("--node-exporter", default=shutil.which("prometheus-node-exporter"))
    args = parser.parse_args()
    if not args.node_exporter:
        print("prometheus-node-exporter not found (apt-get install prometheus-node-exporter)")
        return 2
    agent_port, intake_port, ne_port = free_port(), free_port(), free_port()
    agent = subprocess.Popen(
        [sys.executable, "-m", "laggard.cli", "agent", "--web.listen-address",
         f"127.0.0.1:{agent_port}", "--intake.socket", "", "--intake.address",
         f"127.0.0.1:{intake_port}", "--collector.nvml.fake-gpus", str(GPUS)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    node_exporter = subprocess.Popen(
        [args.node_exporter, f"--web.listen-address=127.0.0.1:{ne_port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    urls = {"laggard": f"http://127.0.0.1:{agent_port}/metrics",
            "node_exporter": f"http://127.0.0.1:{ne_port}/metrics"}
    pids = {"laggard": agent.pid, "node_exporter": node_exporter.pid}
    try:
        wait_for(urls["laggard"], b"laggard_gpu_info")
        feed(intake_port)
        wait_for(urls["laggard"], b'laggard_straggler_score{')
        wait_for(urls["node_exporter"], b"node_cpu_seconds_total")
        bodies = {name: scrape(url)[1] for name, url in urls.items()}
        load0 = os.getloadavg()[0]
        cpu0 = {name: proc_cpu(pid) for name, pid in pids.items()}
        wall0 = time.monotonic()
        time.sleep(args.idle)
        idle_wall = time.monotonic() - wall0
        idle_rate = {name: (proc_cpu(pid) - cpu0[name]) / idle_wall
                     for name, pid in pids.items()}
        walls: dict[str, list[float]] = {name: [] for name in urls}
        cpu1 = {name: proc_cpu(pid) for name, pid in pids.items()}
        wall1 = time.monotonic()
        for _ in range(args.scrapes):
            for name, url in urls.items():
                walls[name].append(scrape(url)[0])
        phase = time.monotonic() - wall1
        per_scrape = {name: max(proc_cpu(pid) - cpu1[name] - idle_rate[name] * phase, 0.0)
                      / args.scrapes for name, pid in pids.items()}
        load1 = os.getloadavg()[0]
    finally:
        for process in (agent, node_exporter):
            process.terminate()
            process.wait(10)
    print(f"{args.scrapes} scrapes each, alternating, as Prometheus 2.42 asks (gzip); "
          f"load {load0:.1f} -> {load1:.1f}")
    for name in urls:
        print(f"  {name:14s} {samples(bodies[name]):5d} samples, {len(bodies[name]):7d} bytes: "
              f"median {statistics.median(walls[name]) * 1e3:7.3f} ms wall, "
              f"{per_scrape[name] * 1e3:7.3f} ms CPU per scrape "
              f"(idle {idle_rate[name]:.3%} of a core)")
    wall_ratio = statistics.median(walls["laggard"]) / statistics.median(walls["node_exporter"])
    cpu_ratio = per_scrape["laggard"] / per_scrape["node_exporter"]
    print(f"  laggard / node_exporter: median wall {wall_ratio:.2f}x, CPU per scrape "
          f"{cpu_ratio:.2f}x (target <= 1.0)")
    gpu = sum(1 for line in bodies["laggard"].splitlines()
              if line.startswith(b"laggard_gpu_") and b'gpu="' in line)
    print(f"  laggard's per-GPU samples: {gpu} for {GPUS} GPUs = {gpu / GPUS:.1f} per GPU "
          f"(target <= 26)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
