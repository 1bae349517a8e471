"""Cost of GPU sampling: CPU of the ``nvml`` collector for 8 fake GPUs at 1 s and at 0.1 s.

**In-process (load-independent).** The collector runs on a fake clock, so every round is timed
in CPU and nothing waits. At ``--collector.nvml.interval 0.1`` a second of sampling is nine
fast rounds (each GPU's SM clock and clock-event reasons: two NVML calls) and one full round
(every field, one ``nvmlDeviceGetFieldValues`` batch per GPU, the families built and rendered
to text once); at 1 s it is one full round. The fake NVML's own cost is measured in the same
run and subtracted: every NVML call of the rounds is recorded (name and arguments), then
replayed straight on the fake, without the collector, and timed. What remains is laggard's
own work. The real NVML's cost per call stays for a GPU machine to measure.

**A real agent (wall clock, shares the machine).** ``laggard agent --collector.nvml.fake-gpus
8`` runs for ``--seconds`` with the nvml collector at 1 s, then at 0.1 s; its process CPU
(``/proc/PID/stat`` utime + stime) per wall second is compared, and the ratio printed.

Targets (issue 34): 8 fake GPUs at 0.1 s under 1 % of a core.

Usage: ``python benchmarks/collector_cost.py [--seconds 300] [--agent-seconds 30]``
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from typing import Any

from laggard.agent.sampler import render_each
from laggard.collectors.nvml import NvmlCollector
from laggard.demo.harness import free_port
from laggard.nvml.fake import FakeNvml
from laggard.nvml.library import NvmlLibrary

GPUS = 8
FAST_PER_SECOND = 9  # at 0.1 s: nine fast rounds and one full round per second


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


class Clock:
    """A fake monotonic clock the benchmark moves by hand."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def cpu_seconds(fn: Any, repeats: int) -> float:
    """Mean CPU seconds (process time) of ``fn()`` over ``repeats`` calls."""
    start = time.process_time_ns()
    for _ in range(repeats):
        fn()
    return (time.process_time_ns() - start) / 1e9 / repeats


def sampling_cost(seconds: int, interval: float) -> dict[str, float]:
    """CPU per simulated second of sampling 8 fake GPUs at ``interval`` (1.0 or 0.1), with
    the rendering the agent does once per full round, and the fake's share of it."""
    fake = FakeNvml(GPUS)
    fake.advance(12)  # inside a throttle episode: the detector and the reasons do their work
    clock = Clock()
    recorder = Recorder(fake)
    collector = NvmlCollector(NvmlLibrary(recorder), clock=clock, interval=interval)
    rendered: list[object] = [None]

    def one_round() -> None:
        families = collector.collect()
        if families is not rendered[0]:  # what the agent's sampler does: render new ones only
            render_each(families)
            rendered[0] = families
        clock.now += interval

    one_round()  # init, handles, identity
    recorder.calls.clear()
    rounds = round(seconds / interval)
    total = cpu_seconds(one_round, rounds) * rounds / seconds
    calls = [(getattr(fake, name), args) for name, args in recorder.calls]

    def replay() -> None:
        for function, args in calls:
            try:
                function(*args)
            except fake.NVMLError:  # NotSupported fields raise in the round as well
                pass

    fake_only = cpu_seconds(replay, 3) / seconds
    return {"total": total, "fake": fake_only, "laggard": max(total - fake_only, 0.0),
            "calls_per_second": len(calls) / seconds}


def proc_cpu(pid: int) -> float:
    """CPU seconds (user + system) a process has used, from /proc/PID/stat."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def agent_cpu(seconds: float, *flags: str) -> float:
    """Share of one core a real agent with 8 fake GPUs uses over ``seconds`` of wall time,
    after 3 s of start-up."""
    port = free_port()
    cmd = [sys.executable, "-m", "laggard.cli", "agent", "--web.listen-address",
           f"127.0.0.1:{port}", "--intake.socket", "", "--collector.nvml.fake-gpus", str(GPUS),
           *flags]
    agent = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(3)
        cpu0, wall0 = proc_cpu(agent.pid), time.monotonic()
        time.sleep(seconds)
        return (proc_cpu(agent.pid) - cpu0) / (time.monotonic() - wall0)
    finally:
        agent.terminate()
        agent.wait(10)


def load() -> str:
    return f"load {os.getloadavg()[0]:.1f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=300,
                        help="simulated seconds of sampling timed in-process")
    parser.add_argument("--agent-seconds", type=float, default=30,
                        help="wall seconds each real agent is measured (0: skip)")
    args = parser.parse_args()

    print(f"in-process, {GPUS} fake GPUs, CPU per second of sampling ({load()}):")
    costs = {}
    for interval in (1.0, 0.1):
        cost = costs[interval] = sampling_cost(args.seconds, interval)
        print(f"  interval {interval:>3} s: {cost['calls_per_second']:6.0f} NVML calls/s; "
              f"whole {cost['total']:7.3%} of a core, fake NVML alone {cost['fake']:7.3%}, "
              f"laggard's own {cost['laggard']:7.3%}")
    share = costs[0.1]["laggard"]
    print(f"  0.1 s / 1 s (laggard's own): {share / costs[1.0]['laggard']:.2f}x; "
          f"0.1 s against the 1 % target: ratio {share / 0.01:.3f}")
    if args.agent_seconds > 0:
        one = agent_cpu(args.agent_seconds)
        fast = agent_cpu(args.agent_seconds, "--collector.nvml.interval", "0.1")
        print(f"real agent, {GPUS} fake GPUs, every default collector, process CPU "
              f"({load()}):")
        print(f"  nvml at 1 s: {one:7.3%} of a core; nvml at 0.1 s: {fast:7.3%}; "
              f"ratio {fast / one:.2f}x (the 0.1 s agent's increase: {fast - one:7.3%})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
