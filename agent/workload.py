"""The workload a sender runs in, from its cgroup: ``/proc/<pid>/cgroup`` read once per pid.

The Unix-socket intake knows each datagram's sender pid from the kernel; this turns the pid into
workload labels (Kubernetes pod UID and container id, Slurm job and step) with the pure parser
``laggard.parsers.cgroup``. A training rank sends a datagram per step, so the file is read once
per pid and kept in a bounded cache with a time to live (a pid reused by another process is
seen again after at most ``ttl_seconds``).
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily
from prometheus_client.metrics_core import Metric

from laggard.parsers.cgroup import MAX_CGROUP_TEXT, parse_cgroup

#: What ``laggard_intake_sender_lookups_total{result}`` counts, one per cgroup lookup:
#: ``read`` (file read, labels or none), ``cached``, ``exited`` (the process was gone before
#: its file was read: no labels), ``unreadable`` (another error: permissions, no procfs),
#: ``no_pid`` (the kernel gave no pid: the sender is in a pid namespace the agent cannot see).
LOOKUP_RESULTS = ("read", "cached", "exited", "unreadable", "no_pid")
#: Pids whose labels are kept; past it the least recently used goes.
DEFAULT_MAX_PIDS = 4096
#: Seconds a pid's labels are trusted before its file is read again.
DEFAULT_TTL_SECONDS = 60.0


class WorkloadLabels:
    """Workload labels per sender pid, from ``{proc_root}/<pid>/cgroup``.

    Thread-safe; never raises on a pid (a missing or unreadable file gives no labels, counted).

    Args:
        proc_root: procfs mount point (``--path.procfs``; the host's /proc in a container, with
            the agent in the host's pid namespace so that the kernel's pids are the host's).
        max_pids: most pids cached.
        ttl_seconds: seconds a cached entry is used.
        clock: monotonic clock in seconds (tests pass a fake one).

    Raises:
        ValueError: ``max_pids`` < 1 or ``ttl_seconds`` <= 0.
    """

    def __init__(self, proc_root: str = "/proc", *, max_pids: int = DEFAULT_MAX_PIDS,
                 ttl_seconds: float = DEFAULT_TTL_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if max_pids < 1 or ttl_seconds <= 0:
            raise ValueError("max_pids and ttl_seconds must be positive")
        self._proc_root = proc_root
        self._max_pids = max_pids
        self._ttl = ttl_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._cache: OrderedDict[int, tuple[float, dict[str, str]]] = OrderedDict()
        self.lookups: Counter[str] = Counter()

    def labels_for(self, pid: int | None) -> dict[str, str]:
        """Workload labels of the process ``pid`` (``pod_uid``, ``container_id``,
        ``container_runtime``, ``slurm_job_id``, ``slurm_step_id``; those its cgroup gives).

        Returns:
            A fresh dict, empty where the cgroup names no workload or cannot be read.
        """
        if pid is None or pid <= 0:
            self._count("no_pid")
            return {}
        now = self._clock()
        with self._lock:
            cached = self._cache.get(pid)
            if cached is not None and now - cached[0] < self._ttl:
                self._cache.move_to_end(pid)
                self.lookups["cached"] += 1
                return dict(cached[1])
        labels, result = self._read(pid)
        with self._lock:
            self.lookups[result] += 1
            if result == "read":
                self._cache[pid] = (now, labels)
                self._cache.move_to_end(pid)
                while len(self._cache) > self._max_pids:
                    self._cache.popitem(last=False)
        return dict(labels)

    def _count(self, result: str) -> None:
        with self._lock:
            self.lookups[result] += 1

    def _read(self, pid: int) -> tuple[dict[str, str], str]:
        path = os.path.join(self._proc_root, str(pid), "cgroup")
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                text = f.read(MAX_CGROUP_TEXT)
        except (FileNotFoundError, ProcessLookupError):
            # The process exited between its send and this read (ESRCH on a dying task).
            return {}, "exited"
        except OSError:
            return {}, "unreadable"
        return parse_cgroup(text).labels(), "read"

    def collect(self) -> Iterator[Metric]:
        """``laggard_intake_sender_lookups_total{result}``."""
        family = CounterMetricFamily(
            "laggard_intake_sender_lookups_total",
            "Cgroup lookups of Unix-socket intake senders (pid -> pod, container, Slurm job), "
            "by result: read, cached, exited (gone before its cgroup was read: no labels), "
            "unreadable, no_pid (sender's pid not visible in the agent's pid namespace).",
            labels=["result"])
        with self._lock:
            counts = dict(self.lookups)
        for result in LOOKUP_RESULTS:
            family.add_metric([result], counts.get(result, 0))
        yield family
