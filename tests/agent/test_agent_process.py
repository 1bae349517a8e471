"""The real ``laggard agent`` process: real sockets, real signals, promtool on its exposition."""

import shutil
import socket
import subprocess
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families
from support import budget, stop_agent

from laggard.wire import StepRecord, WindowReport


def _value(text, name, labels=None):
    labels = labels or {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    return None


def _wait_for(agent, name, labels, want, timeout=5.0):
    deadline = time.monotonic() + budget(timeout)
    while time.monotonic() < deadline:
        value = _value(agent.scrape(), name, labels)
        if value == want:
            return value
        time.sleep(0.05)
    return _value(agent.scrape(), name, labels)


def _send(port, payloads):
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for p in payloads:
            s.sendto(p, ("127.0.0.1", port))


def test_agent_serves_collectors_and_per_rank_series(agent_factory):
    # lo is virtual, left out by the default device rule: asked for by name.
    # --intake.rank-histograms: the checks here read each rank's counters and progress
    # (laggard_steps_total...), outside the default series set since issue 34
    agent = agent_factory("--intake.rank-histograms",
                          "--collector.interval", "0.1", "--collector.netdev.device-include", "lo")
    records = [StepRecord(rank=r, world_size=2, step=s, phases={"forward": 0.01},
                          collective_wait_seconds=0.001).encode()
               for s in range(5) for r in range(2)]
    _send(agent.intake_port, records)
    assert _wait_for(agent, "laggard_steps_total", {"rank": "1"}, 5) == 5
    text = agent.scrape()
    assert _value(text, "laggard_collector_success", {"collector": "host"}) == 1
    assert _value(text, "laggard_collector_success", {"collector": "netdev"}) == 1
    assert _value(text, "laggard_network_receive_bytes_total", {"device": "lo"}) is not None
    assert _value(text, "laggard_build_info") == 1


def test_garbage_datagrams_are_counted_and_good_ones_still_land(agent_factory):
    agent = agent_factory("--intake.rank-histograms")
    good = StepRecord(rank=0, world_size=1, step=0).encode()
    garbage = [b"", b"\x00" * 100, b"{not json", b'{"v": 99}', b"[]",
               b'{"v":1,"rank":0,"world_size":1,"step":0,"phases":{"f":-5}}', b"z" * 9000,
               bytes(range(256)) * 4]
    _send(agent.intake_port, garbage + [good])
    assert _wait_for(agent, "laggard_intake_datagrams_total", {}, 1) == 1
    text = agent.scrape()
    rejected = {r: _value(text, "laggard_intake_rejected_total", {"reason": r})
                for r in ("oversized", "not_json", "version", "range")}
    assert rejected == {"oversized": 1, "not_json": 5, "version": 1, "range": 1}
    assert agent.proc.poll() is None


def test_window_report_exports_scores_and_findings(agent_factory):
    agent = agent_factory("--intake.rank-histograms")
    finding = {"detector": "straggler", "kind": "compute", "severity": "warning", "rank": 3,
               "step": 20, "message": "rank 3 computes 25% slower", "evidence": {}}
    _send(agent.intake_port, [WindowReport(step=20, world_size=4, scores={3: 12.5},
                                           findings=[finding]).encode()])
    assert _wait_for(agent, "laggard_straggler_score", {"rank": "3"}, 12.5) == 12.5
    text = agent.scrape()
    assert _value(text, "laggard_findings_total",
                  {"detector": "straggler", "kind": "compute", "severity": "warning"}) == 1
    assert _value(text, "laggard_straggler_active", {"rank": "3", "kind": "compute"}) == 1


def test_missing_hardware_reports_success_zero_without_traceback(agent_factory, tmp_path):
    agent = agent_factory("--intake.rank-histograms",
                          "--path.procfs", str(tmp_path), "--collector.interval", "0.1")
    assert _wait_for(agent, "laggard_collector_success", {"collector": "netdev"}, 0) == 0
    assert _value(agent.scrape(), "laggard_collector_success", {"collector": "host"}) == 1
    code, output = stop_agent(agent)
    assert code == 0
    assert "Traceback" not in output


def test_sigterm_stops_the_agent_cleanly(agent_factory):
    agent = agent_factory("--intake.rank-histograms")
    code, output = stop_agent(agent)
    assert code == 0, output
    assert "stopping" in output


def test_bad_flags_give_a_clear_error_and_status_2():
    import sys

    for flags in (["--collector.interval", "0.01"], ["--web.listen-address", "nonsense"]):
        result = subprocess.run([sys.executable, "-m", "laggard.cli", "agent", *flags],
                                capture_output=True, text=True, timeout=budget(30))
        assert result.returncode == 2
        assert "laggard agent:" in result.stderr
        assert "Traceback" not in result.stderr


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed "
                    "(Debian package prometheus; scripts/ensure-prometheus.sh installs it)")
def test_promtool_accepts_the_exposition(agent_factory):
    agent = agent_factory("--intake.rank-histograms", "--collector.interval", "0.1")
    _send(agent.intake_port, [StepRecord(rank=0, world_size=1, step=0, phases={"data": 0.1},
                                         comm={"bytes": 10}).encode(),
                              WindowReport(step=0, world_size=1, scores={0: 0.0}).encode()])
    _wait_for(agent, "laggard_intake_datagrams_total", {}, 2)
    result = subprocess.run(["promtool", "check", "metrics"], input=agent.scrape(),
                            capture_output=True, text=True, timeout=budget(30))
    assert result.returncode == 0, result.stdout + result.stderr


def test_naming_the_inspector_directory_enables_its_collector(agent_factory, tmp_path):
    from support import FIXTURES

    source = FIXTURES / "analyze" / "inspector" / "inspector01_doc_v4.0_allreduce_coll_perf.jsonl"
    (tmp_path / "rank2.log").write_text(source.read_text())
    agent = agent_factory("--intake.rank-histograms", "--collector.interval", "0.1",
                          "--collector.nccl_inspector.dir", str(tmp_path))
    deadline = time.monotonic() + budget(5)
    count = None
    while time.monotonic() < deadline and not count:
        text = agent.scrape()
        count = _value(text, "laggard_nccl_collective_seconds_count")
        time.sleep(0.1)
    assert _value(text, "laggard_collector_success", {"collector": "nccl_inspector"}) == 1
    assert count == 1


def test_an_address_in_use_is_named_in_the_error(agent_factory):
    import sys

    agent = agent_factory("--intake.rank-histograms")
    result = subprocess.run(
        [sys.executable, "-m", "laggard.cli", "agent",
         "--web.listen-address", f"127.0.0.1:{agent.port}", "--intake.address", "127.0.0.1:0"],
        capture_output=True, text=True, timeout=budget(30))
    assert result.returncode == 2
    assert f"--web.listen-address 127.0.0.1:{agent.port}: Address already in use" in result.stderr


def test_an_unknown_agent_flag_shows_the_agent_usage():
    import sys

    result = subprocess.run([sys.executable, "-m", "laggard.cli", "agent", "--bogus"],
                            capture_output=True, text=True, timeout=budget(30))
    assert result.returncode == 2
    assert "usage: laggard agent" in result.stderr
    assert "unrecognized arguments: --bogus" in result.stderr
