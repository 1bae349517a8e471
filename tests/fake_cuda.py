"""A fake ``torch.cuda`` with torch's names, for the device-timing code on machines without a GPU.

Its device runs a stream's work in order on a device clock the test drives: ``launch(seconds)``
enqueues that much device work on the current stream (what a kernel launch does; it returns at
once), ``Event.record()`` enqueues a marker after the work so far, and the device clock only
moves when the test calls ``run(seconds)``. ``Event.query()`` is True once the device clock has
passed the marker; ``elapsed_time`` refuses (RuntimeError, as CUDA's does) unless both events
were recorded and completed. Nothing in it blocks: ``synchronize()`` raises, so a test fails if
the code under test ever calls it.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator


class FakeStream:
    """One stream: the device time at which its enqueued work so far ends."""

    def __init__(self, device: FakeCuda) -> None:
        self.device = device
        self.tail = 0.0  # device seconds at which the last enqueued work completes

    def wait_event(self, event: Event) -> None:
        """Later work on this stream starts after ``event``."""
        if event.stamp is not None:
            self.tail = max(self.tail, event.stamp)


class Event:
    """``torch.cuda.Event(enable_timing=True)``."""

    def __init__(self, enable_timing: bool = False, device: FakeCuda | None = None) -> None:
        self.enable_timing = enable_timing
        self.device = device
        self.stamp: float | None = None

    def record(self, stream: FakeStream | None = None) -> None:
        device = self.device
        assert device is not None
        device.records += 1
        stream = stream or device.current_stream()
        stream.tail = max(stream.tail, device.now)
        self.stamp = stream.tail

    def query(self) -> bool:
        assert self.device is not None
        self.device.queries += 1
        return self.stamp is not None and self.device.now >= self.stamp

    def elapsed_time(self, end: Event) -> float:
        if not (self.enable_timing and end.enable_timing):
            raise RuntimeError("Both events must be created with argument 'enable_timing=True'")
        if self.stamp is None or end.stamp is None or not (self.query() and end.query()):
            raise RuntimeError("Both events must be recorded and completed")
        return 1e3 * (end.stamp - self.stamp)

    def synchronize(self) -> None:
        raise AssertionError("Event.synchronize() blocks the training thread")


class FakeCuda:
    """The module object: ``Event``, ``current_stream``, ``Stream``, ``synchronize``.

    Attributes:
        now: the device clock, seconds (moved only by :meth:`run`).
        records, queries: calls counted, for cost assertions.
    """

    def __init__(self) -> None:
        self.now = 0.0
        self.records = 0
        self.queries = 0
        self._stream = FakeStream(self)

    def Event(self, enable_timing: bool = False) -> Event:  # noqa: N802 - torch's name
        return Event(enable_timing, self)

    def Stream(self) -> FakeStream:  # noqa: N802 - torch's name
        return FakeStream(self)

    def current_stream(self) -> FakeStream:
        return self._stream

    @contextlib.contextmanager
    def stream(self, stream: FakeStream) -> Iterator[None]:
        """``torch.cuda.stream(s)``: make ``s`` the current stream inside the block."""
        previous, self._stream = self._stream, stream
        try:
            yield
        finally:
            self._stream = previous

    def is_available(self) -> bool:
        return True

    def synchronize(self) -> None:
        raise AssertionError("torch.cuda.synchronize() blocks the training thread")

    def launch(self, seconds: float, stream: FakeStream | None = None) -> None:
        """Enqueue ``seconds`` of device work on ``stream`` (the current one)."""
        stream = stream or self._stream
        stream.tail = max(stream.tail, self.now) + seconds

    def run(self, seconds: float) -> None:
        """Let the device run for ``seconds``."""
        self.now += seconds


class RealTimeCuda(FakeCuda):
    """A fake device whose clock is the host's wall clock (``time.perf_counter``): it runs its
    streams' work as time passes, as a real GPU does, so a multi-process job can use it as its
    ``device=``; ``launch(seconds)`` is device work its CPU never waits for. ``run`` is refused:
    nothing drives this clock but time."""

    def __init__(self) -> None:
        self._origin = time.perf_counter()
        super().__init__()

    @property  # type: ignore[override]
    def now(self) -> float:
        return time.perf_counter() - self._origin

    @now.setter
    def now(self, value: float) -> None:
        if value != 0.0:
            raise AssertionError("a real-time fake device's clock is the wall clock")

    def run(self, seconds: float) -> None:
        raise AssertionError("a real-time fake device runs by itself")

    def behind(self) -> float:
        """Seconds of enqueued work the current stream has left (0 when idle)."""
        return max(0.0, self._stream.tail - self.now)
