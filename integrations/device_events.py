"""Device timing events, recorded on a stream and read without ever blocking the training thread.

On CUDA a kernel launch returns at once and the device runs it later, so a CPU clock around a
phase times the *launch*. What the device did is read from timing events recorded on the stream
(``torch.cuda.Event(enable_timing=True)``): ``record()`` costs about 2.5 µs of CPU and enqueues a
marker, ``query()`` says without blocking whether the stream has passed it, and
``start.elapsed_time(end)`` gives the milliseconds between two completed events (it refuses
unless both were recorded and completed). DDP's own sampled timer reads the previous
iteration's events at the next forward for the same reason. Megatron-LM's StragglerDetector,
XPUTimer and veScale's NDTimeline pool their events the same way.

Two pieces, both independent of torch (the ``cuda`` module is passed in, so tests pass a fake
with torch's names and the demo an emulated asynchronous device):

* :class:`EventPool`: events made once, up front; taking one on the hot path creates nothing,
  an empty pool gives None (counted) instead of allocating.
* :class:`PendingIntervals`: a FIFO of ``(start, end, sink)`` intervals. :meth:`harvest` pops
  intervals from the front while their end event has completed (``query()``), hands each its
  seconds and returns both events to the pool; it never calls ``synchronize()``. Streams
  complete in order, so the first pending interval blocks the rest only as long as the device
  is behind. An interval pending for longer than ``max_pending`` newer ones is dropped (its sink
  gets NaN) and counted, so a stream that never completes cannot grow memory.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(slots=True)
class DeviceEventStats:
    """Counters of the device events; read them, they are never reset.

    Attributes:
        recorded: events recorded.
        harvested: intervals read (both events completed).
        exhausted: events asked of an empty pool (that interval is not timed).
        expired: intervals dropped still pending (``max_pending`` newer ones behind them).
        errors: ``record`` / ``query`` / ``elapsed_time`` calls that raised (the interval is
            dropped as NaN).
    """

    recorded: int = 0
    harvested: int = 0
    exhausted: int = 0
    expired: int = 0
    errors: int = 0


class EventPool:
    """A fixed set of timing events made once.

    Args:
        cuda: the ``torch.cuda`` module (or a module with its names: ``Event``,
            ``current_stream``).
        size: events to make (each a few hundred bytes of driver state on CUDA).
        stats: counters to update (a fresh :class:`DeviceEventStats` when None).

    Raises:
        ValueError: ``size`` < 2.
        Whatever ``cuda.Event`` raises (no device): at construction, never on the hot path.
    """

    def __init__(self, cuda: Any, size: int = 512, stats: DeviceEventStats | None = None) -> None:
        if size < 2:
            raise ValueError("an event pool needs at least 2 events")
        self.cuda = cuda
        self.size = size
        self.stats = stats if stats is not None else DeviceEventStats()
        self._free = [cuda.Event(enable_timing=True) for _ in range(size)]

    @property
    def free(self) -> int:
        """Events available."""
        return len(self._free)

    def record(self, stream: Any = None) -> Any:
        """Take an event and record it on ``stream`` (the current stream when None).

        Returns:
            The recorded event, or None when the pool is empty or ``record`` raised (counted).
        """
        if not self._free:
            self.stats.exhausted += 1
            return None
        event = self._free.pop()
        try:
            if stream is None:
                event.record()
            else:
                event.record(stream)
        except Exception:  # noqa: BLE001 - a failed record only loses this interval
            self.stats.errors += 1
            self._free.append(event)
            return None
        self.stats.recorded += 1
        return event

    def give_back(self, *events: Any) -> None:
        """Return events to the pool (None is ignored)."""
        self._free.extend(e for e in events if e is not None)


class PendingIntervals:
    """Device intervals waiting for their events to complete, read in order, never blocking.

    Args:
        pool: where the events come from and go back to.
        max_pending: intervals kept pending at most; the oldest beyond it is dropped as NaN.

    Raises:
        ValueError: ``max_pending`` < 1.
    """

    def __init__(self, pool: EventPool, max_pending: int = 256) -> None:
        if max_pending < 1:
            raise ValueError("max_pending must be >= 1")
        self.pool = pool
        self.max_pending = max_pending
        self._queue: collections.deque[tuple[Any, Any, Callable[[float], None]]] = (
            collections.deque())

    def __len__(self) -> int:
        return len(self._queue)

    def add(self, start: Any, end: Any, sink: Callable[[float], None]) -> None:
        """Queue the interval ``start -> end``; ``sink(seconds)`` is called when it is read
        (NaN when either event is None, expired or unreadable)."""
        if start is None or end is None:
            self.pool.give_back(start, end)
            sink(float("nan"))
            return
        self._queue.append((start, end, sink))
        while len(self._queue) > self.max_pending:
            old_start, old_end, old_sink = self._queue.popleft()
            self.pool.stats.expired += 1
            # never give back an event the stream may still write: drop it from the pool
            old_sink(float("nan"))

    def harvest(self) -> int:
        """Read every interval at the front whose end event has completed.

        Returns:
            Intervals read. Never blocks: ``query()`` only.
        """
        read = 0
        stats = self.pool.stats
        while self._queue:
            start, end, sink = self._queue[0]
            try:
                if not end.query():
                    break
                seconds = start.elapsed_time(end) / 1e3  # milliseconds -> seconds
            except Exception:  # noqa: BLE001 - an unreadable pair is NaN, the rest go on
                stats.errors += 1
                seconds = float("nan")
            self._queue.popleft()
            self.pool.give_back(start, end)
            stats.harvested += 1
            read += 1
            sink(seconds)
        return read


def cuda_if_available() -> Any:
    """``torch.cuda`` when torch is installed and a CUDA device is usable, else None."""
    try:
        import torch
    except ImportError:
        return None
    try:
        return torch.cuda if torch.cuda.is_available() else None
    except Exception:  # noqa: BLE001 - a broken driver is "no device"
        return None


__all__ = ["DeviceEventStats", "EventPool", "PendingIntervals", "cuda_if_available"]
