"""``onebit_adam``: 1-bit Adam (Tang et al., "1-bit Adam: Communication Efficient Large-Scale
Training with Adam's Convergence Speed", ICML 2021, Algorithm 1), as an optimizer/hook pair.

1. **Warm-up** (``freeze_step`` steps): plain AdamW. Gradients are all-reduced uncompressed (the
   hook's fp32 all-reduce) and the optimizer is ``torch.optim.AdamW`` itself, so the warm-up is
   bitwise AdamW.
2. **Compression stage**: the variance ``v`` (and its bias correction) is frozen. Each rank forms
   its local momentum ``m_i = beta1 m + (1 - beta1) g_i`` from the shared momentum ``m`` of the
   previous step, and the hook all-reduces *the momentum*, not the gradient, with the compressed
   all-reduce of 1-bit Adam (§4.2; DeepSpeed's ``compressed_allreduce``) and error feedback on
   both stages:

   * worker: ``p_i = m_i + delta_i``; all-to-all of ``C(p_i)`` chunk by chunk;
     ``delta_i = p_i - C(p_i)``;
   * server (rank j, chunk j): ``q_j = mean_i C(p_i)_j + delta_bar_j``; all-gather of
     ``C(q_j)``; ``delta_bar_j = q_j - C(q_j)``;

   ``C`` is the scaled sign of :mod:`~laggard.compression.signcodec` (one scale per
   chunk). The result, the same on every rank, reaches the optimizer as the parameters'
   ``.grad``; :class:`OneBitAdam` takes it as its new momentum and steps
   ``x -= lr (m / (1 - beta1^t)) / (sqrt(v / (1 - beta2^T_w)) + eps)`` (plus AdamW's decoupled
   weight decay).

Unlike the per-bucket hooks, the momentum is compressed as one flat vector over all parameters
in ``model.parameters()`` order, at the last bucket of the step (as DeepSpeed compresses the
optimizer's flat buffer): the chunks, hence the result, do not depend on DDP's bucket layout, so
a checkpoint resumes to exactly the step an uninterrupted run takes, even though DDP rebuilds its
buckets after a restart. Bytes per rank: ``2 (W-1)/W * N/8`` plus ``16 (W-1)`` of scales.

Bad input: a rank whose momentum holds NaN or Inf sends that chunk as a NaN flag (see signcodec);
a server receiving a flag sends one on, every rank gets NaN for that chunk, and
:class:`OneBitAdam` skips the step on every rank alike (counted in ``nonfinite_steps``); every
rank's worker and server errors go back to what they were before the step. During the warm-up
the optimizer skips a step whose (all-reduced, hence shared) gradients are not finite. A
checkpoint only loads into a job of the same world size and rank (the server error is one chunk
of W): anything else is a ``ValueError``.

Off the CPU the hook reads nothing back to the host (:mod:`laggard.integrations.device_reads`):
flagged chunks keep their worker error through ``torch.where``, the server's error is copied in
(not swapped) only where its chunk was finite, and a flagged step restores both errors from their
copies on every rank alike; the skip decision travels to :class:`OneBitAdam` as a 0-d device flag,
which :meth:`OneBitAdam.step` reads once per step, after ``backward()`` (the decision to leave
the parameters alone is a host branch, as torch's ``GradScaler`` reads its ``found_inf``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as dist

from laggard.compression import kernels
from laggard.compression.base import CompressionState, all_finite
from laggard.compression.residuals import BucketLayout
from laggard.compression.signcodec import (
    accumulate_rows,
    chunk_elements,
    chunk_lengths,
    decode_rows,
    encode_rows,
    nan_row,
    scales,
)
from laggard.compression.two_stage import StageTwoWorker
from laggard.integrations.collective_bytes import (
    allgather_bytes,
    ring_allreduce_bytes,
)
from laggard.integrations.device_reads import finite_flag, on_host


class OneBitAdam(torch.optim.AdamW):
    """AdamW for ``freeze_step`` steps, then Adam with frozen variance on a given momentum.

    After the freeze, each parameter's ``.grad`` must hold the new momentum (what the
    ``onebit_adam`` hook writes there), not a gradient.

    Args:
        params: parameters or parameter groups, as for ``torch.optim.AdamW``.
        lr, betas, eps, weight_decay: as for ``torch.optim.AdamW`` (decoupled weight decay).
        freeze_step: steps of plain AdamW before the variance is frozen, >= 1.

    Raises:
        ValueError: ``freeze_step`` below 1 (the frozen variance comes from the warm-up).

    Attributes:
        skip_next: set by the hook when the step's momentum is not finite; the next
            :meth:`step` then leaves parameters and state alone.
        nonfinite_steps: steps skipped that way.
    """

    def __init__(self, params: Iterable[Any], lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2, *, freeze_step: int = 100) -> None:
        if not isinstance(freeze_step, int) or freeze_step < 1:
            raise ValueError(f"freeze_step must be an integer >= 1, got {freeze_step!r}")
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                         foreach=False)
        for group in self.param_groups:
            group["freeze_step"] = freeze_step
        self.skip_next = False
        self._skip_flag: torch.Tensor | None = None
        self.nonfinite_steps = 0
        self._denominators: dict[int, torch.Tensor] = {}

    def flag_nonfinite(self, flag: torch.Tensor) -> None:
        """Skip the next step if the 0-d bool device tensor ``flag`` holds (OR-ed over calls);
        read by :meth:`step`, so the hook that raises it reads nothing to the host."""
        self._skip_flag = flag if self._skip_flag is None else self._skip_flag | flag

    @property
    def steps(self) -> int:
        """Optimizer steps taken (AdamW's per-parameter ``step``, the same for all)."""
        for state in self.state.values():
            if "step" in state:
                return int(state["step"])
        return 0

    @property
    def frozen(self) -> bool:
        """True once the warm-up is over: the hook compresses the momentum from then on."""
        return self.steps >= self.param_groups[0]["freeze_step"]

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """AdamW's ``load_state_dict``; the frozen denominators are recomputed from it."""
        super().load_state_dict(state_dict)
        self._denominators.clear()

    def frozen_denominator(self, p: torch.Tensor) -> torch.Tensor:
        """``sqrt(v_hat) + eps`` of parameter ``p`` with its variance frozen: shaped like ``p``,
        its dtype, computed once (bias correction ``1 - beta2^freeze_step``, Algorithm 1 of Tang
        et al.). Coordinates that saw no gradient in the whole warm-up (``v == 0``) get ``inf``:
        ``m / eps`` would turn a compressor's ``+-scale`` into a huge step, so they are left alone.

        Raises:
            KeyError: ``p`` has no variance yet (no gradient during the warm-up).
        """
        denominator = self._denominators.get(id(p))
        if denominator is None:
            group = next(g for g in self.param_groups if any(q is p for q in g["params"]))
            correction2 = (1 - group["betas"][1] ** group["freeze_step"]) ** 0.5
            variance = self.state[p]["exp_avg_sq"]
            denominator = (variance.sqrt() / correction2).add_(group["eps"])
            denominator.masked_fill_(variance == 0, float("inf"))
            self._denominators[id(p)] = denominator
        return denominator

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        """AdamW's step during the warm-up; the frozen-variance step after it."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if self._skip_flag is not None:
            flag, self._skip_flag = self._skip_flag, None
            if bool(flag):  # the step's one host read of the shared verdict (module docstring)
                self.skip_next = True
        if self.skip_next:
            self.skip_next = False
            self.nonfinite_steps += 1
            return loss
        if not self.frozen:
            grads = [p.grad for group in self.param_groups for p in group["params"]
                     if p.grad is not None]
            finite = bool(torch.stack([finite_flag(g) for g in grads]).all()) \
                if grads and not on_host(grads[0]) else all(all_finite(g) for g in grads)
            if not finite:
                self.nonfinite_steps += 1  # the shared gradients: every rank skips alike
                return loss
            super().step()
            return loss
        for group in self.param_groups:
            beta1 = group["betas"][0]
            lr, decay = group["lr"], group["weight_decay"]
            for p in group["params"]:
                state = self.state[p]
                if p.grad is None or "exp_avg_sq" not in state:
                    continue  # no gradient during the warm-up: no variance to freeze
                state["step"] += 1
                state["exp_avg"].copy_(p.grad)
                denominator = self.frozen_denominator(p)
                if decay != 0:
                    p.mul_(1 - lr * decay)
                p.addcdiv_(state["exp_avg"], denominator,
                           value=-lr / (1 - beta1 ** float(state["step"])))
        return loss


class OneBitAdamCompression(CompressionState):
    """The hook half of 1-bit Adam; builds and owns its :class:`OneBitAdam` (``.optimizer``).

    Args:
        process_group, timer, integrity: see :class:`CompressionState`.
        model: the module DDP wraps (required: the optimizer updates its parameters).
        warmup_steps: AdamW steps before the variance is frozen (``freeze_step``), >= 1;
            default 100.
        lr, betas, eps, weight_decay: the optimizer's, as for ``torch.optim.AdamW``.

    Raises:
        ValueError: no ``model``, or ``warmup_steps`` below 1.

    Creating it is collective (it makes a second process group); call :meth:`close` on every rank
    after the last step.
    """

    name = "onebit_adam"

    def __init__(self, process_group: dist.ProcessGroup, *, model: torch.nn.Module | None = None,
                 warmup_steps: int = 100, lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2, **kwargs: Any) -> None:
        if model is None:
            raise ValueError("onebit_adam needs model=: its optimizer updates that model")
        if not isinstance(warmup_steps, int) or warmup_steps < 1:
            raise ValueError(f"onebit_adam needs warmup_steps >= 1 (the variance it freezes "
                             f"comes from the warm-up), got {warmup_steps!r}")
        super().__init__(process_group, model=model, **kwargs)
        params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = OneBitAdam(params, lr=lr, betas=betas, eps=eps,
                                    weight_decay=weight_decay, freeze_step=warmup_steps)
        self._order = params
        self._offsets, total = {}, 0
        for p in params:
            self._offsets[id(p)] = total
            total += p.numel()
        self.numel = total
        w = self.world_size
        self.chunk = chunk_elements(total, w)
        device = params[0].device if params else None
        self._lengths = chunk_lengths(total, w, device)
        zeros = [torch.zeros(w * self.chunk, device=device) for _ in range(3)]
        self._error, self._work, self._momentum = zeros
        self._server = torch.zeros(self.chunk, device=device)
        self._server_work = torch.zeros_like(self._server)
        self._server_before = self._server  # the device path's copy of the last server error
        self._server_swapped = False
        kernels.warm_up()
        self._pending: list[tuple[torch.Tensor, BucketLayout, torch.futures.Future]] = []
        self._covered = 0
        self._first_index = 0
        self._worker = StageTwoWorker(process_group)

    @property
    def nonfinite_steps(self) -> int:
        """Optimizer steps skipped on every rank for a result (or, in the warm-up, gradients)
        that was not finite: counted by :class:`OneBitAdam` when it skips them."""
        return self.optimizer.nonfinite_steps

    def communicate(self, bucket) -> torch.futures.Future:  # type: ignore[no-untyped-def]
        """Stage this bucket's local momentum; at the step's last bucket, compress the whole
        flat momentum (one all-to-all, then the all-gather on the worker thread) and complete
        every bucket's future with its slice of the averaged momentum. Before the freeze, the
        plain fp32 all-reduce.

        Raises:
            ValueError: (in the future) a bucket holds another model's parameter, or the step's
                buckets do not cover the model (unused parameters).
        """
        if not self.optimizer.frozen:
            return self.plain_allreduce(bucket)
        self.timer.bucket_ready()
        buffer, layout = bucket.buffer(), BucketLayout.of(bucket)
        beta1 = self.optimizer.param_groups[0]["betas"][0]
        for p, start, end in layout.slices():
            offset = self._offsets.get(id(p))
            if offset is None:
                raise ValueError("onebit_adam: a bucket holds a parameter of another model")
            local = self._work[offset : offset + end - start]
            # m_i + delta_i into the work buffer; delta_i itself stays until the encode succeeds
            torch.add(self._error[offset : offset + end - start], buffer[start:end],
                      alpha=1 - beta1, out=local)
            momentum = self.optimizer.state[p].get("exp_avg")
            if momentum is not None:
                local.add_(momentum.view(-1), alpha=beta1)
        if not self._pending:
            self._first_index = bucket.index()  # the step's integrity records go under it
        self._covered += layout.numel
        if not bucket.is_last():
            fut: torch.futures.Future = torch.futures.Future()
            self._pending.append((buffer, layout, fut))
            return fut
        pending, covered = self._pending + [(buffer, layout, None)], self._covered
        self._pending, self._covered = [], 0
        if covered != self.numel:
            error = ValueError(f"onebit_adam: the step's buckets held {covered} gradient "
                               f"elements, the model {self.numel} (unused parameters?)")
            return _fail(pending, error)
        return self._compress(self._first_index if len(pending) > 1 else bucket.index(),
                              pending)

    def _compress(self, index: int, pending: list) -> torch.futures.Future:
        w, c, n = self.world_size, self.chunk, self.numel
        work = self._work
        work[n:].zero_()
        payload, finite = encode_rows(work.view(w, c), self._lengths)
        if not on_host(work):  # the same, chosen on the device
            work.view(w, c).copy_(torch.where(finite.unsqueeze(1), work.view(w, c),
                                              self._error.view(w, c)))
        elif not bool(finite.all()):  # keep the previous worker error for flagged chunks
            work.view(w, c)[~finite] = self._error.view(w, c)[~finite]
        work[n:].zero_()
        self._error, self._work = work, self._error
        received, first = self.start_alltoall(index, payload, ring_allreduce_bytes(4 * n, w))

        def finish() -> torch.Tensor:
            try:
                return self._finish(index, received, pending)
            except BaseException as exc:
                _fail(pending[:-1], exc)
                raise

        return self._worker.submit(first, finish, work.device)

    def _finish(self, index: int, received: torch.Tensor, pending: list) -> torch.Tensor:
        w, c, n = self.world_size, self.chunk, self.numel
        if self.integrity is not None:
            self.integrity.alltoall_received(index, received)
        reply = self._server_stage(received)
        gathered = torch.empty(w * reply.numel(), dtype=torch.uint8, device=reply.device)
        if self.integrity is not None:
            self.integrity.allgather_sent(index, reply, stage=1)
        second = dist.all_gather_single(gathered, reply, group=self._worker.group, async_op=True)
        # wait on the tracked future: its completion is recorded before DDP can take the step
        self.timer.track(second.get_future(), allgather_bytes(reply.numel(), w), "allgather",
                         raw_bytes=0, bucket_ready=False).wait()
        rows = gathered.view(w, -1)
        if self.integrity is not None:
            self.integrity.allgather_received(index, rows, stage=1)
        if not on_host(rows):
            bad = ~torch.isfinite(scales(rows)).all()
            self.optimizer.flag_nonfinite(bad)
            # back to the errors the step started from, where flagged (every rank alike)
            self._error.copy_(torch.where(bad, self._work, self._error))
            self._server.copy_(torch.where(bad, self._server_before, self._server))
        elif not bool(torch.isfinite(scales(rows)).all()):
            self.optimizer.skip_next = True
            # the step is dropped everywhere: back to the errors it started from (the previous
            # buffers are still the spare ones), on every rank alike
            self._error, self._work = self._work, self._error
            if self._server_swapped:
                self._server, self._server_work = self._server_work, self._server
        momentum = decode_rows(rows, out=self._momentum.view(w, c)).view(-1)[:n]
        for buffer, layout, fut in pending:
            for p, start, end in layout.slices():
                offset = self._offsets[id(p)]
                buffer[start:end].copy_(momentum[offset : offset + end - start])
            if fut is not None:
                fut.set_result(buffer)
        return pending[-1][0]

    def _server_stage(self, received: torch.Tensor) -> torch.Tensor:
        """Average the W chunks received, add the server error, re-compress; one payload row."""
        w, c = self.world_size, self.chunk
        self._server_swapped = False
        if not on_host(received):
            return self._server_stage_on_device(received)
        if not bool(torch.isfinite(scales(received)).all()):
            return nan_row(c).to(received.device).view(-1)  # pass the flag on, keep the error
        server = self._server_work
        server.copy_(self._server)
        accumulate_rows(received, server, 1.0 / w)
        real = max(0, min(c, self.numel - self.rank * c))
        server[real:].zero_()  # padding: what the workers sent there is +-scale
        length = self._lengths[self.rank : self.rank + 1]
        reply, finite = encode_rows(server.view(1, c), length)
        if bool(finite.all()):
            server[real:].zero_()
            self._server, self._server_work = server, self._server
            self._server_swapped = True
        return reply.view(-1)

    def _server_stage_on_device(self, received: torch.Tensor) -> torch.Tensor:
        """:meth:`_server_stage` without a host read: the new server error is copied into
        ``_server`` where every scale was finite, and ``_server_before`` keeps the old one for
        a flagged step."""
        w, c = self.world_size, self.chunk
        ok = torch.isfinite(scales(received)).all()
        self._server_before = self._server.clone()
        server = self._server_work
        server.copy_(self._server)
        accumulate_rows(received, server, 1.0 / w)
        real = max(0, min(c, self.numel - self.rank * c))
        server[real:].zero_()
        reply, finite = encode_rows(server.view(1, c), self._lengths[self.rank : self.rank + 1])
        server[real:].zero_()
        self._server.copy_(torch.where(ok & finite.all(), server, self._server))
        return torch.where(ok, reply.view(-1), nan_row(c, received.device).view(-1))

    def state_dict(self) -> dict[str, Any]:
        """Both error buffers and the optimizer's state: all a resume needs for the same step.

        Per rank (the errors differ per rank): save one per rank, load it into the same rank of
        a job of the same world size.
        """
        state = super().state_dict()
        state.update({
            "world_size": self.world_size, "rank": self.rank, "numel": self.numel,
            "names": [self._names.get(id(p), "") for p in self._order],
            "worker_error": self._error[: self.numel].clone(),
            "server_error": self._server.clone(),
            "optimizer": self.optimizer.state_dict(),
        })
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output.

        Raises:
            ValueError: another compressor's checkpoint, another world size or rank (the server
                error is this rank's chunk of W), or another model's parameters.
        """
        super().load_state_dict(state)
        if state.get("world_size") != self.world_size or state.get("rank") != self.rank:
            raise ValueError(
                f"onebit_adam checkpoint of rank {state.get('rank')} of "
                f"{state.get('world_size')}, this is rank {self.rank} of {self.world_size}: "
                "its server error is one chunk of the world size it was taken with; resume "
                "with that world size (or restart the compression from a plain AdamW state)")
        if state.get("names") != [self._names.get(id(p), "") for p in self._order] \
                or state.get("numel") != self.numel:
            raise ValueError("onebit_adam checkpoint of another model's parameters")
        self._error.zero_()
        self._error[: self.numel].copy_(state["worker_error"])
        self._server.copy_(state["server_error"])
        self.optimizer.load_state_dict(state["optimizer"])

    def close(self) -> None:
        """Stop the stage-two thread and destroy its group: collective, every rank, after the
        last ``backward()``."""
        self._worker.close()


def _fail(pending: list, error: BaseException) -> torch.futures.Future:
    """Set ``error`` on every pending bucket's future; return a failed future for the last."""
    for _, _, fut in pending:
        if fut is not None and not fut.done():
            fut.set_exception(error)
    failed: torch.futures.Future = torch.futures.Future()
    failed.set_exception(error)
    return failed


__all__ = ["OneBitAdam", "OneBitAdamCompression"]
