"""``laggard cluster-demo`` end to end, as CI runs it: 2 emulated nodes x 2 ranks on shaped links,
a real agent per node, a real Prometheus with laggard's rules, one slowed rank named with its node,
cause and alert; the link check naming a degraded link; everything removed on Ctrl-C mid-job and
at the timeout; wrong flags and missing privileges refused before anything is made."""

from __future__ import annotations

import argparse
import ctypes
import json
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support import budget

from laggard.demo.cluster import (
    DEMO_ALERT_FOR,
    measure_links,
    parse_rate,
    slow_links,
)
from laggard.demo.harness import laggard_rules, process_tree
from laggard.demo.netns import EmulatedCluster, LinkShape

pytestmark = pytest.mark.slow


def _leftovers(pid: int) -> list[str]:
    """Namespaces and links named after ``pid`` that still exist."""
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
    names += [p.name for p in Path("/sys/class/net").iterdir()]
    return [n for n in names if re.fullmatch(rf"lgd{pid}(n\d+p?|br)", n)]


@pytest.mark.usefixtures("need_namespaces")
def test_two_nodes_slowed_rank_is_named_with_node_cause_and_alert(tmp_path: Path) -> None:
    pytest.importorskip("torch", reason="the demo job needs torch (pip install 'laggard[torch]')")
    if shutil.which("prometheus") is None:
        pytest.skip("prometheus not installed (apt-get install prometheus)")
    out = tmp_path / "report.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "laggard.cli", "cluster-demo", "--nodes", "2",
         "--ranks-per-node", "2", "--rate", "1gbit", "--fault", "slow-rank", "--fault-node", "1",
         "--slowdown", "2.0", "--steps", "80", "--window", "8", "--fault-at-step", "16",
         "--timeout", f"{budget(240):.0f}", "--json", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        output, _ = proc.communicate(timeout=budget(280))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, output
    report = json.loads(out.read_text())
    verdict = report["verdict"]
    # torchrun's static rendezvous: node 1's local rank 0 is global rank 1 * 2 + 0.
    assert (verdict["node"], verdict["rank"], verdict["cause"]) == ("node1", 2, "compute"), output
    assert report["ranks"] == {"0": "node0", "1": "node0", "2": "node1", "3": "node1"}
    # The in-job finding names the node itself (each emulated node has its own host name).
    named = [f for f in report["findings"] if f["kind"] == "compute"]
    assert named and named[0]["node"] == "node1" and named[0]["local_rank"] == 0
    assert 2 in verdict["alert_ranks"], report["alerts"]
    assert report["job"]["world_size"] == 4
    assert "verdict:   named correctly" in output
    assert _leftovers(proc.pid) == []


@pytest.mark.usefixtures("need_namespaces")
def test_a_hung_rank_is_named_in_the_job_and_by_the_hang_alert_then_the_job_stopped(
        tmp_path: Path) -> None:
    pytest.importorskip("torch", reason="the demo job needs torch (pip install 'laggard[torch]')")
    if shutil.which("prometheus") is None:
        pytest.skip("prometheus not installed (apt-get install prometheus)")
    out = tmp_path / "report.json"
    started, run_budget = time.monotonic(), budget(240)
    proc = subprocess.Popen(
        [sys.executable, "-m", "laggard.cli", "cluster-demo", "--nodes", "3", "--fault", "hang",
         "--hang-kind", "data", "--fault-node", "2", "--steps", "400", "--window", "10",
         "--fault-at-step", "20", "--hang-bound", "90", "--timeout", f"{run_budget:.0f}",
         "--json", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        output, _ = proc.communicate(timeout=budget(280))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, output
    report = json.loads(out.read_text())
    verdict, prometheus = report["verdict"], report["job"]["prometheus"]
    assert verdict["in_job_correct"] and verdict["prometheus_correct"], output
    assert prometheus["ranks"] == [2] and verdict["node"] == "node2"
    assert 0 < verdict["in_job_seconds"] <= budget(30)
    assert 0 < verdict["prometheus_seconds"] <= budget(60)
    assert "LaggardJobHung" in verdict["alerts_firing"]
    assert "verdict:   named correctly" in output
    # stopped once named: never gloo's timeout
    assert time.monotonic() - started < run_budget
    assert _leftovers(proc.pid) == []


@pytest.mark.usefixtures("need_namespaces")
def test_three_nodes_degraded_link_is_named_in_job_with_node_cause_and_alert(
        tmp_path: Path) -> None:
    pytest.importorskip("torch", reason="the demo job needs torch (pip install 'laggard[torch]')")
    if shutil.which("prometheus") is None:
        pytest.skip("prometheus not installed (apt-get install prometheus)")
    out = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, "-m", "laggard.cli", "cluster-demo", "--nodes", "3", "--fault", "link",
         "--fault-node", "1", "--fault-rate", "100mbit", "--steps", "90", "--window", "6",
         "--fault-at-step", "24", "--timeout", f"{budget(240):.0f}", "--json", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=budget(280))
    assert proc.returncode == 0, proc.stdout
    report = json.loads(out.read_text())
    verdict = report["verdict"]
    assert (verdict["node"], verdict["cause"]) == ("node1", "link"), proc.stdout
    # named by the in-job link detector, not only by the end-of-run link check
    assert verdict["source"].startswith("in-job link detector"), proc.stdout
    named = [f for f in report["findings"] if f["kind"] == "link"]
    assert named[0]["node"] == "node1" and named[0]["evidence"]["peers"] == [0, 2]
    assert "LaggardSlowLink" in verdict["alerts_firing"], report["alerts"]


def _drop_all_capabilities() -> None:
    # Runs in the child before exec: with an empty bounding set even uid 0 execs without
    # capabilities (capabilities(7), "Transformation of capabilities during execve()").
    libc = ctypes.CDLL(None, use_errno=True)
    for cap in range(64):
        libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)


PR_CAPBSET_DROP = 24


def test_without_privileges_it_says_so_and_creates_nothing() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "laggard.cli", "cluster-demo"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=_drop_all_capabilities,
    )
    try:
        _, err = proc.communicate(timeout=budget(60))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 2, err
    assert "needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN)" in err
    assert "Traceback" not in err
    # only its own names (lgd<pid>...): other runs on this machine may make namespaces meanwhile
    assert _leftovers(proc.pid) == []


@pytest.mark.usefixtures("need_namespaces")
def test_link_check_names_the_one_degraded_link() -> None:
    with EmulatedCluster(3, LinkShape(rate_bps=1e9, delay_s=0)) as cluster:
        cluster.shape(cluster.nodes[1], LinkShape(rate_bps=100e6, delay_s=0))
        measured = measure_links(cluster, deadline=time.monotonic() + budget(60))
    assert [m["node"] for m in measured] == ["node0", "node1", "node2"]
    degraded = measured[1]
    assert 0.8 * 100e6 < degraded["up_bps"] < 1.02 * 100e6
    assert 0.8 * 100e6 < degraded["down_bps"] < 1.02 * 100e6
    assert [m["node"] for m in slow_links(measured)] == ["node1"]


def test_rates_parse_in_tc_notation() -> None:
    assert parse_rate("1gbit") == 1e9
    assert parse_rate("100mbit") == 100e6
    assert parse_rate("10G") == 10e9
    assert parse_rate("2.5gbit") == 2.5e9
    for bad in ("fast", "0mbit", "1 parsec", ""):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_rate(bad)


def test_demo_rules_are_laggards_with_for_cut_short() -> None:
    rules = laggard_rules(DEMO_ALERT_FOR)
    assert "laggard-alerts.yml" in rules
    alerts = rules["laggard-alerts.yml"]
    assert "LaggardStragglerDetected" in alerts
    durations = re.findall(r"^\s*for:\s*(\S+)", alerts, flags=re.MULTILINE)
    assert durations and set(durations) == {DEMO_ALERT_FOR}


def _start_demo(*extra: str) -> subprocess.Popen[str]:
    # SIGINT ignored, as a script's `&` starts it: the demo must still take Ctrl-C (it trained
    # to its end through one in a CI run started that way)
    return subprocess.Popen(
        [sys.executable, "-m", "laggard.cli", "cluster-demo", "--nodes", "3",
         "--steps", "400", "--timeout", f"{budget(120):.0f}", *extra],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))


@pytest.mark.usefixtures("need_namespaces")
def test_ctrl_c_mid_job_removes_every_process_namespace_and_link() -> None:
    pytest.importorskip("torch", reason="the demo job needs torch (pip install 'laggard[torch]')")
    if shutil.which("prometheus") is None:
        pytest.skip("prometheus not installed (apt-get install prometheus)")
    demo = _start_demo()
    try:
        assert demo.stdout is not None
        lines = []
        for line in demo.stdout:  # bounded by the demo's own --timeout
            lines.append(line)
            if re.match(r"\s*step\s+0/", line):  # rank 0's first step: every rank is running
                break
        started = process_tree(demo.pid)
        # 3 agents, Prometheus, 3 launchers, 3 ranks (and the ranks' own helpers)
        assert len(started) >= 10, "".join(lines)
        assert _leftovers(demo.pid)
        demo.send_signal(signal.SIGINT)
        out, _ = demo.communicate(timeout=budget(60))
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.communicate()
    assert demo.returncode == 130, out
    assert "interrupted" in out and "Traceback" not in out
    assert _leftovers(demo.pid) == []
    assert not [p for p in started if Path(f"/proc/{p}").exists()]


@pytest.mark.usefixtures("need_namespaces")
def test_the_timeout_stops_the_run_and_everything_is_removed() -> None:
    pytest.importorskip("torch", reason="the demo job needs torch (pip install 'laggard[torch]')")
    if shutil.which("prometheus") is None:
        pytest.skip("prometheus not installed (apt-get install prometheus)")
    demo = subprocess.run(
        [sys.executable, "-m", "laggard.cli", "cluster-demo", "--nodes", "3",
         "--steps", "100000", "--timeout", "8"],
        capture_output=True, text=True, timeout=budget(120))
    out = demo.stdout + demo.stderr
    assert demo.returncode == 2, out
    assert "past --timeout (8 s)" in out and "removed" in out and "Traceback" not in out
    assert not [n for n in _names_of_dead_runs() if n.startswith("lgd")]


def _names_of_dead_runs() -> list[str]:
    """lgd-prefixed namespaces and links whose creating process is gone."""
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
    names += [p.name for p in Path("/sys/class/net").iterdir()]
    dead = []
    for name in names:
        m = re.match(r"lgd(\d+)", name)
        if m and not Path(f"/proc/{m.group(1)}").exists():
            dead.append(name)
    return dead


def test_a_wrong_flag_is_refused_before_anything_is_made() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "laggard.cli", "cluster-demo",
         "--compression", "no-such-compressor"],
        capture_output=True, text=True, timeout=budget(60))
    assert done.returncode == 2
    assert "unknown --compression 'no-such-compressor'" in done.stderr
    assert "Traceback" not in done.stderr
