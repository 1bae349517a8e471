"""A forged datagram from another uid, on a real agent's real Unix socket (issue 32, item 2).

The test makes a system user of its own (removed at teardown) and sends, from a process running
as that user, a forged critical window report and a step-0 record for a run this test's process
(the run's owner) is writing: both are refused and counted, the real finding and rank stay, and
the agent's log names the forger's pid and uid. Needs root (to make the user and to run as it).
"""

from __future__ import annotations

import json
import os
import pwd
import secrets
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from support import budget, scrape, stop_agent, wait_for

from laggard.wire import StepRecord, WindowReport

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

def _value(text: str, name: str, labels: dict[str, str]) -> float | None:
    """The first sample ``name`` whose labels include ``labels``, or None."""
    return next((sample.value for family in text_string_to_metric_families(text)
                 for sample in family.samples
                 if sample.name == name and labels.items() <= sample.labels.items()), None)


@pytest.fixture
def test_user() -> Iterator[pwd.struct_passwd]:
    """A system user made for this test (``laggard-test-XXXX``), removed at teardown."""
    if os.geteuid() != 0:
        pytest.skip("making a test user and sending as it needs root (this test is not root)")
    useradd, userdel = shutil.which("useradd"), shutil.which("userdel")
    if useradd is None or userdel is None:
        pytest.skip("useradd/userdel not installed: cannot make a test user")
    name = f"laggard-test-{secrets.token_hex(2)}"
    subprocess.run([useradd, "--system", "--no-create-home", "--shell", "/usr/sbin/nologin",
                    name], check=True, capture_output=True, timeout=budget(30))
    try:
        yield pwd.getpwnam(name)
    finally:
        subprocess.run([userdel, name], capture_output=True, timeout=budget(30))


@pytest.fixture
def socket_dir() -> Iterator[Path]:
    """A directory every user may search (pytest's tmp_path is root's alone)."""
    path = Path(tempfile.mkdtemp(prefix="laggard-owner-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _send_as(user: pwd.struct_passwd, path: Path, payload: bytes) -> int:
    """Send ``payload`` to ``path`` from a new process running as ``user``; its pid.

    A fork, not an exec: the interpreter of this checkout may sit where the user cannot read it.
    The child only drops its ids and sends (no Python state of the parent's is used).
    """
    pid = os.fork()
    if pid == 0:  # the child: any failure is its exit status
        status = 1
        try:
            os.setgroups([])
            os.setgid(user.pw_gid)
            os.setuid(user.pw_uid)
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
                sock.sendto(payload, str(path))
            status = 0
        finally:
            os._exit(status)
    _, wait_status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(wait_status) == 0, "the test user's send failed"
    return pid


def test_a_forged_report_and_step_zero_from_another_uid_are_refused(
        agent_factory, test_user, socket_dir) -> None:
    path = socket_dir / "intake.sock"
    # --intake.rank-histograms: the checks here read each rank's counters and progress
    # (laggard_steps_total...), outside the default series set since issue 34
    agent = agent_factory("--intake.rank-histograms", "--intake.socket", str(path))
    owner = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        # One process is one rank to the agent (a pid that reports as another rank moves).
        for step in range(10):
            owner.sendto(StepRecord(run="job", rank=1, world_size=2, step=step).encode(),
                         str(path))
        real = {"detector": "straggler", "kind": "compute", "severity": "warning", "rank": 1,
                "step": 9, "message": "rank 1 slow", "evidence": {}}
        owner.sendto(WindowReport(run="job", step=9, world_size=2, scores={0: 0.1, 1: 4.0},
                                  findings=[real]).encode(), str(path))
        assert wait_for(lambda: _value(agent.scrape(), "laggard_straggler_active",
                                       {"run": "job", "rank": "1"}) == 1, timeout=10)

        forged = {"detector": "straggler", "kind": "compute", "severity": "critical",
                  "rank": 0, "step": 10, "message": "forged", "evidence": {}}
        forger = _send_as(test_user, path, WindowReport(run="job", step=10, world_size=2,
                                               scores={0: 9.0}, findings=[forged]).encode())
        _send_as(test_user, path, StepRecord(run="job", rank=1, world_size=2, step=0).encode())
        assert wait_for(lambda: _value(agent.scrape(), "laggard_intake_rejected_total",
                                       {"reason": "foreign_sender"}) == 2, timeout=10)
        text = agent.scrape()
        assert _value(text, "laggard_steps_total", {"run": "job", "rank": "1"}) == 10
        assert _value(text, "laggard_straggler_active", {"run": "job", "rank": "1"}) == 1
        assert _value(text, "laggard_straggler_active", {"run": "job", "rank": "0"}) is None
        # no restart: the reasons' series appear with their first count
        assert _value(text, "laggard_intake_ranks_forgotten_total", {"reason": "restart"}) is None
        assert _value(text, "laggard_intake_job_resets_total", {"reason": "restart"}) is None
        # The run's findings (the node's collectors may add their own).
        findings = [f for f in json.loads(scrape(f"http://127.0.0.1:{agent.port}/findings"))
                    if f.get("run") == "job"]
        assert [f["message"] for f in findings] == ["rank 1 slow"]
        assert (findings[0]["sender_pid"], findings[0]["sender_uid"]) == (os.getpid(), 0)
    finally:
        owner.close()
    status, out = stop_agent(agent)
    assert status == 0, out
    refusals = [line for line in out.splitlines() if "foreign_sender" in line]
    assert len(refusals) == 1, out  # logged once for that uid
    assert f"pid {forger} uid {test_user.pw_uid} for run 'job', owned by uid 0" in refusals[0]
    assert f"sender_pid={os.getpid()} sender_uid=0" in out
