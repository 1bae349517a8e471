"""End to end against a real Prometheus: LaggardJobHung names the rank a hung job waits for.

A real ``laggard agent`` receives, on its real UDP intake, what the ranks of two runs send:
step records and heartbeats while they train, then heartbeats only once they hang. In run
``hang-missing`` ranks 0-2 issue allreduce #101 of their data-parallel group and wait in it,
rank 3 never issues it (nothing pending: hung in its data loader); in run ``hang-silent``
rank 1's heartbeats stop while its process (this test's, whose pid the heartbeats carry) lives.
Debian's ``prometheus`` scrapes the agent every second with laggard's rule files loaded (the
shipped expressions; ``for:`` cut to 2 s) and must fire LaggardJobHung for rank 3 (missing, with
the group and the op) and rank 1 (silent), for no other rank, and for nothing while the runs
train. Prometheus is stopped by its pid whatever happens.
"""

from __future__ import annotations

import os
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import AgentProcess, budget, start_agent, stop_agent

from laggard.demo.harness import PrometheusServer, laggard_rules
from laggard.wire import GroupProgress, Heartbeat, StepRecord

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(120),
    pytest.mark.skipif(shutil.which("prometheus") is None,
                       reason="prometheus missing: apt-get install prometheus"),
]

GROUP = "g0[0,1,2,3]"
#: How long the alert may take once the job hangs, at a 1 s scrape and rule interval: the
#: agent's 5 s stall threshold, the 10 s of silence for a silent rank, scrapes and ``for: 2s``
#: (idle-machine seconds, ``budget``-ed by the load).
FIRE_DEADLINE_S = 40.0


@pytest.fixture
def agent() -> Iterator[AgentProcess]:
    agent = start_agent("--no-collector.nvml", "--no-collector.xid", "--collector.interval", "0.5")
    try:
        yield agent
    finally:
        stop_agent(agent)


@pytest.fixture
def prometheus(agent: AgentProcess, tmp_path: Path) -> Iterator[PrometheusServer]:
    with PrometheusServer(tmp_path, [f"127.0.0.1:{agent.port}"], interval_s=1.0,
                          rules=laggard_rules(alert_for="2s")) as server:
        yield server


class Job:
    """Sends what two runs' ranks send, 10 steps a second, until :meth:`hang`."""

    def __init__(self, intake_port: int) -> None:
        self._address = ("127.0.0.1", intake_port)
        self._stop = threading.Event()
        self.hung = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Job:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        pid = os.getpid()
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            step = 0
            while not self._stop.is_set():
                hung = self.hung.is_set()
                for rank in range(4):
                    if not hung:
                        sock.sendto(StepRecord(rank=rank, world_size=4, step=step,
                                               run="hang-missing", step_seconds=0.1).encode(),
                                    self._address)
                        issued = completed = step
                    else:
                        issued, completed = (101, 100) if rank < 3 else (100, 100)
                    groups = [GroupProgress(GROUP, issued=issued, completed=completed,
                                            op="allreduce", issued_age_seconds=0.05)]
                    phase = "collective_wait" if rank < 3 or not hung else "data"
                    sock.sendto(Heartbeat(rank=rank, world_size=4, step=step, pid=pid,
                                          run="hang-missing", phase=phase, phase_seconds=0.05,
                                          step_seconds=0.1, groups=groups).encode(),
                                self._address)
                for rank in range(2):
                    if not hung:
                        sock.sendto(StepRecord(rank=rank, world_size=2, step=step,
                                               run="hang-silent", step_seconds=0.1).encode(),
                                    self._address)
                    if not hung or rank == 0:
                        sock.sendto(Heartbeat(rank=rank, world_size=2, step=step, pid=pid,
                                              run="hang-silent", phase="forward").encode(),
                                    self._address)
                if not hung:
                    step += 1
                self._stop.wait(0.1)


def _firing(prom: PrometheusServer) -> set[tuple[str, str, str, str, str]]:
    return {(a["labels"]["run"], a["labels"]["rank"], a["labels"]["kind"],
             a["labels"].get("group", ""), a["labels"].get("op", ""))
            for a in prom.alerts()
            if a["labels"]["alertname"] == "LaggardJobHung" and a["state"] == "firing"}


def _ever_fired(prom: PrometheusServer) -> bool:
    return bool(prom.query('max_over_time(ALERTS{alertname="LaggardJobHung"}[10m])'))


def test_the_hung_jobs_culprits_are_named_by_prometheus(
    agent: AgentProcess, prometheus: PrometheusServer
) -> None:
    with Job(agent.intake_port) as job:
        # Training: scraped a few times, heartbeats of every rank, nothing stalled.
        started = time.monotonic()
        # (group progress is exported while a rank is stalled: none yet, issue 34)
        while not prometheus.query('laggard_rank_heartbeat_age_seconds{run="hang-missing"}'):
            assert time.monotonic() - started < budget(30), "no heartbeat series reached Prometheus"
            time.sleep(0.5)
        time.sleep(8)
        assert not _ever_fired(prometheus), "LaggardJobHung fired while the job trained"
        job.hung.set()
        hung_at = time.monotonic()
        expected = {("hang-missing", "3", "missing", GROUP, "allreduce"),
                    ("hang-silent", "1", "silent", "", "")}
        while _firing(prometheus) != expected:
            assert time.monotonic() - hung_at < budget(FIRE_DEADLINE_S), _firing(prometheus)
            time.sleep(0.5)
        named_after = time.monotonic() - hung_at
        print(f"LaggardJobHung named both culprits {named_after:.1f} s after the hang")
        # The alert's value is the seconds the waiting ranks have been stalled.
        (alert,) = [a for a in prometheus.alerts() if a["labels"].get("kind") == "missing"]
        assert "rank 3 never issued the allreduce its peers wait in" in \
            alert["annotations"]["summary"]
        assert 5 <= float(alert["value"]) <= named_after + 6
        # The ranks that wait are never named.
        ranks = {(a["metric"]["run"], a["metric"]["rank"]) for a in prometheus.query(
            'ALERTS{alertname="LaggardJobHung"}')}
        assert ranks == {("hang-missing", "3"), ("hang-silent", "1")}
    # Every rule evaluated on real data without an error (a many-to-many match, a duplicate
    # series): Prometheus logs those at warn.
    log = prometheus.log_path.read_text(errors="replace")
    assert "Evaluating rule failed" not in log, log[-3000:]
