"""Real 3-rank gloo jobs that hang on purpose: rank 0's log names the rank that holds the job up,
through the job's own store, while the job hangs; a long step on every rank is not a hang; the
heartbeat datagrams arrive on a real Unix datagram socket. Every process is killed at the end.

One process per rank (``hang_worker.py``), rendezvous over TCP on loopback (rank 0 hosts the
store), the hang rules of ``laggard.detectors.hang``.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from support import budget

pytest.importorskip("torch")

from laggard.demo.harness import free_port  # noqa: E402
from laggard.wire import Heartbeat, RecordError, decode_items  # noqa: E402

HERE = Path(__file__).resolve().parent
WORLD = 3
HUNG_RANK = 2
HUNG_STEP = 6
pytestmark = pytest.mark.slow


class Job:
    """The ranks of one job, each in a session of its own (so it can be killed whole)."""

    def __init__(self, out: Path, **cfg: object) -> None:
        self.out = out
        port = free_port()
        config = {"scenario": "data", "rank": HUNG_RANK, "step": HUNG_STEP, "steps": 40,
                  "hang_seconds": None, "store_seconds": 2.0, "agent": "", "step_sleep": 0.0,
                  "long_seconds": 0.0, **cfg}
        self.procs: list[subprocess.Popen] = []
        for rank in range(WORLD):
            env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(WORLD),
                   "LOCAL_RANK": str(rank), "MASTER_ADDR": "127.0.0.1",
                   "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"}
            env.pop("LAGGARD_INTAKE", None)
            self.procs.append(subprocess.Popen(
                [sys.executable, str(HERE / "hang_worker.py"), str(out), json.dumps(config)],
                env=env, stdout=subprocess.DEVNULL, stderr=open(out / f"err{rank}.log", "w"),
                start_new_session=True))

    def wait_for_file(self, name: str, timeout: float) -> dict | None:
        """The JSON file ``name`` once a rank has written it; None after ``timeout`` seconds
        or once every rank has exited without it."""
        deadline = time.monotonic() + timeout
        path = self.out / name
        while time.monotonic() < deadline:
            if path.exists():
                return json.loads(path.read_text())
            if all(p.poll() is not None for p in self.procs):
                break
            time.sleep(0.2)
        return json.loads(path.read_text()) if path.exists() else None

    def stderr(self, rank: int) -> str:
        return (self.out / f"err{rank}.log").read_text()

    def kill(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)  # the rank's own session: only ours
        for proc in self.procs:
            proc.wait(budget(10))


@pytest.fixture
def job(tmp_path):
    started: list[Job] = []

    def start(**cfg: object) -> Job:
        started.append(Job(tmp_path, **cfg))
        return started[-1]

    yield start
    for j in started:
        j.kill()


def _hang_lines(job: Job) -> list[str]:
    return [line for line in job.stderr(0).splitlines() if line.startswith("laggard.hang ")]


def _assert_named(job: Job, kind: str, phase: str, within: float) -> dict:
    """Rank 0 reported the hung rank, of ``kind``, in ``phase``, ``within`` seconds of the hang
    starting (idle-machine seconds, ``budget``-ed by the load), with one log line."""
    within = budget(within)
    start = job.wait_for_file("hang_start.json", timeout=budget(180))
    assert start is not None, job.stderr(0)[-3000:]
    report = job.wait_for_file("report.json", timeout=within + 60)
    assert report is not None, job.stderr(0)[-3000:]
    assert report["ranks"] == [HUNG_RANK], report
    assert {c["kind"] for c in report["culprits"]} == {kind}
    assert report["time"] - start["time"] <= within, report
    lines = _hang_lines(job)
    assert len(lines) == 1, lines
    assert f"rank {HUNG_RANK} never issued it (last in phase {phase} for " in lines[0]
    assert lines[0].endswith(report["message"])
    return report


def test_a_rank_blocked_in_its_data_loading_is_named_missing_within_30_s(job):
    """Default thresholds: 10 s without progress, keys every 2 s."""
    running = job(scenario="data")
    report = _assert_named(running, "missing", "data", within=30)
    assert report["step"] == HUNG_STEP
    assert f"hung since step {HUNG_STEP} in allreduce #" in report["message"]
    assert "of group default_pg" in report["message"]


def test_a_rank_spinning_in_python_keeps_its_heartbeat_and_is_named(job, tmp_path):
    path = str(tmp_path / "intake.sock")
    sink = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sink.bind(path)
    sink.settimeout(0.5)
    beats: list[tuple[float, Heartbeat]] = []
    rejected: list[str] = []
    stop = threading.Event()

    def receive() -> None:
        while not stop.is_set():
            try:
                payload = sink.recv(65536)
            except TimeoutError:
                continue
            try:
                items = decode_items(payload)  # step records come batched on the socket
            except RecordError as exc:
                rejected.append(exc.reason)
                continue
            beats.extend((time.time(), item) for item in items if isinstance(item, Heartbeat))

    reader = threading.Thread(target=receive, daemon=True)
    reader.start()
    try:
        running = job(scenario="python", agent=path, hang_seconds=3.0, store_seconds=0.5)
        _assert_named(running, "missing", "forward", within=30)
        start = json.loads((tmp_path / "hang_start.json").read_text())
        deadline = time.monotonic() + budget(20)
        while time.monotonic() < deadline and not any(
                t > start["time"] + 3 and b.rank == HUNG_RANK for t, b in beats):
            time.sleep(0.2)
    finally:
        stop.set()
        reader.join(5)
        sink.close()
    assert not rejected
    assert {b.rank for _, b in beats} == set(range(WORLD))
    for _, b in beats:
        assert (b.run, b.world_size, b.node) == ("hang-test", WORLD, f"node{b.rank}")
    spinning = [b for t, b in beats if b.rank == HUNG_RANK and t > start["time"] + 1]
    assert len(spinning) >= 2  # its heartbeat goes on while its training thread spins
    assert all((b.step, b.phase, b.pid) == (HUNG_STEP, "forward", start["pid"])
               for b in spinning)
    assert spinning[-1].phase_seconds > spinning[0].phase_seconds
    [dp] = [g for g in spinning[-1].groups if g.group.endswith(":0")]
    waiting = [b for t, b in beats if b.rank == 0 and t > start["time"] + 1][-1]
    [dp0] = [g for g in waiting.groups if g.group == dp.group]
    assert dp.issued < dp0.issued and dp0.pending > 0 and dp.pending == 0


def test_a_rank_that_skips_one_collective_is_named_in_that_group(job):
    running = job(scenario="skip", hang_seconds=3.0, store_seconds=0.5)
    report = _assert_named(running, "missing", "backward", within=30)
    [culprit] = report["culprits"]
    assert culprit["op"] == "allreduce" and culprit["seq"] == HUNG_STEP + 1
    assert f"in allreduce #{HUNG_STEP + 1} of group metrics: rank {HUNG_RANK}" in (
        report["message"])


def test_a_long_step_on_every_rank_is_slow_not_hung(job):
    """Every rank spends 20 steps' time in one checkpoint phase, past the 3 s threshold: rank 0
    reads the keys and classifies a quiet, level job, and reports nothing."""
    running = job(scenario="long", steps=16, step=8, step_sleep=0.3, long_seconds=6.0,
                  hang_seconds=3.0, store_seconds=0.5)
    result = running.wait_for_file("rank0.json", timeout=budget(240))
    assert result is not None, running.stderr(0)[-3000:]
    assert all(p.wait(budget(60)) == 0 for p in running.procs)
    assert not (running.out / "report.json").exists() and not _hang_lines(running)
    assert result["hangs_reported"] == 0 and result["classifications"] >= 1
    assert result["store_errors"] == 0 and result["bad_keys"] == 0
    assert result["store_reads"] >= 1 and result["store_writes"] >= 3
