"""``laggard healthcheck`` against a real agent (fake GPUs, a real kernel-log file), run as the
process node-problem-detector and slurmd run: its exit status, its one line, and with ``--slurm``
a real slurmctld's node drained, left alone or resumed (tests/support_slurm.py)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from support import budget, scrape, stop_agent, wait_for
from support_slurm import SlurmCluster, slurm_cluster, start_slurm  # noqa: F401 - the fixture
from test_cli_startup import HEAVY, _loaded

from laggard.demo.harness import free_port
from laggard.detectors.finding import Finding, Severity
from laggard.wire import StepRecord, WindowReport

REPO = Path(__file__).resolve().parents[2]
HEALTH_CHECK_PROGRAM = REPO / "deploy" / "slurm" / "laggard-healthcheck.sh"

# The fake NVML lists its GPUs at 0000:18:00, 0000:28:00, ... (nvml/fake.py).
LISTED_GPU0 = "0000:18:00"
UNLISTED = "0000:91:00"


def kernel_line(pci: str, xid: int, text: str, ago: float = 30.0) -> str:
    """One journald short-iso kernel-log line of an Xid, ``ago`` seconds ago."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S+0000", time.gmtime(time.time() - ago))
    return (f"{stamp} node01 kernel: NVRM: Xid (PCI:{pci}): {xid}, pid='<unknown>', "
            f"name=<unknown>, {text}\n")


FALLEN_OFF = kernel_line(UNLISTED, 79, "GPU has fallen off the bus.")
DBE = kernel_line(LISTED_GPU0, 48, "An uncorrectable double bit error (DBE) has been detected "
                  "on GPU in the framebuffer at physAddr 0x7fffa8860 partition 7, subpartition 1.")
XID13 = kernel_line(LISTED_GPU0, 13, "Graphics SM Warp Exception on (GPC 9, TPC 1, SM 1): "
                    "Out Of Range Address")


def healthcheck(agent_url: str, *flags: str, env: dict[str, str] | None = None
                ) -> subprocess.CompletedProcess:
    """Run ``laggard healthcheck`` as a process, as node-problem-detector and slurmd do."""
    return subprocess.run([sys.executable, "-m", "laggard.cli", "healthcheck", "--agent",
                           agent_url, *flags], capture_output=True, text=True,
                          timeout=budget(60), env={**os.environ, **(env or {})}, check=False)


def start(agent_factory, tmp_path: Path, kmsg: str = "", scenario: str = "steady",
          log_name: str = "kern.log"):
    """A real agent with 2 fake GPUs reading ``kmsg`` as its kernel log; (agent, URL, log)."""
    log = tmp_path / log_name
    log.write_text(kmsg)
    agent = agent_factory("--collector.interval", "0.2", "--path.kmsg", str(log),
                          "--collector.nvml.fake-gpus", "2",
                          "--collector.nvml.fake-gpus-scenario", scenario,
                          "--node.name", "gpu-07")
    # The first round of the nvml collector is in (the verdict counts the GPUs it checked).
    assert wait_for(lambda: "laggard_gpu_info{" in agent.scrape(), 10)
    return agent, f"http://127.0.0.1:{agent.port}", log


def findings(url: str) -> list[dict]:
    return json.loads(scrape(f"{url}/findings"))


def test_help_imports_neither_the_run_module_nor_anything_heavy(tmp_path: Path) -> None:
    status, modules = _loaded(["healthcheck", "--help"], tmp_path)
    assert status == 0
    assert not [m for m in modules if m.split(".")[0] in HEAVY]
    assert not {"laggard.actions.healthcheck", "laggard.parsers"} & modules


def test_a_healthy_node_exits_0_with_one_line(agent_factory, tmp_path: Path) -> None:
    _, url, _ = start(agent_factory, tmp_path)
    done = healthcheck(url)
    assert (done.returncode, done.stdout) == (0, "OK: node gpu-07 healthy (2 GPUs checked)\n")


def test_a_bare_agent_on_a_node_without_gpus_is_healthy_for_what_it_has(agent_factory,
                                                                         tmp_path: Path) -> None:
    """No fake GPUs: the real NVML, absent on this machine (the nvml collector finds no
    hardware), and an empty kernel log: absent is not failing."""
    pynvml = pytest.importorskip("pynvml")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass  # no driver: the node this test is about
    else:
        pynvml.nvmlShutdown()
        pytest.skip("this machine has an NVIDIA driver: its GPUs are not absent")
    log = tmp_path / "kern.log"
    log.write_text("")
    agent = agent_factory("--path.kmsg", str(log), "--node.name", "cpu-01")
    # The nvml collector's first round is in (whatever series says it found no hardware).
    assert wait_for(lambda: any(line.startswith("laggard_collector_") and 'collector="nvml"'
                                in line for line in agent.scrape().splitlines()), 10)
    done = healthcheck(f"http://127.0.0.1:{agent.port}")
    assert (done.returncode, done.stdout) == (0, "OK: node cpu-01 healthy (no GPU)\n")


def test_a_gpu_fallen_off_the_bus_is_a_problem(agent_factory, tmp_path: Path) -> None:
    _, url, _ = start(agent_factory, tmp_path, FALLEN_OFF)
    assert wait_for(lambda: any(f["kind"] == "gpu_lost" for f in findings(url)), 10)
    done = healthcheck(url)
    assert (done.returncode, done.stdout) == (1, f"PROBLEM: GPU {UNLISTED} lost (+1 more)\n")


def test_the_default_fake_gpu_story_lost_gpu_dbe_and_pending_remap_read_from_nvml(
        agent_factory, tmp_path: Path) -> None:
    """The fake NVML's default scenario (nvml/fake.py), one step a second from the agent's
    start: Xid 48 with an uncorrected ECC error and a pending row remap on GPU 0 at step 40
    (an NVML event), the last GPU lost at steps 50-59 (GpuIsLost), all reset when the 60-step
    period wraps. Checked while GPU 1 is lost: every NVML-side rule, in order."""
    _, url, _ = start(agent_factory, tmp_path, scenario="default")
    lost = 'laggard_gpu_lost{gpu="1"} 1.0'
    for _ in range(2):  # a check that misses the 10-step window (a loaded host) tries again
        assert wait_for(lambda: lost in scrape(f"{url}/metrics"), 90)
        done = healthcheck(url)
        if lost in scrape(f"{url}/metrics"):
            break
    problems = [line.split(": ", 1)[0] for line in done.stderr.splitlines()
                if line.startswith("problem ")]
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout == "PROBLEM: GPU 1 lost (+3 more)\n"
    assert problems == ["problem gpu_lost gpu1", "problem xid 48/gpu0",
                        "problem row_remap_pending gpu0", "problem ecc_uncorrected gpu0"]


def test_a_warning_xid_is_not_a_problem_a_critical_one_appended_later_is(
        agent_factory, tmp_path: Path) -> None:
    _, url, log = start(agent_factory, tmp_path, XID13)
    assert wait_for(lambda: any(f["kind"] == "xid" for f in findings(url)), 10)
    assert healthcheck(url).returncode == 0
    with log.open("a") as f:
        f.write(DBE)
    assert wait_for(lambda: len([f for f in findings(url) if f["kind"] == "xid"]) == 2, 10)
    done = healthcheck(url)
    assert (done.returncode, done.stdout) == (1, "PROBLEM: critical Xid 48 on gpu0 (reset_gpu)\n")
    # Taken as handled once older than --xid-max-age (the DBE line is 30 s old).
    assert healthcheck(url, "--xid-max-age", "0.1").returncode == 0


def test_a_clock_event_reason_is_a_problem_once_held_for_the_threshold(
        agent_factory, tmp_path: Path) -> None:
    _, url, _ = start(agent_factory, tmp_path, scenario="throttle:1:hw_slowdown")
    assert wait_for(lambda: any(f["detector"] == "throttle" for f in findings(url)), 10)
    assert healthcheck(url).returncode == 0  # held for seconds, not the default 5 minutes
    done = healthcheck(url, "--clock-event-minutes", "0")
    assert done.returncode == 1
    assert done.stdout.startswith("PROBLEM: GPU 1 clocks held by hw_slowdown for "), done.stdout
    # A site that counts only thermal reasons.
    assert healthcheck(url, "--clock-event-minutes", "0", "--clock-event-reasons",
                       "sw_thermal,hw_thermal").returncode == 0
    bad = healthcheck(url, "--clock-event-reasons", "hw_slowdown,power")
    assert bad.returncode == 2 and "clock_event_reasons: ['power']" in bad.stdout


def test_an_agent_that_cannot_be_read_is_unknown_never_healthy(agent_factory,
                                                                tmp_path: Path) -> None:
    agent, url, _ = start(agent_factory, tmp_path)
    stop_agent(agent)
    done = healthcheck(url)
    assert done.returncode == 2
    assert done.stdout.startswith(f"UNKNOWN: agent unreachable: {url}/metrics: "), done.stdout


class _NotAnAgent(BaseHTTPRequestHandler):
    """An HTTP server on the agent's port that is something else (a 404 everywhere but
    ``/metrics``, which serves another exporter's metrics)."""

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        body = b"node_load1 0.5\n" if self.path == "/metrics" else b"not found\n"
        self.send_response(200 if self.path == "/metrics" else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.mark.parametrize("findings_status", [404, 200])
def test_something_else_on_the_port_is_unknown(findings_status: int) -> None:
    handler = type("Handler", (_NotAnAgent,), {})
    if findings_status == 200:  # /findings answers JSON, but /metrics has no laggard agent
        original = handler.do_GET

        def do_get(self) -> None:
            if self.path != "/findings":
                return original(self)
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"[]")

        handler.do_GET = do_get
    server = ThreadingHTTPServer(("127.0.0.1", free_port()), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        done = healthcheck(f"http://127.0.0.1:{server.server_port}")
    finally:
        server.shutdown()
        server.server_close()
    assert done.returncode == 2, done.stdout
    expected = ("UNKNOWN: agent unreachable: " if findings_status == 404
                else "UNKNOWN: no laggard_agent_info in /metrics")
    assert done.stdout.startswith(expected), done.stdout


def test_a_negative_threshold_is_refused_as_unknown() -> None:
    done = healthcheck("http://127.0.0.1:1", "--hung-minutes", "-1")
    assert (done.returncode, done.stdout) == (
        2, "UNKNOWN: bad flag: --hung-minutes must be >= 0 and finite, not -1.0\n")


#: A rank whose training thread hangs after 5 steps: its heartbeats go on (the same step) until
#: its stdin closes, then it exits. With a second argument, it hangs waiting in collective 101
#: of group g0[0,8], which rank 8 (on another node) never issued.
HUNG_RANK = r"""
import os, socket, sys, threading, time
from laggard.wire import GroupProgress, Heartbeat, StepRecord
path = sys.argv[1]
groups = [GroupProgress("g0[0,8]", issued=101, completed=100, op="allreduce",
                        issued_age_seconds=0.5)] if len(sys.argv) > 2 else []
sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
for step in range(5):
    sock.sendto(StepRecord(rank=0, world_size=1, step=step, run="hung-run",
                           step_seconds=0.05).encode(), path)
def beat():
    while True:
        sock.sendto(Heartbeat(rank=0, world_size=1, step=5, run="hung-run", pid=os.getpid(),
                              phase="forward", phase_seconds=1.0, groups=groups).encode(), path)
        time.sleep(0.2)
threading.Thread(target=beat, daemon=True).start()
sys.stdin.read()
"""


@pytest.mark.parametrize("waits_on_another_node", [False, True])
def test_a_rank_of_this_node_stalled_past_the_threshold_is_hung_unless_a_victim(
        agent_factory, tmp_path: Path, waits_on_another_node: bool) -> None:
    socket_path = tmp_path / "intake.sock"
    agent = agent_factory("--intake.socket", str(socket_path), "--intake.stall-seconds", "1",
                          "--collector.nvml.fake-gpus", "1",
                          "--collector.nvml.fake-gpus-scenario", "steady")
    url = f"http://127.0.0.1:{agent.port}"
    extra = ["waits"] if waits_on_another_node else []
    rank = subprocess.Popen([sys.executable, "-c", HUNG_RANK, str(socket_path), *extra],
                            stdin=subprocess.PIPE, text=True)
    stalled = 'laggard_rank_stalled_seconds{rank="0",run="hung-run"}'

    def stalled_seconds() -> float:
        line = next((ln for ln in agent.scrape().splitlines() if ln.startswith(stalled)), "")
        return float(line.rpartition(" ")[2] or 0)

    try:
        assert wait_for(lambda: stalled_seconds() >= 3, 20)
        assert healthcheck(url).returncode == 0  # seconds, not the default 10 minutes
        done = healthcheck(url, "--hung-minutes", "0.03")
        if waits_on_another_node:  # a victim: rank 8's node is the one to look at
            assert done.returncode == 0, done.stdout
        else:
            assert done.returncode == 1
            assert done.stdout.startswith("PROBLEM: rank 0 of run hung-run stalled for "), (
                done.stdout)
    finally:
        assert rank.stdin is not None
        rank.stdin.close()
        rank.wait(timeout=budget(10))
    # An exited rank is not hung (its stall is 0 once the agent sees the process gone).
    assert wait_for(lambda: stalled_seconds() == 0, 10)
    assert healthcheck(url, "--hung-minutes", "0.03").returncode == 0


def test_a_straggler_rank_of_this_node_held_past_the_threshold(agent_factory,
                                                               tmp_path: Path) -> None:
    """Rank 0's WindowReports over the agent's UDP intake name rank 1 of this node (and rank 3
    of another) a straggler, window after window: the held finding is a problem once it has
    held for --straggler-minutes; another node's rank never is."""
    agent, url, _ = start(agent_factory, tmp_path)

    def straggler(rank: int, node: str) -> dict:
        return Finding(detector="straggler", kind="compute", severity=Severity.WARNING,
                       message=f"rank {rank} compute 40% above the median", rank=rank,
                       node=node, local_rank=rank, step=40).to_dict()

    mine, theirs = straggler(1, "gpu-07"), straggler(3, "gpu-08")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        def send(payload: bytes) -> None:
            sock.sendto(payload, ("127.0.0.1", agent.intake_port))

        send(StepRecord(rank=0, world_size=4, step=40, run="job", step_seconds=0.1).encode())
        send(WindowReport(step=40, world_size=4, run="job", findings=[mine, theirs],
                          active=[mine, theirs]).encode())
        assert wait_for(lambda: len(findings(url)) == 2, 10)
        time.sleep(1.5)  # the next window, 1.5 s on: both still hold
        send(WindowReport(step=48, world_size=4, run="job", active=[mine, theirs]).encode())
        assert wait_for(lambda: all(f["last_seen"] != f["first_seen"] for f in findings(url)),
                        10)
    assert healthcheck(url).returncode == 0  # held 1.5 s, not the default 10 minutes
    done = healthcheck(url, "--straggler-minutes", "0.02")
    assert done.returncode == 1
    assert done.stdout.startswith("PROBLEM: rank 1 (compute) a straggler for "), done.stdout
    assert "(+" not in done.stdout  # rank 3 is gpu-08's


# -- Slurm: HealthCheckProgram ----------------------------------------------------------------


def _reasons(cluster: SlurmCluster) -> list[str]:
    return [line.split("|", 1)[1] for line in cluster.sinfo_reasons().splitlines()]


def test_slurm_drains_its_node_with_the_structured_reason_only_when_acting(
        agent_factory, tmp_path: Path, slurm_cluster: SlurmCluster) -> None:  # noqa: F811
    _, url, _ = start(agent_factory, tmp_path, FALLEN_OFF)
    assert wait_for(lambda: any(f["kind"] == "gpu_lost" for f in findings(url)), 10)
    slurm = ["--slurm", "--node", slurm_cluster.node]
    env = slurm_cluster.env

    dry = healthcheck(url, *slurm, env=env)
    assert dry.returncode == 1
    assert _reasons(slurm_cluster) == [] and not slurm_cluster.state().drained
    assert "audit action=drain target=" in dry.stderr and "outcome=would_act" in dry.stderr
    assert f"reason=laggard:gpu_lost:{UNLISTED}" in dry.stderr

    acted = healthcheck(url, *slurm, "--act", env=env)
    assert acted.returncode == 1 and "outcome=acted" in acted.stderr, acted.stderr
    assert _reasons(slurm_cluster) == [f"laggard:gpu_lost:{UNLISTED}"]
    again = healthcheck(url, *slurm, "--act", env=env)  # slurmd runs it every interval
    assert "outcome=skipped" in again.stderr and "already drained by laggard" in again.stderr
    assert _reasons(slurm_cluster) == [f"laggard:gpu_lost:{UNLISTED}"]


def test_slurm_leaves_another_drain_alone_and_resumes_only_its_own(
        agent_factory, tmp_path: Path, slurm_cluster: SlurmCluster) -> None:  # noqa: F811
    _, url, _ = start(agent_factory, tmp_path, FALLEN_OFF, log_name="sick.log")
    _, healthy_url, _ = start(agent_factory, tmp_path, log_name="well.log")
    assert wait_for(lambda: any(f["kind"] == "gpu_lost" for f in findings(url)), 10)
    slurm = ["--slurm", "--act", "--slurm-resume", "--node", slurm_cluster.node]
    env = slurm_cluster.env

    slurm_cluster.drain_as_someone_else("bad DIMM, ticket 4711")
    sick = healthcheck(url, *slurm, env=env)
    assert sick.returncode == 1 and "drained by someone else" in sick.stderr, sick.stderr
    well = healthcheck(healthy_url, *slurm, env=env)
    assert well.returncode == 0 and "not laggard's" in well.stderr, well.stderr
    assert _reasons(slurm_cluster) == ["bad DIMM, ticket 4711"]

    slurm_cluster.run("scontrol", "update", f"nodename={slurm_cluster.node}", "state=resume")
    assert healthcheck(url, *slurm, env=env).returncode == 1
    assert _reasons(slurm_cluster) == [f"laggard:gpu_lost:{UNLISTED}"]
    # Without --slurm-resume a healthy verdict leaves laggard's drain for a person to lift.
    assert healthcheck(healthy_url, *slurm[:2], "--node", slurm_cluster.node,
                       env=env).returncode == 0
    assert _reasons(slurm_cluster) == [f"laggard:gpu_lost:{UNLISTED}"]
    resumed = healthcheck(healthy_url, *slurm, env=env)
    assert resumed.returncode == 0 and "action=resume" in resumed.stderr, resumed.stderr
    assert _reasons(slurm_cluster) == [] and not slurm_cluster.state().drained


def test_slurm_drains_nothing_when_the_agent_is_down(
        tmp_path: Path, slurm_cluster: SlurmCluster) -> None:  # noqa: F811
    done = healthcheck(f"http://127.0.0.1:{free_port()}", "--slurm", "--act", "--node",
                       slurm_cluster.node, env=slurm_cluster.env)
    assert done.returncode == 2 and "audit" not in done.stderr
    assert _reasons(slurm_cluster) == []


@pytest.mark.parametrize("act", [True, False], ids=["act", "dry_run"])
def test_slurmd_runs_the_shipped_health_check_program_and_it_drains_the_node(
        agent_factory, tmp_path: Path, act: bool) -> None:
    """slurmd itself runs deploy/slurm/laggard-healthcheck.sh (its HealthCheckProgram, at its
    start and every 2 s) with only SLURMD_NODENAME set: with --act the node is drained with
    laggard's reason; in the dry run the log says what it would do and nothing is drained."""
    _, url, _ = start(agent_factory, tmp_path, FALLEN_OFF)
    assert wait_for(lambda: any(f["kind"] == "gpu_lost" for f in findings(url)), 10)
    log = tmp_path / "healthcheck.log"
    laggard = shutil.which("laggard") or str(Path(sys.executable).parent / "laggard")
    # slurmd passes no environment but SLURMD_NODENAME: what a site sets in the script's
    # first lines (its agent's address, the test cluster's conf) comes from a wrapper here.
    wrapper = tmp_path / "health-check-program"
    conf_dir = Path(tempfile.mkdtemp(prefix="laggard-hc-"))
    wrapper.write_text(
        "#!/bin/sh\n"
        f"export LAGGARD={laggard} LAGGARD_AGENT_URL={url} LAGGARD_HEALTHCHECK_LOG={log}\n"
        f"export SLURM_CONF={conf_dir}/slurm.conf\n"
        f"export LAGGARD_HEALTHCHECK_FLAGS='{'--act' if act else ''}'\n"
        f"exec {HEALTH_CHECK_PROGRAM}\n")
    wrapper.chmod(0o755)
    cluster = start_slurm(f"HealthCheckProgram={wrapper}\nHealthCheckInterval=2\n"
                          "HealthCheckNodeState=ANY\n", root=conf_dir)
    try:
        if cluster.slurmd_error:
            pytest.skip(cluster.slurmd_error)
        outcome = "outcome=acted" if act else "outcome=would_act"
        assert wait_for(lambda: log.exists() and outcome in log.read_text(), 30), (
            log.read_text() if log.exists() else "no log")
        text = log.read_text()
        assert f"target={cluster.node}" in text and "outcome=failed" not in text, text
        if act:
            assert "outcome=acted" in text, text
            assert wait_for(lambda: _reasons(cluster) == [f"laggard:gpu_lost:{UNLISTED}"], 10)
            assert cluster.state().drained_by_laggard
        else:
            assert "outcome=would_act" in text and "outcome=acted" not in text, text
            assert _reasons(cluster) == [] and not cluster.state().drained
    finally:
        cluster.stop()
        shutil.rmtree(conf_dir, ignore_errors=True)
