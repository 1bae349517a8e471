"""``laggard cluster-demo`` end to end, as CI runs it: 2 emulated nodes x 2 ranks on shaped links,
a real agent per node, a real Prometheus with laggard's rules, one slowed rank; and the refusal
without root."""

from __future__ import annotations

import ctypes
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def _leftovers(pid: int) -> list[str]:
    """Namespaces and links named after ``pid`` that still exist."""
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
    names += [p.name for p in Path("/sys/class/net").iterdir()]
    return [n for n in names if n.startswith(f"lgd{pid}")]


@pytest.mark.usefixtures("need_namespaces")
def test_two_nodes_slowed_rank_is_named_with_node_cause_and_alert(tmp_path: Path) -> None:
    pytest.importorskip("torch", reason="the demo job needs torch (pip install 'laggard[torch]')")
    if shutil.which("prometheus") is None:
        pytest.skip("prometheus not installed (apt-get install prometheus)")
    out = tmp_path / "report.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "laggard.agent.cli", "cluster-demo", "--nodes", "2",
         "--ranks-per-node", "2", "--rate", "1gbit", "--fault", "slow-rank", "--fault-node", "1",
         "--slowdown", "2.0", "--steps", "80", "--window", "8", "--timeout", "240",
         "--json", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        output, _ = proc.communicate(timeout=280)
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
    assert 2 in verdict["alert_ranks"], report["alerts"]
    assert report["job"]["world_size"] == 4
    assert "verdict:   named correctly" in output
    assert _leftovers(proc.pid) == []


def _drop_all_capabilities() -> None:
    # Runs in the child before exec: with an empty bounding set even uid 0 execs without
    # capabilities (capabilities(7), "Transformation of capabilities during execve()").
    libc = ctypes.CDLL(None, use_errno=True)
    for cap in range(64):
        libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)


PR_CAPBSET_DROP = 24


def test_without_privileges_it_says_so_and_creates_nothing() -> None:
    before = set(subprocess.run(["ip", "netns", "list"], capture_output=True,
                                text=True).stdout.split())
    done = subprocess.run(
        [sys.executable, "-m", "laggard.agent.cli", "cluster-demo"],
        capture_output=True, text=True, timeout=60, preexec_fn=_drop_all_capabilities,
    )
    assert done.returncode == 2, done.stderr
    assert "needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN)" in done.stderr
    assert "Traceback" not in done.stderr
    after = set(subprocess.run(["ip", "netns", "list"], capture_output=True,
                               text=True).stdout.split())
    assert after <= before
