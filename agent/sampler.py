"""Runs each collector on its own schedule, in its own thread, and keeps its latest sample.

Scrapes read the latest sample and never wait on hardware; a collector that hangs (an NVML call
stuck on a dying GPU) or raises delays only its own series, never another collector or the HTTP
server. This is node_exporter's contract, with sampling decoupled from scrapes as dcgm-exporter
does.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field

from prometheus_client.metrics_core import Metric

from laggard.agent.supervisor import RestartableThread
from laggard.collectors.base import Collector, NoDataError

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Sample:
    """The latest outcome of one collector.

    Attributes:
        metrics: metric families of the last successful round (kept when a round fails, so
            counters do not vanish; cleared on ``NoDataError``).
        success: whether the last round succeeded.
        duration_seconds: how long the last round took.
        failures: rounds that failed since start.
    """

    metrics: list[Metric] = field(default_factory=list)
    success: bool = False
    duration_seconds: float = 0.0
    failures: int = 0


class CollectorThread:
    """Calls ``collector.collect()`` every ``interval`` seconds and stores the result.

    Args:
        collector: the collector to run.
        interval: seconds between the starts of two rounds.
    """

    def __init__(self, collector: Collector, interval: float) -> None:
        self.collector = collector
        self.interval = interval
        self._lock = threading.Lock()
        self._sample = Sample()
        self._stop = threading.Event()
        self._last_error: str | None = None
        #: The sampling thread (restartable: the agent's supervisor watches it).
        self.thread = RestartableThread(self._run, f"laggard-collector-{collector.name}")

    @property
    def sample(self) -> Sample:
        """The latest sample (a snapshot; safe to read from any thread)."""
        with self._lock:
            s = self._sample
            return Sample(list(s.metrics), s.success, s.duration_seconds, s.failures)

    def start(self) -> None:
        """Start sampling in the background."""
        self.thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        """Ask the thread to stop and wait up to ``timeout`` seconds for it."""
        self._stop.set()
        self.thread.join(timeout)

    def collect_once(self) -> Sample:
        """Run one round now (in the caller's thread) and store it."""
        start = time.perf_counter()
        try:
            metrics = list(self.collector.collect())
        except NoDataError as exc:
            self._report(f"no data: {exc}", logging.INFO)
            self._store(None, start)
        except Exception as exc:  # noqa: BLE001 - a failing collector must not stop the agent
            self._report(f"failed: {type(exc).__name__}: {exc}", logging.WARNING)
            self._store(None, start, keep=True)
        else:
            if self._last_error is not None:
                log.info("collector %s recovered", self.collector.name)
                self._last_error = None
            self._store(metrics, start)
        return self.sample

    def _store(self, metrics: list[Metric] | None, start: float, keep: bool = False) -> None:
        duration = time.perf_counter() - start
        with self._lock:
            s = self._sample
            if metrics is not None:
                self._sample = Sample(metrics, True, duration, s.failures)
            else:
                self._sample = Sample(s.metrics if keep else [], False, duration, s.failures + 1)

    def _report(self, message: str, level: int) -> None:
        # Log once per distinct error, not once per round: a GPU-less node would otherwise log
        # "no NVML" every second forever.
        if message != self._last_error:
            log.log(level, "collector %s %s", self.collector.name, message)
            self._last_error = message

    def _run(self) -> None:
        next_start = time.monotonic()
        while not self._stop.is_set():
            self.collect_once()
            next_start += self.interval
            delay = next_start - time.monotonic()
            if delay < 0:  # fell behind (slow hardware): skip missed rounds, don't burst
                next_start = time.monotonic()
                delay = 0
            self._stop.wait(delay)
