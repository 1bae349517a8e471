"""Host collector (psutil): a golden exposition of a fixed psutil reading, this machine's own
values read back through a fresh registry, fields psutil does not offer left out, and a psutil
call that raises costing one failed round, not the agent."""

from __future__ import annotations

import os
from collections import namedtuple

import psutil
import pytest
from support import FIXTURES, registry_of

from laggard.agent.sampler import CollectorThread
from laggard.collectors import host
from laggard.collectors.host import HostCollector

# The field names psutil gives on Linux (psutil/_pslinux.py ``scputimes``, ``svmem``).
LinuxCpuTimes = namedtuple("LinuxCpuTimes", "user nice system idle iowait irq softirq steal "
                                            "guest guest_nice")
MacCpuTimes = namedtuple("MacCpuTimes", "user nice system idle")  # psutil/_psosx.py
Memory = namedtuple("Memory", "total available percent used free")
#: A procfs tree with a real /proc/pressure/cpu copied from a 2-CPU VM.
PROC = str(FIXTURES / "proc")


@pytest.fixture
def fixed_host(monkeypatch):
    """psutil and os.getloadavg giving the readings of a 2-socket training node."""
    monkeypatch.setattr(host.psutil, "cpu_times", lambda: LinuxCpuTimes(
        812345.25, 12.5, 90210.75, 9876543.5, 4321.0, 0.0, 210.5, 0.0, 0.0, 0.0))
    monkeypatch.setattr(host.psutil, "cpu_count", lambda: 224)
    monkeypatch.setattr(host.psutil, "virtual_memory", lambda: Memory(
        2164173619200, 1987654321152, 8.2, 160000000000, 1900000000000))
    monkeypatch.setattr(host.os, "getloadavg", lambda: (31.5, 29.25, 28.0))


def test_golden_exposition_of_a_fixed_reading(fixed_host, expose, golden):
    golden("host/node.prom", expose(HostCollector(proc_root=PROC)))


def test_exposition_passes_promtool(fixed_host, expose, promtool):
    promtool(expose(HostCollector(proc_root=PROC)))


def test_values_are_base_units_and_cpu_time_is_per_mode(fixed_host):
    registry = registry_of(HostCollector())
    assert registry.get_sample_value("laggard_host_cpu_seconds_total",
                                     {"mode": "iowait"}) == 4321.0
    assert registry.get_sample_value("laggard_host_cpu_seconds_total",
                                     {"mode": "user"}) == 812345.25
    assert registry.get_sample_value("laggard_host_cpus") == 224
    assert registry.get_sample_value("laggard_host_load5") == 29.25
    assert registry.get_sample_value("laggard_host_memory_total_bytes") == 2164173619200
    assert registry.get_sample_value("laggard_host_memory_available_bytes") == 1987654321152


def test_cpu_pressure_is_the_psi_some_total_in_seconds(fixed_host):
    registry = registry_of(HostCollector(proc_root=PROC))
    total = int((FIXTURES / "proc" / "pressure" / "cpu").read_text().split("total=")[1].split()[0])
    assert registry.get_sample_value(
        "laggard_host_pressure_cpu_waiting_seconds_total") == total / 1e6


def test_a_kernel_without_psi_gives_the_pressure_family_no_sample(fixed_host, tmp_path, expose):
    text = expose(HostCollector(proc_root=str(tmp_path)))
    assert "# TYPE laggard_host_pressure_cpu_waiting_seconds_total counter" in text
    assert "\nlaggard_host_pressure_cpu_waiting_seconds_total " not in text
    assert "laggard_host_load1 31.5" in text  # the rest is there


def test_this_machines_own_values():
    registry = registry_of(HostCollector())
    assert registry.get_sample_value("laggard_host_cpus") == psutil.cpu_count()
    total = registry.get_sample_value("laggard_host_memory_total_bytes")
    available = registry.get_sample_value("laggard_host_memory_available_bytes")
    assert total == psutil.virtual_memory().total and 0 < available <= total
    assert registry.get_sample_value("laggard_host_cpu_seconds_total", {"mode": "idle"}) > 0
    if hasattr(os, "getloadavg"):
        assert registry.get_sample_value("laggard_host_load1") >= 0
    if os.path.exists("/proc/pressure/cpu"):
        assert registry.get_sample_value("laggard_host_pressure_cpu_waiting_seconds_total") > 0


def test_fields_psutil_does_not_offer_are_left_out_not_zero(fixed_host, monkeypatch, expose,
                                                            value):
    monkeypatch.setattr(host.psutil, "cpu_times", lambda: MacCpuTimes(10.0, 0.0, 5.0, 100.0))

    def no_loadavg():
        raise OSError("getloadavg unavailable")

    monkeypatch.setattr(host.os, "getloadavg", no_loadavg)
    monkeypatch.setattr(host.psutil, "cpu_count", lambda: None)  # "undetermined"
    text = expose(HostCollector())
    assert value(text, 'laggard_host_cpu_seconds_total{mode="system"}') == 5.0
    assert 'mode="iowait"' not in text
    assert "laggard_host_load" not in text
    assert "laggard_host_cpus" not in text
    assert value(text, "laggard_host_memory_total_bytes") == 2164173619200  # the rest is there


def test_a_psutil_call_that_raises_fails_the_round_and_the_next_one_recovers(fixed_host,
                                                                             monkeypatch):
    good = psutil.virtual_memory

    def broken():
        raise psutil.Error("/proc/meminfo unreadable")

    thread = CollectorThread(HostCollector(), interval=60.0)
    assert thread.collect_once().success
    monkeypatch.setattr(host.psutil, "virtual_memory", broken)
    sample = thread.collect_once()
    assert not sample.success and sample.failures == 1
    assert sample.metrics  # the last good round is kept: counters do not vanish
    monkeypatch.setattr(host.psutil, "virtual_memory", good)
    assert thread.collect_once().success
