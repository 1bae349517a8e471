"""``none``: the plain averaging all-reduce, timed and counted; the baseline of the others."""

from __future__ import annotations

import torch
import torch.distributed as dist
from laggard.integrations.compression.base import CompressionState, first_tensor
from laggard.integrations.compression.wire import ring_allreduce_bytes, tensor_bytes


class NoCompression(CompressionState):
    """All-reduce the bucket as DDP does without a hook (divide by the world size, then sum).

    Sends ``2 (W-1)/W * 4 N`` bytes per rank for ``N`` fp32 gradients.
    """

    name = "none"

    def communicate(self, bucket) -> torch.futures.Future:  # type: ignore[no-untyped-def]
        self.timer.bucket_ready()
        buffer = bucket.buffer()
        buffer.div_(self.world_size)
        if self.integrity is not None:
            self.integrity.allreduce_sent(bucket.index(), buffer)
        fut = dist.all_reduce(buffer, group=self.process_group, async_op=True).get_future()
        nbytes = ring_allreduce_bytes(tensor_bytes(buffer), self.world_size)
        fut = self.timer.track(fut, nbytes, "allreduce", raw_bytes=self.raw_bytes(buffer),
                               bucket_ready=False)
        if self.integrity is None:
            return fut.then(first_tensor)
        integrity, index = self.integrity, bucket.index()

        def checked(done: torch.futures.Future) -> torch.Tensor:
            result = first_tensor(done)
            integrity.allreduce_received(index, result)
            return result

        return fut.then(checked)
