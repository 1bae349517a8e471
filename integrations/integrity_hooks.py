"""The DDP communication-hook wrappers of gradient integrity: :func:`integrity_allreduce_hook`
(the averaging all-reduce, as DDP's default, with every check) and :func:`with_integrity` (any
hook, a compressor of :func:`laggard.compression.make_hook` among them, with the result-hash and
NaN/Inf checks), both with :class:`IntegrityHookState`. They hand what they see to a
:class:`~laggard.integrations.integrity.GradientIntegrity`, which records and checks it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from laggard.integrations.comm_timing import first_tensor
from laggard.integrations.device_reads import on_host
from laggard.integrations.integrity_fingerprints import nonfinite_count_tensor, nonfinite_counts

if TYPE_CHECKING:
    from laggard.integrations.comm_timing import CommTimer
    from laggard.integrations.integrity import GradientIntegrity


@dataclass(slots=True)
class IntegrityHookState:
    """State of :func:`integrity_allreduce_hook` and of hooks made by :func:`with_integrity`.

    Attributes:
        integrity: the recorder.
        inner: the wrapped hook's own state (``with_integrity`` only).
        timer: a CommTimer to time the plain all-reduce with (optional).
        process_group: group of the plain all-reduce (None: WORLD).
    """

    integrity: GradientIntegrity
    inner: Any = None
    timer: CommTimer | None = None
    process_group: dist.ProcessGroup | None = None


# Hooks are left unannotated: DDP compares annotations with dist.GradBucket by identity.
def integrity_allreduce_hook(state: IntegrityHookState, bucket):  # type: ignore[no-untyped-def]
    """DDP communication hook: averaging all-reduce (as DDP's default) with every check.

    Divides the bucket by the world size, fingerprints it (float64 sums, NaN/Inf), all-reduces
    it, and fingerprints the result (hash, float64 sum, NaN/Inf).

    Args:
        state: :class:`IntegrityHookState`.
        bucket: DDP's ``GradBucket``; its ``buffer()`` is reduced in place.

    Returns:
        A future of the averaged bucket buffer.
    """
    integrity, index = state.integrity, bucket.index()
    group = state.process_group if state.process_group is not None else dist.group.WORLD
    assert group is not None  # WORLD: DDP runs only once the default group is initialised
    buffer = bucket.buffer()
    buffer.div_(group.size())
    integrity.allreduce_sent(index, buffer)
    fut = dist.all_reduce(buffer, group=group, async_op=True).get_future()
    if state.timer is not None:
        fut = state.timer.track(fut, buffer.numel() * buffer.element_size())

    def received(done: torch.futures.Future) -> torch.Tensor:
        result = first_tensor(done)
        integrity.inject("after_reduce", index, result)
        integrity.allreduce_received(index, result)
        return result

    return fut.then(received)


def with_integrity(hook: Callable[[Any, Any], torch.futures.Future]) -> Callable[..., Any]:
    """Wrap any DDP communication hook with the result-hash and NaN/Inf checks.

    The wrapped hook's state is :class:`IntegrityHookState` with ``inner`` = the hook's own
    state. Before the hook, the local gradients' NaN/Inf are counted; after it, an
    ``after_reduce`` fault is applied if due, then the result is hashed: every rank must hold
    the same averaged bucket, whatever the compressor, so a rank whose result differs is named.

    Returns:
        A hook for ``DistributedDataParallel.register_comm_hook``.
    """

    def integrity_hook(state: IntegrityHookState, bucket):  # type: ignore[no-untyped-def]
        integrity, index = state.integrity, bucket.index()
        buffer = bucket.buffer()
        local = nonfinite_counts(buffer) if on_host(buffer) else nonfinite_count_tensor(buffer)
        fut = hook(state.inner, bucket)

        def finished(done: torch.futures.Future) -> torch.Tensor:
            result = first_tensor(done)
            integrity.inject("after_reduce", index, result)
            integrity.result(index, result, local)
            return result

        return fut.then(finished)

    integrity_hook.__name__ = f"integrity_{getattr(hook, '__name__', 'hook')}"
    return integrity_hook


__all__ = ["IntegrityHookState", "integrity_allreduce_hook", "with_integrity"]
