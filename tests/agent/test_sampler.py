"""The sampler thread: a collector that can wait for its data gets a round when data comes,
not only every interval; one that cannot is sampled every interval."""

from __future__ import annotations

import threading
import time

from prometheus_client.core import GaugeMetricFamily
from support import budget

from laggard.agent.sampler import CollectorThread


class Waiting:
    """A collector whose source says when it has news (as the xid collector's /dev/kmsg)."""

    name = "waiting"

    def __init__(self) -> None:
        self.news = threading.Event()
        self.rounds = 0
        self.round_done = threading.Condition()

    def wait_for_data(self, timeout: float) -> bool:
        return self.news.wait(timeout)

    def collect(self) -> list[GaugeMetricFamily]:
        self.news.clear()
        with self.round_done:
            self.rounds += 1
            self.round_done.notify_all()
        return [GaugeMetricFamily("laggard_rounds", "Rounds.", value=self.rounds)]


def wait_rounds(collector: Waiting, n: int, seconds: float) -> bool:
    with collector.round_done:
        return collector.round_done.wait_for(lambda: collector.rounds >= n, budget(seconds))


def test_data_brings_a_round_long_before_the_interval() -> None:
    collector = Waiting()
    thread = CollectorThread(collector, 3600.0)  # type: ignore[arg-type]
    thread.start()
    try:
        assert wait_rounds(collector, 1, 5.0)
        for n in (2, 3):
            collector.news.set()
            assert wait_rounds(collector, n, 5.0), f"no round {n} after the data came"
        assert b"laggard_rounds 3.0" in thread.sample.texts["laggard_rounds"]
    finally:
        thread.stop()


def three_rounds_at_the_interval(collector: Waiting) -> bool:
    """Whether a thread at a 0.2 s interval runs three rounds of ``collector`` with no data."""
    thread = CollectorThread(collector, 0.2)  # type: ignore[arg-type]
    thread.start()
    try:
        return wait_rounds(collector, 3, 10.0)
    finally:
        thread.stop()


def test_without_data_the_interval_still_brings_rounds() -> None:
    assert three_rounds_at_the_interval(Waiting())


def test_a_broken_wait_falls_back_to_the_interval() -> None:
    collector = Waiting()

    def broken(timeout: float) -> bool:
        raise OSError("poll failed")

    collector.wait_for_data = broken  # type: ignore[method-assign]
    assert three_rounds_at_the_interval(collector)


def test_a_stop_ends_a_long_wait_promptly() -> None:
    collector = Waiting()
    thread = CollectorThread(collector, 3600.0)  # type: ignore[arg-type]
    thread.start()
    assert wait_rounds(collector, 1, 5.0)
    start = time.monotonic()
    thread.stop(timeout=budget(5.0))
    assert time.monotonic() - start < budget(2.0)
