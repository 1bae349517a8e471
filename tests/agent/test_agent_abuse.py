"""A real agent process against hostile input, on loopback only: it keeps serving, stays small,
forgets what goes stale, and accounts for every datagram sent."""

import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families
from support import budget, free_port, scrape, stop_agent

from laggard.wire import StepRecord, WindowReport


def _values(text, name):
    return {tuple(sorted(s.labels.items())): s.value
            for f in text_string_to_metric_families(text) for s in f.samples if s.name == name}


def _value(text, name, **labels):
    return _values(text, name).get(tuple(sorted(labels.items())))


def _send(port, payloads, host="127.0.0.1", family=socket.AF_INET):
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        for p in payloads:
            s.sendto(p, (host, port))


def _poll(fetch, predicate, timeout=10.0):
    deadline = time.monotonic() + budget(timeout)
    value = fetch()
    while not predicate(value) and time.monotonic() < deadline:
        time.sleep(0.05)
        value = fetch()
    return value


def _accounted(text):
    """accepted + rejected + kernel drops, as the agent's own counters say."""
    return (_value(text, "laggard_intake_datagrams_total")
            + sum(_values(text, "laggard_intake_rejected_total").values())
            + (_value(text, "laggard_intake_kernel_drops_total") or 0))


def test_hostile_datagrams_neither_stop_the_intake_nor_break_a_scrape(agent_factory):
    # --intake.rank-histograms: the checks here read each rank's counters and progress
    # (laggard_steps_total...), outside the default series set since issue 34
    agent = agent_factory("--intake.rank-histograms",
                          "--no-collector.host", "--no-collector.netdev")
    hostile = [
        b"[" * 5000,  # once a RecursionError that killed the intake thread
        b'{"v":1,"rank":0,"world_size":1,"step":0,"collectives":[{"op":"a","seconds":0,'
        b'"bytes":1' + b"0" * 400 + b"}]}",  # once an OverflowError in every later scrape
        b'{"v":1,"rank":0,"world_size":1,"step":1' + b"0" * 300 + b"}",
        b'{"v":1,"rank":0,"world_size":1,"step":0,"phases":{"f":NaN}}',
        b'{"v":1,"rank":0,"world_size":1,"step":0,"comm":{"bytes":1e308}}',
        b'{"v":1,"type":"window","step":0,"world_size":4,"findings":[{"detector":"straggler",'
        b'"kind":"compute","severity":"warning","rank":999999999}]}',
        b'{"v":1,"type":"window","step":0,"world_size":1,"scores":{"0":' + b"9" * 5000 + b"}}",
    ]
    _send(agent.intake_port, hostile)
    text = _poll(agent.scrape, lambda t: sum(_values(t, "laggard_intake_rejected_total").values())
                 == len(hostile))
    assert sum(_values(text, "laggard_intake_rejected_total").values()) == len(hostile)
    assert _value(text, "laggard_intake_rejected_total", reason="too_deep") == 1
    assert _value(text, "laggard_intake_rejected_total", reason="range") == 5
    _send(agent.intake_port, [StepRecord(rank=0, world_size=1, step=0).encode()])
    text = _poll(agent.scrape, lambda t: _value(t, "laggard_steps_total", run="", rank="0") == 1)
    assert _value(text, "laggard_steps_total", run="", rank="0") == 1
    assert _value(text, "laggard_agent_thread_restarts_total", thread="laggard-intake") == 0
    assert agent.proc.poll() is None


def test_landing_page_404_and_strict_json_findings(agent_factory):
    # No xid collector: the history of this machine's kernel log may hold findings of its own.
    agent = agent_factory("--intake.rank-histograms",
                          "--no-collector.host", "--no-collector.netdev", "--no-collector.xid")
    base = f"http://127.0.0.1:{agent.port}"
    assert '<a href="metrics">' in scrape(base + "/")
    with pytest.raises(urllib.error.HTTPError) as excinfo:
        scrape(base + "/metricz")
    assert excinfo.value.code == 404
    # Python's json reads NaN and Infinity; evidence carrying them must come out as valid JSON.
    _send(agent.intake_port, [
        b'{"v":1,"type":"window","step":3,"world_size":4,"findings":[{"detector":"straggler",'
        b'"kind":"compute","severity":"warning","rank":2,"evidence":{"z":NaN,"w":[Infinity]}}]}'])

    def findings():
        return scrape(base + "/findings")

    body = _poll(findings, lambda b: b != "[]")

    def refuse(token):
        raise ValueError(f"not strict JSON: {token}")

    (doc,) = json.loads(body, parse_constant=refuse)
    assert doc["evidence"] == {"z": None, "w": [None]}


def test_the_web_server_listens_on_ipv6():
    port, intake_port = free_port(host="::1"), free_port(socket.SOCK_DGRAM, host="::1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "laggard.cli", "agent", "--web.listen-address", f"[::1]:{port}",
         "--intake.address", f"[::1]:{intake_port}", "--no-collector.host",
         "--no-collector.netdev", "--intake.rank-histograms"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    class _Agent:
        pass

    agent = _Agent()
    agent.proc = proc
    try:
        url = f"http://[::1]:{port}/metrics"

        def fetch():
            try:
                return scrape(url)
            except OSError:
                return ""

        assert _poll(fetch, bool, 20), "no answer on [::1]"
        _send(intake_port, [StepRecord(rank=0, world_size=1, step=0).encode()], host="::1",
              family=socket.AF_INET6)
        text = _poll(fetch, lambda t: _value(t, "laggard_steps_total", run="", rank="0") == 1)
        assert _value(text, "laggard_steps_total", run="", rank="0") == 1
    finally:
        code, output = stop_agent(agent)
    assert code == 0, output


def test_stale_ranks_and_their_flags_are_forgotten(agent_factory):
    agent = agent_factory("--intake.rank-histograms",
                          "--intake.rank-ttl", "1", "--no-collector.host",
                          "--no-collector.netdev")
    flag = {"detector": "straggler", "kind": "compute", "severity": "warning", "rank": 1}
    _send(agent.intake_port, [StepRecord(rank=1, world_size=2, step=5).encode(),
                              WindowReport(step=5, world_size=2, scores={1: 4.0},
                                           findings=[flag]).encode()])
    text = _poll(agent.scrape,
                 lambda t: _value(t, "laggard_straggler_active", run="", rank="1",
                                  kind="compute") == 1)
    assert _value(text, "laggard_straggler_active", run="", rank="1", kind="compute") == 1
    seen = time.monotonic()
    text = _poll(agent.scrape, lambda t: _value(t, "laggard_intake_ranks") == 0, 5)
    assert time.monotonic() - seen < 3.0
    assert _value(text, "laggard_straggler_active", run="", rank="1", kind="compute") is None
    assert _value(text, "laggard_steps_total", run="", rank="1") is None
    assert _value(text, "laggard_straggler_score", run="", rank="1") is None


def test_a_flood_is_accounted_for_datagram_by_datagram(agent_factory):
    agent = agent_factory("--intake.rank-histograms",
                          "--no-collector.host", "--no-collector.netdev")
    good = [StepRecord(rank=r, world_size=8, step=s, phases={"forward": 0.01}).encode()
            for s in range(50) for r in range(8)]
    garbage = [b"\x00", b"{", b"[" * 40, b'{"v":7}', b"x" * 9000]
    payloads = good + garbage * 80
    rounds = 25  # 10 000 datagrams as fast as one sender can push them
    start = time.monotonic()
    for _ in range(rounds):
        _send(agent.intake_port, payloads)
    assert time.monotonic() - start < 60
    sent = rounds * len(payloads)
    text = _poll(agent.scrape, lambda t: _accounted(t) >= sent, 30)
    assert _accounted(text) == sent
    assert _value(text, "laggard_intake_kernel_drops_total") is not None
    assert agent.proc.poll() is None
