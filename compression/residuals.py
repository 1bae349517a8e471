"""Error-feedback residuals that survive DDP's bucket rebuild and a checkpoint round trip.

Error feedback (Seide et al. 2014; Karimireddy et al., "Error Feedback Fixes SignSGD", ICML 2019)
keeps, per rank, what compression dropped and adds it to the next step's gradient. A hook sees
gradients bucket by bucket, so it wants the residual as one flat buffer laid out like the bucket.
But DDP rebuilds its buckets after the first iteration (in the order gradients became ready), so a
residual keyed by ``bucket.index()`` would land on the wrong parameters. Here each parameter owns
its residual; a bucket's flat buffer is a cache whose slices *are* those per-parameter residuals
(views). When a bucket's parameter list changes, its flat buffer is rebuilt by copying each
parameter's residual from wherever it lived before.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class BucketLayout:
    """Which parameters a gradient bucket holds, and where, in its flat buffer.

    Attributes:
        params: the bucket's parameters, in buffer order.
        offsets: element offset of each parameter's gradient in the buffer.
        numel: total number of elements in the buffer.
        key: identity of the layout (the parameters' ``id``), to notice a rebuild.
    """

    params: tuple[torch.Tensor, ...]
    offsets: tuple[int, ...]
    numel: int
    key: tuple[int, ...]

    @classmethod
    def of(cls, bucket) -> BucketLayout:  # type: ignore[no-untyped-def]
        """The layout of a ``dist.GradBucket`` (or anything with ``parameters()``, ``buffer()``).

        Raises:
            ValueError: the parameters do not tile the buffer (DDP packs them back to back).
        """
        params = tuple(bucket.parameters())
        offsets, total = [], 0
        for p in params:
            offsets.append(total)
            total += p.numel()
        if total != bucket.buffer().numel():
            raise ValueError(f"bucket {bucket.index()}: parameters hold {total} elements, "
                             f"buffer {bucket.buffer().numel()}")
        return cls(params, tuple(offsets), total, tuple(id(p) for p in params))

    def slices(self) -> Iterable[tuple[torch.Tensor, int, int]]:
        """``(param, start, end)`` element ranges in the flat buffer."""
        for p, start in zip(self.params, self.offsets, strict=True):
            yield p, start, start + p.numel()


#: Called as ``on_evict(bucket_index, old_layout, old_flat)`` before a stale flat buffer is dropped.
EvictCallback = Callable[[int, BucketLayout, torch.Tensor], None]


class ErrorFeedback:
    """Per-parameter residuals, served as one flat float32 buffer per bucket.

    Not thread-safe per bucket: a bucket's buffer is used by one step at a time, which is how DDP
    calls hooks (the next hook call for a bucket comes after DDP waited on the previous future).

    Args:
        on_evict: called with the old layout and buffer of a bucket whose flat buffer is about to
            be dropped; the per-parameter residuals are still views into ``old_flat``, so adding
            to it updates them (the sign hook folds its server residual in this way).
    """

    def __init__(self, on_evict: EvictCallback | None = None) -> None:
        self._on_evict = on_evict
        self._param: dict[int, torch.Tensor] = {}  # id(param) -> 1-D residual (view or own)
        self._owner: dict[int, int] = {}  # id(param) -> bucket index whose flat holds it
        self._flat: dict[int, tuple[BucketLayout, torch.Tensor]] = {}

    def flat(self, bucket_index: int, layout: BucketLayout, padded_numel: int = 0) -> torch.Tensor:
        """The bucket's residual buffer, float32, ``max(layout.numel, padded_numel)`` elements.

        The first ``layout.numel`` elements are the parameters' residuals (zeros for a parameter
        never seen); the padding is zeros when created and is the caller's to keep.
        """
        cached = self._flat.get(bucket_index)
        size = max(layout.numel, padded_numel)
        if cached is not None and cached[0].key == layout.key and cached[1].numel() == size:
            return cached[1]
        stale = {self._owner[k] for k in layout.key if k in self._owner}
        if cached is not None:
            stale.add(bucket_index)
        for index in sorted(stale):
            old_layout, old_flat = self._flat.pop(index)
            for key in old_layout.key:
                del self._owner[key]  # the residual stays, as a view into old_flat
            if self._on_evict is not None:
                self._on_evict(index, old_layout, old_flat)
        device = layout.params[0].device if layout.params else None
        flat = torch.zeros(size, dtype=torch.float32, device=device)
        for p, start, end in layout.slices():
            old = self._param.get(id(p))
            if old is not None:
                flat[start:end].copy_(old)
            self._param[id(p)] = flat[start:end]
            self._owner[id(p)] = bucket_index
        self._flat[bucket_index] = (layout, flat)
        return flat

    def export(
        self, names: dict[int, str], extra: dict[int, tuple[int, torch.Tensor]] | None = None,
    ) -> dict[str, torch.Tensor]:
        """Copies of every residual (1-D float32, the parameter's elements), keyed by name.

        Args:
            names: ``id(param)`` -> name.
            extra: bucket index -> ``(start, tensor)`` to add to that bucket's flat buffer from
                element ``start`` on, in the copy only (the sign hook's folded server residual).

        Raises:
            ValueError: a residual's parameter has no name.
        """
        copies = {index: flat.clone() for index, (_, flat) in self._flat.items()}
        for index, (start, add) in (extra or {}).items():
            end = min(start + add.numel(), self._flat[index][0].numel)
            if end > start:
                copies[index][start:end] += add[: end - start]
        out: dict[str, torch.Tensor] = {}
        positions = {id(p): (index, s, e) for index, (layout, _) in self._flat.items()
                     for p, s, e in layout.slices()}
        for pid, residual in self._param.items():
            if pid not in names:
                raise ValueError("a residual belongs to a parameter missing from model=; pass "
                                 "the module wrapped by DistributedDataParallel")
            if pid in positions:
                index, s, e = positions[pid]
                out[names[pid]] = copies[index][s:e].clone()
            else:
                out[names[pid]] = residual.clone()
        return out

    def load(self, residuals: dict[str, torch.Tensor], params: dict[str, torch.Tensor]) -> None:
        """Replace every residual with ``residuals`` (name -> tensor), dropping all buffers.

        Raises:
            ValueError: an unknown name, or a size that does not match the parameter.
        """
        fresh: dict[int, torch.Tensor] = {}
        for name, value in residuals.items():
            param = params.get(name)
            if param is None:
                raise ValueError(f"residual for unknown parameter {name!r}")
            if value.numel() != param.numel():
                raise ValueError(f"residual {name!r} has {value.numel()} elements, the parameter "
                                 f"{param.numel()}")
            fresh[id(param)] = value.detach().reshape(-1).to(torch.float32, copy=True)
        self._param, self._owner, self._flat = fresh, {}, {}


class ServerResiduals:
    """The error feedback of a two-stage all-reduce's *server* stage: per bucket, what the
    average of this rank's chunk (elements ``[rank c, (rank+1) c)`` of the padded bucket) still
    owes, as 1-bit Adam's ``delta_bar`` (Tang et al. 2021, Algorithm 1).

    When DDP rebuilds a bucket, its chunks no longer map to the same parameters, so the residual
    is folded into this rank's worker residual, times W (the next average divides by W): the sum
    of all residuals over ranks, hence the error feedback's guarantee, is unchanged. Pass
    :meth:`fold` as the worker :class:`ErrorFeedback`'s ``on_evict``.

    Args:
        rank, world_size: this rank's place in the group.
    """

    def __init__(self, rank: int, world_size: int) -> None:
        self.rank, self.world_size = rank, world_size
        self._server: dict[int, tuple[tuple[int, ...], torch.Tensor]] = {}

    def get(self, index: int, layout: BucketLayout, c: int) -> torch.Tensor:
        """Bucket ``index``'s server residual, float32 ``(c,)``, zeros for a new layout."""
        entry = self._server.get(index)
        if entry is None or entry[0] != layout.key or entry[1].numel() != c:
            device = layout.params[0].device if layout.params else None
            entry = (layout.key, torch.zeros(c, dtype=torch.float32, device=device))
            self._server[index] = entry
        return entry[1]

    def fold(self, index: int, layout: BucketLayout, flat: torch.Tensor) -> None:
        """``on_evict``: add ``W *`` the server residual into the bucket's old worker buffer."""
        entry = self._server.pop(index, None)
        if entry is None or entry[0] != layout.key:
            return
        c = entry[1].numel()
        start, end = self.rank * c, min(self.rank * c + c, layout.numel)
        if end > start:
            flat[start:end].add_(entry[1][: end - start], alpha=self.world_size)

    def folded(self) -> dict[int, tuple[int, torch.Tensor]]:
        """``extra`` for :meth:`ErrorFeedback.export`: each bucket's residual folded as on a
        rebuild (checkpoints stay per parameter, independent of the bucket layout)."""
        return {index: (self.rank * server.numel(), server * self.world_size)
                for index, (_, server) in self._server.items()}

    def clear(self) -> None:
        """Drop every bucket's server residual (after a checkpoint load: it is in the workers')."""
        self._server.clear()
