"""``none``: the plain averaging all-reduce, timed and counted; the baseline of the others."""

from __future__ import annotations

import torch

from laggard.compression.base import CompressionState


class NoCompression(CompressionState):
    """All-reduce the bucket as DDP does without a hook (divide by the world size, then sum).

    Sends ``2 (W-1)/W * 4 N`` bytes per rank for ``N`` fp32 gradients.
    """

    name = "none"

    def communicate(self, bucket) -> torch.futures.Future:  # type: ignore[no-untyped-def]
        """The plain fp32 all-reduce (:meth:`~CompressionState.plain_allreduce`)."""
        return self.plain_allreduce(bucket)
