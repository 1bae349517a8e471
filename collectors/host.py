"""Host CPU, memory and load through psutil, and CPU pressure (PSI) from procfs, so a slow rank
can be matched to a busy host."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import psutil
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from laggard.collectors.base import AgentSettings, CollectorSpec
from laggard.parsers.pressure import parse_pressure


class HostCollector:
    """CPU time by mode, load averages, memory and the number of CPUs of this host.

    Series: ``laggard_host_cpu_seconds_total{mode}`` (summed over CPUs, like
    ``node_cpu_seconds_total`` without the per-CPU label), ``laggard_host_load1/5/15``,
    ``laggard_host_memory_total_bytes``, ``laggard_host_memory_available_bytes``,
    ``laggard_host_cpus``, and ``laggard_host_pressure_cpu_waiting_seconds_total`` (the ``some``
    total of ``/proc/pressure/cpu``, as node_exporter's ``node_pressure_cpu_waiting_seconds_total``;
    no sample on a kernel without PSI).

    Args:
        proc_root: root of procfs (``--path.procfs``; tests point it at a fixture tree).
    """

    name = "host"

    def __init__(self, proc_root: str = "/proc") -> None:
        self.pressure_path = Path(proc_root) / "pressure" / "cpu"

    def collect(self) -> Iterator[Metric]:
        """Sample psutil once; a field psutil does not offer on this OS is left out."""
        cpu = CounterMetricFamily(
            "laggard_host_cpu_seconds_total", "CPU time spent in each mode, all CPUs, in seconds.",
            labels=["mode"],
        )
        for mode, seconds in psutil.cpu_times()._asdict().items():
            cpu.add_metric([mode], seconds)
        yield cpu
        cpus = psutil.cpu_count()  # None where psutil cannot tell: left out, not 0
        if cpus:
            yield GaugeMetricFamily("laggard_host_cpus", "Logical CPUs of this host.", value=cpus)
        try:
            load = os.getloadavg()
        except OSError:
            load = None
        if load is not None:
            for minutes, value in zip((1, 5, 15), load, strict=True):
                yield GaugeMetricFamily(f"laggard_host_load{minutes}",
                                        f"{minutes}-minute load average.", value=value)
        pressure = CounterMetricFamily(
            "laggard_host_pressure_cpu_waiting_seconds_total",
            "Time some task waited for a CPU (PSI cpu some total), in seconds.")
        try:
            some = parse_pressure(self.pressure_path.read_text().splitlines()).get("some")
        except OSError:  # no PSI on this kernel (before 4.20, CONFIG_PSI off, psi=0)
            some = None
        if some is not None:
            pressure.add_metric([], some.total_seconds)
        yield pressure  # without PSI: the family with no sample
        memory = psutil.virtual_memory()
        yield GaugeMetricFamily("laggard_host_memory_total_bytes", "Physical memory, in bytes.",
                                value=memory.total)
        yield GaugeMetricFamily("laggard_host_memory_available_bytes",
                                "Memory available to new processes without swapping, in bytes.",
                                value=memory.available)


def from_config(settings: AgentSettings, context: object) -> HostCollector:
    """Registry factory."""
    return HostCollector(proc_root=settings.proc_root)


COLLECTOR = CollectorSpec(name="host", build=from_config, default=True,
                          help="CPU, memory and load of this host (psutil)")
