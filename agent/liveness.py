"""Whether a training rank's process still exists, checked against pid reuse, through psutil.

A rank whose steps and heartbeats stop is either hung (its process lives: keep its series and
say so) or gone (it exited or crashed: forget it like any stale rank). The agent knows the pid
from the kernel (the agent's socket, a Unix datagram socket: ``SCM_CREDENTIALS``) or from the
heartbeat itself (``Heartbeat.pid``, over the optional UDP intake). A pid alone does not name a
process for long: once a process exits the kernel hands its pid to the next one. So the process
is identified when its pid is first seen (``psutil.Process(pid)``: the pid and its creation
time, ``/proc/PID/stat`` field 22), and a later check finds the rank's process only when the
process under that pid now is the same one (psutil's own pid-reuse check: two ``Process``
handles are equal when pid and creation time since boot are, which changes of the wall clock
do not move, unlike ``create_time()`` in seconds since the epoch).

Three answers, never a guess: ``alive`` (same pid, same creation time, not a zombie),
``exited`` (the pid is gone, a zombie, or now belongs to a process that started later),
``unknown`` (no pid, no procfs at ``proc_root``, a pid never seen alive, or a process psutil
cannot read: ``AccessDenied``).
"""

from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Literal, TypeAlias

import psutil

__all__ = ["PROCESS_STATES", "ProcessIdentity", "ProcessState", "ProcessWatch"]

ProcessState = Literal["alive", "exited", "unknown"]
#: Values of ``laggard_rank_process_state{state}``.
PROCESS_STATES: tuple[ProcessState, ...] = ("alive", "exited", "unknown")
#: One process as first seen: psutil's handle, which holds its pid and creation time.
ProcessIdentity: TypeAlias = psutil.Process
#: psutil states of a process that has exited but was not reaped yet, or is being torn down.
_GONE_STATUSES = frozenset((psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD))
#: What psutil may raise on a procfs it cannot parse (a truncated or foreign stat file).
_UNREADABLE = (psutil.AccessDenied, OSError, ValueError, IndexError)
#: Serialises the rare swaps of ``psutil.PROCFS_PATH`` (a module global) for another root.
_PROCFS_LOCK = threading.Lock()


@contextmanager
def _procfs(root: str) -> Iterator[None]:
    """``psutil.PROCFS_PATH`` set to ``root`` for the block.

    psutil reads its procfs root from a module global when a ``Process`` is made. Only a root
    other than psutil's (``--path.procfs`` in a container, a fixture tree in tests) swaps it,
    under a lock; another thread calling psutil meanwhile (the host collector) reads the same
    kind of tree for that moment.
    """
    if root == psutil.PROCFS_PATH:
        yield
        return
    with _PROCFS_LOCK:
        saved, psutil.PROCFS_PATH = psutil.PROCFS_PATH, root
        try:
            yield
        finally:
            psutil.PROCFS_PATH = saved


class ProcessWatch:
    """Tells a live rank process from one that is gone, through psutil under ``proc_root``.

    Not thread-safe on its own: the run table calls it under its lock. Never raises.

    Args:
        proc_root: procfs mount point (``--path.procfs``; the host's /proc in a container, with
            the agent in the host's pid namespace, so that the kernel's pids are the host's).
        max_cached: most pids whose identity :meth:`identify` remembers (oldest first out); a
            pid past it is read again.
        cache_seconds: how long an identity read is reused for the same pid (a sender that
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
        self._seen: OrderedDict[int, tuple[float, ProcessIdentity | None]] = OrderedDict()
        #: Processes looked up (each a read of one stat file), for tests and benchmarks.
        self.reads = 0

    def _lookup(self, pid: int) -> ProcessIdentity | None | Literal["gone"]:
        """psutil's handle of the process ``pid`` names now; ``"gone"`` when there is none (or
        a zombie); None when procfs is absent or the process cannot be read."""
        if not os.path.isdir(self._proc_root):
            return None
        self.reads += 1
        try:
            with _procfs(self._proc_root):
                process = psutil.Process(pid)
                if process.status() in _GONE_STATUSES:
                    return "gone"  # exited: only its parent has not reaped it yet
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            return "gone"
        except _UNREADABLE:
            return None
        return process

    def identify(self, pid: int) -> ProcessIdentity | None:
        """The process ``pid`` names now, looked up once per pid while cached.

        Call it when a rank's pid is first seen: the process that sent the datagram is the one
        alive under that pid now.

        Args:
            pid: a process id in the agent's pid namespace.

        Returns:
            Its identity (pid and creation time); None when it cannot be told (no procfs, the
            pid already gone, access denied, an unreadable stat file): the rank's process
            state is then ``unknown``.
        """
        now = self._clock()
        cached = self._seen.get(pid)
        if cached is not None and now - cached[0] < self._cache_seconds:
            return cached[1]
        found = self._lookup(pid)
        identity = found if isinstance(found, psutil.Process) else None
        self._seen.pop(pid, None)
        self._seen[pid] = (now, identity)
        if len(self._seen) > self._max_cached:
            self._seen.popitem(last=False)
        return identity

    def forget(self, pid: int) -> None:
        """Drop the cached identity of ``pid`` (its process was found gone)."""
        self._seen.pop(pid, None)

    def state(self, pid: int | None, identity: ProcessIdentity | None) -> ProcessState:
        """Whether the process first seen as ``pid`` with ``identity`` still exists.

        Args:
            pid: the rank's process id; None when unknown.
            identity: what :meth:`identify` returned when the pid was first seen.

        Returns:
            ``alive``, ``exited`` (gone, a zombie, or its pid reused by a later process) or
            ``unknown``.
        """
        if pid is None or identity is None:
            return "unknown"
        found = self._lookup(pid)
        if found is None:
            return "unknown"
        # psutil's equality is its pid-reuse check: same pid and same creation time.
        if found == "gone" or found != identity:
            self.forget(pid)
            return "exited"
        return "alive"
