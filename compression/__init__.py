"""Compressed, overlapped gradient communication: DDP communication hooks with error feedback.

Each compressor is a hook state class; one function, :func:`make_hook`, checks the request and
builds ``(state, hook)`` for ``DistributedDataParallel.register_comm_hook``::

    from laggard.compression import make_hook

    state, hook = make_hook("sign", model=ddp.module, timer=timer)
    ddp.register_comm_hook(state, hook)
    ...                                  # train; timer.take_step() per step
    torch.save(state.state_dict(), f"compression-rank{rank}.pt")   # residuals are per rank
    state.close()                        # every rank, before destroy_process_group()

===========  ==========================================================  ========================
name         what crosses the wire                                       bytes per rank, N fp32
===========  ==========================================================  ========================
none         fp32 ring all-reduce                                        2 (W-1)/W * 4N
fp16         fp16 ring all-reduce (torch's ``fp16_compress_hook``)       2 (W-1)/W * 2N
sign         signs, 1 bit each, all-to-all then all-gather (1-bit Adam)  2 (W-1)/W * N/8 + scales
topk         k values + int32 indices: all-gather (W <= 2), else sparse  (W-1) * 8k, or
             reduce-scatter + all-gather with re-selection (Ok-Topk)     2 (W-1)/W * 8k
powersgd     rank-r factors P, Q, two all-reduces (PowerSGD)             2 (W-1)/W * 4 r (n+m)
onebit_adam  Adam's momentum after a warm-up, 1 bit each, as ``sign``    2 (W-1)/W * N/8 + scales
===========  ==========================================================  ========================

Every hook returns its future without blocking the autograd thread (the second stage of
``sign``, ``powersgd``, ``onebit_adam`` and top-k's reduce-scatter runs on a worker thread),
times each collective and counts the bytes it sends through a
:class:`~laggard.integrations.comm_timing.CommTimer`, and keeps error-feedback residuals per
parameter, so they survive DDP's bucket rebuild after the first iteration and a ``state_dict`` /
``load_state_dict`` round trip.

This package was ``laggard.integrations.compression`` (that path is gone). It builds on the
training side (the timer of :mod:`laggard.integrations.comm_timing`, the byte accounting of
:mod:`laggard.integrations.collective_bytes`); nothing in ``laggard.integrations`` imports it
back (``.importlinter``).
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

from laggard.compression.base import (
    CompressionState,
    compression_hook,
    resolve_group,
)
from laggard.compression.fp16 import Fp16Compression
from laggard.compression.momentum import MomentumCompression
from laggard.compression.none import NoCompression
from laggard.compression.onebit_adam import OneBitAdam, OneBitAdamCompression
from laggard.compression.powersgd import PowerSGDCompression
from laggard.compression.sign import SignCompression
from laggard.compression.topk import TopKCompression

#: Compressor name -> hook state class.
COMPRESSORS: dict[str, type[CompressionState]] = {
    cls.name: cls
    for cls in (NoCompression, Fp16Compression, SignCompression, TopKCompression,
                PowerSGDCompression, OneBitAdamCompression)
}

_COMMON_OPTIONS = {"model", "timer", "integrity", "warmup_steps"}
_ADAM = {"lr", "betas", "eps", "weight_decay"}
_MOMENTUM = _ADAM | {"preconditioned"}
_OPTIONS = {"topk": {"ratio", "seed", "algorithm"}, "powersgd": {"rank", "seed"},
            "onebit_adam": _ADAM}
#: Compressors that can take Adam's momentum instead of the gradient (``momentum=True``).
MOMENTUM = ("sign", "topk", "powersgd")


def make_hook(
    name: str, process_group: dist.ProcessGroup | None = None, **options: Any,
) -> tuple[CompressionState, Any]:
    """Build a compression hook and its state, checking everything that can be checked now.

    Collective for ``sign`` and ``powersgd`` (they create a second process group): call it on
    every rank, in the same order.

    Args:
        name: one of :data:`COMPRESSORS` (``none``, ``fp16``, ``sign``, ``topk``, ``powersgd``,
            ``onebit_adam``).
        process_group: group to reduce over; None for the default group.
        **options: ``model`` (the module DDP wraps, to name residuals in checkpoints),
            ``timer`` (a CommTimer to record into), ``warmup_steps`` (plain all-reduce steps
            before compressing, default 0), ``integrity`` (a GradientIntegrity), and per
            compressor ``ratio`` (topk, in (0, 1], default 0.01), ``algorithm`` (topk:
            ``auto``, ``allgather``, ``scatter``), ``rank`` (powersgd, >= 1, default 4),
            ``seed``; ``onebit_adam`` takes ``model`` (required), ``warmup_steps`` (default
            100) and AdamW's ``lr``, ``betas``, ``eps``, ``weight_decay``. ``momentum=True``
            (sign, topk, powersgd) applies the compressor to Adam's momentum after
            ``warmup_steps`` of AdamW, as 1-bit Adam does (:mod:`.momentum`); the state then
            has the optimizer as ``.optimizer`` and takes AdamW's options and
            ``preconditioned`` (default True: the compressor sees ``m / (sqrt(v_hat) + eps)``).

    Returns:
        ``(state, hook)`` for ``ddp.register_comm_hook(state, hook)``.

    Raises:
        ValueError: unknown compressor or option, an option out of range, torch.distributed not
            initialised, this rank outside ``process_group``, or a backend other than gloo/NCCL.
    """
    cls = COMPRESSORS.get(name)
    if cls is None:
        raise ValueError(f"unknown compressor {name!r}; choose one of {', '.join(COMPRESSORS)}")
    momentum = options.pop("momentum", False)
    if not isinstance(momentum, bool):
        raise ValueError(f"momentum must be True or False, got {momentum!r}")
    allowed = _COMMON_OPTIONS | _OPTIONS.get(name, set()) | (_MOMENTUM if momentum else set())
    unknown = set(options) - allowed
    if unknown:
        hint = " (AdamW's options need momentum=True)" if unknown & _ADAM else ""
        raise ValueError(f"compressor {name!r} takes no option {', '.join(sorted(unknown))}"
                         f"{hint}")
    _check_adam(options)
    if momentum and name not in MOMENTUM:
        raise ValueError(f"momentum=True works with {', '.join(MOMENTUM)}, not {name!r}")
    if momentum:
        adam = {key: options.pop(key) for key in (*_MOMENTUM, "warmup_steps") if key in options}
        model = options.get("model")
        if model is None:
            raise ValueError(f"{name} with momentum=True needs model=: its optimizer updates "
                             "that model")
        inner = cls(resolve_group(process_group), **options)
        return MomentumCompression(inner, **adam, model=model), compression_hook
    group = resolve_group(process_group)
    return cls(group, **options), compression_hook


def _check_adam(options: dict[str, Any]) -> None:
    """AdamW's options, checked before torch's own checks (which raise IndexError/TypeError)."""
    betas = options.get("betas")
    if betas is not None and not (
            isinstance(betas, (tuple, list)) and len(betas) == 2
            and all(isinstance(b, (int, float)) and 0 <= b < 1 for b in betas)):
        raise ValueError(f"betas must be two numbers in [0, 1), got {betas!r}")
    for key in ("lr", "eps", "weight_decay"):
        value = options.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not value >= 0):
            raise ValueError(f"{key} must be a number >= 0, got {value!r}")


__all__ = ["COMPRESSORS", "CompressionState", "MomentumCompression", "OneBitAdam",
           "compression_hook", "make_hook"]
