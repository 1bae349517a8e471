"""One warning per cause: the once-only log every long-lived laggard component uses, so a fault
that repeats every step (a closed socket, a malformed field) says so once and does not flood the
job's log.
"""
from __future__ import annotations

import logging
import threading

__all__ = ["LogOnce"]


class LogOnce:
    """Logs each key's first message at a fixed level and drops the rest.

    Thread-safe (a lock around the set of keys seen): the monitor's training thread, its
    heartbeat threads and the agent's samplers share the pattern. The keys are kept for the
    object's life, so callers pass a bounded vocabulary (a reason, a field name), never a step
    number.

    Args:
        logger: where the messages go.
        level: the ``logging`` level, WARNING by default.
    """

    __slots__ = ("_logger", "_level", "_seen", "_lock")

    def __init__(self, logger: logging.Logger, level: int = logging.WARNING) -> None:
        self._logger = logger
        self._level = level
        self._seen: set[str] = set()
        self._lock = threading.Lock()

    def __call__(self, key: str, msg: str, *args: object) -> bool:
        """Log ``msg % args`` if ``key`` has not been logged before.

        Returns:
            True if this call logged, False if the key had been seen.
        """
        with self._lock:
            if key in self._seen:
                return False
            self._seen.add(key)
        self._logger.log(self._level, msg, *args)
        return True

    def seen(self, key: str) -> bool:
        """Whether ``key`` has been logged."""
        with self._lock:
            return key in self._seen
