"""Series a node agent exports: per rank, per GPU and per node, by default and with
``--intake.rank-histograms`` (issue 34: a node with 8 GPUs and one 8-rank job at most 400).

A real ``laggard agent --collector.nvml.fake-gpus 8`` is started and 8 ranks of one run send it
what a training job's monitors send, as real intake datagrams encoded by :mod:`laggard.wire`:
a StepRecord per rank per step (the demo's phases ``data``, ``forward``, ``backward`` and
``optimizer``, the collective wait, one all-reduce, the communication summary, the rank's GPU),
a heartbeat per rank per step (one process group), and rank 0's WindowReport with every rank's
score and a straggler finding on rank 3. ``/metrics`` is then scraped and each sample put in one
bucket: a sample with a ``rank`` label is the rank's, one with a ``gpu`` label (and no rank) the
GPU's, any other the node's (host, network, the agent itself, the run's aggregates).

The baseline, in the same run, is the same agent with ``--intake.rank-histograms`` (the
per-rank histograms and detail the agent exported by default before issue 34); the issue's
figures for main before it (145 per rank, 43.5 per GPU, 1,635 per node, with the demo's
traffic) are printed beside them.

Usage: ``python benchmarks/series_budget.py [--ranks 8] [--gpus 8] [--steps 40]``
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from laggard.demo.harness import free_port
from laggard.wire import CollectiveTiming, GroupProgress, Heartbeat, StepRecord, WindowReport

#: Issue 34's figures for main before it: an 8-GPU node with one 8-rank demo job.
BEFORE = {"rank": 145.0, "gpu": 43.5, "node": 1635.0}
#: The issue's targets.
TARGETS = {"rank": 12, "gpu": 26, "node": 400}
#: The run the ranks report for.
RUN = "budget"
#: Rank that runs slow (a compute straggler the WindowReport names).
SLOW_RANK = 3


def fake_uuid(gpu: int) -> str:
    """The UUID the fake NVML (:class:`laggard.nvml.fake.FakeNvml`) gives GPU ``gpu``."""
    from laggard.nvml.fake import FakeNvml

    nvml = FakeNvml(gpus=gpu + 1)
    nvml.nvmlInit()
    return str(nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(gpu)))


def rank_datagrams(ranks: int, steps: int) -> Iterator[bytes]:
    """The datagrams ``ranks`` ranks of one run send over ``steps`` steps (see the module
    docstring), in the order they would arrive; rank r runs on GPU r."""
    uuids = [fake_uuid(r) for r in range(ranks)]
    pid = os.getpid()
    for step in range(steps):
        for rank in range(ranks):
            slow = 1.1 if rank == SLOW_RANK else 1.0
            forward, backward = 0.030 * slow, 0.060 * slow
            wait = 0.020 if rank == SLOW_RANK else 0.029
            yield StepRecord(
                rank=rank, world_size=ranks, step=step, local_rank=rank, run=RUN,
                phases={"data": 0.004, "forward": forward, "backward": backward,
                        "optimizer": 0.010},
                collective_wait_seconds=wait, step_seconds=0.135,
                collectives=[CollectiveTiming("allreduce", 0.025, 4 << 20)],
                comm={"total_seconds": 0.025, "exposed_seconds": wait, "bytes": 4 << 20,
                      "raw_bytes": 4 << 20},
                uuid=uuids[rank]).encode()
            yield Heartbeat(rank=rank, world_size=ranks, step=step + 1, run=RUN, pid=pid,
                            phase="forward", phase_seconds=0.01, step_seconds=0.135,
                            groups=[GroupProgress("default_pg", issued=step + 1,
                                                  completed=step + 1, op="allreduce")]).encode()
        if step % 10 == 9:
            yield WindowReport(
                step=step, world_size=ranks, run=RUN,
                scores={r: (0.1 if r == SLOW_RANK else 0.0) for r in range(ranks)},
                active=[{"detector": "straggler", "kind": "compute", "severity": "warning",
                         "rank": SLOW_RANK}],
                # as StragglerDetector.stats: every kind, most of them 0
                detector_stats={"windows": step // 10 + 1, "malformed_windows": 0,
                                "missing_rank_reports": 0, "invalid_durations": 0}).encode()


def send(port: int, datagrams: Iterator[bytes]) -> int:
    """Send ``datagrams`` to the agent's UDP intake on loopback ``port``; how many were sent."""
    sent = 0
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for payload in datagrams:
            s.sendto(payload, ("127.0.0.1", port))
            sent += 1
            if sent % 64 == 0:
                time.sleep(0.005)  # the intake's socket buffer is not the subject here
    return sent


@dataclass(frozen=True)
class SeriesCount:
    """Samples of one exposition, by owner.

    Attributes:
        rank: samples with a ``rank`` label, by family.
        gpu: samples with a ``gpu`` label and no ``rank``, by family.
        node: every other sample, by family.
    """

    rank: Counter[str]
    gpu: Counter[str]
    node: Counter[str]

    @property
    def total(self) -> int:
        """Every sample of the exposition."""
        return sum(self.rank.values()) + sum(self.gpu.values()) + sum(self.node.values())


def count_series(exposition: str) -> SeriesCount:
    """Put each sample of a ``/metrics`` text in one bucket (see :class:`SeriesCount`)."""
    rank: Counter[str] = Counter()
    gpu: Counter[str] = Counter()
    node: Counter[str] = Counter()
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            if "rank" in sample.labels:
                rank[family.name] += 1
            elif "gpu" in sample.labels:
                gpu[family.name] += 1
            else:
                node[family.name] += 1
    return SeriesCount(rank, gpu, node)


def scrape(port: int) -> str:
    """``/metrics`` of the agent on loopback ``port``."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as response:
        return response.read().decode()


def agent_command(port: int, intake_port: int, gpus: int, *extra: str) -> list[str]:
    """``laggard agent`` with ``gpus`` fake GPUs, its UDP intake on ``intake_port``."""
    return [sys.executable, "-m", "laggard.cli", "agent",
            "--web.listen-address", f"127.0.0.1:{port}",
            "--intake.address", f"127.0.0.1:{intake_port}", "--intake.socket", "",
            "--collector.nvml.fake-gpus", str(gpus), *extra]


def settled(scrape_text: Callable[[], str], sent: int, timeout: float) -> str:
    """The first exposition from ``scrape_text`` in which the agent has taken all ``sent``
    datagrams and sampled its GPUs.

    Raises:
        RuntimeError: not within ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while True:
        text = scrape_text()
        families = {f.name: f for f in text_string_to_metric_families(text)}
        accepted = families["laggard_intake_datagrams"].samples[0].value
        if accepted >= sent and "laggard_gpu_sm_clock_hertz" in families:
            return text
        if time.monotonic() > deadline:
            raise RuntimeError(f"the agent took {accepted} of {sent} datagrams")
        time.sleep(0.2)


def measure(ranks: int, gpus: int, steps: int, *extra: str) -> SeriesCount:
    """Start an agent with ``extra`` flags, send it ``steps`` steps of ``ranks`` ranks, wait
    until every rank's records are in and the GPUs sampled, count its exposition."""
    port, intake_port = free_port(), free_port(socket.SOCK_DGRAM)
    proc = subprocess.Popen(agent_command(port, intake_port, gpus, *extra),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                scrape(port)
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("the agent did not start") from None
                time.sleep(0.2)
        sent = send(intake_port, rank_datagrams(ranks, steps))
        return count_series(settled(lambda: scrape(port), sent, timeout=120))
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _line(what: str, count: SeriesCount, ranks: int, gpus: int) -> str:
    per_rank = sum(count.rank.values()) / ranks
    per_gpu = sum(count.gpu.values()) / gpus
    return f"{what:<34} {per_rank:9.1f} {per_gpu:8.1f} {count.total:9d}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--families", action="store_true",
                        help="list the default set's samples by family")
    args = parser.parse_args()
    default = measure(args.ranks, args.gpus, args.steps)
    detail = measure(args.ranks, args.gpus, args.steps, "--intake.rank-histograms")
    print(f"load: {os.getloadavg()[0]:.1f} (1-minute average)")
    print(f"{'':<34} {'per rank':>9} {'per GPU':>8} {'per node':>9}")
    print(f"{'main before issue 34 (the issue)':<34} {BEFORE['rank']:9.1f} "
          f"{BEFORE['gpu']:8.1f} {BEFORE['node']:9.0f}")
    print(_line("--intake.rank-histograms", detail, args.ranks, args.gpus))
    print(_line("default", default, args.ranks, args.gpus))
    print(f"{'target':<34} {TARGETS['rank']:9d} {TARGETS['gpu']:8d} {TARGETS['node']:9d}")
    per_rank = sum(default.rank.values()) / args.ranks
    print(f"default / before: per rank {per_rank / BEFORE['rank']:.3f}, per node "
          f"{default.total / BEFORE['node']:.3f}; default / --intake.rank-histograms: per rank "
          f"{sum(default.rank.values()) / max(1, sum(detail.rank.values())):.3f}, per node "
          f"{default.total / detail.total:.3f}")
    rank_and_node = sum(default.rank.values()) + sum(default.node.values())
    print(f"default, ranks + node (neither rank nor GPU): {rank_and_node}; with each GPU at "
          f"its budget of {TARGETS['gpu']}: {rank_and_node + args.gpus * TARGETS['gpu']} "
          f"(target {TARGETS['node']})")
    if args.families:
        for bucket in ("rank", "gpu", "node"):
            for name, n in getattr(default, bucket).most_common():
                print(f"  {bucket:<5} {name:<52} {n}")


if __name__ == "__main__":
    main()
