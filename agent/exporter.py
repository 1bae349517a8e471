"""The agent's one prometheus_client collector: latest samples, collector health, intake."""

from __future__ import annotations

import platform
from collections.abc import Iterable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from laggard import __version__
from laggard.agent.context import FindingLog
from laggard.agent.run_metrics import RunMetrics
from laggard.agent.run_table import RankTable
from laggard.agent.sampler import CollectorThread
from laggard.agent.supervisor import Supervisor
from laggard.agent.udp_intake import UdpIntake


class AgentExporter:
    """Yields every series the agent serves at ``/metrics``.

    Reads only what the collector threads and the intake already hold, so a scrape costs
    microseconds per series and never touches hardware.

    Args:
        threads: one per enabled collector.
        table: the intake's run table (rendered by :class:`RunMetrics`), or None when the
            intake is off.
        findings: findings raised on this node and reported by the job.
        node: this node's name (``laggard_agent_info{node}``).
        intake: the optional UDP intake (its kernel drops), or None.
        supervisor: the thread supervisor (its restart counts), or None.
    """

    def __init__(self, threads: Iterable[CollectorThread], table: RankTable | None,
                 findings: FindingLog, node: str, *, intake: UdpIntake | None = None,
                 supervisor: Supervisor | None = None) -> None:
        self._threads = list(threads)
        self._run_metrics = None if table is None else RunMetrics(table)
        self._findings = findings
        self._node = node
        self._intake = intake
        self._supervisor = supervisor

    def collect(self) -> Iterator[Metric]:
        """Called by prometheus_client on every scrape."""
        build = GaugeMetricFamily("laggard_build_info",
                                  "Version of laggard, and of the Python running it (value 1).",
                                  labels=["version", "python_version"])
        build.add_metric([__version__, platform.python_version()], 1)
        yield build
        agent = GaugeMetricFamily("laggard_agent_info", "This agent's node name (value 1).",
                                  labels=["node"])
        agent.add_metric([self._node], 1)
        yield agent
        success = GaugeMetricFamily(
            "laggard_collector_success",
            "1 if the collector's last round succeeded, 0 if it failed or found no hardware.",
            labels=["collector"])
        duration = GaugeMetricFamily("laggard_collector_duration_seconds",
                                     "Duration of the collector's last round, in seconds.",
                                     labels=["collector"])
        merged: dict[str, Metric] = {}
        for thread in self._threads:
            sample = thread.sample
            name = thread.collector.name
            success.add_metric([name], 1 if sample.success else 0)
            duration.add_metric([name], sample.duration_seconds)
            for metric in sample.metrics:
                # Two collectors may yield one family (e.g. per-GPU series from NVML and XID):
                # merge their samples so the exposition holds each name once.
                if metric.name in merged:
                    merged[metric.name].samples.extend(metric.samples)
                else:
                    copy = Metric(metric.name, metric.documentation, metric.type, metric.unit)
                    copy.samples = list(metric.samples)
                    merged[metric.name] = copy
        yield success
        yield duration
        yield from merged.values()
        if self._supervisor is not None:
            yield from self._supervisor.collect()
        if self._run_metrics is not None:
            yield from self._run_metrics.collect()
        if self._intake is not None:
            yield from self._intake.collect()
        findings = CounterMetricFamily(
            "laggard_findings_total", "Findings raised, by detector, kind and severity.",
            labels=["detector", "kind", "severity"])
        for (detector, kind, severity), count in sorted(self._findings.counts().items()):
            findings.add_metric([detector, kind, severity], count)
        yield findings
