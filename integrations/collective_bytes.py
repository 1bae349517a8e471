"""Byte accounting of collectives: the bytes each rank sends per collective, by algorithm.

Plain arithmetic on sizes (no torch import, no wire format): the timing hook of
:mod:`laggard.integrations.comm_timing` and the compression hooks of :mod:`laggard.compression`
both count with it, so it lives below both (it was ``laggard.integrations.compression.wire``).

The figures are those of the bandwidth-optimal algorithms NCCL uses and that nccl-tests'
"bus bandwidth" is defined from (NVIDIA, nccl-tests ``doc/PERFORMANCE.md``): with ``W`` ranks,

* ring all-reduce of ``n`` bytes: each rank sends ``2 (W-1)/W * n`` (reduce-scatter, then
  all-gather of ``n/W`` chunks);
* all-gather of ``n`` bytes per rank: each rank's chunk reaches ``W-1`` peers, so each rank sends
  ``(W-1) * n`` in total over the ring;
* all-to-all of ``n`` bytes per peer: ``(W-1) * n`` (nothing is sent to itself).

gloo's own algorithms differ in schedule but not in these totals for large messages. The hooks
pass these numbers to :meth:`CommTimer.track` as ``nbytes`` (bytes this rank puts on the wire),
and the uncompressed baseline (fp32 ring all-reduce of the bucket) as ``raw_bytes``.
"""

from __future__ import annotations


def ring_allreduce_bytes(nbytes: int, world_size: int) -> int:
    """Bytes one rank sends in a ring all-reduce of an ``nbytes`` buffer: ``2 (W-1)/W nbytes``,
    rounded down (0 for a world of 1)."""
    return 2 * (world_size - 1) * nbytes // world_size


def allgather_bytes(nbytes_per_rank: int, world_size: int) -> int:
    """Bytes one rank sends in an all-gather where every rank contributes ``nbytes_per_rank``."""
    return (world_size - 1) * nbytes_per_rank


def alltoall_bytes(nbytes_per_peer: int, world_size: int) -> int:
    """Bytes one rank sends in an all-to-all of ``nbytes_per_peer`` to every other rank."""
    return (world_size - 1) * nbytes_per_peer


def tensor_bytes(tensor) -> int:  # type: ignore[no-untyped-def]
    """Bytes a tensor's elements occupy (``numel * element_size``), of any dtype and shape.

    Unannotated so that this module needs no torch: anything with ``numel()`` and
    ``element_size()`` will do."""
    return tensor.numel() * tensor.element_size()
