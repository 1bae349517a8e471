"""Runs each collector on its own schedule, in its own thread, and keeps its latest sample.

Scrapes read the latest sample and never wait on hardware; a collector that hangs (an NVML call
stuck on a dying GPU) or raises delays only its own series, never another collector or the HTTP
server. This is node_exporter's contract, with sampling decoupled from scrapes as dcgm-exporter
does. The families of a round are rendered to exposition text here, once per round: a scrape
joins the texts of the last rounds and builds no family (issue 34: a scrape that formatted
every GPU sample anew cost 3.4x node_exporter's).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from prometheus_client.metrics_core import Metric

from laggard.agent.exposition import render
from laggard.agent.supervisor import RestartableThread
from laggard.collectors.base import Collector, NoDataError

log = logging.getLogger(__name__)

#: Least seconds between two rounds of a collector woken by its data (a flood of kernel-log
#: records costs ten rounds a second at most), and the longest single wait for data (a stop is
#: seen within it).
MIN_EVENT_GAP = 0.1
WAIT_SLICE_SECONDS = 0.5


@dataclass(slots=True)
class Sample:
    """The latest outcome of one collector.

    Attributes:
        metrics: metric families of the last successful round (kept when a round fails, so
            counters do not vanish; cleared on ``NoDataError``).
        success: whether the last round succeeded.
        duration_seconds: how long the last round took.
        failures: rounds that failed since start.
        absent: the last round found no hardware to read (``NoDataError``): not a failure.
        texts: each family of ``metrics`` rendered in the Prometheus text format (0.0.4), by
            family name, once per round (a scrape joins them; a name two collectors share is
            merged at the scrape).
    """

    metrics: list[Metric] = field(default_factory=list)
    success: bool = False
    duration_seconds: float = 0.0
    failures: int = 0
    absent: bool = False
    texts: dict[str, bytes] = field(default_factory=dict)


def render_each(metrics: Iterable[Metric]) -> dict[str, bytes]:
    """Each family's text exposition, by family name (a name yielded twice is merged)."""
    merged: dict[str, Metric] = {}
    for metric in metrics:
        if metric.name in merged:
            merged[metric.name] = merge(merged[metric.name], metric)
        else:
            merged[metric.name] = metric
    return {name: render((metric,)) for name, metric in merged.items()}


def merge(first: Metric, second: Metric) -> Metric:
    """One family holding the samples of two of the same name (the first one's help and
    type)."""
    out = Metric(first.name, first.documentation, first.type, first.unit)
    out.samples = [*first.samples, *second.samples]
    return out


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
        self._returned: object = None  # what collect() returned last (identity: unchanged)
        #: The sampling thread (restartable: the agent's supervisor watches it).
        self.thread = RestartableThread(self._run, f"laggard-collector-{collector.name}")

    @property
    def sample(self) -> Sample:
        """The latest sample. Each round stores a new :class:`Sample` and never changes a stored
        one, so the object returned is safe to read from any thread without a copy."""
        with self._lock:
            return self._sample

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
            returned = self.collector.collect()
            unchanged = returned is self._returned and self._sample.success
            self._returned = returned
            metrics = None if unchanged else list(returned)
            texts = {} if metrics is None else render_each(metrics)
        except NoDataError as exc:
            if getattr(exc, "absent", True):
                self._report(f"no data: {exc}", logging.INFO)
                self._store(None, {}, start, absent=True)
            else:  # the hardware is there but does not answer: failing
                self._report(f"failed: {exc}", logging.WARNING)
                self._store(None, {}, start)
        except Exception as exc:  # noqa: BLE001 - a failing collector must not stop the agent
            self._report(f"failed: {type(exc).__name__}: {exc}", logging.WARNING)
            self._store(None, {}, start, keep=True)
        else:
            if self._last_error is not None:
                log.info("collector %s recovered", self.collector.name)
                self._last_error = None
            self._store(metrics, texts, start, unchanged=unchanged)
        return self.sample

    def _store(self, metrics: list[Metric] | None, texts: dict[str, bytes], start: float, *,
               keep: bool = False, absent: bool = False, unchanged: bool = False) -> None:
        duration = time.perf_counter() - start
        with self._lock:
            s = self._sample
            if metrics is not None:
                self._sample = Sample(metrics, True, duration, s.failures, texts=texts)
            elif unchanged:
                # the collector returned its last list again: same families, same text
                self._sample = Sample(s.metrics, True, duration, s.failures, texts=s.texts)
            elif keep:
                self._sample = Sample(s.metrics, False, duration, s.failures + 1, texts=s.texts)
            else:
                self._sample = Sample([], False, duration, s.failures + (not absent),
                                      absent=absent)

    def _report(self, message: str, level: int) -> None:
        # Log once per distinct error, not once per round: a GPU-less node would otherwise log
        # "no NVML" every second forever.
        if message != self._last_error:
            log.log(level, "collector %s %s", self.collector.name, message)
            self._last_error = message

    def _run(self) -> None:
        next_start = time.monotonic()
        wait = getattr(self.collector, "wait_for_data", None)
        while not self._stop.is_set():
            self.collect_once()
            next_start += self.interval
            delay = next_start - time.monotonic()
            if delay < 0:  # fell behind (slow hardware): skip missed rounds, don't burst
                next_start = time.monotonic()
                delay = 0
            if wait is None:
                self._stop.wait(delay)
                continue
            try:
                if self._wait_for_data(wait, delay):
                    next_start = time.monotonic()  # a round for the data; the interval anew
            except Exception as exc:  # noqa: BLE001 - a broken wait falls back to the interval
                log.warning("collector %s: waiting for data failed (%s: %s); sampling every "
                            "%g s instead", self.collector.name, type(exc).__name__, exc,
                            self.interval)
                wait = None

    def _wait_for_data(self, wait: Callable[[float], bool], delay: float) -> bool:
        """Between two rounds of a collector that can wait for its source (``wait_for_data``,
        the xid collector's kernel log and NVML events): at least :data:`MIN_EVENT_GAP`
        seconds, then until it has data or the interval is up, in slices short enough that a
        stop is seen. True when data came."""
        if self._stop.wait(min(MIN_EVENT_GAP, delay)):
            return False
        end = time.monotonic() + max(delay - MIN_EVENT_GAP, 0.0)
        while not self._stop.is_set():
            left = end - time.monotonic()
            if left <= 0:
                return False
            if wait(min(left, WAIT_SLICE_SECONDS)):
                return True
        return False
