"""``topk``: top-k sparsification with error feedback, by all-gather or sparse reduce-scatter.

Compressor (Deep Gradient Compression; Lin et al., ICLR 2018; error feedback as in Stich et al.,
"Sparsified SGD with Memory", NeurIPS 2018): ``p = g + e``; send the ``k = ceil(ratio * N)``
entries of largest magnitude with their indices; keep ``e = p`` with those entries zeroed. The
error obeys ``|p - topk(p)|_2^2 <= (1 - k/N) |p|_2^2`` (Stich et al., Lemma A.1), and the kept
entries are exact.

Choosing the entries: ``torch.topk`` over millions of elements is slow on CPU (580 ms for 1% of
25 M here), so, as DGC does, a threshold is estimated on a random sample; the candidates above it
(about 1.25 k) go through an exact selection. The result is the exact top k (up to ties)
whenever the sample did not overshoot; when it did, an exact selection over the bucket runs.

Two exchanges (``algorithm``):

* ``allgather``: each rank contributes ``k`` fp32 values and ``k`` int32 indices to an
  all-gather: ``(W-1) * 8k`` bytes per rank against ``2 (W-1)/W * 4 N`` for an fp32 ring
  all-reduce, a ratio of ``1 / (W ratio)`` that shrinks as the world grows (every rank receives
  every selection).
* ``scatter``: the sparse reduce-scatter then all-gather of Ok-Topk (Li and Hoefler, "Near-Optimal
  Sparse Allreduce for Distributed Deep Learning", PPoPP 2022), with fixed, equal regions and a
  fixed budget per region instead of Ok-Topk's balanced boundaries and global threshold (so gloo's
  fixed-size all-to-all serves it, without a round to exchange sizes). The bucket is cut into W
  regions of ``c = ceil(N/W)``; rank i sends the top ``k_r = ceil(k/W)`` of its ``p`` in region j
  to rank j (all-to-all); rank j adds the W contributions / W to its *server* residual and
  re-sparsifies: its top ``k_r`` go to every rank (all-gather), the rest stays in the server
  residual (error feedback on both stages, as in 1-bit Adam's compressed all-reduce). Bytes per
  rank: ``2 (W-1)/W * 8 k_r W``, about ``16k`` at any world size: ``N / (2k)`` = 50-fold fewer
  than fp32 at 1%, flat in W. The result holds at most ``k`` entries (``k_r`` per region), not
  the exact global top k.

``auto`` takes ``allgather`` up to 2 ranks (the same ``8k`` bytes in one collective) and
``scatter`` above. A bucket whose gradients hold NaN/Inf is sent as a NaN flag and its residuals
are left as they were; every rank's result for it is NaN (counted in ``nonfinite_buckets`` on the
rank that held it). The other ranks put back into their residuals what they had selected to send
(error feedback then owes it, with this step's gradient, to the next step) and the servers of the
sparse reduce-scatter restore theirs: nothing a residual held is lost anywhere.

Off the CPU nothing is read back to the host (:mod:`laggard.integrations.device_reads`): the
selection is ``torch.topk`` (exact; the sampled threshold needs a host read of the threshold and
a data-dependent ``nonzero``), and every NaN decision is a 0-d device flag applied with
``torch.where``: a flagged bucket's payload is the NaN flag and its residual is written back
with the values it had (:func:`select_on_device`); ``put_back`` and the NaN result likewise.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from laggard.compression import kernels
from laggard.compression.base import ServerFeedbackState, all_finite
from laggard.compression.residuals import BucketLayout
from laggard.compression.two_stage import StageTwoWorker
from laggard.integrations.collective_bytes import allgather_bytes
from laggard.integrations.device_reads import DeviceCount, finite_flag, on_host

#: The exchanges :class:`TopKCompression` can use (``auto`` picks by world size).
ALGORITHMS = ("auto", "allgather", "scatter")
#: Below this many elements the exact ``torch.topk`` is cheap enough.
EXACT_BELOW = 1 << 16
#: Sample at least this many elements, and enough that ~200 of them lie above the threshold.
MIN_SAMPLE = 8192
#: Candidates aimed for, as a multiple of k (slack for the threshold's sampling error).
OVERSELECT = 1.25


def select_topk(values: torch.Tensor, k: int, generator: torch.Generator,
                workspace: torch.Tensor | None = None,
                mask: torch.Tensor | None = None, *,
                add: torch.Tensor | None = None) -> torch.Tensor:
    """Indices of the ``k`` entries of largest magnitude (unordered), after ``values += add``.

    A threshold is estimated on a random sample (as DGC does) so that about ``1.25 k`` entries
    lie above it; those candidates go through an exact selection. On CPU the candidates are
    collected by one Numba pass over the buffer (:func:`.kernels.add_collect_above`), which also
    does the error-feedback add: the bucket is read once. Elsewhere, torch ops. When the sample
    over- or undershot (fewer than ``k`` candidates, or more than ``2 k + 64``), an exact
    selection over the whole buffer runs instead. A bucket of zeros (threshold 0) selects its
    nonzero entries and then the first zeros, without sorting.

    Args:
        values: 1-D float tensor of ``N`` elements, finite (the hooks check before selecting).
        k: 1 <= k <= N.
        generator: CPU generator for the sample positions.
        workspace: optional float tensor like ``values`` to hold the magnitudes where they are
            materialised (small buckets, other devices).
        mask: optional bool tensor of ``N`` elements for the comparison, likewise.
        add: optional finite tensor of ``G <= N`` elements added into ``values[:G]`` first.

    Returns:
        int64 tensor of ``k`` distinct indices.
    """
    if _kernel_path(values, k, add):
        chosen = np.empty(k, dtype=np.int64)
        picked = np.empty(k, dtype=np.float32)
        if _topk_cpu(values.numpy(), None if add is None else add.numpy(), k, generator,
                     chosen, picked, zero=False):
            return torch.from_numpy(chosen)
        add = None  # the kernel did the add
    elif add is not None:
        values[: add.numel()].add_(add)
    n = values.numel()
    if values.device.type == "cpu" and n >= EXACT_BELOW and 4 * k < n:
        return torch.from_numpy(_exact_cpu(values.detach().numpy(), k))
    magnitude = torch.abs(values, out=workspace) if workspace is not None else values.abs()
    if n < EXACT_BELOW or 4 * k >= n:
        return torch.topk(magnitude, k, sorted=False).indices
    threshold = _sampled_threshold(values.detach(), None, k, generator)
    above_mask = torch.ge(magnitude, threshold, out=mask) if mask is not None \
        else magnitude >= threshold
    candidates = above_mask.nonzero().view(-1)
    if candidates.numel() < k:
        return torch.topk(magnitude, k, sorted=False).indices
    return candidates[torch.topk(magnitude[candidates], k, sorted=False).indices]


def _kernel_path(values: torch.Tensor, k: int, add: torch.Tensor | None) -> bool:
    """Whether :func:`_topk_cpu` serves this selection: a large float32 CPU bucket."""
    n = values.numel()
    return values.device.type == "cpu" and values.dtype == torch.float32 \
        and values.is_contiguous() and n >= EXACT_BELOW and 4 * k < n \
        and (add is None or (add.dtype == torch.float32 and add.is_contiguous()))


def _sampled_threshold(values: torch.Tensor, add: torch.Tensor | None, k: int,
                       generator: torch.Generator) -> float:
    """A magnitude threshold about ``OVERSELECT k`` entries of ``values (+ add)`` exceed, from
    a random sample of at least ``MIN_SAMPLE`` entries."""
    n = values.numel()
    size = min(n, max(MIN_SAMPLE, 200 * n // k))
    positions = torch.randint(n, (size,), generator=generator)
    above = min(size, math.ceil(size * OVERSELECT * k / n))
    if values.device.type != "cpu":
        return float(values[positions.to(values.device)].abs().kthvalue(size - above + 1).values)
    flat, where = values.numpy(), positions.numpy()
    sample = flat[where]  # numpy's fancy indexing: ~10x torch's at these sizes
    if add is not None:
        extra = add.numpy()
        if extra.size == n:
            sample += extra[where]
        else:
            inside = where < extra.size
            sample[inside] += extra[where[inside]]
    magnitudes = np.abs(sample, out=sample)
    return float(np.partition(magnitudes, size - above)[size - above])


def _exact_cpu(values: np.ndarray, k: int) -> np.ndarray:
    """The exact top-k positions of a large CPU bucket: its nonzero entries then its first
    zeros when it has at most k nonzeros (no sorting), else numpy's introselect."""
    nonzero = np.flatnonzero(values)
    if nonzero.size <= k:
        zeros = np.flatnonzero(values == 0)[: k - nonzero.size]
        return np.concatenate([nonzero, zeros]).astype(np.int64)
    return np.argpartition(np.abs(values), values.size - k)[-k:].astype(np.int64)


def _topk_cpu(values: np.ndarray, add: np.ndarray | None, k: int, generator: torch.Generator,
              chosen: np.ndarray, picked: np.ndarray, zero: bool) -> bool:
    """The top k of float32 ``values`` after ``values[:G] += add``, into ``chosen`` (positions)
    and ``picked`` (values), by the kernels: the sampled threshold, one pass that adds and
    collects the candidates with their values, the exact k among them (zeroed in ``values``
    with ``zero``). False when the sample over- or undershot or the bucket is mostly zeros: the
    add is done, the caller selects exactly instead."""
    threshold = _sampled_threshold(torch.from_numpy(values),
                                   None if add is None else torch.from_numpy(add), k, generator)
    if threshold <= 0:  # most of the bucket is zero
        if add is not None:
            values[: add.size] += add
        return False
    positions = np.empty(2 * k + 64, dtype=np.int64)
    found = np.empty(2 * k + 64, dtype=np.float32)
    limit = kernels.threshold_bits(threshold)
    count = kernels.collect_above(values, limit, positions, found) if add is None \
        else kernels.add_collect_above(values, add, limit, positions, found)
    if count < k:
        return False
    magnitudes = np.abs(found[:count])
    kth = np.partition(magnitudes, count - k)[count - k]
    kernels.take_topk(values, positions[:count], found[:count], kth, k, chosen, picked, zero)
    return True


class TopKCompression(ServerFeedbackState):
    """Top-k sparsification with error feedback (see the module docstring).

    Args:
        process_group, model, timer: see :class:`~laggard.compression.base.CompressionState`;
            residuals and their checkpoint: :class:`~laggard.compression.base.ServerFeedbackState`.
        ratio: fraction of each bucket's elements sent, in (0, 1]; default 1%. ``k`` is
            ``ceil(ratio N)``, at least 1 and never more than the bucket (``ratio`` 1 sends
            every element, exactly).
        seed: seed of the threshold's sampling.
        algorithm: ``allgather`` (every rank's k entries to every rank), ``scatter`` (the sparse
            reduce-scatter / all-gather), or ``auto`` (default): ``allgather`` up to 2 ranks,
            where both send ``8k`` bytes and it takes one collective, ``scatter`` above.

    Raises:
        ValueError: ``ratio`` outside (0, 1] or an unknown ``algorithm``.

    Attributes:
        nonfinite_buckets: buckets whose gradients held NaN/Inf on this rank (sent as a NaN flag;
            the residual was left as it was; every rank's result for the bucket is NaN). Off the
            CPU it is counted on the device and reading it waits for the stream (exact; a stats
            read, not for inside backward).
    """

    name = "topk"

    def __init__(self, process_group: dist.ProcessGroup, *, ratio: float = 0.01, seed: int = 0,
                 algorithm: str = "auto", **kwargs: Any) -> None:
        if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 < ratio <= 1:
            raise ValueError(f"top-k ratio must be a number in (0, 1], got {ratio!r}")
        if algorithm not in ALGORITHMS:
            raise ValueError(f"top-k algorithm {algorithm!r} not in {ALGORITHMS}")
        super().__init__(process_group, **kwargs)
        self.ratio = ratio
        if algorithm == "auto":
            algorithm = "allgather" if self.world_size <= 2 else "scatter"
        self.algorithm = algorithm
        self._generator = torch.Generator().manual_seed(seed)
        # bucket index -> magnitudes and mask buffers
        self._workspace: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._nonfinite = DeviceCount()
        self._worker = StageTwoWorker(process_group) if algorithm == "scatter" else None
        kernels.warm_up()

    @property
    def nonfinite_buckets(self) -> int:
        """Buckets flagged for NaN/Inf on this rank (see the class docstring)."""
        return self._nonfinite.value()

    def k(self, numel: int) -> int:
        """Entries a bucket of ``numel`` elements sends in the all-gather variant."""
        return min(numel, max(1, math.ceil(self.ratio * numel)))

    def workspace(self, index: int, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The bucket's reusable magnitudes and comparison-mask buffers."""
        workspace = self._workspace.get(index)
        if workspace is None or workspace[0].shape != like.shape:
            workspace = self._workspace[index] = (
                torch.empty_like(like), torch.empty(like.shape, dtype=torch.bool,
                                                    device=like.device))
        return workspace

    def _region_workspace(self, index: int, p: torch.Tensor, region: int,
                          length: int) -> tuple[torch.Tensor, torch.Tensor]:
        magnitudes, mask = self.workspace(index, p)
        where = slice(region * length, (region + 1) * length)
        return magnitudes[where], mask[where]

    def communicate(self, bucket) -> torch.futures.Future:  # type: ignore[no-untyped-def]
        """Select this rank's top k (error feedback on) and start the exchange of
        :attr:`algorithm`; a future of the bucket's sparse average, NaN for a bucket some rank
        flagged."""
        self.timer.bucket_ready()
        if self.algorithm == "scatter":
            return self._scatter(bucket)
        buffer, w, index = bucket.buffer(), self.world_size, bucket.index()
        layout = BucketLayout.of(bucket)
        k = self.k(layout.numel)
        p = self.residuals.flat(index, layout)
        host = on_host(buffer)
        if not host:  # the NaN decision on the device (module docstring)
            finite = finite_flag(buffer)
            self._nonfinite.add(~finite)
            payload = select_on_device(p, buffer, k, finite, self.workspace(index, p)[0])
        elif all_finite(buffer):
            payload = self.select(p, buffer, k, lambda: self.workspace(index, p))
        else:  # the NaN flag; the residual keeps its value
            self._nonfinite.add(1)
            payload = nan_flag(k, p.device)
        if self.integrity is not None:
            self.integrity.allgather_sent(index, payload)
        gathered = torch.empty(w * 2 * k, dtype=torch.int32, device=p.device)
        fut = dist.all_gather_single(gathered, payload, group=self.process_group,
                                     async_op=True).get_future()
        fut = self.timer.track(fut, allgather_bytes(payload.numel() * 4, w), "allgather",
                               raw_bytes=self.raw_bytes(buffer), bucket_ready=False)

        def decompress(_: torch.futures.Future) -> torch.Tensor:
            rows = gathered.view(w, 2 * k)
            if self.integrity is not None:
                self.integrity.allgather_received(index, rows)
            if not host:
                put_back(p, payload.view(1, -1), 0, when=flagged_on_device(rows))
            elif flagged(rows):  # another rank's NaN: keep what this rank selected to send
                put_back(p, payload.view(1, -1), 0)
            return scatter_rows(buffer, rows, 0, 1 / w)

        return fut.then(decompress)

    def select(self, p: torch.Tensor, gradient: torch.Tensor | None, k: int,
                workspace: Callable[[], tuple[torch.Tensor, torch.Tensor]] | None = None,
                ) -> torch.Tensor:
        """``p[:G] += gradient`` (finite: the callers check), then the payload of p's top k
        (int32 ``(2k,)``: values' bits, then indices), zeroing them in ``p``."""
        payload = torch.empty(2 * k, dtype=torch.int32, device=p.device)
        if _kernel_path(p, k, gradient):
            entries = payload.numpy()
            if _topk_cpu(p.numpy(), None if gradient is None else gradient.numpy(), k,
                         self._generator, entries[k:], entries[:k].view(np.float32),
                         zero=True):
                return payload
            gradient = None  # the kernel did the add
        # the magnitudes and mask buffers only on other devices (made on demand: they cost 1.25
        # times the bucket's memory; the CPU paths need neither)
        magnitudes, mask = workspace() if workspace is not None and p.device.type != "cpu" \
            else (None, None)
        chosen = select_topk(p, k, self._generator, magnitudes, mask, add=gradient)
        if p.device.type == "cpu":  # numpy's fancy indexing: ~20x torch's for these sizes
            flat, where = p.numpy(), chosen.numpy()
            payload.numpy()[:k] = flat[where].view(np.int32)
            flat[where] = 0
        else:
            payload[:k] = p[chosen].view(torch.int32)
            p[chosen] = 0
        payload[k:] = chosen
        return payload

    def _scatter(self, bucket) -> torch.futures.Future:  # type: ignore[no-untyped-def]
        """The sparse reduce-scatter / all-gather variant (module docstring)."""
        buffer, w, index = bucket.buffer(), self.world_size, bucket.index()
        layout = BucketLayout.of(bucket)
        n = layout.numel
        c = -(-n // w)  # region (chunk) length
        kr = min(c, -(-self.k(n) // w))  # entries per region
        p = self.residuals.flat(index, layout, padded_numel=w * c)
        host = on_host(buffer)
        if not host:
            finite = finite_flag(buffer)
            self._nonfinite.add(~finite)
            rows = [select_on_device(p[j * c : (j + 1) * c], buffer[j * c : (j + 1) * c], kr,
                                     finite, self._region_workspace(index, p, j, c)[0])
                    for j in range(w)]
        elif all_finite(buffer):
            rows = [self.select(p[j * c : (j + 1) * c], buffer[j * c : (j + 1) * c], kr,
                                 partial(self._region_workspace, index, p, j, c))
                    for j in range(w)]
        else:  # every region flagged; the residual is left as it was
            self._nonfinite.add(1)
            rows = [nan_flag(kr, p.device)] * w
        payload = torch.stack(rows)
        received, first = self.start_alltoall(index, payload, self.raw_bytes(buffer))
        server = self.server.get(index, layout, c)
        real = max(0, min(c, n - self.rank * c))
        worker = self._worker
        assert worker is not None  # the scatter exchange always has its stage-two worker

        def finish() -> torch.Tensor:
            if self.integrity is not None:
                self.integrity.alltoall_received(index, received)
            values = received[:, :kr].contiguous().view(torch.float32).reshape(-1)
            before = server.clone()  # 1/W of the bucket: restored if another region is flagged
            if not host:
                ok = torch.isfinite(values).all()
                server.index_add_(0, received[:, kr:].reshape(-1).long(),
                                  torch.where(ok, values, -0.0), alpha=1 / w)
                server[real:].zero_()
                reply = select_on_device(server, None, kr, ok,
                                         self.workspace(-1 - index, server)[0])
            elif bool(torch.isfinite(values).all()):
                server.index_add_(0, received[:, kr:].reshape(-1).long(), values, alpha=1 / w)
                server[real:].zero_()
                reply = self.select(server, None, kr,
                                    lambda: self.workspace(-1 - index, server))
            else:  # pass the flag on, keep the server residual
                reply = nan_flag(kr, server.device)
            gathered = torch.empty(w * 2 * kr, dtype=torch.int32, device=reply.device)
            if self.integrity is not None:
                self.integrity.allgather_sent(index, reply, stage=1)
            second = dist.all_gather_single(gathered, reply, group=worker.group,
                                            async_op=True)
            self.timer.track(second.get_future(), allgather_bytes(reply.numel() * 4, w),
                             "allgather", raw_bytes=0, bucket_ready=False).wait()
            rows = gathered.view(w, 2 * kr)
            if self.integrity is not None:
                self.integrity.allgather_received(index, rows, stage=1)
            if not host:
                bad = flagged_on_device(rows)
                server.copy_(torch.where(bad, before, server))
                put_back(p, payload, c, when=bad)
            elif flagged(rows):  # some rank's NaN: nothing of this step is applied anywhere
                server.copy_(before)
                put_back(p, payload, c)
            return scatter_rows(buffer, rows, c, 1.0)

        return worker.submit(first, finish, buffer.device)

    def close(self) -> None:
        """Stop the stage-two thread and destroy its group (``scatter`` only): collective, every
        rank, after the last ``backward()``."""
        if self._worker is not None:
            self._worker.close()


def nan_flag(k: int, device: torch.device) -> torch.Tensor:
    """The payload of a bucket that held NaN/Inf: NaN values at indices ``0..k-1`` (int32
    ``(2k,)``); every receiver turns the whole bucket to NaN (:func:`scatter_rows`)."""
    payload = torch.empty(2 * k, dtype=torch.int32, device=device)
    payload[:k] = torch.full((k,), float("nan"), device=device).view(torch.int32)
    payload[k:] = torch.arange(k, device=device)
    return payload


def flagged(rows: torch.Tensor) -> bool:
    """Whether any of the sparse rows (int32 ``(R, 2k)``) is a NaN flag (a host read)."""
    return bool(flagged_on_device(rows))


def flagged_on_device(rows: torch.Tensor) -> torch.Tensor:
    """:func:`flagged` as a 0-d bool tensor on ``rows``' device (no host read)."""
    k = rows.shape[1] // 2
    return ~torch.isfinite(rows[:, :k].contiguous().view(torch.float32)).all()


def select_on_device(p: torch.Tensor, gradient: torch.Tensor | None, k: int,
                     finite: torch.Tensor, magnitudes: torch.Tensor | None = None
                     ) -> torch.Tensor:
    """The selection of :meth:`TopKCompression.select` without a host read, for any device.

    ``p[:G] += gradient`` where ``finite``, then the exact top k of ``|p|`` (``torch.topk``,
    unordered), zeroed in ``p``. Where ``finite`` is False the same work runs but the gradient
    added is ``-0.0`` (``x + -0.0`` is ``x`` bit for bit) and the chosen entries are written back
    with their values, so ``p`` is left exactly as it was, and the payload is :func:`nan_flag`'s.

    Args:
        p: float32 ``(N,)`` residual, updated in place.
        gradient: float ``(G,)``, ``G <= N``, or None.
        k: 1 <= k <= N.
        finite: 0-d bool tensor on ``p``'s device.
        magnitudes: optional float32 ``(N,)`` scratch for ``|p|``.

    Returns:
        int32 ``(2k,)``: the values' bits, then the indices.
    """
    if gradient is not None:
        p[: gradient.numel()].add_(torch.where(finite, gradient, -0.0))
    magnitude = torch.abs(p, out=magnitudes) if magnitudes is not None else p.abs()
    chosen = torch.topk(magnitude, k, sorted=False).indices
    values = p[chosen]
    payload = torch.empty(2 * k, dtype=torch.int32, device=p.device)
    payload[:k] = torch.where(finite, values, float("nan")).view(torch.int32)
    payload[k:] = torch.where(finite, chosen, torch.arange(k, device=p.device))
    p[chosen] = torch.where(finite, 0.0, values)
    return payload


def put_back(p: torch.Tensor, rows: torch.Tensor, region: int,
             when: torch.Tensor | None = None) -> None:
    """Undo a selection: write this rank's sent values (int32 ``(R, 2k)`` rows, row ``r`` at
    offset ``r region``) back into the residual ``p`` they were zeroed in. Flag rows (NaN) are
    skipped: their residual was never touched.

    ``when``: a 0-d bool device tensor; given, nothing is read to the host: every row's entries
    are written, with the new values only where ``when`` holds and the row is finite.
    """
    k = rows.shape[1] // 2
    for r, row in enumerate(rows):
        values = row[:k].contiguous().view(torch.float32)
        where = row[k:].long() + r * region
        if when is not None:
            p[where] = torch.where(when & torch.isfinite(values), values, p[where])
        elif bool(torch.isfinite(values).all()):
            p[where] = values


def scatter_rows(buffer: torch.Tensor, rows: torch.Tensor, region: int,
                 weight: float) -> torch.Tensor:
    """Write the gathered sparse rows into ``buffer`` (zeros elsewhere); NaN if any is flagged.

    Args:
        buffer: the bucket's flat buffer, ``N`` elements, overwritten.
        rows: int32 ``(R, 2k)``: values' bits, then indices.
        region: 0 when the indices are bucket positions (all-gather variant, where rows may
            share indices and are summed); else row ``j``'s indices are offsets in region ``j``
            of this length (scatter variant; regions past ``N`` are padding and dropped).
        weight: multiplies the values (``1/W`` for the all-gather variant's mean).
    """
    r, width = rows.shape
    k = width // 2
    buffer.zero_()
    if on_host(buffer) and buffer.dtype == torch.float32 and buffer.is_contiguous():
        entries = rows.numpy()
        if not kernels.scatter_add(buffer.numpy(), entries[:, :k].view(np.float32),
                                   entries[:, k:], region, np.float32(weight)):
            buffer.fill_(float("nan"))
        return buffer
    values = rows[:, :k].contiguous().view(torch.float32)
    indices = rows[:, k:].to(torch.int64)
    if on_host(buffer) and not bool(torch.isfinite(values).all()):
        return buffer.fill_(float("nan"))
    finite = torch.isfinite(values).all()  # 0-d, on the device: no host read
    if region:
        indices += torch.arange(r, device=rows.device).unsqueeze(1) * region
        # padding regions: added as -0.0 at 0 (x + -0.0 is x), no data-dependent shape
        keep = indices < buffer.numel()
        indices, values = torch.where(keep, indices, 0), torch.where(keep, values, -0.0)
    buffer.index_add_(0, indices.reshape(-1), values.reshape(-1).to(buffer.dtype), alpha=weight)
    return buffer.masked_fill_(~finite, float("nan"))
