"""Nothing lost at the agent's socket, on a real agent and 8 real sender processes: step records
batched at a high step rate arrive every one (counted end to end) through the kernel's default
queue (``net.unix.max_dgram_qlen``), and an overflow forced by stopping the agent is counted on
both sides and said once, as a warning, in each job's log and in the agent's."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from support import budget, start_agent, stop_agent, wait_for

RANKS = 8
RUN = "batch-e2e"

# One rank: AgentReports as the monitor drives it, a step every PERIOD seconds (the demo's
# ranks step every 16-28 ms: ENVIRONMENT.md); with a marker file, it stops after PHASE1 steps
# until the go file appears.
SENDER = r"""
import json, logging, os, sys, time
from laggard.integrations.agent_reports import AgentReports
from laggard.integrations.monitor_config import MonitorStats
from laggard.integrations.phases import StepTimes
from laggard.log_once import LogOnce
logging.basicConfig(stream=sys.stderr, format="%(levelname)s %(message)s")
path, rank, steps, phase1, marker, go, period = sys.argv[1:8]
rank, steps, phase1, period = int(rank), int(steps), int(phase1), float(period)
stats = MonitorStats()
reports = AgentReports(path, stats=stats, log_once=LogOnce(logging.getLogger("laggard")),
                       rank=rank, world_size=8, local_rank=rank, node="n0", run="batch-e2e",
                       device_id=None)
times = StepTimes(phases={"forward": 0.0005, "backward": 0.0004}, compute_seconds=0.0009,
                  data_seconds=0.0, collective_wait_seconds=0.0001,
                  collective_seconds=0.0001, comm_bytes=0.0, step_seconds=0.001)
for step in range(steps):
    if step == phase1 and marker:
        open(marker, "w").close()
        while not os.path.exists(go):
            time.sleep(0.01)
    reports.send_step(step, times, None)
    time.sleep(period)
reports.close()
print(json.dumps({"sent": stats.records_sent, "dropped": stats.send_dropped,
                  "errors": stats.send_errors, "batches": stats.batches_sent}))
"""


def _total(text: str, name: str, **labels: str) -> float:
    return sum(sample.value for family in text_string_to_metric_families(text)
               for sample in family.samples
               if sample.name == name and all(sample.labels.get(k) == v
                                              for k, v in labels.items()))


@pytest.fixture
def socket_dir() -> Iterator[Path]:
    directory = Path(tempfile.mkdtemp(prefix="laggard-batch-", dir="/tmp"))
    yield directory
    for child in directory.iterdir():
        child.unlink()
    directory.rmdir()


def _senders(path: Path, steps: int, period: float, phase1: int = 0,
             marker_dir: Path | None = None) -> list[subprocess.Popen[str]]:
    procs = []
    for rank in range(RANKS):
        marker = str(marker_dir / f"ready{rank}") if marker_dir else ""
        go = str(marker_dir / "go") if marker_dir else ""
        procs.append(subprocess.Popen(
            [sys.executable, "-c", SENDER, str(path), str(rank), str(steps), str(phase1),
             marker, go, str(period)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "LAGGARD_INTAKE": "", "LAGGARD_UDP_FALLBACK": ""}))
    return procs


def _results(procs: list[subprocess.Popen[str]]) -> list[tuple[dict, str]]:
    out = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=budget(60))
        assert proc.returncode == 0, stderr
        out.append((json.loads(stdout.strip().splitlines()[-1]), stderr))
    return out


@pytest.mark.slow
def test_eight_fast_ranks_lose_no_record_through_the_default_queue(socket_dir: Path) -> None:
    path = socket_dir / "intake.sock"
    # --intake.rank-histograms: the checks here read each rank's counters and progress
    # (laggard_steps_total...), outside the default series set since issue 34
    agent = start_agent("--intake.rank-histograms", "--intake.socket", str(path))
    steps = 300
    try:
        # twice the demo's step rate: 800 records a second into the kernel's default queue
        results = _results(_senders(path, steps, 0.01))
        for stats, stderr in results:
            assert stats == {"sent": steps, "dropped": 0, "errors": 0,
                             "batches": stats["batches"]}, stderr
            assert stats["batches"] > 0 and "dropped" not in stderr
        # every record of every rank arrived: counted end to end
        assert wait_for(lambda: _total(agent.scrape(), "laggard_steps_total", run=RUN)
                        == RANKS * steps, timeout=10)
        text = agent.scrape()
        assert _total(text, "laggard_intake_sender_dropped_total") == 0
        assert _total(text, "laggard_intake_rejected_total") == 0
    finally:
        stop_agent(agent)


@pytest.mark.slow
def test_an_overflow_is_counted_on_both_sides_and_warned_once(socket_dir: Path) -> None:
    path = socket_dir / "intake.sock"
    agent = start_agent("--intake.rank-histograms", "--intake.socket", str(path))
    # more batches per rank than the kernel's queue and the sender's backlog hold together
    steps, phase1 = 1700, 1500
    try:
        agent.proc.send_signal(signal.SIGSTOP)  # the agent reads nothing: its queue fills
        try:
            procs = _senders(path, steps, 0.0005, phase1, socket_dir)
            assert wait_for(lambda: all((socket_dir / f"ready{r}").exists()
                                        for r in range(RANKS)), timeout=60)
        finally:
            agent.proc.send_signal(signal.SIGCONT)
        (socket_dir / "go").touch()
        results = _results(procs)
        dropped = sum(stats["dropped"] for stats, _ in results)
        assert dropped > 0
        for stats, stderr in results:
            assert stats["sent"] + stats["dropped"] == steps and stats["errors"] == 0
            warnings = [line for line in stderr.splitlines() if "records dropped" in line]
            assert len(warnings) == (1 if stats["dropped"] else 0), stderr
            if warnings:
                assert warnings[0].startswith("WARNING")
                assert "sysctl -w net.unix.max_dgram_qlen=" in warnings[0]
        # the agent has every record sent and learnt of every one dropped from the batches
        assert wait_for(lambda: _total(agent.scrape(), "laggard_steps_total", run=RUN)
                        == sum(stats["sent"] for stats, _ in results), timeout=10)
        assert _total(agent.scrape(), "laggard_intake_sender_dropped_total") == dropped
    finally:
        _, out = stop_agent(agent)
    said = [line for line in out.splitlines() if "senders dropped records" in line]
    assert len(said) == 1 and "WARNING" in said[0], out
