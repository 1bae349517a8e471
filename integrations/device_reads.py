"""No host reads of device tensors on the hot path: flags and counts stay on the device.

On CUDA, ``bool(t)``, ``t.item()``, ``t.tolist()``, ``float(t)``, ``t.cpu()``, a blocking
copy to or from pageable memory, and data-dependent shapes (``nonzero``, boolean-mask indexing)
make the CPU wait until the stream has caught up (they are what
``torch.cuda.set_sync_debug_mode`` reports). Inside ``backward()`` that wait destroys the CPU's
run-ahead that compute/communication overlap depends on, once per bucket. So the compression
hooks and the integrity recorder keep what they decide on the device:

* a decision that cannot wait (a NaN bucket must not poison a residual) is made on the device
  (``torch.where`` / masked ops on a 0-d bool :func:`finite_flag`), never with ``bool()``;
* counts are :class:`DeviceCount` objects: host ints on the CPU path, device int64 tensors
  elsewhere, read only where a stats read asks for them;
* values the host needs later are copied ``non_blocking`` into pinned memory behind an event
  (:class:`Readback`) and read once that event has completed (``query()`` never blocks).

Host reads of CPU tensors are not synchronisation: on the CPU path everything here reduces to the
old host code (Numba kernels, numpy views). :func:`on_host` is the one switch between the two;
tests force the device branch on CPU tensors with :func:`device_path` (the device code is
device-agnostic torch), which is how its results are checked against the CPU path bit for bit.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

_forced = {"on": False}


def on_host(tensor: torch.Tensor) -> bool:
    """Whether reading ``tensor`` from Python is free: a CPU tensor, and the device branches
    not forced by :func:`device_path`."""
    return tensor.device.type == "cpu" and not _forced["on"]


@contextlib.contextmanager
def device_path() -> Iterator[None]:
    """Run the device branches on CPU tensors, on every thread (tests only: the device code is
    the same torch ops on any device, so its results can be compared with the CPU path's)."""
    previous = _forced["on"]
    _forced["on"] = True
    try:
        yield
    finally:
        _forced["on"] = previous


def finite_flag(tensor: torch.Tensor) -> torch.Tensor:
    """Whether no element is NaN or Inf, as a 0-d bool tensor on ``tensor``'s device (no host
    read). One pass: a sum in ``tensor``'s dtype, so an overflowing sum of finite values (beyond
    3e38 in float32) also reads as not finite, as ``laggard.compression.base.all_finite`` does."""
    return torch.isfinite(tensor.sum())


def to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A CPU tensor on ``device`` without a blocking copy: through pinned memory with
    ``non_blocking=True`` on CUDA (the caching host allocator keeps the pinned block until the
    copy has run), a plain ``to`` elsewhere (CPU: no copy at all)."""
    if torch.device(device).type == "cuda":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)


class DeviceCount:
    """An event count kept where the decision about it is made.

    ``add(int)`` counts on the host (the CPU path decided on the host); ``add(tensor)`` adds a
    0-d bool/int device tensor into a device int64 accumulator without reading it.

    :meth:`value` is exact: on a device it reads the accumulator, which waits for the stream to
    reach the last ``add``; call it at a stats read (a test, a report), never inside backward.
    :meth:`lagged` reads without waiting: the device part as of the last completed copy (one
    read late), exact once the stream has passed the adds.
    """

    def __init__(self) -> None:
        self._host = 0
        self._device: torch.Tensor | None = None
        self._readback: Readback | None = None
        self._lagged = 0

    def add(self, amount: int | torch.Tensor) -> None:
        """Count ``amount`` (an int, or a 0-d bool/integer tensor on any device)."""
        if isinstance(amount, torch.Tensor):
            amount = amount.to(torch.int64)
            self._device = amount.clone() if self._device is None else self._device.add_(amount)
        else:
            self._host += amount

    def value(self) -> int:
        """The exact count (a host read of the device accumulator: a sync on a device)."""
        if self._device is None:
            return self._host
        return self._host + int(self._device)

    def lagged(self) -> int:
        """The count without waiting: the host part plus the device part of the last copy that
        completed; starts a new copy behind an event."""
        if self._device is None:
            return self._host
        if self._readback is not None:
            done = self._readback.result()
            if done is not None:
                self._lagged = int(done)
                self._readback = None
        if self._readback is None:
            self._readback = Readback(self._device.reshape(1))
        return self._host + self._lagged


def _cuda_event() -> Any:
    event = torch.cuda.Event()
    event.record()
    return event


class _Completed:
    """The event of a copy that ran synchronously (CPU tensors): always complete."""

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        return None


#: Makes the event that guards a :class:`Readback` of a non-CUDA tensor (tests replace it with
#: one that never completes, to see what a pending copy does).
make_cpu_event: Any = _Completed


class Readback:
    """Device values on their way to the host: a ``non_blocking`` copy into pinned memory,
    behind an event recorded on the current stream right after it.

    Args:
        values: a tensor on any device; on CUDA it must stay unmodified until the copy has run
            (the copy is ordered on the current stream, so later kernels on that stream are fine).

    The host never waits: :meth:`result` is None until ``event.query()`` says the copy has run.
    """

    __slots__ = ("host", "event")

    def __init__(self, values: torch.Tensor) -> None:
        if values.device.type == "cuda":
            self.host = torch.empty(values.shape, dtype=values.dtype, pin_memory=True)
            self.host.copy_(values, non_blocking=True)
            self.event = _cuda_event()
        else:  # a CPU tensor (the device branch forced in a test): nothing to wait for
            self.host = values.clone()
            self.event = make_cpu_event()

    def ready(self) -> bool:
        """Whether the copy has run (``Event.query()``: never blocks)."""
        return bool(self.event.query())

    def result(self) -> torch.Tensor | None:
        """The host copy (a CPU tensor: reading it is free) once :meth:`ready`, else None."""
        return self.host if self.ready() else None

    def wait(self) -> torch.Tensor:
        """The host copy, waiting for the event (``Event.synchronize()``: a host wait, for the
        ``skip_step`` policy only, which needs this step's verdict before the optimizer step)."""
        self.event.synchronize()
        return self.host


__all__ = ["DeviceCount", "Readback", "device_path", "finite_flag", "on_host", "to_device"]
