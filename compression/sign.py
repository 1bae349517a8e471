"""``sign``: 1-bit sign compression with error feedback, in 1-bit Adam's two-stage all-reduce.

Compressor (EF-SignSGD; Karimireddy et al., "Error Feedback Fixes SignSGD and other Gradient
Compression Schemes", ICML 2019, Algorithm 2): ``p = g + e``; send ``C(p) = (|p|_1 / d) sign(p)``;
keep ``e = p - C(p)``. Its error is exactly ``|p - C(p)|_2^2 = |p|_2^2 - |p|_1^2 / d`` (expand the
square), at most ``(1 - 1/d) |p|_2^2``. Here the scale is per chunk (W of them per bucket), which
only lowers the error. Signs are packed 8 per byte; sign(0) is sent as +.

Collective (the compressed all-reduce of 1-bit Adam; Tang et al., "1-bit Adam", ICML 2021, §4.2
and DeepSpeed's ``compressed_allreduce``): the bucket is cut into W chunks.

1. all-to-all: rank i sends chunk j, compressed with worker error feedback, to rank j;
2. rank j averages the W chunks it received, adds its *server* residual, compresses again;
3. all-gather of the re-compressed chunks; every rank decompresses the whole bucket.

Per rank that is ``2 (W-1)/W * N/8`` bytes plus ``16 (W-1)`` bytes of scales, against
``2 (W-1)/W * 4 N`` for an fp32 ring all-reduce: 32 times fewer at any world size, where an
all-gather of every rank's packed signs (``(W-1) N/8``) saves only ``64/W``-fold.

Payload of one chunk, the layout of :mod:`.signcodec` (its :func:`~.signcodec.compress_rows`):
``c/8`` bytes of packed signs, then the scale as a float64 (8 bytes). A chunk whose input held
NaN or Inf goes out as a NaN scale: the codec's flag.

Off the CPU the hook reads nothing back to the host (:mod:`laggard.integrations.device_reads`):
the NaN decisions are 0-d device flags applied with ``torch.where`` (a flagged bucket's residual
is updated by ``0 * sign``, i.e. left as it was; the server keeps ``before``), so the same work
is done whatever the flags say and the bytes sent are those of the CPU path's branches.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from laggard.compression import kernels
from laggard.compression.base import ServerFeedbackState, all_finite
from laggard.compression.residuals import BucketLayout
from laggard.compression.signcodec import (
    chunk_elements,
    chunk_lengths,
    compress_rows,
    decompress_rows,
    nan_row,
    scales,
)
from laggard.compression.two_stage import StageTwoWorker
from laggard.integrations.collective_bytes import allgather_bytes
from laggard.integrations.device_reads import DeviceCount, finite_flag, on_host


class SignCompression(ServerFeedbackState):
    """EF-SignSGD in the two-stage compressed all-reduce (see the module docstring).

    Args:
        process_group, model, timer: see :class:`~laggard.compression.base.CompressionState`;
            residuals and their checkpoint: :class:`~laggard.compression.base.ServerFeedbackState`.

    Attributes:
        nonfinite_buckets: buckets whose gradients held NaN/Inf on this rank (sent as a NaN
            flag, the residual left as it was; every rank's result for the bucket is NaN, the
            servers keep their residuals and the other ranks owe what they sent to the next
            step). Off the CPU it is counted on the device and reading it waits for the stream
            (exact; a stats read, not for inside backward).

    Creating it is collective (it makes a second process group); call :meth:`close` on every rank
    after the last step.
    """

    name = "sign"

    def __init__(self, process_group: dist.ProcessGroup, **kwargs: Any) -> None:
        super().__init__(process_group, **kwargs)
        self._nonfinite = DeviceCount()
        self._worker = StageTwoWorker(process_group)
        kernels.warm_up()  # the decode runs on the codec's kernels (CPU)

    @property
    def nonfinite_buckets(self) -> int:
        """Buckets flagged for NaN/Inf on this rank (see the class docstring)."""
        return self._nonfinite.value()

    def communicate(self, bucket) -> torch.futures.Future:  # type: ignore[no-untyped-def]
        """Compress the bucket in W chunks with worker error feedback and start the all-to-all;
        the server stage and the all-gather run on the worker thread. A future of the decoded
        average (float32, the bucket's shape), NaN for a bucket some rank flagged."""
        self.timer.bucket_ready()
        buffer, index, w = bucket.buffer(), bucket.index(), self.world_size
        layout = BucketLayout.of(bucket)
        n = layout.numel
        c = chunk_elements(n, w)
        work = self.residuals.flat(index, layout, padded_numel=w * c)
        lengths = chunk_lengths(n, w, work.device)
        host = on_host(buffer)
        finite: bool | torch.Tensor
        if not host:  # the same work whatever the flag; where() picks (module docstring)
            flag = finite = finite_flag(buffer)
            self._nonfinite.add(~flag)
            work[:n].add_(torch.where(flag, buffer, -0.0))  # x + -0.0 is x, bit for bit
            payload = torch.where(flag, compress_rows(work.view(w, c), lengths, keep=flag),
                                  nan_row(c, work.device))
            work[n:].zero_()
        elif finite := all_finite(buffer):
            work[:n].add_(buffer)
            payload = compress_rows(work.view(w, c), lengths)
            work[n:].zero_()  # padding carries no residual
        else:  # the NaN flag in every chunk; the residual keeps its value
            self._nonfinite.add(1)
            payload = nan_row(c).to(buffer.device).expand(w, -1).contiguous()
        received, first = self.start_alltoall(index, payload, self.raw_bytes(buffer))
        server = self.server.get(index, layout, c)
        my_length = lengths[self.rank : self.rank + 1]

        real = max(0, min(c, n - self.rank * c))

        def finish() -> torch.Tensor:
            if self.integrity is not None:
                self.integrity.alltoall_received(index, received)
            before = server.clone()  # 1/W of the bucket: restored if the step is flagged
            if not host:
                reply = self._server_on_device(received, server, c, real, my_length)
            elif bool(torch.isfinite(scales(received)).all()):
                server.add_(decompress_rows(received).mean(0))
                server[real:].zero_()  # padding: what the workers sent there is sign(0)
                reply = compress_rows(server.view(1, c), my_length).view(-1)
            else:  # pass the flag on
                reply = nan_row(c).to(server.device).view(-1)
            gathered = torch.empty(w * reply.numel(), dtype=torch.uint8, device=reply.device)
            if self.integrity is not None:
                self.integrity.allgather_sent(index, reply, stage=1)
            second = dist.all_gather_single(gathered, reply, group=self._worker.group,
                                            async_op=True)
            # wait on the tracked future: its completion is recorded before DDP can take the step
            self.timer.track(second.get_future(), allgather_bytes(reply.numel(), w), "allgather",
                             raw_bytes=0, bucket_ready=False).wait()
            if self.integrity is not None:
                self.integrity.allgather_received(index, gathered.view(w, -1), stage=1)
            rows = gathered.view(w, -1)
            if not host:
                bad = ~torch.isfinite(scales(rows)).all()
                server.copy_(torch.where(bad, before, server))
                owed = decompress_rows(payload).view(-1)  # what was sent, when it was finite
                work.add_(torch.where(bad & finite, owed, -0.0))
                work[n:].zero_()
                return buffer.copy_(torch.where(bad, float("nan"),
                                                decompress_rows(rows).view(-1)[:n]))
            if not bool(torch.isfinite(scales(rows)).all()):  # some rank's NaN
                server.copy_(before)
                if finite:  # owe what was sent to the next step (to rounding)
                    work.add_(decompress_rows(payload).view(-1))
                    work[n:].zero_()
                return buffer.fill_(float("nan"))
            buffer.copy_(decompress_rows(rows).view(-1)[:n])
            return buffer

        return self._worker.submit(first, finish, buffer.device)

    @staticmethod
    def _server_on_device(received: torch.Tensor, server: torch.Tensor, c: int, real: int,
                          length: torch.Tensor) -> torch.Tensor:
        """The server stage without a host read: the mean of the W chunks is added only where
        every scale is finite, and the reply is the flag otherwise (one payload row, uint8)."""
        ok = torch.isfinite(scales(received)).all()
        server.add_(torch.where(ok, decompress_rows(received).mean(0), -0.0))
        server[real:].zero_()
        reply = compress_rows(server.view(1, c), length, keep=ok).view(-1)
        return torch.where(ok, reply, nan_row(c, server.device).view(-1))

    def close(self) -> None:
        """Stop the stage-two thread and destroy its group: collective, every rank, after the
        last ``backward()``."""
        self._worker.close()

