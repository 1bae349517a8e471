"""The host-context participant on this real machine (real psutil, real /proc): its columns,
preemptions it really measures under CPU hogs, reads that fail counted and never raised; the
monitor hosting it by default; a whole-job slowdown that names CPU-bound hosts; and one real
4-rank gloo job with a CPU hog beside it (host_contention_worker.py)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
from support import budget, torchrun, wait_for

from laggard.demo.harness import load_factor
from laggard.detectors.host_contention import HOST_CONTEXT_COLUMN_NAMES, describe_host_contention
from laggard.detectors.window import WindowLayout, WindowRecord
from laggard.integrations import host_context
from laggard.integrations.host_context import HostContextParticipant, HostReading, window_values
from laggard.integrations.monitor import TrainingMonitor
from laggard.integrations.participants import MonitorContext

HERE = Path(__file__).parent
HAS_PSI = Path("/proc/pressure/cpu").exists()


def _context() -> MonitorContext:
    return MonitorContext(rank=0, world_size=1, node="node07", local_rank=0, window_steps=5,
                          group=lambda: None, log_once=lambda key, msg, *args: None,
                          count_error=lambda where, exc: None)


def _participant(**kwargs) -> HostContextParticipant:
    p = HostContextParticipant(**kwargs)
    p.attach(_context())
    return p


def _spin_thread_cpu(seconds: float) -> None:
    """Run this thread until it has had ``seconds`` of CPU (however long that takes)."""
    start = time.thread_time()
    while time.thread_time() - start < seconds:
        pass


def _hogs(count: int) -> list[subprocess.Popen]:
    """``count`` busy Python processes (each one CPU's worth); the caller kills them."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]


def _kill(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        proc.kill()
    for proc in procs:
        proc.wait()


def test_every_column_of_this_machine_is_read_and_in_range():
    p = _participant()
    _spin_thread_cpu(0.05)
    values = p.contribute(4)
    assert set(values) == set(HOST_CONTEXT_COLUMN_NAMES)
    assert values["host_load1_per_cpu"] == pytest.approx(
        psutil.getloadavg()[0] / psutil.cpu_count(), abs=0.5)
    assert 0 <= values["host_cpu_steal_ratio"] <= 1  # Linux counts steal (0 on bare metal)
    assert values["rank_involuntary_switches_per_second"] >= 0
    if HAS_PSI:
        assert 0 <= values["host_cpu_pressure_some_ratio"] <= 1
    else:
        assert math.isnan(values["host_cpu_pressure_some_ratio"])
    assert p.stats["windows"] == 1 and not any(k.endswith("_errors") for k in p.stats)
    layout = WindowLayout(p.columns)  # packs into the gather vector
    assert layout.unpack(np.stack([layout.pack(values)]))["host_load1_per_cpu"].shape == (1,)


def test_cpu_hogs_show_as_pressure_and_as_preemptions_of_this_thread():
    p = _participant()
    hogs = _hogs(2 * (psutil.cpu_count() or 1))
    try:
        _spin_thread_cpu(0.3)  # more runnable processes than CPUs: the scheduler preempts it
        values = p.contribute(9)
    finally:
        _kill(hogs)
    assert values["rank_involuntary_switches_per_second"] > 0
    if HAS_PSI:
        assert values["host_cpu_pressure_some_ratio"] > 0


def test_a_kernel_without_psi_leaves_pressure_nan_and_stops_asking(tmp_path):
    p = _participant(proc_root=str(tmp_path))  # no pressure/cpu there
    values = [p.contribute(step) for step in (4, 9)]
    assert all(math.isnan(v["host_cpu_pressure_some_ratio"]) for v in values)
    assert p.stats["pressure_unavailable"] == 1 and p.stats["pressure_errors"] == 0
    assert math.isfinite(values[1]["host_load1_per_cpu"])


def test_a_garbled_pressure_file_and_a_failing_psutil_are_counted_never_raised(tmp_path,
                                                                               monkeypatch):
    (tmp_path / "pressure").mkdir()
    (tmp_path / "pressure" / "cpu").write_text("some avg10=garbled\n")
    p = _participant(proc_root=str(tmp_path))

    def broken():
        raise psutil.AccessDenied(1, "cpu_times")

    monkeypatch.setattr(host_context.psutil, "cpu_times", broken)
    values = p.contribute(4)
    assert math.isnan(values["host_cpu_pressure_some_ratio"])
    assert math.isnan(values["host_cpu_steal_ratio"])
    assert math.isfinite(values["rank_involuntary_switches_per_second"])
    assert p.stats["pressure_errors"] == 2  # at attach and at the window
    assert p.stats["cpu_times_errors"] == 1  # broken after attach


def test_window_values_are_deltas_over_the_window_with_guest_time_counted_once():
    times = {"user": 100.0, "nice": 0.0, "system": 20.0, "idle": 500.0, "steal": 10.0,
             "guest": 50.0, "guest_nice": 0.0}
    last = HostReading(10.0, 1.0, 5.0, times, 1000)
    later = {**times, "user": 130.0, "system": 30.0, "idle": 540.0, "steal": 30.0,
             "guest": 80.0}  # 30 s of user of which 30 s guest: not 60 s
    now = HostReading(12.0, 6.0, 6.5, later, 1400)
    values = window_values(last, now, cpus=4)
    assert values["host_load1_per_cpu"] == 1.5 and values["host_cpus"] == 4.0
    assert values["host_cpu_pressure_some_ratio"] == pytest.approx(0.75)
    assert values["host_cpu_steal_ratio"] == pytest.approx(20 / (30 + 10 + 40 + 20))
    assert values["rank_involuntary_switches_per_second"] == 200.0
    first = window_values(None, now, cpus=None)
    assert all(math.isnan(v) for v in first.values())


def test_the_monitor_hosts_it_by_default_and_the_config_turns_it_off():
    on = TrainingMonitor(TrainingMonitor.Config(agent_address="", heartbeat_seconds=0,
                                                hang_store_seconds=0), rank=0, world_size=4)
    off = TrainingMonitor(TrainingMonitor.Config(agent_address="", heartbeat_seconds=0,
                                                 hang_store_seconds=0, host_context=False),
                          rank=0, world_size=4)
    try:
        assert isinstance(on.participant("host_context"), HostContextParticipant)
        assert off.participant("host_context") is None
    finally:
        on.close()
        off.close()


def _window(rng: np.random.Generator, step: int, factor: float, pressure: float) -> WindowRecord:
    ranks = 8
    compute = 0.1 * factor * (1 + 0.01 * rng.standard_normal(ranks))
    columns = {"compute_seconds": compute, "data_seconds": np.full(ranks, 0.001),
               "collective_wait_seconds": 0.01 + compute.max() - compute,
               "transfer_seconds": np.full(ranks, np.nan),
               "step_seconds": np.full(ranks, compute.max() + 0.012),
               "host_load1_per_cpu": np.full(ranks, 1.0 + 2 * pressure),
               "host_cpu_pressure_some_ratio": np.full(ranks, pressure),
               "host_cpu_steal_ratio": np.zeros(ranks),
               "rank_involuntary_switches_per_second": np.full(ranks, 400 * pressure)}
    return WindowRecord(step=step, columns=columns, ranks=np.arange(ranks), world_size=ranks,
                        nodes=["node07"] * 4 + ["node08"] * 4)


def test_a_whole_job_slowdown_on_cpu_bound_hosts_says_so_through_the_monitor():
    monitor = TrainingMonitor(TrainingMonitor.Config(agent_address="", heartbeat_seconds=0,
                                                     hang_store_seconds=0),
                              rank=0, world_size=8)
    rng = np.random.default_rng(5)
    try:
        for i in range(24):
            busy = i >= 10
            monitor.analyse(_window(rng, 20 * i + 19, 1.4 if busy else 1.0,
                                    0.55 if busy else 0.02))
    finally:
        monitor.close()
    (finding,) = [f for f in monitor.findings if f.kind == "job_slowdown"]
    assert "not one rank: the hosts were CPU-bound: 2 of 2 nodes (node07, node08), load up " \
           "to 2.1 per CPU, CPU pressure up to 55% (PSI some)" in finding.message, finding.message
    assert "; else check shared storage" in finding.message
    assert finding.evidence["host"]["cpu_bound_nodes"] == 2


@pytest.mark.slow
def test_a_real_job_beside_cpu_hogs_carries_the_columns_and_names_its_busy_host(tmp_path):
    outcome: dict[str, subprocess.CompletedProcess[str]] = {}
    job = threading.Thread(target=lambda: outcome.setdefault("proc", torchrun(
        HERE / "host_contention_worker.py", 4, str(tmp_path), f"{load_factor():.2f}",
        timeout=180)), daemon=True)
    job.start()
    hogs: list[subprocess.Popen] = []
    try:
        assert wait_for(lambda: (tmp_path / "warm").exists() or not job.is_alive(), 120)
        assert (tmp_path / "warm").exists(), outcome.get("proc")
        hogs = _hogs(2 * (psutil.cpu_count() or 1))  # bounded: twice the CPUs, killed below
        (tmp_path / "hogs").write_text(" ".join(str(h.pid) for h in hogs))
        job.join(budget(180))
    finally:
        _kill(hogs)
    proc = outcome["proc"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "result.json").read_text())
    windows = result["windows"]
    assert len(windows) >= 20 and not any(k.endswith("_errors") for k in result["host_stats"])
    for window in windows:  # every record carries the columns, one value per rank
        assert all(len(window[name]) == 4 for name in HOST_CONTEXT_COLUMN_NAMES)
        assert all(v is not None and v >= 0 for v in window["host_load1_per_cpu"])
    hogged = windows[-6:]  # well after the hogs started: 4 ranks + 4 hogs on this host
    for window in hogged:
        record = WindowRecord(step=window["step"], ranks=np.arange(4), nodes=window["nodes"],
                              columns={n: np.array([np.nan if v is None else v
                                                    for v in window[n]])
                                       for n in HOST_CONTEXT_COLUMN_NAMES})
        described = describe_host_contention(record)
        assert described is not None and "the hosts were CPU-bound: 1 of 1 nodes" in \
            described[0], window
    slowdowns = [f for f in result["raised"] if f["kind"] == "job_slowdown"]
    print("load", os.getloadavg(), "job_slowdown:", [f["message"] for f in slowdowns])
    for finding in slowdowns:
        assert "not one rank: the hosts were CPU-bound: 1 of 1 nodes" in finding["message"], \
            finding
        cpus = psutil.cpu_count()
        assert (f"4 ranks on {cpus} CPUs" in finding["message"]) == (cpus < 4), finding
        assert finding["evidence"]["host"]["cpu_bound_nodes"] == 1
