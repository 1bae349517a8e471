"""What every compression hook state shares: its process group, timer, parameter names, checkpoint.

A state is the ``state`` argument of ``DistributedDataParallel.register_comm_hook(state, hook)``;
the hook itself is the one function :func:`compression_hook`, which calls the state's
``communicate(bucket)``.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import torch
import torch.distributed as dist

from laggard.compression.residuals import ErrorFeedback, ServerResiduals
from laggard.integrations.collective_bytes import (
    alltoall_bytes,
    ring_allreduce_bytes,
    tensor_bytes,
)
from laggard.integrations.comm_timing import CommTimer, first_tensor

_BACKENDS = {"gloo", "nccl"}


def resolve_group(process_group: dist.ProcessGroup | None) -> dist.ProcessGroup:
    """The group a hook will reduce over, checked for what the hooks can serve.

    Raises:
        ValueError: torch.distributed is not initialised, this rank is not in the group, or the
            group's backend is neither gloo nor NCCL (the two the hooks are built and tested for).
    """
    if not dist.is_available() or not dist.is_initialized():
        raise ValueError("torch.distributed is not initialised: call init_process_group() first")
    group = process_group if process_group is not None else dist.group.WORLD
    if group is None or group is dist.GroupMember.NON_GROUP_MEMBER:
        raise ValueError("this rank is not a member of the process group")
    backend = str(dist.get_backend(group))
    # a device-mixed group names each device's backend: "cpu:gloo,cuda:nccl"
    names = {part.split(":")[-1] for part in backend.split(",")}
    if not names <= _BACKENDS:
        raise ValueError(f"backend {backend!r} is not supported: compression hooks run on gloo "
                         "or nccl")
    return group


def module_parameters(model: torch.nn.Module | None) -> dict[str, torch.Tensor]:
    """Name -> parameter of ``model``, without DDP's ``module.`` prefix (so a checkpoint loads
    whether it was taken through the DDP wrapper or the bare module)."""
    if model is None:
        return {}
    return {name.removeprefix("module."): p for name, p in model.named_parameters()}


class CompressionState:
    """Base class of the hook states.

    Args:
        process_group: resolved group (see :func:`resolve_group`).
        model: the module DDP wraps (or the DDP wrapper); only needed to name residuals in
            :meth:`state_dict`.
        timer: CommTimer to record into; a fresh one when None.
        integrity: a ``GradientIntegrity`` the hooks hand their exact payloads to before
            sending and after receiving (gradient-integrity checks); None for none.
        warmup_steps: steps run with the plain fp32 all-reduce before compressing (torch's
            ``start_powerSGD_iter``, 1-bit Adam's warm-up stage: early gradients change fast
            and adaptive optimizers settle their statistics on exact ones); default 0.

    Attributes:
        process_group, world_size, rank: the group and this rank's place in it.
        timer: the CommTimer every collective of this hook is tracked by.
    """

    name: ClassVar[str] = ""

    def __init__(
        self,
        process_group: dist.ProcessGroup,
        *,
        model: torch.nn.Module | None = None,
        timer: CommTimer | None = None,
        integrity: Any = None,
        warmup_steps: int = 0,
    ) -> None:
        if not isinstance(warmup_steps, int) or warmup_steps < 0:
            raise ValueError(f"warmup_steps must be an integer >= 0, got {warmup_steps!r}")
        if model is not None and not isinstance(model, torch.nn.Module):
            raise ValueError(f"model must be the torch.nn.Module DDP wraps, got "
                             f"{type(model).__name__}")
        if timer is not None and not isinstance(timer, CommTimer):
            raise ValueError(f"timer must be a laggard CommTimer, got {type(timer).__name__}")
        self.process_group = process_group
        self.warmup_steps = warmup_steps
        #: steps whose last bucket went through this hook
        self.steps = 0
        # laggard.integrations.integrity.GradientIntegrity: fingerprints each exact payload
        self.integrity = integrity
        self.world_size = process_group.size()
        self.rank = dist.get_rank(process_group)
        self.timer = timer if timer is not None else CommTimer(process_group)
        self._params = module_parameters(model)
        self._names = {id(p): name for name, p in self._params.items()}

    def communicate(self, bucket) -> torch.futures.Future:  # type: ignore[no-untyped-def]
        """Launch this bucket's collectives; return a future of the averaged buffer."""
        raise NotImplementedError

    def plain_allreduce(self, bucket) -> torch.futures.Future:  # type: ignore[no-untyped-def]
        """All-reduce the bucket as DDP does without a hook (divide by the world size, then
        sum), timed and counted: the ``none`` hook, and every hook's warm-up."""
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

    def start_alltoall(self, index: int, payload: torch.Tensor,
                       raw_bytes: int) -> tuple[torch.Tensor, torch.futures.Future]:
        """The first stage of a two-stage hook: row ``j`` of ``payload`` (``(W, ...)``) to rank
        ``j``, fingerprinted when integrity checks are on, timed and counted (each rank sends
        ``W - 1`` rows); returns the receive buffer and the tracked future."""
        received = torch.empty_like(payload)
        if self.integrity is not None:
            self.integrity.alltoall_sent(index, payload)
        fut = dist.all_to_all_single(received, payload, group=self.process_group,
                                     async_op=True).get_future()
        fut = self.timer.track(fut, alltoall_bytes(tensor_bytes(payload[0]), self.world_size),
                               "alltoall", raw_bytes=raw_bytes, bucket_ready=False)
        return received, fut

    def raw_bytes(self, buffer: torch.Tensor) -> int:
        """What an fp32 ring all-reduce of ``buffer`` would send from this rank (the baseline)."""
        return ring_allreduce_bytes(buffer.numel() * 4, self.world_size)

    def state_dict(self) -> dict[str, Any]:
        """This rank's compressor state (residuals differ per rank: save one per rank)."""
        return {"compressor": self.name}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned.

        Raises:
            ValueError: the checkpoint is another compressor's, was taken with ``momentum=True``
            by a hook without it, or does not fit the model.
        """
        if state.get("compressor") != self.name:
            raise ValueError(f"checkpoint of compressor {state.get('compressor')!r}, this hook "
                             f"is {self.name!r}")
        if state.get("momentum") and not getattr(self, "takes_momentum", False):
            raise ValueError("checkpoint taken with momentum=True (it holds the optimizer): "
                             "load it into make_hook(..., momentum=True)")

    def _require_names(self) -> None:
        if not self._params:
            raise ValueError(f"{self.name}: pass model= to make_hook to checkpoint its state")

    def close(self) -> None:
        """Release threads and groups (collective for two-stage hooks); idempotent."""


class ServerFeedbackState(CompressionState):
    """A hook state with error feedback on both stages of a two-stage all-reduce (``sign``,
    ``topk``): per-parameter worker residuals and a server residual per bucket, checkpointed
    together.

    Args:
        process_group, **kwargs: see :class:`CompressionState`.

    Attributes:
        server: this rank's :class:`~laggard.compression.residuals.ServerResiduals`.
        residuals: the worker :class:`~laggard.compression.residuals.ErrorFeedback`; a bucket
            rebuild folds the server residual into it (``on_evict``).
    """

    def __init__(self, process_group: dist.ProcessGroup, **kwargs: Any) -> None:
        super().__init__(process_group, **kwargs)
        self.server = ServerResiduals(self.rank, self.world_size)
        self.residuals = ErrorFeedback(on_evict=self.server.fold)

    def state_dict(self) -> dict[str, Any]:
        """Residuals per parameter name (1-D float32 each), the server residual folded in as on
        a bucket rebuild, so the checkpoint does not depend on DDP's bucket layout.

        Raises:
            ValueError: the hook was made without ``model=`` (no names to key residuals by).
        """
        self._require_names()
        state = super().state_dict()
        state["residuals"] = self.residuals.export(self._names, self.server.folded())
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s residuals; the server residuals start from zero (what
        they held is in the worker residuals).

        Raises:
            ValueError: another compressor's checkpoint, no ``model=``, or residuals that do not
                fit the model's parameters.
        """
        super().load_state_dict(state)
        self._require_names()
        self.residuals.load(state["residuals"], self._params)
        self.server.clear()


# Unannotated on purpose: DDP's register_comm_hook compares the annotations with
# dist.GradBucket and Future[Tensor] by identity (see laggard.integrations.comm_timing).
def compression_hook(state: CompressionState, bucket):  # type: ignore[no-untyped-def]
    """The DDP communication hook of every compressor: ``state.communicate(bucket)``, or the
    plain fp32 all-reduce during the first ``state.warmup_steps`` steps.

    Args:
        state: a :class:`CompressionState` made by ``make_hook``.
        bucket: DDP's ``GradBucket``; its flat ``buffer()`` holds this rank's gradients.

    Returns:
        A ``torch.futures.Future`` holding the averaged (decompressed) bucket buffer.
    """
    if state.steps < state.warmup_steps:
        fut = state.plain_allreduce(bucket)
    else:
        fut = state.communicate(bucket)
    if bucket.is_last():
        state.steps += 1
    return fut


def all_finite(tensor: torch.Tensor) -> bool:
    """True when no element is NaN or Inf, in one read (a float32 sum; an overflowing sum of
    finite values, beyond 3e38, also reads as not finite: such gradients are as unusable)."""
    if tensor.device.type == "cpu" and tensor.dtype == torch.float32:
        return bool(np.isfinite(np.add.reduce(tensor.detach().numpy(), axis=None,
                                              dtype=np.float32)))
    return bool(torch.isfinite(tensor.sum()))
