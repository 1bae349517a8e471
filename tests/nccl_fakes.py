"""Fakes with torch's names for the NCCL timing paths (no GPU here): a ``torch.cuda`` whose
current stream can be switched (``torch.cuda.stream(s)``), an NCCL-like ``Work`` whose future is
done at *enqueue* and runs ``then()`` callbacks at once on a stream that waited for the
collective, and a ``torch.distributed`` for the link probe's point-to-point calls."""

from __future__ import annotations

import time
from contextlib import contextmanager
from types import SimpleNamespace

from fake_cuda import FakeCuda, FakeStream


class StreamCuda(FakeCuda):
    """FakeCuda plus ``torch.cuda.stream(s)``: the current stream inside the block is ``s``."""

    @contextmanager
    def stream(self, stream: FakeStream):  # torch's name
        saved, self._stream = self._stream, stream
        try:
            yield
        finally:
            self._stream = saved


class NcclFuture:
    """``work.get_future()`` of ProcessGroupNCCL: done at enqueue, callbacks run at once, their
    current stream made to wait for the collective's stream (a CUDA-aware future)."""

    def __init__(self, work: NcclWork) -> None:
        self.work = work

    def done(self) -> bool:
        return True

    def then(self, callback):
        cuda = self.work.cuda
        side = cuda.Stream()
        marker = cuda.Event()
        marker.record(self.work.stream)
        side.wait_event(marker)
        with cuda.stream(side):
            callback(self)
        return self

    def add_done_callback(self, callback) -> None:
        callback(self)  # at once: what a CPU clock around the future would time


class NcclWork:
    """A collective issued now: ``seconds`` of device time on its own stream, which waits for
    the current stream's work issued so far (what ProcessGroupNCCL does at launch)."""

    def __init__(self, cuda: StreamCuda, seconds: float) -> None:
        self.cuda = cuda
        self.stream = cuda.Stream()
        issued = cuda.Event()
        issued.record()
        self.stream.wait_event(issued)
        cuda.launch(seconds, self.stream)

    def get_future(self) -> NcclFuture:
        return NcclFuture(self)

    def wait(self) -> None:  # the current stream waits; the CPU does not
        done = self.cuda.Event()
        done.record(self.stream)
        self.cuda.current_stream().wait_event(done)


class P2pDist:
    """``torch.distributed``'s ``isend`` / ``recv`` / ``send`` as the link probe calls them on
    NCCL: each returns at once on the CPU after ``cpu_seconds`` of launch overhead; the ack's
    ``recv`` leaves the next round trip of ``round_trips`` as device work on the current stream
    (the recv made the current stream wait for the ack)."""

    def __init__(self, cuda: StreamCuda, round_trips: list[float], cpu_seconds: float = 0.0):
        self.cuda = cuda
        self.round_trips = list(round_trips)
        self.cpu_seconds = cpu_seconds
        self.calls: list[tuple[str, int, int]] = []

    def _launch(self) -> None:
        if self.cpu_seconds:
            time.sleep(self.cpu_seconds)

    def isend(self, tensor, dst, group=None, tag=0):
        self._launch()
        self.calls.append(("isend", dst, tag))
        return SimpleNamespace(wait=lambda: None)

    def send(self, tensor, dst, group=None, tag=0) -> None:
        self._launch()
        self.calls.append(("send", dst, tag))

    def recv(self, tensor, src, group=None, tag=0) -> None:
        self._launch()
        self.calls.append(("recv", src, tag))
        if tensor.numel() == 1:  # the ack: the round trip ends when it arrives
            self.cuda.launch(self.round_trips.pop(0))

    def get_global_rank(self, group, group_rank: int) -> int:
        return group_rank
