"""Whether a training rank's process still exists: ``/proc/PID``, checked against pid reuse.

A rank whose steps and heartbeats stop is either hung (its process lives: keep its series and
say so) or gone (it exited or crashed: forget it like any stale rank). The agent knows the pid
from the kernel (the Unix-socket intake's ``SCM_CREDENTIALS``) or from the heartbeat itself
(``Heartbeat.pid``, over UDP). A pid alone does not name a process for long: once a process
exits the kernel hands its pid to the next one. So the start time of the process
(``/proc/PID/stat`` field 22, in clock ticks after boot) is read when the pid is first seen,
and a later check finds the rank's process only when the pid has the same start time.

Three answers, never a guess: ``alive`` (same pid, same start time), ``exited`` (the pid is gone,
or now belongs to a process that started later), ``unknown`` (no pid, no procfs at
``proc_root``, a pid never seen alive, or a stat file that cannot be read or parsed).
"""

from __future__ import annotations

import os
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Literal

from laggard.parsers.proc_pid_stat import MAX_PID_STAT_BYTES, parse_pid_stat

__all__ = ["PROCESS_STATES", "ProcessState", "ProcessWatch"]

ProcessState = Literal["alive", "exited", "unknown"]
#: Values of ``laggard_rank_process_state{state}``.
PROCESS_STATES: tuple[ProcessState, ...] = ("alive", "exited", "unknown")


class ProcessWatch:
    """Reads ``{proc_root}/PID/stat`` to tell a live rank process from one that is gone.

    Not thread-safe on its own: the intake calls it under its table's lock. Never raises.

    Args:
        proc_root: procfs mount point (``--path.procfs``; the host's /proc in a container, with
            the agent in the host's pid namespace, so that the kernel's pids are the host's).
        max_cached: most pids whose start time :meth:`start_ticks` remembers (oldest first
            out); a pid past it is read again.
        cache_seconds: how long a start time read is reused for the same pid (a sender that
            takes several ranks or runs in a burst is read once; the kernel does not hand a
            pid to another process that soon unless the pid space wraps around).
        clock: monotonic clock in seconds (tests pass a fake one).
    """

    def __init__(self, proc_root: str = "/proc", max_cached: int = 4096,
                 cache_seconds: float = 5.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._proc_root = proc_root
        self._max_cached = max(1, max_cached)
        self._cache_seconds = cache_seconds
        self._clock = clock
        self._starts: OrderedDict[int, tuple[float, int | None]] = OrderedDict()
        #: Stat files read (each a few microseconds), for tests and benchmarks.
        self.reads = 0

    def _read(self, pid: int) -> int | None | Literal["gone"]:
        """The start time of ``pid`` in clock ticks; ``"gone"`` when procfs has no such pid;
        None when procfs is absent or the file unreadable or malformed."""
        if not os.path.isdir(self._proc_root):
            return None
        self.reads += 1
        try:
            with open(os.path.join(self._proc_root, str(pid), "stat"), "rb") as f:
                text = f.read(MAX_PID_STAT_BYTES).decode("utf-8", "replace")
        except (FileNotFoundError, ProcessLookupError, NotADirectoryError):
            return "gone"
        except OSError:
            return None
        try:
            stat = parse_pid_stat(text)
        except ValueError:
            return None
        if stat.pid != pid:
            return None  # a fixture or a procfs of another pid namespace: not this process
        # A zombie (Z) or dead (X) process has exited: only its parent has not reaped it yet.
        return "gone" if stat.state in ("Z", "X") else stat.start_ticks

    def start_ticks(self, pid: int) -> int | None:
        """The start time of the process ``pid`` names now, read once per pid while cached.

        Call it when a rank's pid is first seen: the process that sent the datagram is the one
        alive under that pid now.

        Args:
            pid: a process id in the agent's pid namespace.

        Returns:
            Its start time in clock ticks after boot; None when it cannot be told (no procfs,
            the pid already gone or in no visible namespace, an unreadable file): the rank's
            process state is then ``unknown``.
        """
        now = self._clock()
        cached = self._starts.get(pid)
        if cached is not None and now - cached[0] < self._cache_seconds:
            return cached[1]
        read = self._read(pid)
        start = read if isinstance(read, int) else None
        self._starts.pop(pid, None)
        self._starts[pid] = (now, start)
        if len(self._starts) > self._max_cached:
            self._starts.popitem(last=False)
        return start

    def forget(self, pid: int) -> None:
        """Drop the cached start time of ``pid`` (its process was found gone)."""
        self._starts.pop(pid, None)

    def state(self, pid: int | None, start_ticks: int | None) -> ProcessState:
        """Whether the process first seen as ``pid`` with ``start_ticks`` still exists.

        Args:
            pid: the rank's process id; None when unknown.
            start_ticks: what :meth:`start_ticks` returned when the pid was first seen.

        Returns:
            ``alive``, ``exited`` (gone, a zombie, or its pid reused by a later process) or
            ``unknown``.
        """
        if pid is None or start_ticks is None:
            return "unknown"
        read = self._read(pid)
        if read is None:
            return "unknown"
        if read == "gone" or read != start_ticks:
            self.forget(pid)
            return "exited"
        return "alive"
