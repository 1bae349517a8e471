"""Prometheus past one server, end to end: two shards, a global receiver, four real agents.

Four ``laggard agent --collector.nvml.fake-gpus 2`` processes on loopback receive the per-step
records of two runs (datagrams on their real UDP intakes, as ``TrainingMonitor`` sends them):
run ``sharded-run``, 8 ranks, two per agent, whose rank 5 computes 1.3x the others and which
the in-job detector's WindowReports (sent to rank 0's agent) name; and run ``quiet-run``, 4
ranks, one per agent, none slow. Three of Debian's ``prometheus`` servers run the
configurations :func:`laggard.dashboards.shards.render` writes: two shards that list all four
agents and keep, by hashmod on ``__address__``, those that hash to them, with the per-node rules,
remote-writing to a third started with ``--web.enable-remote-write-receiver`` that evaluates the
per-run rules. Then:

- each agent is scraped by exactly one shard, the one Prometheus's hashmod (MD5 of the address,
  its last 8 bytes mod N) names, and each shard scrapes two of them (rank 0's agent and the slow
  rank's on different shards, so the verdict and the slow rank's series cross the shards);
- on the receiver ``LaggardStragglerDetected`` (the in-job verdict) and ``LaggardStragglerRank``
  (the cross-node recording-rule comparison: each shard's per-rank means, their run median on
  the receiver) fire for run ``sharded-run`` and rank 5, for no other rank and not for
  ``quiet-run``; no shard evaluates either;
- the receiver holds only what the shards send: no GPU clock series.

``for:`` durations are cut to 0 in copies of the rule files, as in test_prometheus_e2e: the
expressions are the generated ones. Every wait polls the servers' HTTP APIs, bounded by
``budget``. Servers and agents are stopped by their pids however the test ends.
"""

from __future__ import annotations

import hashlib
import random
import re
import shutil
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
import yaml
from support import (
    AgentProcess,
    DatagramSender,
    budget,
    start_agent,
    stop_agent,
    straggler_report,
)

from laggard.dashboards.shards import GLOBAL_RULES_FILE, SHARD_RULES_FILE, render
from laggard.demo.harness import PrometheusServer
from laggard.wire import StepRecord

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(300),
    pytest.mark.skipif(shutil.which("prometheus") is None,
                       reason="prometheus missing: apt-get install prometheus"),
]

SHARDS = 2
AGENTS_PER_SHARD = 2
#: Agents started at most while looking for two per shard (each lands on a shard with
#: probability 1/2: eight starts leave a shard short with probability under 4 %; sixteen, 0.2 %).
MAX_AGENT_STARTS = 16
RUN, RUN_WORLD, SLOW_RANK, SLOWDOWN = "sharded-run", 8, 5, 1.3
QUIET_RUN, QUIET_WORLD = "quiet-run", 4


def hashmod_shard(address: str, modulus: int) -> int:
    """The shard Prometheus's ``hashmod`` relabel action puts ``address`` on: the MD5 of the
    value, its last 8 bytes read as a big-endian unsigned integer, modulo ``modulus``
    (prometheus/model/relabel/relabel.go, ``case HashMod``)."""
    digest = hashlib.md5(address.encode()).digest()
    return int.from_bytes(digest[8:], "big") % modulus


def _address(agent: AgentProcess) -> str:
    return f"127.0.0.1:{agent.port}"


@pytest.fixture
def agents() -> Iterator[list[AgentProcess]]:
    """Four agents, ordered so that agents 0-1 hash to shard 0 and agents 2-3 to shard 1."""
    by_shard: dict[int, list[AgentProcess]] = {shard: [] for shard in range(SHARDS)}
    spare: list[AgentProcess] = []
    try:
        for _ in range(MAX_AGENT_STARTS):
            if all(len(a) == AGENTS_PER_SHARD for a in by_shard.values()):
                break
            agent = start_agent("--collector.nvml.fake-gpus", "2", "--collector.interval", "1")
            shard = by_shard[hashmod_shard(_address(agent), SHARDS)]
            (shard if len(shard) < AGENTS_PER_SHARD else spare).append(agent)
            if spare:
                stop_agent(spare.pop())
        ordered = [a for shard in range(SHARDS) for a in by_shard[shard]]
        assert len(ordered) == SHARDS * AGENTS_PER_SHARD, "hashmod never filled both shards"
        yield ordered
    finally:
        for agent in (a for shard in by_shard.values() for a in shard):
            stop_agent(agent)


def _send_step(intakes: list[tuple[str, int]], rng: random.Random
               ) -> Callable[[socket.socket, int], None]:
    """Both runs' StepRecords to the agents of their ranks, and every 10 steps ``sharded-run``'s
    WindowReport, naming rank 5, to rank 0's agent."""
    per_agent = RUN_WORLD // len(intakes)

    def send(sock: socket.socket, step: int) -> None:
        for rank in range(RUN_WORLD):
            record = _step_record(RUN, RUN_WORLD, rank, step, rank // per_agent, rng)
            sock.sendto(record.encode(), intakes[rank // per_agent])
        for rank in range(QUIET_WORLD):
            sock.sendto(_step_record(QUIET_RUN, QUIET_WORLD, rank, step, rank, rng).encode(),
                        intakes[rank])
        if step % 10 == 9:
            report = straggler_report(RUN, RUN_WORLD, SLOW_RANK, step, SLOWDOWN,
                                      node=f"node-{SLOW_RANK // per_agent}")
            sock.sendto(report.encode(), intakes[0])

    return send


def _step_record(run: str, world: int, rank: int, step: int, node: int,
                 rng: random.Random) -> StepRecord:
    slow = SLOWDOWN if (run, rank) == (RUN, SLOW_RANK) else 1.0
    jitter = rng.uniform(0.97, 1.03)
    # The others wait in the all-reduce for the slow rank; it arrives last and waits least.
    wait = 0.002 if slow > 1 else 0.002 + 0.030 * (SLOWDOWN - 1)
    return StepRecord(
        rank=rank, world_size=world, step=step, local_rank=rank % 2, node=f"node-{node}",
        run=run, phases={"data": 0.002, "forward": 0.010 * slow * jitter,
                         "backward": 0.020 * slow * jitter, "optimizer": 0.003},
        collective_wait_seconds=wait, step_seconds=0.002 + 0.030 * SLOWDOWN + 0.005,
    )


def _for_cut(text: str) -> str:
    return re.sub(r"^(\s*for:\s*)\S+", r"\g<1>0s", text, flags=re.MULTILINE)


@pytest.fixture
def servers(agents: list[AgentProcess], tmp_path: Path
            ) -> Iterator[tuple[PrometheusServer, list[PrometheusServer]]]:
    """The receiver (started first: the shards' configurations name its port), then the shards."""
    for name in ("global", *(f"shard-{i}" for i in range(SHARDS))):
        (tmp_path / name).mkdir()
    def files(remote_write_url: str) -> dict[str, str]:
        return render(SHARDS, remote_write_url=remote_write_url, rules_dir=str(tmp_path),
                      targets=[_address(a) for a in agents], scrape_interval="1s",
                      evaluation_interval="1s", batch_send_deadline="1s")

    with ExitStack() as stack:
        # The global layer's files do not depend on the URL the shards write to.
        unsent = files("http://192.0.2.1/unused")
        receiver = stack.enter_context(PrometheusServer(
            tmp_path / "global", [],
            rules={GLOBAL_RULES_FILE: _for_cut(unsent[f"rules/{GLOBAL_RULES_FILE}"])},
            config=yaml.safe_load(unsent["prometheus-global.yml"]),
            flags=["--web.enable-remote-write-receiver"]))
        generated = files(f"{receiver.url}/api/v1/write")
        shards = [stack.enter_context(PrometheusServer(
            tmp_path / f"shard-{i}", [],
            rules={SHARD_RULES_FILE: _for_cut(generated[f"rules/{SHARD_RULES_FILE}"])},
            config=yaml.safe_load(generated[f"prometheus-shard-{i}.yml"])))
            for i in range(SHARDS)]
        yield receiver, shards


def _poll(what: str, probe: Callable[[], Any], seconds: float) -> Any:
    """``probe()`` every 0.5 s until it returns something truthy; fail after ``budget(seconds)``."""
    deadline = time.monotonic() + budget(seconds)
    while True:
        found = probe()
        if found or time.monotonic() > deadline:
            assert found, f"{what}: not seen within {budget(seconds):.0f} s"
            return found
        time.sleep(0.5)


def _firing(prom: PrometheusServer, name: str) -> list[dict[str, str]]:
    return [a["labels"] for a in prom.alerts()
            if a["labels"]["alertname"] == name and a["state"] == "firing"]


def _scraped(prom: PrometheusServer) -> set[str]:
    return {s["metric"]["instance"] for s in prom.query('up{job="laggard"} == 1')}


def test_two_shards_feed_a_receiver_where_the_straggler_alerts_fire(
        agents: list[AgentProcess],
        servers: tuple[PrometheusServer, list[PrometheusServer]]) -> None:
    receiver, shards = servers
    addresses = [_address(a) for a in agents]
    expected = [set(addresses[i * AGENTS_PER_SHARD:(i + 1) * AGENTS_PER_SHARD])
                for i in range(SHARDS)]
    assert hashmod_shard(addresses[0], SHARDS) != hashmod_shard(addresses[SLOW_RANK // 2], SHARDS)

    # Each agent scraped by exactly one shard: the one hashmod names.
    _poll("every shard scraping its agents",
          lambda: all(_scraped(s) == e for s, e in zip(shards, expected, strict=True)), 60)
    targets = [{t["labels"]["instance"] for t in s.api("targets")["activeTargets"]}
               for s in shards]
    assert targets == expected

    intakes = [("127.0.0.1", a.intake_port) for a in agents]
    with DatagramSender(_send_step(intakes, random.Random(34)), period=0.1):
        detected = _poll("LaggardStragglerDetected on the receiver",
                         lambda: _firing(receiver, "LaggardStragglerDetected"), 120)
        by_rank = _poll("LaggardStragglerRank on the receiver",
                        lambda: _firing(receiver, "LaggardStragglerRank"), 120)
        shard_alerts = {a["labels"]["alertname"] for s in shards for a in s.alerts()}
        counts = {name: prom.query('count({__name__=~".+"})')
                  for name, prom in (("receiver", receiver), *(
                      (f"shard-{i}", s) for i, s in enumerate(shards)))}

    assert {(a["run"], a["rank"], a["kind"], a["instance"]) for a in detected} == {
        (RUN, str(SLOW_RANK), "compute", addresses[0])}
    assert {(a["run"], a["rank"], a["instance"]) for a in by_rank} == {
        (RUN, str(SLOW_RANK), addresses[SLOW_RANK // 2])}
    assert not shard_alerts & {"LaggardStragglerDetected", "LaggardStragglerRank"}
    # The receiver has the shards' per-rank means and the verdict, not the GPUs' clocks.
    assert receiver.query("laggard_straggler_active")
    assert receiver.query("instance_rank:laggard_compute_seconds_per_step:mean2m")
    assert not receiver.query("laggard_gpu_sm_clock_hertz")
    assert all(s.query("laggard_gpu_sm_clock_hertz") for s in shards)
    print("series held:", {k: v[0]["value"][1] if v else None for k, v in counts.items()})
