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
(:mod:`laggard.integrations.compression.two_stage`): torch's ``powerSGD_hook`` launches it from a
``.then()`` callback and hangs on gloo with two or more buckets. Bytes per rank: a ring all-reduce
of ``4 (dense + n r)`` then of ``4 m r`` per matrix.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from laggard.integrations.compression.base import CompressionState
from laggard.integrations.compression.residuals import BucketLayout, ErrorFeedback
from laggard.integrations.compression.two_stage import StageTwoWorker
from laggard.integrations.compression.wire import ring_allreduce_bytes

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

    Creating it is collective (it makes a second process group); call :meth:`close` on every rank
    after the last step.
    """

    name = "powersgd"

    def __init__(self, process_group: dist.ProcessGroup, *, rank: int = 4, seed: int = 0,
                 **kwargs: Any) -> None:
        if not isinstance(rank, int) or rank < 1:
            raise ValueError(f"PowerSGD rank must be an integer >= 1, got {rank!r}")
        super().__init__(process_group, **kwargs)
        self.approximation_rank = rank
        self.seed = seed
        self.residuals = ErrorFeedback()
        self._q: dict[int, torch.Tensor] = {}  # id(param) -> Q, (cols, r), warm start
        self._plans: dict[int, BucketPlan] = {}
        self._worker = StageTwoWorker(process_group)

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
            q = q.to(mat.param.device)
            self._q[id(mat.param)] = q
        return q

    def communicate(self, bucket) -> torch.futures.Future:  # type: ignore[no-untyped-def]
        self.timer.bucket_ready()
        buffer, w, r = bucket.buffer(), self.world_size, self.approximation_rank
        layout = BucketLayout.of(bucket)
        plan = self.plan(bucket.index(), layout)
        m_flat = self.residuals.flat(bucket.index(), layout)
        m_flat.add_(buffer)  # M = grad + e, for every parameter of the bucket
        stage1 = torch.empty(plan.stage1, dtype=torch.float32, device=m_flat.device)
        for start, end, at in plan.dense:
            stage1[at : at + end - start].copy_(m_flat[start:end])
            m_flat[start:end].zero_()  # sent exactly: no residual
        matrices = [m_flat[mat.start : mat.end].view(mat.rows, mat.cols) for mat in plan.matrices]
        ps = [stage1[mat.p_start : mat.p_start + mat.rows * r].view(mat.rows, r)
              for mat in plan.matrices]
        for mat, m, p in zip(plan.matrices, matrices, ps, strict=True):
            torch.mm(m, self._warm_q(mat), out=p)
        if self.integrity is not None:
            self.integrity.allreduce_sent(bucket.index(), stage1)
        first = dist.all_reduce(stage1, group=self.process_group, async_op=True).get_future()
        first = self.timer.track(first, ring_allreduce_bytes(stage1.numel() * 4, w), "allreduce",
                         raw_bytes=self.raw_bytes(buffer), bucket_ready=False)

        def finish() -> torch.Tensor:
            if self.integrity is not None:
                self.integrity.allreduce_received(bucket.index(), stage1)
            stage1.div_(w)
            for start, end, at in plan.dense:
                buffer[start:end].copy_(stage1[at : at + end - start])
            stage2 = torch.empty(plan.stage2, dtype=torch.float32, device=stage1.device)
            qs = [stage2[mat.q_start : mat.q_start + mat.cols * r].view(mat.cols, r)
                  for mat in plan.matrices]
            for m, p, q in zip(matrices, ps, qs, strict=True):
                p.copy_(torch.linalg.qr(p).Q)
                torch.mm(m.t(), p, out=q)
            if plan.stage2:
                if self.integrity is not None:
                    self.integrity.allreduce_sent(bucket.index(), stage2, stage=1)
                second = dist.all_reduce(stage2, group=self._worker.group, async_op=True)
                # wait on the tracked future: its completion is recorded before DDP takes the step
                self.timer.track(second.get_future(),
                                 ring_allreduce_bytes(stage2.numel() * 4, w), "allreduce",
                                 raw_bytes=0, bucket_ready=False).wait()
                if self.integrity is not None:
                    self.integrity.allreduce_received(bucket.index(), stage2, stage=1)
                stage2.div_(w)
            for mat, m, p, q in zip(plan.matrices, matrices, ps, qs, strict=True):
                self._q[id(mat.param)] = q.clone()
                approx = buffer[mat.start : mat.end].view(mat.rows, mat.cols)
                torch.mm(p, q.t(), out=approx)
                m.sub_(approx)  # e = M - approx
            return buffer

        return self._worker.submit(first, finish, buffer.device)

    def state_dict(self) -> dict[str, Any]:
        """Residuals and warm-start Q matrices per parameter name."""
        self._require_names()
        state = super().state_dict()
        state["residuals"] = self.residuals.export(self._names)
        state["q"] = {self._names[pid]: q.clone() for pid, q in self._q.items()}
        state["rank"] = self.approximation_rank
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
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
        self._worker.close()
