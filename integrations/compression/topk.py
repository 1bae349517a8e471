"""``topk``: top-k sparsification with error feedback, exchanged with one all-gather.

Compressor (Deep Gradient Compression; Lin et al., ICLR 2018; error feedback as in Stich et al.,
"Sparsified SGD with Memory", NeurIPS 2018): ``p = g + e``; send the ``k = ceil(ratio * N)``
entries of largest magnitude with their indices; keep ``e = p`` with those entries zeroed. The
error obeys ``|p - topk(p)|_2^2 <= (1 - k/N) |p|_2^2`` (Stich et al., Lemma A.1), and the kept
entries are exact.

Choosing the entries: ``torch.topk`` over millions of elements is slow on CPU (580 ms for 1% of
25 M here), so, as DGC does, a threshold is estimated on a random sample; the candidates above it
(about 1.25 k) go through an exact ``topk``. The result is the exact top k (up to ties) whenever
the sample did not overshoot; when it did, the exact ``topk`` over the whole bucket runs instead.

Collective: each rank contributes ``k`` fp32 values and ``k`` int32 indices (one int32 tensor of
``2k``) to an all-gather: ``(W-1) * 8k`` bytes per rank, against ``2 (W-1)/W * 4 N`` for an fp32
ring all-reduce, a ratio of ``N / (W k) = 1 / (W * ratio)``: 25 at 1% and 4 ranks, shrinking as
the world grows, because every rank receives every other rank's selection.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist

from laggard.integrations.compression.base import CompressionState
from laggard.integrations.compression.residuals import BucketLayout, ErrorFeedback
from laggard.integrations.compression.wire import allgather_bytes

#: Below this many elements the exact ``torch.topk`` is cheap enough.
EXACT_BELOW = 1 << 16
#: Sample at least this many elements, and enough that ~200 of them lie above the threshold.
MIN_SAMPLE = 8192
#: Candidates aimed for, as a multiple of k (slack for the threshold's sampling error).
OVERSELECT = 1.25


def select_topk(values: torch.Tensor, k: int, generator: torch.Generator,
                workspace: torch.Tensor | None = None) -> torch.Tensor:
    """Indices of the ``k`` entries of largest magnitude (unordered).

    Args:
        values: 1-D float tensor of ``N`` elements.
        k: 1 <= k <= N.
        generator: CPU generator for the sample positions.
        workspace: optional float tensor like ``values`` to hold the magnitudes (saves
            allocating and faulting in a fresh buffer every step).

    Returns:
        int64 tensor of ``k`` distinct indices.
    """
    n = values.numel()
    magnitude = torch.abs(values, out=workspace) if workspace is not None else values.abs()
    if n < EXACT_BELOW or 4 * k >= n:
        return torch.topk(magnitude, k, sorted=False).indices
    size = min(n, max(MIN_SAMPLE, 200 * n // k))
    positions = torch.randint(n, (size,), generator=generator).to(values.device)
    above = min(size, math.ceil(size * OVERSELECT * k / n))
    threshold = magnitude[positions].kthvalue(size - above + 1).values
    candidates = (magnitude >= threshold).nonzero().view(-1)
    if candidates.numel() < k:
        return torch.topk(magnitude, k, sorted=False).indices
    return candidates[torch.topk(magnitude[candidates], k, sorted=False).indices]


class TopKCompression(CompressionState):
    """Top-k sparsification with error feedback (see the module docstring).

    Args:
        process_group, model, timer: see :class:`CompressionState`.
        ratio: fraction of each bucket's elements sent, in (0, 1]; default 1%.
        seed: seed of the threshold's sampling.

    Raises:
        ValueError: ``ratio`` outside (0, 1].
    """

    name = "topk"

    def __init__(self, process_group: dist.ProcessGroup, *, ratio: float = 0.01, seed: int = 0,
                 **kwargs: Any) -> None:
        if not 0 < ratio <= 1:
            raise ValueError(f"top-k ratio must be in (0, 1], got {ratio!r}")
        super().__init__(process_group, **kwargs)
        self.ratio = ratio
        self.residuals = ErrorFeedback()
        self._generator = torch.Generator().manual_seed(seed)
        self._workspace: dict[int, torch.Tensor] = {}  # bucket index -> magnitudes buffer

    def communicate(self, bucket) -> torch.futures.Future:  # type: ignore[no-untyped-def]
        self.timer.bucket_ready()
        buffer, w = bucket.buffer(), self.world_size
        layout = BucketLayout.of(bucket)
        p = self.residuals.flat(bucket.index(), layout)
        p.add_(buffer)
        k = max(1, math.ceil(self.ratio * layout.numel))
        workspace = self._workspace.get(bucket.index())
        if workspace is None or workspace.shape != p.shape:
            workspace = self._workspace[bucket.index()] = torch.empty_like(p)
        chosen = select_topk(p, k, self._generator, workspace)
        payload = torch.empty(2 * k, dtype=torch.int32, device=p.device)
        payload[:k] = p[chosen].view(torch.int32)
        payload[k:] = chosen
        p[chosen] = 0
        if self.integrity is not None:
            self.integrity.allgather_sent(bucket.index(), payload)
        gathered = torch.empty(w * 2 * k, dtype=torch.int32, device=p.device)
        fut = dist.all_gather_single(gathered, payload, group=self.process_group,
                                     async_op=True).get_future()
        fut = self.timer.track(fut, allgather_bytes(payload.numel() * 4, w), "allgather",
                               raw_bytes=self.raw_bytes(buffer), bucket_ready=False)

        def decompress(_: torch.futures.Future) -> torch.Tensor:
            rows = gathered.view(w, 2 * k)
            if self.integrity is not None:
                self.integrity.allgather_received(bucket.index(), rows)
            values = rows[:, :k].contiguous().view(torch.float32).reshape(-1)
            indices = rows[:, k:].reshape(-1).to(torch.int64)
            buffer.zero_()
            buffer.index_add_(0, indices, values.to(buffer.dtype), alpha=1 / w)
            return buffer

        return fut.then(decompress)

    def state_dict(self) -> dict[str, Any]:
        """Residuals per parameter name."""
        self._require_names()
        state = super().state_dict()
        state["residuals"] = self.residuals.export(self._names)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self._require_names()
        self.residuals.load(state["residuals"], self._params)
