"""FSDP2's all-gather and reduce-scatter, timed for a
:class:`~laggard.integrations.tracer.CollectiveTracer` (any backend).

:func:`instrument_fsdp` is the entry point (also importable from
:mod:`laggard.integrations.trace_sources` and :mod:`laggard.integrations`); which source times
what on which backend is in :mod:`laggard.integrations.trace_sources`'s table.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from laggard.integrations.collective_bytes import tensor_bytes
from laggard.integrations.trace_ops import wire_bytes

if TYPE_CHECKING:
    from laggard.integrations.tracer import CollectiveTracer


def instrument_fsdp(model: Any, tracer: CollectiveTracer) -> int:
    """Time every all-gather and reduce-scatter of an FSDP2 model (``fully_shard``).

    Wraps each FSDP module's current all-gather and reduce-scatter comms (the defaults, or your
    own set before) with timed ones through ``FSDPModule.set_custom_all_gather`` /
    ``set_custom_reduce_scatter``; the wrapped comm does the same collective, so training is
    unchanged. Call after ``fully_shard`` and before the first step.

    CPU tensors (gloo): timed around the call on the CPU clock (FSDP2 on gloo blocks the
    training thread in the call). CUDA tensors: FSDP2 makes the call inside its all-gather
    (reduce-scatter) stream context and it returns at enqueue, so the CPU clock would time the
    launch; instead pooled timing events are recorded on that current stream before and after
    the call (an async ``Work``: at issue and in its future's ``then()`` callback) and read
    without blocking at a later ``tracer.take_step()`` (:meth:`CollectiveTracer.timed`,
    :meth:`CollectiveTracer.track`): the collective's device time on the stream it ran on.

    Args:
        model: the root module; every ``FSDPModule`` in ``model.modules()`` is instrumented.
        tracer: where the timings go.

    Returns:
        FSDP modules instrumented; 0 when this torch has no FSDP2 custom-comm API (its module
        ``torch.distributed.fsdp._fully_shard`` is private; counted in ``tracer.stats`` and
        logged once) or the model has no FSDP module.
    """
    try:
        from torch.distributed.fsdp import FSDPModule
        from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather, ReduceScatter
    except ImportError as exc:
        tracer._count("errors", "fsdp_import", "laggard: FSDP2 custom comms unavailable in this "
                      "torch (%r); FSDP collectives not traced", exc)
        return 0
    timed_ag, timed_rs = _timed_comm_classes(AllGather, ReduceScatter)
    count = 0
    for module in model.modules():
        if not isinstance(module, FSDPModule):
            continue
        try:
            state = module._get_fsdp_state()
            for pg in state._fsdp_param_groups:
                if not isinstance(pg._all_gather_comm, timed_ag):
                    module.set_custom_all_gather(timed_ag(pg._all_gather_comm, tracer))
                if not isinstance(pg._reduce_scatter_comm, timed_rs):
                    module.set_custom_reduce_scatter(timed_rs(pg._reduce_scatter_comm, tracer))
            count += 1
        except Exception as exc:  # noqa: BLE001 - leave the module untraced, train on
            tracer._count("errors", "fsdp_instrument", "laggard: cannot instrument an FSDP "
                          "module (%r); its collectives are not traced", exc)
    return count


def _timed_comm_classes(all_gather_base: type, reduce_scatter_base: type) -> tuple[type, type]:
    """Subclasses of FSDP2's AllGather / ReduceScatter that time a wrapped comm."""

    class TimedAllGather(all_gather_base):  # type: ignore[misc,valid-type]
        def __init__(self, inner: Any, tracer: CollectiveTracer) -> None:
            self.inner, self.tracer = inner, tracer

        def allocate(self, *args: Any, **kwargs: Any) -> Any:
            return self.inner.allocate(*args, **kwargs)

        def __call__(self, output_tensor: Any, input_tensor: Any, group: Any,
                     async_op: bool = False) -> Any:
            nbytes = wire_bytes("allgather", tensor_bytes(input_tensor), group.size())
            if async_op:
                work = self.inner(output_tensor, input_tensor, group, async_op)
                return self.tracer.track(work, "allgather", group, nbytes, tensor=input_tensor)
            with self.tracer.timed("allgather", group, nbytes, tensor=input_tensor):
                return self.inner(output_tensor, input_tensor, group, async_op)

    class TimedReduceScatter(reduce_scatter_base):  # type: ignore[misc,valid-type]
        def __init__(self, inner: Any, tracer: CollectiveTracer) -> None:
            self.inner, self.tracer = inner, tracer

        def allocate(self, *args: Any, **kwargs: Any) -> Any:
            return self.inner.allocate(*args, **kwargs)

        def __call__(self, output_tensor: Any, input_tensor: Any, group: Any, op: Any,
                     async_op: bool = False) -> Any:
            nbytes = wire_bytes("reduce_scatter", tensor_bytes(input_tensor), group.size())
            if async_op:
                work = self.inner(output_tensor, input_tensor, group, op, async_op)
                return self.tracer.track(work, "reduce_scatter", group, nbytes,
                                         tensor=input_tensor)
            with self.tracer.timed("reduce_scatter", group, nbytes, tensor=input_tensor):
                return self.inner(output_tensor, input_tensor, group, op, async_op)

    return TimedAllGather, TimedReduceScatter


__all__ = ["instrument_fsdp"]
