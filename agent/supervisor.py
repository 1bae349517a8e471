"""Restarts any agent thread that dies, and counts it.

Each loop of the agent (the UDP intake, each collector, the HTTP server) already catches what it
expects; the supervisor is the last line for what nobody expected (a bug, a ``BaseException``
from a library): a dead intake would otherwise drop every later record in silence.
``laggard_agent_thread_restarts_total{thread}`` makes each restart visible.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily
from prometheus_client.metrics_core import Metric

log = logging.getLogger(__name__)


class RestartableThread:
    """A daemon thread running ``target`` that can be started again once it has died.

    Args:
        target: the loop to run; it returns when its owner asks it to stop.
        name: thread name, also the ``thread`` label of the restart counter.
    """

    def __init__(self, target: Callable[[], None], name: str) -> None:
        self.name = name
        self._target = target
        self._thread = threading.Thread(target=target, name=name, daemon=True)
        self.started = False

    def start(self) -> None:
        """Start the thread (once; later starts go through :meth:`restart`)."""
        self.started = True
        self._thread.start()

    def is_alive(self) -> bool:
        """Whether the thread runs now."""
        return self._thread.is_alive()

    def restart(self) -> None:
        """Start a fresh thread on the same target (the old one has ended)."""
        self._thread = threading.Thread(target=self._target, name=self.name, daemon=True)
        self._thread.start()

    def join(self, timeout: float | None = None) -> None:
        """Wait up to ``timeout`` seconds for the thread to end."""
        if self._thread.is_alive():
            self._thread.join(timeout)


class Supervisor:
    """Checks the watched threads every ``interval`` seconds and restarts the dead ones.

    Stop the supervisor before the threads it watches, or it restarts them as they stop.

    Args:
        interval: seconds between two checks.
    """

    def __init__(self, interval: float = 1.0) -> None:
        self.interval = interval
        self._watched: list[RestartableThread] = []
        self._lock = threading.Lock()
        self._restarts: Counter[str] = Counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="laggard-supervisor",
                                        daemon=True)

    def watch(self, thread: RestartableThread) -> None:
        """Watch ``thread`` from now on (its restart counter starts at 0)."""
        with self._lock:
            self._watched.append(thread)
            self._restarts[thread.name] += 0

    def check_once(self) -> list[str]:
        """Restart every started thread that has died; returns their names."""
        restarted = []
        with self._lock:
            for thread in self._watched:
                if thread.started and not thread.is_alive():
                    log.error("agent thread %s died; restarting it", thread.name)
                    thread.restart()
                    self._restarts[thread.name] += 1
                    restarted.append(thread.name)
        return restarted

    def start(self) -> None:
        """Start checking in the background."""
        self._thread.start()

    def stop(self) -> None:
        """Stop checking (idempotent)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.check_once()
            except Exception:  # noqa: BLE001 - the watcher itself must not die
                log.exception("supervisor check failed")

    def collect(self) -> Iterator[Metric]:
        """``laggard_agent_thread_restarts_total{thread}`` (called on every scrape)."""
        family = CounterMetricFamily(
            "laggard_agent_thread_restarts_total",
            "Agent threads (intake, HTTP server, collectors) found dead and restarted.",
            labels=["thread"])
        with self._lock:
            for name, count in sorted(self._restarts.items()):
                family.add_metric([name], count)
        yield family
