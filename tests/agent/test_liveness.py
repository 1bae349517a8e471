"""ProcessWatch through psutil: real processes alive, exited, zombie; a fixture procfs with a
reused pid; no procfs."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil

from laggard.agent.liveness import ProcessWatch


def _stat(root: Path, pid: int, start_ticks: int, state: str = "S") -> None:
    fields = [state, "1"] + ["0"] * 17 + [str(start_ticks)] + ["0"] * 30
    (root / str(pid)).mkdir(parents=True, exist_ok=True)
    (root / str(pid) / "stat").write_text(f"{pid} (python3 (x)) {' '.join(fields)}\n")


def test_this_process_is_alive():
    watch = ProcessWatch()
    identity = watch.identify(os.getpid())
    assert identity is not None and watch.state(os.getpid(), identity) == "alive"


def test_a_child_that_exits_is_exited_and_a_zombie_too():
    watch = ProcessWatch(cache_seconds=0.0)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        identity = watch.identify(child.pid)
        assert watch.state(child.pid, identity) == "alive"
        child.kill()
        # Not reaped yet (no wait): a zombie, which has exited. Wait on its state, not a clock.
        while psutil.Process(child.pid).status() != psutil.STATUS_ZOMBIE:
            time.sleep(0.01)
        assert watch.state(child.pid, identity) == "exited"
    finally:
        child.kill()
        child.wait(timeout=10)
    assert watch.state(child.pid, identity) == "exited"  # reaped: gone
    assert watch.identify(child.pid) is None


def test_a_reused_pid_is_exited_and_the_procfs_root_is_restored(tmp_path):
    root = tmp_path / "proc"
    _stat(root, 4242, 777)
    watch = ProcessWatch(str(root), cache_seconds=0.0)
    before = psutil.PROCFS_PATH
    identity = watch.identify(4242)
    assert identity is not None and watch.state(4242, identity) == "alive"
    _stat(root, 4242, 9000)  # another process got the pid
    assert watch.state(4242, identity) == "exited"
    _stat(root, 4343, 5, state="Z")
    assert watch.identify(4343) is None
    assert psutil.PROCFS_PATH == before


def test_no_procfs_is_unknown(tmp_path):
    watch = ProcessWatch(str(tmp_path / "none"))
    assert watch.identify(os.getpid()) is None
    assert watch.state(os.getpid(), None) == "unknown"
    assert watch.state(None, None) == "unknown"
