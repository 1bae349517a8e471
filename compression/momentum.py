"""``momentum=True``: 1-bit Adam's recipe with another compressor (``topk``, ``powersgd``, ...).

1-bit Adam's argument (Tang et al., ICML 2021, §3-4) is not about the sign: once Adam's variance
is frozen after a warm-up, the update is linear in the momentum, so the momentum can go through
any error-compensated compressor and the optimizer sees a compressed all-reduce of a quantity
that changes slowly. Error feedback on *raw gradients* with AdamW fares worse: each coordinate's
gradient arrives in bursts (top-k sends it every ~1/ratio steps, with what accumulated), which
inflates AdamW's variance and shrinks its steps.

:class:`MomentumCompression` wraps a compressor's hook state: for the first ``warmup_steps`` it
all-reduces gradients uncompressed (its optimizer is then AdamW); after that it writes each
rank's local momentum ``beta1 m + (1 - beta1) g`` into the bucket in place of the gradient and
lets the wrapped compressor (its own error feedback, collectives, bytes and integrity
fingerprints unchanged) average it; :class:`.onebit_adam.OneBitAdam` takes the result as its
momentum. A result that is not finite (the wrapped compressor's NaN
flag) makes the optimizer skip that step on every rank. Off the CPU that decision is a 0-d device
flag handed to :meth:`OneBitAdam.flag_nonfinite`, read once per step by the optimizer, so the
hook's callback reads nothing to the host.

With ``preconditioned=True`` (the default) the compressor sees the update the optimizer will
apply, ``u_i = m_i / (sqrt(v_hat) + eps)``, not the raw momentum: the frozen denominator is the
same on every rank, so the mean of the ``u_i`` times it is the mean momentum, and the
compressor's error (top-k's dropped entries, PowerSGD's rank-r remainder) is measured in the
units of the step. Top-k then sends the coordinates whose *update* is largest, not those whose
gradient scale is (``benchmarks/RESULTS.md``: topk +9.5% against +9.8%, powersgd +10.1%
against +12.2% loss after 300 demo steps).

Each rank's momentum is built from the shared, compressed momentum of the previous step, as in
1-bit Adam. Keeping each rank's own full momentum instead (Deep Gradient Compression's momentum
correction) was tried and trailed further on the demo model (``benchmarks/RESULTS.md``).
"""

from __future__ import annotations

from typing import Any

import torch

from laggard.compression.base import CompressionState, all_finite
from laggard.compression.onebit_adam import OneBitAdam
from laggard.compression.residuals import BucketLayout
from laggard.integrations.comm_timing import first_tensor
from laggard.integrations.device_reads import finite_flag, on_host


class MomentumCompression(CompressionState):
    """A compressor applied to Adam's momentum after a warm-up (module docstring).

    Args:
        inner: the compressor's hook state (built with ``warmup_steps=0``).
        model: the module DDP wraps; its trainable parameters are the optimizer's.
        warmup_steps: AdamW steps before the variance is frozen, >= 1.
        lr, betas, eps, weight_decay: the optimizer's, as for ``torch.optim.AdamW``.
        preconditioned: compress ``m / (sqrt(v_hat) + eps)`` instead of ``m`` (module
            docstring); default True.

    Raises:
        ValueError: no ``model`` or ``warmup_steps`` below 1.

    Attributes:
        optimizer: the :class:`OneBitAdam` to step instead of your own.
        inner: the wrapped compressor; its ``timer`` is this state's.
    """

    def __init__(self, inner: CompressionState, *, model: torch.nn.Module | None,
                 warmup_steps: int = 100, lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2, preconditioned: bool = True) -> None:
        if model is None:
            raise ValueError(f"{inner.name} with momentum=True needs model=: its optimizer "
                             "updates that model")
        if not isinstance(warmup_steps, int) or warmup_steps < 1:
            raise ValueError(f"momentum=True needs warmup_steps >= 1 (the variance it freezes "
                             f"comes from the warm-up), got {warmup_steps!r}")
        self.name = inner.name  # type: ignore[misc]  # checkpoints name the compressor
        super().__init__(inner.process_group, model=model, timer=inner.timer)
        self.inner = inner
        self.optimizer = OneBitAdam([p for p in model.parameters() if p.requires_grad], lr=lr,
                                    betas=betas, eps=eps, weight_decay=weight_decay,
                                    freeze_step=warmup_steps)
        self.preconditioned = preconditioned
        self._finite: dict[int, torch.Tensor] = {}

    def communicate(self, bucket) -> torch.futures.Future:  # type: ignore[no-untyped-def]
        """Write this rank's (preconditioned) momentum into the bucket, let the wrapped
        compressor average it; a future of the averaged momentum. Before the freeze, the plain
        fp32 all-reduce of the gradients."""
        if not self.optimizer.frozen:
            return self.inner.plain_allreduce(bucket)
        buffer, beta1 = bucket.buffer(), self.optimizer.param_groups[0]["betas"][0]
        slices = list(BucketLayout.of(bucket).slices())
        for p, start, end in slices:
            state = self.optimizer.state[p]
            local = buffer[start:end].mul_(1 - beta1)
            if "exp_avg" in state:
                local.add_(state["exp_avg"].view(-1), alpha=beta1)
            if self.preconditioned and "exp_avg_sq" in state:
                local.div_(self.optimizer.frozen_denominator(p).view(-1))  # inf: dead, 0
        optimizer, scales = self.optimizer, self._scales

        def checked(fut: torch.futures.Future) -> torch.Tensor:
            result = first_tensor(fut)
            if not on_host(result):  # the same, decided on the device
                finite = finite_flag(result)
                optimizer.flag_nonfinite(~finite)
                if self.preconditioned:
                    for p, start, end in slices:
                        if "exp_avg_sq" in optimizer.state[p]:
                            result[start:end].mul_(torch.where(finite, scales(p), 1.0))
                return result
            if not all_finite(result):  # the compressor's NaN flag: skip the step everywhere
                optimizer.skip_next = True
            elif self.preconditioned:  # back from the update to the momentum
                for p, start, end in slices:
                    if "exp_avg_sq" in optimizer.state[p]:
                        result[start:end].mul_(scales(p))
            return result

        return self.inner.communicate(bucket).then(checked)

    @property
    def nonfinite_buckets(self) -> int:
        """Buckets whose momentum held NaN/Inf on this rank (the wrapped compressor's count)."""
        return int(getattr(self.inner, "nonfinite_buckets", 0))

    @property
    def nonfinite_steps(self) -> int:
        """Optimizer steps skipped on every rank for a result that was not finite."""
        return self.optimizer.nonfinite_steps

    def _scales(self, p: torch.Tensor) -> torch.Tensor:
        """The frozen ``sqrt(v_hat) + eps`` of ``p``, flat, with 0 where it is ``inf``."""
        scale = self._finite.get(id(p))
        if scale is None:
            scale = self.optimizer.frozen_denominator(p).view(-1).clone()
            scale.masked_fill_(scale.isinf(), 0)  # no boolean-mask indexing (a host wait)
            self._finite[id(p)] = scale
        return scale

    def state_dict(self) -> dict[str, Any]:
        """The wrapped compressor's state (per rank) and the optimizer's."""
        return {**self.inner.state_dict(), "momentum": True,
                "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output.

        Raises:
            ValueError: a checkpoint without the optimizer (taken with ``momentum=False``), or
                one the wrapped compressor refuses.
        """
        if state.get("compressor") != self.name:
            raise ValueError(f"checkpoint of compressor {state.get('compressor')!r}, this hook "
                             f"is {self.name!r} with momentum=True")
        if not state.get("momentum"):
            raise ValueError("checkpoint taken without momentum=True: no optimizer state")
        self.inner.takes_momentum = True  # type: ignore[attr-defined]
        try:
            self.inner.load_state_dict(state)
        finally:
            self.inner.takes_momentum = False  # type: ignore[attr-defined]
        self.optimizer.load_state_dict(state["optimizer"])

    def close(self) -> None:
        """Close the wrapped compressor (collective for two-stage ones)."""
        self.inner.close()


__all__ = ["MomentumCompression"]
