"""A real agent keeps a stopped rank visible while it lives, and forgets it once it exits.

A real ``laggard agent`` with its Unix-socket intake (the kernel names each sender's pid) and a
short rank TTL; the ranks are real processes sending real datagrams on that socket: step
records, then heartbeats only (a hung training thread), then nothing (the GIL held), then they
exit. The series must outlive the old TTL while the process lives and go once it has exited.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from support import AgentProcess, budget, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

TTL_S = 3.0
RUN = "stall-run"

#: A training rank's datagrams, on command: ``beat`` heartbeats every 0.2 s (steps stopped),
#: ``quiet`` stops them (the process stays), ``exit`` ends it without a goodbye.
SENDER = r"""
import os, socket, sys, threading, time
from laggard.wire import GroupProgress, Heartbeat, StepRecord
path, rank, world = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
run = "stall-run"
for step in range(5):
    sock.sendto(StepRecord(rank=rank, world_size=world, step=step, run=run,
                           step_seconds=0.05).encode(), path)
beating = threading.Event()
def beat():
    while True:
        if beating.is_set():
            groups = [GroupProgress("g0[0,1]", issued=101 if rank == 0 else 100,
                                    completed=100, op="allreduce", issued_age_seconds=0.5)]
            sock.sendto(Heartbeat(rank=rank, world_size=world, step=5, run=run,
                                  pid=os.getpid(), phase="collective_wait",
                                  phase_seconds=1.0, groups=groups).encode(), path)
        time.sleep(0.2)
threading.Thread(target=beat, daemon=True).start()
print("ready", flush=True)
for line in sys.stdin:
    command = line.strip()
    if command == "beat":
        beating.set()
    elif command == "quiet":
        beating.clear()
    elif command == "exit":
        os._exit(0)
    print("ok", command, flush=True)
"""


class Rank:
    """One sender process, driven through its stdin."""

    def __init__(self, socket_path: Path, rank: int, world: int = 2) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", SENDER, str(socket_path), str(rank), str(world)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None and self.proc.stdout.readline() == "ready\n"

    def command(self, text: str) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(text + "\n")
        self.proc.stdin.flush()
        if text != "exit":
            assert self.proc.stdout.readline() == f"ok {text}\n"
        else:
            self.proc.wait(timeout=budget(10))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def _samples(agent: AgentProcess, name: str, rank: int) -> list:
    return [s for f in text_string_to_metric_families(agent.scrape()) for s in f.samples
            if s.name == name and s.labels.get("run") == RUN and s.labels.get("rank") == str(rank)]


def _value(agent: AgentProcess, name: str, rank: int) -> float | None:
    found = _samples(agent, name, rank)
    return found[0].value if found else None


def _state(agent: AgentProcess, rank: int) -> str | None:
    found = _samples(agent, "laggard_rank_process_state", rank)
    return found[0].labels["state"] if found else None


def _forgotten(agent: AgentProcess, reason: str) -> float | None:
    for family in text_string_to_metric_families(agent.scrape()):
        for s in family.samples:
            if s.name == "laggard_intake_ranks_forgotten_total" and \
                    s.labels.get("reason") == reason:
                return s.value
    return None


def test_a_stopped_rank_stays_while_it_lives_and_goes_when_it_exits(agent_factory, tmp_path):
    socket_path = tmp_path / "intake.sock"
    # --intake.rank-histograms: the checks here read each rank's counters and progress
    # (laggard_steps_total...), outside the default series set since issue 34
    agent = agent_factory("--intake.rank-histograms",
                          "--intake.socket", str(socket_path), "--intake.rank-ttl", str(TTL_S),
                          "--intake.stall-seconds", "1")
    hung, silent = Rank(socket_path, 0), Rank(socket_path, 1)
    try:
        assert wait_for(lambda: _value(agent, "laggard_steps_total", 1) == 5)
        hung.command("beat")
        silent.command("beat")
        assert wait_for(lambda: _value(agent, "laggard_rank_heartbeat_age_seconds", 1) is not None)
        silent.command("quiet")
        # Two TTLs without a step: rank 0 still beats, rank 1 is silent but alive.
        time.sleep(2 * TTL_S)
        for rank in (0, 1):
            assert _value(agent, "laggard_steps_total", rank) == 5, rank
            assert _state(agent, rank) == "alive", rank
            assert _value(agent, "laggard_rank_stalled_seconds", rank) > TTL_S, rank
        assert _value(agent, "laggard_rank_heartbeat_age_seconds", 0) < 1.5
        assert _value(agent, "laggard_rank_heartbeat_age_seconds", 1) > 2 * TTL_S - 1
        assert [s.value for s in _samples(agent, "laggard_rank_collective_issued", 0)] == [101]
        inflight = _samples(agent, "laggard_rank_collective_inflight_seconds", 0)
        assert [s.labels["op"] for s in inflight] == ["allreduce"]
        # The silent rank's process exits without a goodbye: it was last heard long ago, so it
        # goes at the agent's next look at its process (once a second).
        silent.command("exit")
        assert wait_for(lambda: _value(agent, "laggard_steps_total", 1) is None, timeout=5)
        assert _forgotten(agent, "exited") == 1
        # The beating rank exits: it stays for the TTL after its last heartbeat, then goes.
        hung.command("exit")
        exited_at = time.monotonic()
        assert wait_for(lambda: _state(agent, 0) == "exited", timeout=5)
        assert _value(agent, "laggard_rank_stalled_seconds", 0) == 0  # gone is not hung
        assert wait_for(lambda: _value(agent, "laggard_steps_total", 0) is None, timeout=10)
        assert time.monotonic() - exited_at > TTL_S - 1.5
        assert _forgotten(agent, "exited") == 2
        assert _forgotten(agent, "stale") is None  # none: the series comes with the first
    finally:
        hung.stop()
        silent.stop()
    assert agent.proc.poll() is None
