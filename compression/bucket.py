"""A stand-in for DDP's ``GradBucket``, to drive a hook outside DDP (tests, benchmarks)."""

from __future__ import annotations

from collections.abc import Sequence

import torch


class FlatBucket:
    """Parameters' gradients packed back to back in one flat buffer, as DDP packs a bucket.

    Args:
        index: bucket index, as ``GradBucket.index()``.
        params: the bucket's parameters, in buffer order.
        buffer: 1-D tensor of ``sum(p.numel())`` elements; zeros of the parameters' dtype when
            None.
        is_last: as ``GradBucket.is_last()``.
    """

    def __init__(self, index: int, params: Sequence[torch.Tensor],
                 buffer: torch.Tensor | None = None, is_last: bool = True) -> None:
        self._index, self._params, self._is_last = index, list(params), is_last
        total = sum(p.numel() for p in self._params)
        dtype = self._params[0].dtype if self._params else torch.float32
        self._buffer = torch.zeros(total, dtype=dtype) if buffer is None else buffer

    def index(self) -> int:
        """The bucket's index, as ``GradBucket.index()``."""
        return self._index

    def buffer(self) -> torch.Tensor:
        """The flat 1-D gradient buffer (a hook reduces it in place)."""
        return self._buffer

    def set_buffer(self, buffer: torch.Tensor) -> None:
        """Replace the flat buffer (same element count), as ``GradBucket.set_buffer``."""
        self._buffer = buffer

    def parameters(self) -> list[torch.Tensor]:
        """The bucket's parameters, in buffer order."""
        return self._params

    def gradients(self) -> list[torch.Tensor]:
        """Views of the buffer shaped like each parameter."""
        views, start = [], 0
        for p in self._params:
            views.append(self._buffer[start : start + p.numel()].view_as(p))
            start += p.numel()
        return views

    def is_last(self) -> bool:
        """Whether this is the step's last bucket, as ``GradBucket.is_last()``."""
        return self._is_last
