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
