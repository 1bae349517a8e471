"""One rank of a real 4-rank gloo job (``torchrun``) laid out as two nodes of two ranks
(``LOCAL_WORLD_SIZE=2``: leaders 0 and 2), in which one rank hangs on purpose; started by
test_hang_node_job.py.

Usage: ``hang_node_worker.py OUT_DIR CONFIG_JSON`` with CONFIG keys ``scenario`` (``stop``: the
rank stops its whole process with ``SIGSTOP``, its heartbeat threads too; ``data``: it blocks in
its data loading), ``rank`` (who hangs), ``step`` (when) and ``no_fallback`` (members never write
their own key: the test's control, what a job would read without the fallback).

Rank 0's ``on_hang`` writes ``report.json``; the hung rank writes ``hang_start.json`` first.
Once the report is there (or after ``deadline`` seconds) every live rank kills a stopped rank
and exits, so ``torchrun`` ends.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist

from laggard.integrations.monitor import TrainingMonitor
from laggard.integrations.tracer import CollectiveTracer


def watchdog(out: Path, deadline: float) -> None:
    """Exit once rank 0 has reported (or at the deadline), killing a stopped rank first."""
    end = time.monotonic() + deadline
    while time.monotonic() < end and not (out / "report.json").exists():
        time.sleep(0.1)
    try:
        start = json.loads((out / "hang_start.json").read_text())
        if start["scenario"] == "stop" and start["pid"] != os.getpid():
            os.kill(start["pid"], signal.SIGKILL)
    except (OSError, ValueError, KeyError):
        pass  # not hung yet, or already killed by another rank
    os._exit(0)


def main(out: Path, cfg: dict) -> None:
    rank = int(os.environ["RANK"])
    os.environ["LOCAL_RANK"] = str(rank % 2)  # two "nodes" of two ranks on this host
    os.environ["LOCAL_WORLD_SIZE"] = "2"
    dist.init_process_group("gloo")
    threading.Thread(target=watchdog, args=(out, cfg["deadline"]), daemon=True).start()
    tracer = CollectiveTracer()

    def on_hang(report) -> None:
        doc = {"time": time.time(), "ranks": list(report.ranks), "message": report.message,
               "culprits": [{"rank": c.rank, "kind": c.kind} for c in report.verdict.culprits]}
        (out / "report.tmp").write_text(json.dumps(doc))
        (out / "report.tmp").rename(out / "report.json")

    config = TrainingMonitor.Config(
        agent_address="", window_steps=5, run="node-test", hang_store_seconds=0.5,
        hang_seconds=3.0, on_hang=on_hang)
    monitor = TrainingMonitor(config, tracer=tracer)
    if cfg["no_fallback"] and monitor._heartbeat is not None:
        monitor._heartbeat.fallback_after = float("inf")
    for step in range(100_000):
        with monitor.step():
            with monitor.phase("data"):
                if rank == cfg["rank"] and step == cfg["step"]:
                    (out / "hang_start.json").write_text(json.dumps(
                        {"time": time.time(), "pid": os.getpid(), "scenario": cfg["scenario"]}))
                    if cfg["scenario"] == "stop":
                        os.kill(os.getpid(), signal.SIGSTOP)
                    time.sleep(3600)
                time.sleep(0.02)
            with monitor.phase("forward"):
                value = torch.ones(4)
                work = dist.all_reduce(value, async_op=True)
                tracer.track(work, "allreduce", None, value.nbytes)
                work.wait()


if __name__ == "__main__":
    main(Path(sys.argv[1]), json.loads(sys.argv[2]))
