"""Collective op names and bytes on the wire, as the trace sources report them to the tracer.

One vocabulary of op names (``allreduce``, ``allgather``, ``reduce_scatter``, ``alltoall``,
``broadcast``, ``barrier``, ``send``, ``recv``) whatever names the source uses (the flight
recorder's ``profiling_name``, NCCL's ``OpType``), and one rule for the bytes a rank puts on the
wire per op (the byte arithmetic itself is :mod:`laggard.integrations.collective_bytes`'s).
No torch import.
"""

from __future__ import annotations

from laggard.integrations.collective_bytes import allgather_bytes, ring_allreduce_bytes

#: Flight-recorder ``profiling_name`` suffix (or NCCL ``OpType`` name) -> tracer op.
OP_NAMES = {"all_reduce": "allreduce", "allreduce": "allreduce", "_allgather_base": "allgather",
            "all_gather": "allgather", "allgather": "allgather",
            "all_gather_into_tensor_coalesced": "allgather",
            "_reduce_scatter_base": "reduce_scatter", "reduce_scatter": "reduce_scatter",
            "reduce_scatter_tensor_coalesced": "reduce_scatter", "broadcast": "broadcast",
            "all_to_all": "alltoall", "alltoallbase": "alltoall", "barrier": "barrier"}


def wire_bytes(op: str, nbytes: int, world_size: int) -> int:
    """Bytes one rank sends under the op's bandwidth-optimal algorithm.

    Args:
        op: ``allreduce`` (ring: ``2 (W-1)/W n``), ``allgather`` (``n`` = the rank's own input:
            ``(W-1) n``), ``reduce_scatter`` (``n`` = the full input: ``(W-1)/W n``),
            ``alltoall`` (``(W-1)/W n``), anything else: ``n``.
        nbytes: bytes of the tensor as described for each op.
        world_size: ranks in the group.

    Source: Thakur, Rabenseifner & Gropp, "Optimization of Collective Communication Operations
    in MPICH", IJHPCA 2005 (ring all-gather / reduce-scatter; all-reduce = both).
    """
    w = max(1, world_size)
    if op == "allreduce":
        return ring_allreduce_bytes(nbytes, w)
    if op == "allgather":
        return allgather_bytes(nbytes, w)
    if op in ("reduce_scatter", "alltoall"):
        return (w - 1) * nbytes // w
    return nbytes


def op_name(op_type: str) -> str:
    """``OpType.ALLREDUCE`` / ``nccl:all_reduce`` -> ``allreduce``."""
    name = op_type.rsplit(".", 1)[-1].rsplit(":", 1)[-1].lower()
    return OP_NAMES.get(name, name.replace("_", ""))


__all__ = ["OP_NAMES", "op_name", "wire_bytes"]
