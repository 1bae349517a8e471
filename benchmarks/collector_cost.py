"""Cost of the GPU collectors: CPU time of one sampling round for 8 fake GPUs, and of one scrape.

Round cost. The ``nvml`` collector samples 8 GPUs of the fake NVML module (the same calls a real
round makes). The fake's own cost is measured in the same run and subtracted: every NVML call of
one round is recorded (name and arguments), then replayed straight on the fake, without the
collector, and timed. What remains is laggard's own work (wrapping, unit conversion, families,
the throttle detector). The ``xid`` collector's round (a kernel-log file with nothing new) is
timed as well.

Targets (issue 3): under 1% of one core at a 1 s interval and under 10% at 0.1 s, i.e. under
10 ms of CPU per round; a scrape under 10 ms.

Scrape cost. In-process, the CPU time the agent's exporter takes to render ``/metrics`` after a
round of 8 fake GPUs (load-independent). Then a real
``laggard agent --collector.nvml.fake-gpus 8`` is started and ``/metrics`` fetched over HTTP
(wall time: includes waiting for a CPU on a loaded machine); the baseline, in the same run, is
the same agent with the GPU collectors switched off.

Usage: ``python benchmarks/collector_cost.py [--rounds 300] [--scrapes 200]``
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from typing import Any

from laggard.collectors.nvml import NvmlCollector
from laggard.collectors.xid import KernelLogSource, XidCollector
from laggard.demo.harness import free_port
from laggard.nvml.fake import FakeNvml
from laggard.nvml.library import NvmlLibrary

GPUS = 8


class Recorder:
    """Stands in for the NVML module and records every function call made through it."""

    def __init__(self, module: Any) -> None:
        self._module = module
        self.calls: list[tuple[str, tuple[Any, ...]]] = []

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._module, name)
        if not callable(attr) or isinstance(attr, type):
            return attr

        def record(*args: Any) -> Any:
            self.calls.append((name, args))
            return attr(*args)

        return record


def cpu_per_round(fn: Any, rounds: int) -> float:
    """Median CPU seconds of ``fn()`` over ``rounds`` calls (process CPU time)."""
    samples = []
    for _ in range(rounds):
        start = time.process_time_ns()
        fn()
        samples.append((time.process_time_ns() - start) / 1e9)
    return statistics.median(samples)


def round_cost(rounds: int) -> dict[str, float]:
    fake = FakeNvml(GPUS)
    fake.advance(12)  # inside a throttle episode: the detector does its work too
    collector = NvmlCollector(NvmlLibrary(fake))
    list(collector.collect())  # init, handles, first round

    def one_round() -> None:
        list(collector.collect())

    total = cpu_per_round(one_round, rounds)

    recorder = Recorder(fake)
    recording = NvmlCollector(NvmlLibrary(recorder))
    list(recording.collect())
    recorder.calls.clear()
    list(recording.collect())
    calls = [(getattr(fake, name), args) for name, args in recorder.calls]

    def replay() -> None:
        for function, args in calls:
            try:
                function(*args)
            except fake.NVMLError:  # NotSupported fields raise in the round as well
                pass

    fake_only = cpu_per_round(replay, rounds)

    with tempfile.NamedTemporaryFile("w", suffix=".log") as log:
        xid = XidCollector(kernel_log=KernelLogSource(log.name), library=None)
        xid.collect()
        xid_round = cpu_per_round(xid.collect, rounds)
    return {"round": total, "fake": fake_only, "laggard": max(total - fake_only, 0.0),
            "xid": xid_round, "calls": float(len(calls))}


def render_cost(rounds: int) -> tuple[float, float]:
    """CPU seconds to render /metrics in-process (the agent's exporter over a sampled round of
    8 fake GPUs), and the same without the GPU collector (baseline). Not disturbed by other
    processes' load, unlike the HTTP timing."""
    from prometheus_client import CollectorRegistry, generate_latest

    from laggard.agent.context import FindingLog
    from laggard.agent.exporter import AgentExporter
    from laggard.agent.sampler import CollectorThread

    def registry(threads: list[CollectorThread]) -> CollectorRegistry:
        reg = CollectorRegistry(auto_describe=False)
        reg.register(AgentExporter(threads, None, FindingLog(), "bench"))  # type: ignore[arg-type]
        return reg

    fake = FakeNvml(GPUS)
    fake.advance(12)
    thread = CollectorThread(NvmlCollector(NvmlLibrary(fake)), 1.0)
    thread.collect_once()
    with_gpus, without = registry([thread]), registry([])
    return (cpu_per_round(lambda: generate_latest(with_gpus), rounds),
            cpu_per_round(lambda: generate_latest(without), rounds))


def scrape_cost(scrapes: int, *flags: str) -> tuple[float, int]:
    """Median wall seconds of one GET /metrics from a real agent, and the body size."""
    port = free_port()
    cmd = [sys.executable, "-m", "laggard.cli", "agent", "--web.listen-address",
           f"127.0.0.1:{port}", "--intake.address", "", "--collector.interval", "1", *flags]
    agent = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             env={**os.environ, "PYTHONUNBUFFERED": "1"})
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        deadline = time.monotonic() + 20
        body = b""
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(url, timeout=2) as response:
                    body = response.read()
                if (flags and b"laggard_gpu_info" not in body
                        and "--collector.nvml.fake-gpus" in flags):
                    raise OSError("first GPU round not in yet")
                break
            except OSError:
                time.sleep(0.1)
        samples = []
        for _ in range(scrapes):
            start = time.perf_counter()
            with urllib.request.urlopen(url, timeout=5) as response:
                body = response.read()
            samples.append(time.perf_counter() - start)
        return statistics.median(samples), len(body)
    finally:
        agent.terminate()
        agent.wait(10)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--scrapes", type=int, default=200)
    args = parser.parse_args()

    cost = round_cost(args.rounds)
    print(f"nvml round, {GPUS} fake GPUs, {cost['calls']:.0f} NVML calls (median CPU):")
    print(f"  whole round          {cost['round'] * 1e3:8.3f} ms")
    print(f"  fake NVML alone      {cost['fake'] * 1e3:8.3f} ms   (replayed calls, baseline)")
    print(f"  laggard's own work   {cost['laggard'] * 1e3:8.3f} ms   "
          f"= {cost['laggard'] / cost['fake']:.2f} x the fake's cost")
    for interval, target in ((1.0, 0.01), (0.1, 0.10)):
        share = cost["laggard"] / interval
        print(f"  at {interval:>3} s interval: {share:7.3%} of one core "
              f"(target < {target:.0%}: ratio {share / target:.3f})")
    print(f"xid round, nothing new in the kernel log: {cost['xid'] * 1e3:.3f} ms CPU")

    render, render_base = render_cost(args.rounds)
    print(f"render /metrics in-process, {GPUS} fake GPUs: {render * 1e3:.3f} ms CPU "
          f"(target < 10 ms: ratio {render / 0.010:.3f}); without GPUs (baseline): "
          f"{render_base * 1e3:.3f} ms")
    gpu_scrape, gpu_bytes = scrape_cost(args.scrapes, "--collector.nvml.fake-gpus", str(GPUS))
    base_scrape, base_bytes = scrape_cost(args.scrapes, "--no-collector.nvml",
                                          "--no-collector.xid", "--no-collector.infiniband")
    print(f"scrape, agent with {GPUS} fake GPUs: {gpu_scrape * 1e3:.3f} ms median, "
          f"{gpu_bytes} bytes (target < 10 ms: ratio {gpu_scrape / 0.010:.3f})")
    print(f"scrape, same agent without GPU collectors (baseline): {base_scrape * 1e3:.3f} ms, "
          f"{base_bytes} bytes; ratio {gpu_scrape / base_scrape:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
