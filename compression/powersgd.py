"""``powersgd``: rank-r PowerSGD with error feedback and warm start, working on gloo and NCCL.

Algorithm (Vogels et al., "PowerSGD: Practical Low-Rank Gradient Compression for Distributed
Optimization", NeurIPS 2019, Algorithm 1), per parameter whose gradient is a matrix ``M`` of
shape ``(n, m)`` (higher-order tensors are viewed as ``(shape[0], -1)``)::

    M = grad + e                      # error feedback
    P = M Q            ; all-reduce P  (mean)          stage 1
    P = orthogonalize(P)
    Q = M^T P          ; all-reduce Q  (mean)          stage 2
    approx = P Q^T     ; e = M - approx
    Q is kept for the next step (warm start: one power iteration per step suffices)

``approx = P P^T M_mean`` is the projection of the mean gradient onto the r columns of ``P``, so
``|M_mean - approx|_F <= |M_mean|_F``, it is never better than the best rank-r approximation
(Eckart-Young), and a gradient of rank <= r is reproduced exactly. Vectors (biases, norms) and
matrices too small to gain 2-fold (``n m < 2 (n + m) r``, torch's ``min_compression_rate``) are
all-reduced uncompressed in stage 1, next to the P matrices.

Stage 2 needs stage 1's result, so it runs on a worker thread and a second process group
(:mod:`laggard.compression.two_stage`): torch's ``powerSGD_hook`` launches it from a
``.then()`` callback and hangs on gloo with two or more buckets. Bytes per rank: a ring all-reduce
of ``4 (dense + n r)`` then of ``4 m r`` per matrix.

Bad input: a bucket whose gradients hold NaN/Inf is counted (``nonfinite_buckets``) and sent as
a NaN flag (its whole stage-1 buffer NaN), which the all-reduce's sum carries to every rank.
Every rank then finds its stage-1 result non-finite, skips stage 2 (all ranks alike, so the
collectives stay paired) and returns NaN for the bucket, as an fp32 all-reduce would; ``M`` is
built in the bucket buffer, so no rank's residuals or warm-start Q change that step, and the next
finite step gives what it would have given had the bad one never happened. (A stage 1 or 2 that
overflows from finite gradients is handled the same way, uncounted.)

Off the CPU the hook reads nothing back to the host (:mod:`laggard.integrations.device_reads`):
skipping stage 2 would need every rank to read its stage-1 flag, so instead every rank runs
stage 2 on every bucket (the same collectives everywhere, paired as before) and the flags, 0-d
device tensors, choose with ``torch.where`` what the residuals, the warm-start Q and the result
become: the values of the CPU path's branches, without its skipped work.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from laggard.compression.base import CompressionState, all_finite
from laggard.compression.residuals import BucketLayout, ErrorFeedback
from laggard.compression.two_stage import StageTwoWorker
from laggard.integrations.collective_bytes import ring_allreduce_bytes
from laggard.integrations.device_reads import DeviceCount, finite_flag, on_host, to_device

#: Compress a matrix only when that sends at most half its elements (torch's default).
MIN_COMPRESSION_RATE = 2


@dataclass(frozen=True, slots=True)
class _Matrix:
    param: torch.Tensor
    start: int  # element range in the bucket
    end: int
    rows: int
    cols: int
    p_start: int  # element offset of its P in the stage-1 buffer
    q_start: int  # element offset of its Q in the stage-2 buffer


@dataclass(frozen=True, slots=True)
class BucketPlan:
    """Where a bucket's parameters go in the two all-reduces (:meth:`PowerSGDCompression.plan`)."""

    key: tuple[int, ...]
    dense: tuple[tuple[int, int, int], ...]  # (start, end, offset in the stage-1 buffer)
    matrices: tuple[_Matrix, ...]
    stage1: int  # elements of the stage-1 buffer
    stage2: int


class PowerSGDCompression(CompressionState):
    """PowerSGD (see the module docstring).

    Args:
        process_group, model, timer: see :class:`CompressionState`.
        rank: approximation rank r, >= 1 (default 4).
        seed: seed of the initial Q matrices (must be the same on every rank).

    Raises:
        ValueError: ``rank`` below 1.

    Attributes:
        nonfinite_buckets: buckets whose gradients held NaN/Inf on this rank (sent as a NaN flag;
            every rank's result for the bucket is NaN and every rank's residuals and Q matrices
            were left as they were). Off the CPU it is counted on the device and reading it
            waits for the stream (exact; a stats read, not for inside backward).

    Creating it is collective (it makes a second process group); call :meth:`close` on every rank
    after the last step.
    """

    name = "powersgd"

    def __init__(self, process_group: dist.ProcessGroup, *, rank: int = 4, seed: int = 0,
                 **kwargs: Any) -> None:
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
            raise ValueError(f"PowerSGD rank must be an integer >= 1, got {rank!r}")
        super().__init__(process_group, **kwargs)
        self.approximation_rank = rank
        self.seed = seed
        self.residuals = ErrorFeedback()
        self._q: dict[int, torch.Tensor] = {}  # id(param) -> Q, (cols, r), warm start
        self._plans: dict[int, BucketPlan] = {}
        self._nonfinite = DeviceCount()
        self._worker = StageTwoWorker(process_group)

    @property
    def nonfinite_buckets(self) -> int:
        """Buckets flagged for NaN/Inf on this rank (see the class docstring)."""
        return self._nonfinite.value()

    def plan(self, index: int, layout: BucketLayout) -> BucketPlan:
        """Where each parameter of the bucket goes: dense in stage 1, or a matrix with its P (stage
        1) and Q (stage 2) offsets; ``stage1`` and ``stage2`` are the two all-reduces' element
        counts. Cached per bucket index until the layout changes."""
        plan = self._plans.get(index)
        if plan is not None and plan.key == layout.key:
            return plan
        r = self.approximation_rank
        dense, matrices, stage1, stage2 = [], [], 0, 0
        for p, start, end in layout.slices():
            rows = p.shape[0] if p.dim() >= 2 else 0
            cols = p.numel() // rows if rows else 0
            if rows and rows * cols >= MIN_COMPRESSION_RATE * (rows + cols) * r:
                matrices.append(_Matrix(p, start, end, rows, cols, -1, stage2))
                stage2 += cols * r
            else:
                dense.append((start, end, stage1))
                stage1 += end - start
        placed = []
        for mat in matrices:  # the P matrices follow the dense part
            placed.append(_Matrix(mat.param, mat.start, mat.end, mat.rows, mat.cols, stage1,
                                  mat.q_start))
            stage1 += mat.rows * r
        plan = BucketPlan(layout.key, tuple(dense), tuple(placed), stage1, stage2)
        self._plans[index] = plan
        return plan

    def _warm_q(self, mat: _Matrix) -> torch.Tensor:
        q = self._q.get(id(mat.param))
        if q is None or q.shape != (mat.cols, self.approximation_rank):
            generator = torch.Generator().manual_seed(self.seed)
            q = torch.randn(mat.cols, self.approximation_rank, generator=generator)
            q = to_device(q, mat.param.device)  # the CPU generator's draw; no blocking copy
            self._q[id(mat.param)] = q
        return q

    def communicate(self, bucket) -> torch.futures.Future:  # type: ignore[no-untyped-def]
        """Stage 1 (all-reduce of the dense part and the P matrices) now, stage 2 (the Q
        matrices) on the worker thread; a future of the bucket's approximated mean."""
        self.timer.bucket_ready()
        buffer, index = bucket.buffer(), bucket.index()
        layout = BucketLayout.of(bucket)
        plan = self.plan(index, layout)
        residual = self.residuals.flat(index, layout)
        stage1 = torch.empty(plan.stage1, dtype=torch.float32, device=residual.device)
        qs = [self._warm_q(mat) for mat in plan.matrices]  # created on every rank alike
        host = on_host(buffer)
        finite: bool | torch.Tensor = finite_flag(buffer) if not host else all_finite(buffer)
        if not host or finite:
            # M = grad + e, held in the bucket: e changes only once stage 1 came back finite
            buffer.add_(residual)
            for start, end, at in plan.dense:
                stage1[at : at + end - start].copy_(buffer[start:end])
            r = self.approximation_rank
            for mat, q in zip(plan.matrices, qs, strict=True):
                p = stage1[mat.p_start : mat.p_start + mat.rows * r].view(mat.rows, r)
                torch.mm(buffer[mat.start : mat.end].view(mat.rows, mat.cols), q, out=p)  # P = M Q
            if not host:  # the NaN flag, on the device (the buffer is not read back)
                assert isinstance(finite, torch.Tensor)
                self._nonfinite.add(~finite)
                stage1.masked_fill_(~finite, math.nan)
        else:  # the NaN flag: the sum makes stage 1 NaN on every rank
            self._nonfinite.add(1)
            stage1.fill_(math.nan)
        if self.integrity is not None:
            self.integrity.allreduce_sent(index, stage1)
        first = dist.all_reduce(stage1, group=self.process_group, async_op=True).get_future()
        first = self.timer.track(first, ring_allreduce_bytes(stage1.numel() * 4, self.world_size),
                                 "allreduce", raw_bytes=self.raw_bytes(buffer),
                                 bucket_ready=False)
        finish = self._finish if host else self._finish_on_device
        return self._worker.submit(first, lambda: finish(index, plan, buffer, residual, stage1),
                                   buffer.device)

    def _finish(self, index: int, plan: BucketPlan, buffer: torch.Tensor, residual: torch.Tensor,
                stage1: torch.Tensor) -> torch.Tensor:
        """Stage 2 and the update of Q and the residuals, on the worker thread.

        ``buffer`` holds ``M = grad + e``. The all-reduced stage 1 (and stage 2) are the same on
        every rank, so every rank takes the same branch: a non-finite one skips the rest (no
        stage 2 for a non-finite stage 1) and leaves Q and the residuals as they were.
        """
        if self.integrity is not None:
            self.integrity.allreduce_received(index, stage1)
        if not all_finite(stage1):
            return buffer.fill_(math.nan)
        w, r = self.world_size, self.approximation_rank
        stage1.div_(w)
        stage2 = torch.empty(plan.stage2, dtype=torch.float32, device=stage1.device)
        ms, ps, qs = _views(plan, buffer, stage1, stage2, r)
        for m, p, q in zip(ms, ps, qs, strict=True):
            p.copy_(torch.linalg.qr(p).Q)
            torch.mm(m.t(), p, out=q)
        if plan.stage2:
            self._reduce_stage_two(index, stage2)
            if not all_finite(stage2):  # Q = M^T P overflowed somewhere
                return buffer.fill_(math.nan)
            stage2.div_(w)
        for start, end, at in plan.dense:
            buffer[start:end].copy_(stage1[at : at + end - start])
            residual[start:end].zero_()  # sent exactly: no residual
        for mat, m, p, q in zip(plan.matrices, ms, ps, qs, strict=True):
            self._q[id(mat.param)] = q.clone()
            e = residual[mat.start : mat.end].view(mat.rows, mat.cols)
            e.copy_(m)
            torch.mm(p, q.t(), out=m)  # the approximation, in the bucket
            e.sub_(m)  # e = M - approx
        return buffer

    def _reduce_stage_two(self, index: int, stage2: torch.Tensor) -> None:
        """Sum every rank's Q = M^T P (stage 2) in place, fingerprinted and timed; waits on the
        tracked future, so its completion is recorded before DDP takes the step."""
        if self.integrity is not None:
            self.integrity.allreduce_sent(index, stage2, stage=1)
        second = dist.all_reduce(stage2, group=self._worker.group, async_op=True)
        w = self.world_size
        self.timer.track(second.get_future(), ring_allreduce_bytes(stage2.numel() * 4, w),
                         "allreduce", raw_bytes=0, bucket_ready=False).wait()
        if self.integrity is not None:
            self.integrity.allreduce_received(index, stage2, stage=1)

    def _finish_on_device(self, index: int, plan: BucketPlan, buffer: torch.Tensor,
                          residual: torch.Tensor, stage1: torch.Tensor) -> torch.Tensor:
        """:meth:`_finish` without a host read (module docstring): stage 2 runs on every rank
        for every bucket, and the flags choose the residuals', Q's and the result's values."""
        if self.integrity is not None:
            self.integrity.allreduce_received(index, stage1)
        w, r = self.world_size, self.approximation_rank
        ok = finite_flag(stage1)
        stage1.div_(w)
        stage2 = torch.empty(plan.stage2, dtype=torch.float32, device=stage1.device)
        ms, ps, qs = _views(plan, buffer, stage1, stage2, r)
        for m, p, q in zip(ms, ps, qs, strict=True):
            # a flagged P is orthogonalised as zeros (QR of NaN is the solver's business)
            p.copy_(torch.linalg.qr(torch.where(ok, p, 0.0)).Q)
            torch.mm(m.t(), p, out=q)
        if plan.stage2:
            self._reduce_stage_two(index, stage2)
            ok = ok & finite_flag(stage2)
            stage2.div_(w)
        for start, end, at in plan.dense:
            buffer[start:end].copy_(stage1[at : at + end - start])
            residual[start:end].masked_fill_(ok, 0.0)  # sent exactly: no residual
        for mat, m, p, q in zip(plan.matrices, ms, ps, qs, strict=True):
            old = self._q[id(mat.param)]
            self._q[id(mat.param)] = torch.where(ok, q, old)
            e = residual[mat.start : mat.end].view(mat.rows, mat.cols)
            e.copy_(torch.where(ok, m, e))
            torch.mm(p, q.t(), out=m)  # the approximation, in the bucket
            e.sub_(torch.where(ok, m, 0.0))  # e = M - approx (x - 0.0 is x)
        return buffer.masked_fill_(~ok, math.nan)

    def state_dict(self) -> dict[str, Any]:
        """Residuals and warm-start Q matrices per parameter name."""
        self._require_names()
        state = super().state_dict()
        state["residuals"] = self.residuals.export(self._names)
        state["q"] = {self._names[pid]: q.clone() for pid, q in self._q.items()}
        state["rank"] = self.approximation_rank
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s residuals and Q matrices.

        Raises:
            ValueError: another compressor's checkpoint, another rank ``r``, no ``model=``, or
                residuals or Q matrices of unknown parameters.
        """
        super().load_state_dict(state)
        self._require_names()
        if state.get("rank") != self.approximation_rank:
            raise ValueError(f"checkpoint has PowerSGD rank {state.get('rank')}, this hook "
                             f"{self.approximation_rank}")
        self.residuals.load(state["residuals"], self._params)
        q = {}
        for name, value in state["q"].items():
            if name not in self._params:
                raise ValueError(f"Q matrix for unknown parameter {name!r}")
            q[id(self._params[name])] = value.clone()
        self._q = q

    def close(self) -> None:
        """Stop the stage-two thread and destroy its group: collective, every rank, after the
        last ``backward()``."""
        self._worker.close()


def _views(plan: BucketPlan, buffer: torch.Tensor, stage1: torch.Tensor, stage2: torch.Tensor,
           rank: int) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
    """Each matrix's M (in the bucket), P (in stage 1) and Q (in stage 2) as views:
    ``(rows, cols)``, ``(rows, rank)`` and ``(cols, rank)`` float32."""
    ms = [buffer[mat.start : mat.end].view(mat.rows, mat.cols) for mat in plan.matrices]
    ps = [stage1[mat.p_start : mat.p_start + mat.rows * rank].view(mat.rows, rank)
          for mat in plan.matrices]
    qs = [stage2[mat.q_start : mat.q_start + mat.cols * rank].view(mat.cols, rank)
          for mat in plan.matrices]
    return ms, ps, qs
