"""The agent's text writer is prometheus_client's ``generate_latest`` (same bytes), and the
collectors' families are rendered once per round, not per scrape."""

from __future__ import annotations

import math

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
)
from prometheus_client.metrics_core import Metric

from laggard.agent import exposition
from laggard.agent.context import FindingLog
from laggard.agent.exporter import AgentExporter
from laggard.agent.sampler import CollectorThread
from laggard.collectors.nvml import NvmlCollector
from laggard.nvml.fake import FakeNvml
from laggard.nvml.library import NvmlLibrary


class _Families:
    def __init__(self, metrics: list[Metric]) -> None:
        self.metrics = metrics

    def collect(self) -> list[Metric]:
        return self.metrics


def library_text(metrics: list[Metric]) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(metrics))  # type: ignore[arg-type]
    return generate_latest(registry)


def awkward_families() -> list[Metric]:
    gauge = GaugeMetricFamily("laggard_x_ratio", 'Help with a \\ and a\nnewline "quoted".',
                              labels=["b", "a", "weird-label"])
    gauge.add_metric(['quote " back \\ nl \n', "ünïcode", "x"], 0.5)
    gauge.add_metric(["", "", ""], math.nan, timestamp=1700000000.25)
    gauge.add_metric(["inf", "", ""], math.inf)
    gauge.add_metric(["big", "", ""], 123456789.0)
    counter = CounterMetricFamily("laggard_y", "A counter.", labels=["k"], created=1.5)
    counter.add_metric(["v"], 3, created=1700000000.0)
    hist = HistogramMetricFamily("laggard_z_seconds", "A histogram, in seconds.",
                                 labels=["op"])
    hist.add_metric(["allreduce"], [("0.1", 1), ("1.0", 3), ("+Inf", 4)], sum_value=2.5)
    info = InfoMetricFamily("laggard_w", "Identity.", value={"version": "1"})
    return [gauge, counter, hist, info, GaugeMetricFamily("laggard_empty", "Nothing yet.")]


def test_the_writer_is_the_librarys_on_awkward_families() -> None:
    families = awkward_families()
    assert exposition.render(families) == library_text(families)


def test_the_writer_is_the_librarys_on_a_gpu_round() -> None:
    fake = FakeNvml(4)
    fake.advance(31)
    families = list(NvmlCollector(NvmlLibrary(fake), all_fields=True).collect())
    assert exposition.render(families) == library_text(families)


def test_a_round_is_rendered_once_and_scrapes_join_the_texts() -> None:
    fake = FakeNvml(2)
    fake.advance(50)  # GPU 1 lost: laggard_gpu_lost from nvml

    class XidLike:
        """A second collector that yields a family the first one yields too."""

        name = "xid"

        def collect(self) -> list[Metric]:
            lost = GaugeMetricFamily("laggard_gpu_lost", "1 when lost.",
                                     labels=["gpu", "pci_bus_id"])
            lost.add_metric(["", "0000:ed:00"], 1)
            return [lost]

    nvml = CollectorThread(NvmlCollector(NvmlLibrary(fake)), 1.0)
    xid = CollectorThread(XidLike(), 1.0)  # type: ignore[arg-type]
    nvml.collect_once()
    xid.collect_once()
    exporter = AgentExporter([nvml, xid], None, FindingLog(), "node01")
    first, second = exporter.prebuilt(), exporter.prebuilt()
    assert first == second
    text = first.decode()
    assert text.count("# TYPE laggard_gpu_lost gauge") == 1  # one family, both collectors'
    assert 'laggard_gpu_lost{gpu="1"} 1.0' in text
    assert 'laggard_gpu_lost{gpu="",pci_bus_id="0000:ed:00"} 1.0' in text
    assert text.count("# TYPE laggard_gpu_info gauge") == 1
    assert nvml.sample.texts["laggard_gpu_info"] in first  # the round's own text, joined


def test_an_unchanged_round_keeps_its_text() -> None:
    class Fast:
        name = "fast"

        def __init__(self) -> None:
            self.families: list[Metric] = []
            self.rounds = 0

        def collect(self) -> list[Metric]:
            self.rounds += 1
            if self.rounds % 3 == 1:  # a full round every third call
                gauge = GaugeMetricFamily("laggard_fast", "Rounds.", value=self.rounds)
                self.families = [gauge]
            return self.families

    thread = CollectorThread(Fast(), 0.1)  # type: ignore[arg-type]
    texts = [thread.collect_once().texts["laggard_fast"] for _ in range(4)]
    assert texts[0] is texts[1] is texts[2]  # the same bytes object: not rendered again
    assert texts[3] != texts[0] and b"laggard_fast 4.0" in texts[3]
    assert thread.sample.success
