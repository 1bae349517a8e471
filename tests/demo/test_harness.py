"""The demos' process plumbing: ports, waiting, and a Prometheus that never outlives its starter."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support import budget

from laggard.demo.harness import NotReadyError, free_port, load_factor, scaled, wait_until_ready


def test_wait_until_ready_names_a_process_that_exited() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    proc.wait()
    with pytest.raises(NotReadyError, match="exited 3"):
        wait_until_ready(f"http://127.0.0.1:{free_port()}/", timeout=5, what="thing",
                         procs=[proc])


def test_wait_until_ready_times_out_with_the_url() -> None:
    url = f"http://127.0.0.1:{free_port()}/metrics"
    with pytest.raises(NotReadyError, match="did not answer"):
        wait_until_ready(url, timeout=0.3)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("prometheus") is None, reason="apt-get install prometheus")
def test_prometheus_dies_with_a_starter_killed_by_sigkill(tmp_path: Path) -> None:
    starter = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time; from pathlib import Path\n"
         "from laggard.demo.harness import PrometheusServer\n"
         "server = PrometheusServer(Path(sys.argv[1]), []).start()\n"
         "print(server.proc.pid, flush=True); time.sleep(600)", str(tmp_path)],
        stdout=subprocess.PIPE, text=True)
    try:
        pid = int(starter.stdout.readline())
        os.kill(pid, 0)  # running
    finally:
        starter.send_signal(signal.SIGKILL)
        starter.wait()
    started = time.monotonic()
    while time.monotonic() - started < budget(15):
        try:
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            return
        if state == "Z":  # exited; only its reaping is left to init
            return
        time.sleep(0.1)
    os.kill(pid, signal.SIGKILL)
    pytest.fail("prometheus outlived the process that started it")


def test_waits_scale_with_the_load_per_cpu_and_never_shrink(monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr(os, "getloadavg", lambda: (20.0, 10.0, 5.0))
    assert load_factor() == 10.0  # a load average of 20 on 2 cores: 10 times slower
    assert scaled(30) == 300.0 and budget(6) == 60.0
    monkeypatch.setattr(os, "getloadavg", lambda: (0.5, 0.5, 0.5))
    assert load_factor() == 1.0 and scaled(30) == 30.0  # idle: the figure as written

    def no_loadavg() -> tuple[float, float, float]:
        raise OSError("no load average here")

    monkeypatch.setattr(os, "getloadavg", no_loadavg)
    assert load_factor() == 1.0
