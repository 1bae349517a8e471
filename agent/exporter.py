"""The agent's one prometheus_client collector: latest samples, collector health, intake."""

from __future__ import annotations

import platform
from collections.abc import Iterable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from laggard import __version__
from laggard.agent.context import FindingLog
from laggard.agent.exposition import render
from laggard.agent.run_metrics import RunMetrics
from laggard.agent.run_table import RankTable
from laggard.agent.sampler import CollectorThread, Sample, merge
from laggard.agent.supervisor import Supervisor
from laggard.agent.udp_intake import UdpIntake


class AgentExporter:
    """Yields every series the agent serves at ``/metrics``.

    Reads only what the collector threads and the intake already hold, so a scrape never
    touches hardware. The collectors' families come as text their threads rendered once per
    round (:meth:`prebuilt`); :meth:`collect` yields what changes between rounds (each
    collector's health, the intake's runs, the findings), built at the scrape.

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
        build = GaugeMetricFamily("laggard_build_info",
                                  "Version of laggard, and of the Python running it (value 1).",
                                  labels=["version", "python_version"])
        build.add_metric([__version__, platform.python_version()], 1)
        agent = GaugeMetricFamily("laggard_agent_info", "This agent's node name (value 1).",
                                  labels=["node"])
        agent.add_metric([self._node], 1)
        self._identity = render((build, agent))  # never changes: rendered once

    def prebuilt(self) -> bytes:
        """The text exposition of every collector's last round (and the agent's identity),
        joined from the texts the threads rendered: no family is built here, except for a
        name two collectors both yield (``laggard_gpu_lost`` from nvml and xid), merged."""
        samples = [thread.sample for thread in self._threads]
        owners: dict[str, list[Sample]] = {}
        for sample in samples:
            for name in sample.texts:
                owners.setdefault(name, []).append(sample)
        parts = [self._identity]
        for name, of in owners.items():
            if len(of) == 1:
                parts.append(of[0].texts[name])
                continue
            families = [m for sample in of for m in sample.metrics if m.name == name]
            combined = families[0]
            for other in families[1:]:
                combined = merge(combined, other)
            parts.append(render((combined,)))
        return b"".join(parts)

    def collect(self) -> Iterator[Metric]:
        """Called by prometheus_client on every scrape: the series that are not prebuilt."""
        success = GaugeMetricFamily(
            "laggard_collector_success",
            "1 if the collector's last round succeeded, 0 if it failed or found no hardware.",
            labels=["collector"])
        absent = GaugeMetricFamily(
            "laggard_collector_absent",
            "1 if the collector's last round found no hardware or source to read (no GPU, no "
            "InfiniBand): not a failure; 0 otherwise.",
            labels=["collector"])
        duration = GaugeMetricFamily("laggard_collector_duration_seconds",
                                     "Duration of the collector's last round, in seconds.",
                                     labels=["collector"])
        for thread in self._threads:
            sample = thread.sample
            name = thread.collector.name
            success.add_metric([name], 1 if sample.success else 0)
            absent.add_metric([name], 1 if sample.absent else 0)
            duration.add_metric([name], sample.duration_seconds)
        yield success
        yield absent
        yield duration
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
