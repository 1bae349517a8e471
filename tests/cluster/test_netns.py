"""The namespace harness on real namespaces, veths, a bridge and tc: TCP between nodes, the
shaped rate measured, counters against bytes sent, and teardown on exit, error and signals."""

from __future__ import annotations

import ipaddress
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support import budget

from laggard.demo.netns import (
    BENCHMARK_NET,
    EmulatedCluster,
    LinkShape,
    NamespaceError,
    sweep_stale,
)

PROBE = str(Path(__file__).with_name("tcp_probe.py"))
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("need_namespaces")]


def transfer(cluster: EmulatedCluster, nbytes: int, port: int = 5201) -> tuple[float, int]:
    """Send ``nbytes`` over TCP from node 0 to node 1: goodput in bit/s, link bytes counted."""
    sender, receiver = cluster.nodes[0], cluster.nodes[1]
    before = cluster.link_counters(sender)
    server = cluster.popen(receiver, [sys.executable, PROBE, "serve", receiver.address,
                                      str(port)], stdout=subprocess.PIPE, text=True)
    assert server.stdout is not None
    assert server.stdout.readline().strip() == "listening"
    sent = cluster.run(sender, [sys.executable, PROBE, "send", receiver.address, str(port),
                                str(nbytes)], timeout=budget(30))
    assert sent.returncode == 0, sent.stderr
    report = json.loads(server.communicate(timeout=budget(30))[0])
    assert report["bytes"] == nbytes
    counted = (cluster.link_counters(sender) - before).tx_bytes
    return report["bytes"] * 8 / report["seconds"], counted


def test_nodes_are_addressed_in_the_benchmark_range_only() -> None:
    with EmulatedCluster(3, LinkShape(rate_bps=0, delay_s=0)) as cluster:
        addresses = [n.address for n in cluster.nodes] + [cluster.gateway]
        assert len(set(addresses)) == 4
        assert all(ipaddress.ip_address(a) in BENCHMARK_NET for a in addresses)
        inside = subprocess.run(["ip", "-n", cluster.nodes[1].netns, "-j", "-4", "addr"],
                                capture_output=True, text=True, check=True).stdout
        local = {a["local"] for link in json.loads(inside) for a in link["addr_info"]}
        assert local == {"127.0.0.1", cluster.nodes[1].address}


def test_tcp_between_nodes_runs_at_the_shaped_rate_and_counters_match() -> None:
    with EmulatedCluster(2, LinkShape(rate_bps=100e6, delay_s=0)) as cluster:
        slow, counted = transfer(cluster, 4 << 20)
        # TCP/IP headers take ~3% of a 1500-byte frame; a token bucket never exceeds its rate
        # over a transfer much larger than its bucket.
        assert 0.80 * 100e6 < slow < 1.02 * 100e6
        assert 4 << 20 <= counted < 1.05 * (4 << 20)
        for node in cluster.nodes:
            cluster.shape(node, LinkShape(rate_bps=400e6, delay_s=0))
        fast, _ = transfer(cluster, 16 << 20, port=5202)
        assert 0.80 * 400e6 < fast < 1.02 * 400e6


def test_everything_is_removed_when_the_body_raises() -> None:
    with pytest.raises(RuntimeError, match="boom"):
        with EmulatedCluster(2, LinkShape(rate_bps=1e9, delay_s=0)) as cluster:
            sleeper = cluster.popen(cluster.nodes[1], ["sleep", "60"])
            assert all(cluster.exists().values())
            raise RuntimeError("boom")
    assert not any(cluster.exists().values())
    assert sleeper.poll() is not None


HOLDER = """
import sys, time
from laggard.demo.netns import EmulatedCluster, LinkShape
with EmulatedCluster(2, LinkShape(rate_bps=1e9, delay_s=0)) as cluster:
    cluster.popen(cluster.nodes[0], ["sleep", "60"])
    print(" ".join([cluster.bridge] + [n.netns for n in cluster.nodes]), flush=True)
    time.sleep(60)
"""


def _names_present(names: list[str]) -> set[str]:
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    present = {line.split()[0] for line in netns.splitlines() if line.strip()}
    present |= {n for n in names if Path(f"/sys/class/net/{n}").exists()}
    return present & set(names)


def _pids_in(netns: str, timeout: float = 10.0) -> list[int]:
    """Pids in ``netns``, waiting for the first (``ip netns exec`` enters it after fork) at most
    ``budget(timeout)`` seconds."""
    started = time.monotonic()
    while True:
        pids = subprocess.run(["ip", "netns", "pids", netns], capture_output=True,
                              text=True).stdout.split()
        if pids or time.monotonic() - started > budget(timeout):
            return [int(p) for p in pids]
        time.sleep(0.05)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_signal_removes_everything(sig: signal.Signals) -> None:
    holder = subprocess.Popen([sys.executable, "-c", HOLDER], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None
        names = holder.stdout.readline().split()
        assert len(names) == 3 and _names_present(names) == set(names)
        sleepers = _pids_in(names[1])
        assert sleepers
        holder.send_signal(sig)
        holder.wait(timeout=budget(30))
    finally:
        if holder.poll() is None:
            holder.kill()
            sweep_stale()
    assert _names_present(names) == set()
    assert not any(Path(f"/proc/{p}").exists() for p in sleepers)


def test_what_a_killed_run_left_is_swept_by_the_next() -> None:
    holder = subprocess.Popen([sys.executable, "-c", HOLDER], stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None
    names = holder.stdout.readline().split()
    holder.kill()  # SIGKILL: no cleanup runs in the holder
    holder.wait(timeout=budget(10))
    assert _names_present(names) == set(names)
    removed = sweep_stale()
    assert set(names) <= set(removed)
    assert _names_present(names) == set()


def test_loss_without_netem_is_refused_with_the_reason() -> None:
    with EmulatedCluster(1, LinkShape(rate_bps=1e9, delay_s=0)) as cluster:
        if cluster.netem_available():
            result = cluster.shape(cluster.nodes[0], LinkShape(1e9, 0.0002, 0.01))
            assert result.qdisc == "netem+tbf" and not result.not_applied
        else:
            with pytest.raises(NamespaceError, match="netem"):
                cluster.shape(cluster.nodes[0], LinkShape(1e9, 0.0, 0.01))
            result = cluster.shape(cluster.nodes[0], LinkShape(1e9, 0.0002))
            assert result.qdisc == "tbf" and result.not_applied
