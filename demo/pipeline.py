"""``laggard demo --parallel pp``: the demo's model as a 2-stage pipeline x data parallel on gloo.

W ranks (4 by default) form a ``DeviceMesh`` of shape ``(2, W / 2)``, dims ``("pp", "dp")``:
ranks ``0 .. W/2 - 1`` are pipeline stage 0 (the embedding, a small residual MLP and the first
half of the blocks), the others stage 1 (the second half, the final norm and the head); rank
``r`` of stage 0 and rank ``r + W/2`` of stage 1 are one pipeline (one data-parallel replica).
Each pipeline trains
with ``torch.distributed.pipelining`` (``PipelineStage`` + ``Schedule1F1B``,
:data:`MICROBATCHES` microbatches per step), its sends and receives traced per peer
(:func:`~laggard.integrations.trace_sources.instrument_pipeline`); after the schedule every
stage all-reduces its gradients over its data-parallel group (the ranks of the same stage), in
buckets, each a synchronous all-reduce timed by the tracer (the exposed collective wait the
straggler detector reads). The monitor gets the mesh, so each rank is compared with the ranks
of its own stage (its peer group).

Phases per step: ``data`` (both stages sample the same batch: their data seed is the replica's),
``forward_backward`` (the schedule: both passes of every microbatch, interleaved by 1F1B, and
the P2P waits, which a thread's CPU clock does not count) and ``optimizer``. The gradient
all-reduce and the loss's all-reduce within the pipeline (so that every rank, rank 0 among them,
knows its pipeline's loss) run between the phases.

Balance: with :data:`PIPELINE_LAYERS` blocks split 2 / 2 and nothing more, stage 1 did 7% more
thread CPU per step than stage 0 in a clean run here (42.6 vs 39.7 ms), 13% on a host at load
17, enough to cross the stage-balance detector's 10% (one false ``stage_imbalance`` in 2 clean
runs): its head and loss, and the schedule's last-stage work. Stage 0's counterweight, a
residual MLP of two 96 x 96 layers after the embedding (:class:`~laggard.demo.model.
FirstStage`), brings the two within 1% (50.6 vs 50.3 ms at load 18).
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from laggard.demo.injections import (
    CyclicGarbage,
    GcInjection,
    StageInjection,
    TokensInjection,
)
from laggard.demo.model import BUCKET_CAP_MB, ByteBatches, ByteLM, load_stdlib_text, split_stages
from laggard.integrations.monitor import TrainingMonitor
from laggard.integrations.trace_ops import wire_bytes
from laggard.integrations.trace_sources import instrument_pipeline
from laggard.integrations.tracer import CollectiveTracer

#: Pipeline stages (the mesh's ``pp`` size).
STAGES = 2
#: Microbatches per step (Schedule1F1B).
MICROBATCHES = 4
#: Transformer blocks of the pipeline demo's model (half per stage).
PIPELINE_LAYERS = 4
#: Sequences per step and pipeline (:data:`MICROBATCHES` of 4).
BATCH_SIZE = 16
#: Tokens per sequence.
SEQ_LEN = 64

__all__ = ["BATCH_SIZE", "MICROBATCHES", "PIPELINE_LAYERS", "STAGES", "Pipeline",
           "build_pipeline_job", "stage_split",
           "train_step_pp"]


def stage_split(stage_injection: StageInjection | None = None) -> tuple[int, int]:
    """``(blocks of the model, blocks of stage 0)``: half and half, plus the injected extra
    blocks on the injected stage."""
    extra = stage_injection.layers if stage_injection is not None else 0
    first = PIPELINE_LAYERS // 2 + (extra if stage_injection and stage_injection.stage == 0
                                    else 0)
    return PIPELINE_LAYERS + extra, first


@dataclasses.dataclass(slots=True)
class Pipeline:
    """One rank's share of the pipeline job.

    Attributes:
        stage: its pipeline stage (0 or 1).
        replica: its data-parallel index (its pipeline).
        schedule: the ``Schedule1F1B`` of its stage.
        module: its stage's module (parameters, the throttle).
        dp_group, dp_size: the ranks of its stage (gradient all-reduce).
        loss_group: the ranks of its pipeline (the loss all-reduce; not traced).
        buckets: gradient buckets, lists of parameters in reverse order (as DDP's).
        handle: the pipeline instrumentation (undone at the end).
    """

    stage: int
    replica: int
    schedule: Any
    module: torch.nn.Module
    dp_group: Any
    dp_size: int
    loss_group: Any
    buckets: list[list[torch.nn.Parameter]]
    handle: Any


def _buckets(params: list[torch.nn.Parameter]) -> list[list[torch.nn.Parameter]]:
    """Parameters in reverse order, cut at :data:`BUCKET_CAP_MB` (DDP's bucketing)."""
    cap = BUCKET_CAP_MB * 1e6
    buckets: list[list[torch.nn.Parameter]] = [[]]
    size = 0.0
    for p in reversed(params):
        if buckets[-1] and size + 4 * p.numel() > cap:
            buckets.append([])
            size = 0.0
        buckets[-1].append(p)
        size += 4 * p.numel()
    return buckets


def build_pipeline_job(args: argparse.Namespace, rank: int, job_cls: Any,
                       injections: list[Any], detector: Any) -> Any:
    """The pipeline job of one rank: the mesh, its stage, schedule, tracer and monitor.

    Args:
        args: the worker's flags.
        rank: this rank.
        job_cls: :class:`laggard.demo.worker.Job` (not imported here: the worker imports this).
        injections: the parsed ``--inject-cause`` injections.
        detector: the straggler detector's config.
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    world = dist.get_world_size()
    mesh = init_device_mesh("cpu", (STAGES, world // STAGES), mesh_dim_names=("pp", "dp"))
    stage, replica = mesh["pp"].get_local_rank(), mesh["dp"].get_local_rank()
    stage_inj = next((i for i in injections if isinstance(i, StageInjection)), None)
    tokens_inj = next((i for i in injections if isinstance(i, TokensInjection)), None)
    seq_len, max_len = SEQ_LEN, SEQ_LEN
    if tokens_inj is not None:
        max_len = tokens_inj.seq_len(SEQ_LEN)
        # the injected rank's whole pipeline: the same microbatches go through every stage
        if replica == _replica_of(tokens_inj.rank, world):
            seq_len = max_len
    layers, first = stage_split(stage_inj)
    torch.manual_seed(args.seed)  # the same model on every rank: each keeps its stage
    model = ByteLM(layers=layers, seq_len=max_len)
    model.throttle.incremental = True
    module = split_stages(model, first, adapter=True)[stage]
    # after the mesh (and before any later group): the tracer watches the pp and dp groups
    tracer = CollectiveTracer()
    handle = instrument_pipeline(tracer)
    pipe = PipelineStage(module, stage, STAGES, torch.device("cpu"), group=mesh["pp"].get_group())
    schedule = Schedule1F1B(pipe, n_microbatches=MICROBATCHES, loss_fn=_loss)
    loss_group = _pipeline_groups(world)
    from laggard.demo.worker import gpu_state_participants, hang_options, node_options

    # the mesh: each rank is compared with the ranks of its stage (same pp coordinate)
    monitor = TrainingMonitor(
        TrainingMonitor.Config(agent_address=args.intake_address, window_steps=args.window,
                               phase_clock="thread_cpu", windows_path=args.windows,
                               straggler=detector, run=args.run_id,
                               **hang_options(args, rank), **node_options(args, rank, world)),
        tracer=tracer, participants=gpu_state_participants(args), mesh=mesh)
    gc_inj = any(isinstance(i, GcInjection) and i.rank == rank for i in injections)
    batches = ByteBatches(load_stdlib_text(), batch_size=BATCH_SIZE, seq_len=seq_len,
                          seed=args.seed * 1000 + replica)
    pipeline = Pipeline(
        stage=stage, replica=replica, schedule=schedule, module=module,
        dp_group=mesh["dp"].get_group(), dp_size=world // STAGES, loss_group=loss_group,
        buckets=_buckets([p for p in module.parameters() if p.requires_grad]), handle=handle)
    optimizer = torch.optim.AdamW(module.parameters(), lr=3e-3)
    return job_cls(model=model, ddp=module, batches=batches, optimizer=optimizer,
                   monitor=monitor, hook_state=None, integrity=None, tracer=tracer,
                   per_step=[], rank=rank, hang=args.hang, hang_marker=args.hang_marker,
                   checkpoint=args.checkpoint, pipeline=pipeline, step_fn=train_step_pp,
                   garbage=CyclicGarbage() if gc_inj else None, garbage_from=args.slow_from,
                   tokens=BATCH_SIZE * seq_len,
                   note_tokens=tokens_inj is None or tokens_inj.noted)


def _replica_of(rank: int, world: int) -> int:
    return rank % (world // STAGES)


def _pipeline_groups(world: int) -> Any:
    """This rank's pipeline as a group of its own, made after the tracer (not traced): the
    loss all-reduce is the demo's bookkeeping, not the job's communication."""
    per_stage = world // STAGES
    mine, _ = dist.new_subgroups_by_enumeration(
        [[r + s * per_stage for s in range(STAGES)] for r in range(per_stage)], backend="gloo")
    return mine


def _loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def train_step_pp(job: Any) -> float:
    """One monitored pipeline step; returns the pipeline's mean loss over its microbatches."""
    from laggard.demo.worker import (
        _step_comm,
        begin_compute,
        end_of_step,
        load_batch,
        size_garbage,
    )

    monitor, pipe = job.monitor, job.pipeline
    throttle = job.model.throttle
    started = time.thread_time()
    with monitor.step():
        x, y = load_batch(job)
        with monitor.phase("forward_backward"):
            begin_compute(job)
            if throttle.factor > 0:
                throttle.start_step()
            losses: list[torch.Tensor] = []
            # return_outputs=False: the last stage would otherwise keep and concatenate every
            # microbatch's logits each step (about 7% of its step here), work stage 0 has not
            if pipe.stage == 0:
                pipe.schedule.step(x, return_outputs=False)
            else:
                pipe.schedule.step(target=y, losses=losses, return_outputs=False)
        _allreduce_gradients(job)
        optimizer_started = time.thread_time()
        with monitor.phase("optimizer"):
            job.optimizer.step()
            job.optimizer.zero_grad(set_to_none=True)
        throttle.optimizer_seconds = time.thread_time() - optimizer_started
        own = float(torch.stack(losses).detach().mean()) if losses else 0.0
        loss = torch.tensor([own])
        dist.all_reduce(loss, group=pipe.loss_group)  # only the last stage has it
        value = float(loss.item())
        end_of_step(job, value)
    size_garbage(job, started)
    job.per_step.append(_step_comm(monitor))
    return value


def _allreduce_gradients(job: Any) -> None:
    """Average the stage's gradients over its data-parallel group, one synchronous all-reduce
    per bucket, each timed by the tracer (blocking: the exposed collective wait)."""
    pipe, tracer = job.pipeline, job.tracer
    for bucket in pipe.buckets:
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in bucket]
        flat = torch.cat([g.reshape(-1) for g in grads])
        nbytes = wire_bytes("allreduce", flat.numel() * flat.element_size(), pipe.dp_size)
        with tracer.timed("allreduce", pipe.dp_group, nbytes, tensor=flat):
            dist.all_reduce(flat, group=pipe.dp_group)
        flat /= pipe.dp_size
        offset = 0
        for p, g in zip(bucket, grads, strict=True):
            n = g.numel()
            p.grad = flat[offset:offset + n].view_as(g).clone()
            offset += n
