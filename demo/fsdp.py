"""The demo's model sharded with FSDP2 (``fully_shard``, ZeRO-3) on gloo, its collectives traced.

Each transformer block is one FSDP unit and the root holds the embedding, the final norm and
the head: per step, one all-gather per unit before its forward, again before its backward
(parameters are freed after forward: ``reshard_after_forward``), and one reduce-scatter per unit
after its backward. Prefetching (``prefetch=True``) issues the next block's all-gather before
the current block computes, in forward (explicit, ``set_modules_to_forward_prefetch``) and in
backward (FSDP2's default); ``prefetch=False`` turns both off, so each all-gather is issued when
its block needs it. On a GPU the prefetched all-gather runs on its own stream, behind compute;
on CPU with gloo FSDP2 issues it synchronously on the training thread, so nothing hides and
prefetch changes only the order: the demo reports both measured, side by side.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch


def shard(model: torch.nn.Module, tracer: Any, *, prefetch: bool = True) -> int:
    """``fully_shard`` each block of a :class:`~laggard.demo.model.ByteLM` and its root, and
    time every all-gather and reduce-scatter with ``tracer``.

    Args:
        model: the ByteLM (sharded in place; it stays the same object).
        tracer: a :class:`~laggard.integrations.tracer.CollectiveTracer`.
        prefetch: prefetch the next block's parameters in forward and backward.

    Returns:
        FSDP units instrumented (blocks + root).
    """
    from torch.distributed.fsdp import fully_shard

    from laggard.integrations.trace_sources import instrument_fsdp

    # torch warns that the root returns a view (nn.Linear on (B, T, D) logits) which an in-place
    # op could corrupt; the demo's logits only go to cross_entropy, never modified in place.
    warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view",
                            category=UserWarning)
    blocks = list(model.blocks)  # type: ignore[union-attr, arg-type]
    for block in blocks:
        fully_shard(block)
    fully_shard(model)
    for i, block in enumerate(blocks):
        nxt = blocks[i + 1: i + 2] if prefetch else []
        prev = blocks[i - 1: i] if prefetch and i > 0 else []
        block.set_modules_to_forward_prefetch(nxt)  # type: ignore[operator]
        block.set_modules_to_backward_prefetch(prev)  # type: ignore[operator]
    return instrument_fsdp(model, tracer)


def mark_stalls(model: torch.nn.Module, clock: Any) -> int:
    """On the emulated asynchronous device: mark each FSDP2 all-gather and reduce-scatter as a
    device stall of the monitor's device clock.

    On CUDA, FSDP2 runs its collectives on streams of their own and the compute stream waits
    for them at a few points (which the monitor marks itself). With gloo the collectives run
    synchronously, on the stream thread that calls them: the stream is stalled for the whole
    call, so the call is the stall. Each one is wrapped (after :func:`shard`'s timing) in a
    ``stall_start`` / ``stall_end`` pair of device marks, ``clock.mark(kind, name)``, so the
    device clock's compute is the step's device time minus them.

    Args:
        model: the sharded ByteLM.
        clock: the monitor's ``device_clock`` (anything with ``mark(kind, name)``); None marks
            nothing.

    Returns:
        Param groups whose comms were wrapped; 0 without a clock or FSDP2's private comm API.
    """
    if clock is None:
        return 0
    try:
        from torch.distributed.fsdp import FSDPModule
        from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather, ReduceScatter
    except ImportError:
        return 0
    from laggard.integrations.fsdp_device import stall_marked

    def stalled_class(base: type, name: str) -> type:
        """A subclass of FSDP2's comm ``base`` whose calls are device stalls."""

        class Stalled(base):  # type: ignore[misc,valid-type]
            def __init__(self, inner: Any) -> None:
                self.inner = inner
                self.call = stall_marked(inner, clock, name)

            def allocate(self, *args: Any, **kwargs: Any) -> Any:
                return self.inner.allocate(*args, **kwargs)

            def __call__(self, *args: Any, **kwargs: Any) -> Any:
                return self.call(*args, **kwargs)

        return Stalled

    StalledAllGather = stalled_class(AllGather, "all_gather")
    StalledReduceScatter = stalled_class(ReduceScatter, "reduce_scatter")
    count = 0
    for module in model.modules():
        if not isinstance(module, FSDPModule):
            continue
        for group in module._get_fsdp_state()._fsdp_param_groups:
            module.set_custom_all_gather(StalledAllGather(group._all_gather_comm))
            module.set_custom_reduce_scatter(StalledReduceScatter(group._reduce_scatter_comm))
            count += 1
    return count


__all__ = ["mark_stalls", "shard"]
