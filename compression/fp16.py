"""``fp16``: torch's ``fp16_compress_hook``, timed and counted.

Halves the bytes of an fp32 all-reduce. Each rank casts its bucket to fp16 and divides by the
world size before the sum, so the result carries fp16 rounding (relative 2**-11 per element and
per addition) and values beyond fp16's range (65504) overflow.
"""

from __future__ import annotations

import torch
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import fp16_compress_hook

from laggard.compression.base import CompressionState
from laggard.integrations.collective_bytes import ring_allreduce_bytes


class Fp16Compression(CompressionState):
    """fp16 all-reduce: ``2 (W-1)/W * 2 N`` bytes per rank for ``N`` gradients."""

    name = "fp16"

    def communicate(self, bucket) -> torch.futures.Future:  # type: ignore[no-untyped-def]
        """torch's fp16 all-reduce of the bucket, timed; a future of the averaged buffer (its
        dtype, fp16 rounding)."""
        self.timer.bucket_ready()
        buffer = bucket.buffer()
        fut = fp16_compress_hook(self.process_group, bucket)
        nbytes = ring_allreduce_bytes(buffer.numel() * 2, self.world_size)
        return self.timer.track(fut, nbytes, "allreduce", raw_bytes=self.raw_bytes(buffer),
                                bucket_ready=False)
