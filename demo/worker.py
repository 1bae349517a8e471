"""One rank of ``laggard demo``: a small decoder-only transformer language model trained with DDP
(or FSDP2 with ``--parallel fsdp``) on gloo, timed by TrainingMonitor and a CollectiveTracer, one
rank optionally slowed.

Launched by ``laggard demo`` through PyTorch's own launcher::

    python -m torch.distributed.run --standalone --nproc_per_node 4 \\
        -m laggard.demo.worker --steps 300 --slow-rank 2 --slowdown 1.25 ...

The text is the Python standard library's own source (found with ``sysconfig``), as bytes: a
vocabulary of 256 tokens, no tokenizer to download. Each rank samples its own batches.

The slowdown is extra real compute inside the slowed rank's backward pass, as a throttled GPU
would add: matrix multiplies worth ``(slowdown - 1)`` times the rank's own compute CPU time *of
that step*, measured as it runs (see :class:`~laggard.demo.model.StepThrottle`, and
:class:`~laggard.demo.model.Throttle` for why backward). Phases are timed in
each rank's thread CPU time, the stand-in for GPU time when W ranks share fewer cores; step and
collective times stay wall time. Rank 0 prints progress and, at the end, writes what the demo's
report needs to ``--result``.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import math
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from laggard.demo.hang import (
    HangingHook,
    HangReportWriter,
    checkpoint_save,
    hang_forever,
    parse_inject,
    write_marker,
)
from laggard.demo.injections import (
    CyclicGarbage,
    GcInjection,
    NodePlacement,
    SlowSchedule,
    TokensInjection,
    parse_injection,
    parse_slow_ranks,
)
from laggard.demo.model import BUCKET_CAP_MB, ByteBatches, ByteLM, load_stdlib_text
from laggard.detectors.straggler import StragglerDetector
from laggard.detectors.window import STEP_COLUMN_NAMES
from laggard.integrations.collective_bytes import ring_allreduce_bytes
from laggard.integrations.comm_timing import CommStep, CommTimer
from laggard.integrations.monitor import TrainingMonitor
from laggard.integrations.tracer import CollectiveTracer

log = logging.getLogger("laggard.demo")

#: Smallest slowdown the demo's detector names. Ranks sharing a CPU's caches with each other and
#: with other processes differ by up to ~3% in CPU time for the same work (2.3% seen here), so
#: the detector's default floor of 2% (made for GPUs of one model) would name one now and then.
MIN_SLOWDOWN = 0.05
#: Whole-job slowdown the demo reports. Four ranks on two cores: the slowed rank's extra compute
#: competes for the cores and caches the others use, which raises every rank's CPU time by
#: 10-12% (seen here), an artefact of the emulation that a GPU job does not have.
JOB_SLOWDOWN_THRESHOLD = 0.25
#: AdamW's learning rate in the demo (and 1-bit Adam's, which runs AdamW for its warm-up).
LEARNING_RATE = 3e-3




# -------------------------------------------------------------------------------- training
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--window", type=int, default=20)
    p.add_argument("--slow-rank", default="", help="a rank or a comma list (1,3); none if empty")
    p.add_argument("--slowdown", type=float, default=1.0)
    p.add_argument("--slow-from", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--nodes", type=int, default=0,
                   help="place the ranks on this many emulated nodes, node-0.. (0: none)")
    p.add_argument("--intake-address", default="")
    p.add_argument("--result", default="")
    p.add_argument("--print-every", type=int, default=20)
    p.add_argument("--compression", default="none")
    p.add_argument("--inject-bitflip", default="")
    p.add_argument("--windows", default="", help="rank 0 saves every window here (JSON lines)")
    p.add_argument("--parallel", choices=["ddp", "fsdp", "pp"], default="ddp")
    p.add_argument("--no-prefetch", dest="prefetch", action="store_false")
    p.add_argument("--run-id", default="", help="run id (TrainingMonitor.Config.run)")
    p.add_argument("--gpu-state", action="store_true",
                   help="add the GPU-state participant (the demo sets LAGGARD_FAKE_NVML)")
    p.add_argument("--device", choices=["cpu", "emulated-async"], default="cpu")
    p.add_argument("--inject-hang", default="", metavar="SPEC",
                   help="hang=rank:R,step:S,kind:K (laggard.demo.hang)")
    p.add_argument("--inject-checkpoint", default="", metavar="SPEC",
                   help="checkpoint=step:S,factor:F (laggard.demo.hang)")
    p.add_argument("--inject-cause", action="append", default=[], metavar="SPEC",
                   help="gc=..., tokens=..., stage=..., stall=..., burst=..., node=..., "
                        "moving=... (laggard.demo.injections)")
    p.add_argument("--hang-marker", default="", help="the hanging rank writes here when it hangs")
    p.add_argument("--hang-report", default="",
                   help="rank 0 appends each hang its monitor names here (JSON lines)")
    args = p.parse_args(argv)
    args.hang = parse_inject(args.inject_hang) if args.inject_hang else None
    args.checkpoint = parse_inject(args.inject_checkpoint) if args.inject_checkpoint else None
    args.causes = [parse_injection(spec) for spec in args.inject_cause]
    # a negative rank is cluster.py's "none" (it passes --slow-rank only when >= 0)
    slow = args.slow_rank.strip()
    args.slow_ranks = [] if not slow or slow.startswith("-") else parse_slow_ranks(slow)
    return args


def slow_schedule(args: argparse.Namespace, world_size: int) -> SlowSchedule:
    """Who is slowed how much at which step (``--slow-rank``, ``--slowdown``, the shapes)."""
    return SlowSchedule.of(world_size=world_size, slow_from=args.slow_from,
                           slow_ranks=args.slow_ranks, slowdown=args.slowdown, nodes=args.nodes,
                           injections=args.causes)


def node_options(args: argparse.Namespace, rank: int, world_size: int) -> dict[str, Any]:
    """``TrainingMonitor.Config(node=...)`` of ``rank`` on its emulated node (``--nodes``);
    empty without emulated nodes (the monitor then says the host's name)."""
    node = NodePlacement(world_size, args.nodes).node_of(rank)
    return {"node": node} if node else {}


def comm_hook(name: str, timer: CommTimer, model: torch.nn.Module) -> tuple[Any, Any]:
    """The DDP communication hook for ``--compression NAME`` and its state.

    Every name, ``none`` (the plain averaging all-reduce) included, comes from
    ``laggard.compression.make_hook``, so bytes are counted the same way for all:
    bytes this rank sends under the collective's algorithm, next to an fp32 all-reduce's.
    """
    from laggard.compression import make_hook

    return make_hook(name, timer=timer, **hook_options(name, model))


def hook_options(name: str, model: torch.nn.Module) -> dict[str, Any]:
    """``make_hook`` options: the model, and 1-bit Adam's learning rate (it owns the optimizer)."""
    return {"model": model, **({"lr": LEARNING_RATE} if name == "onebit_adam" else {})}


def make_optimizer(state: Any, model: torch.nn.Module) -> torch.optim.Optimizer:
    """AdamW, or the optimizer a hook brings (1-bit Adam: AdamW for its warm-up, then the
    frozen-variance steps on the momentum the hook all-reduces)."""
    own = getattr(state, "optimizer", None)
    if own is not None:
        return own
    return torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE)


def integrity_hook(ddp: DistributedDataParallel, name: str, timer: CommTimer,
                   flip: str) -> tuple[Any, Any]:
    """With ``--inject-bitflip``: the compressor's hook with every gradient-integrity check
    (its payloads fingerprinted by the compressor, its result by ``with_integrity``), registered;
    returns ``(hook state, GradientIntegrity)``. Without: ``(None, None)``, nothing registered.
    """
    if not flip:
        return None, None
    from laggard.compression import make_hook
    from laggard.integrations.faults import BitFlipInjector
    from laggard.integrations.integrity import GradientIntegrity
    from laggard.integrations.integrity_hooks import IntegrityHookState, with_integrity

    integrity = GradientIntegrity(GradientIntegrity.Config(replica_every=10),
                                  injector=BitFlipInjector.parse(flip))
    state, hook = make_hook(name, timer=timer, integrity=integrity,
                            **hook_options(name, ddp.module))
    ddp.register_comm_hook(IntegrityHookState(integrity, state), with_integrity(hook))
    return state, integrity


def detector_config() -> StragglerDetector.Config:
    """The straggler detector's settings in the demo (also replayed by
    ``benchmarks/demo_detection.py``)."""
    return StragglerDetector.Config(
        min_slowdown=MIN_SLOWDOWN, job_slowdown_threshold=JOB_SLOWDOWN_THRESHOLD,
        # a CPU job: no GPU to point at (issue 35); the cause is the demo's own injection
        compute_hint="in this CPU demo it is the injected extra work")


def global_mean(value: float) -> float:
    t = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(t)
    return t.item() / dist.get_world_size()


@dataclass(slots=True)
class Job:
    """One rank's training job: model, data, optimizer, hooks and monitor."""

    model: ByteLM
    ddp: Any  # the model to call: DistributedDataParallel, or the FSDP2-sharded ByteLM
    batches: ByteBatches
    optimizer: torch.optim.Optimizer
    monitor: TrainingMonitor
    hook_state: Any
    integrity: Any
    tracer: CollectiveTracer
    per_step: list[list[float]]
    device: Any = None  # --device emulated-async: this rank's EmulatedDevice
    rank: int = 0
    step_index: int = 0  # the loop's step, set before each step
    step_times: list[float] = field(default_factory=list)  # wall seconds of each step so far
    hang: Any = None  # --inject-hang: HangInjection
    hang_marker: str = ""
    hang_hook: HangingHook | None = None  # kinds skip and device: the DDP hook that acts
    checkpoint: Any = None  # --inject-checkpoint: CheckpointInjection
    pipeline: Any = None  # --parallel pp: laggard.demo.pipeline.Pipeline
    step_fn: Any = None  # one monitored step (None: train_step, or train_step_async)
    garbage: CyclicGarbage | None = None  # --inject gc=rank:R on rank R
    garbage_from: int = 0  # the first step it builds garbage in (--slow-from)
    tokens: int = 0  # tokens per step (batch x sequence length)
    trace: list[tuple[float, ...]] = field(default_factory=list)  # TRACE_COLUMNS per step
    note_tokens: bool = True  # monitor.note("tokens", ...) each step (tokens=...,note:off: no)


def build_job(args: argparse.Namespace, rank: int) -> Job:
    """The model, DDP with the timing (and optional integrity) hook, FSDP2 or the pipeline
    (``--parallel``), the collective tracer, and the monitor."""
    if args.parallel == "pp":
        from laggard.demo.pipeline import build_pipeline_job

        return build_pipeline_job(args, rank, Job, args.causes, detector_config())
    tokens = next((i for i in args.causes if isinstance(i, TokensInjection)), None)
    seq_len = max_len = 64
    if tokens is not None:
        max_len = tokens.seq_len(seq_len)  # every rank's model the same: room for the longest
        seq_len = max_len if rank == tokens.rank else seq_len
    torch.manual_seed(args.seed)  # same initial weights everywhere (DDP also broadcasts them)
    model = ByteLM(seq_len=max_len)
    batches = ByteBatches(load_stdlib_text(), batch_size=8, seq_len=seq_len,
                          seed=args.seed * 1000 + rank)
    tracer = CollectiveTracer()  # after init_process_group: watches the default group
    ddp, timer, state, integrity, hang_hook = parallelize(model, args, tracer, rank)
    device = None
    extra: dict[str, Any] = {}
    # CPU time of each rank's thread stands in for GPU time: the ranks share this machine's
    # cores (with each other and with whatever else runs), and wall time would mostly measure
    # the scheduler.
    clock = "thread_cpu"
    if args.device == "emulated-async":
        from laggard.demo.emulated_device import EmulatedDevice

        device = EmulatedDevice(f"rank{rank}")
        clock, extra = "device", {"device": device, "model": model}
    monitor = TrainingMonitor(
        TrainingMonitor.Config(agent_address=args.intake_address, window_steps=args.window,
                               integrity=integrity, phase_clock=clock,
                               windows_path=args.windows,
                               straggler=detector_config(), run=args.run_id,
                               **hang_options(args, rank),
                               **node_options(args, rank, dist.get_world_size())),
        comm_timer=timer, tracer=tracer, participants=gpu_state_participants(args), **extra,
    )
    if device is not None and args.parallel == "fsdp":
        from laggard.demo.fsdp import mark_stalls

        mark_stalls(model, monitor.device_clock)
    optimizer = make_optimizer(state, model)
    garbage = (CyclicGarbage() if any(isinstance(i, GcInjection) and i.rank == rank
                                      for i in args.causes) else None)
    return Job(model=model, ddp=ddp, batches=batches, optimizer=optimizer, monitor=monitor,
               hook_state=state, integrity=integrity, tracer=tracer, per_step=[],
               device=device, rank=rank, hang=args.hang, hang_marker=args.hang_marker,
               hang_hook=hang_hook, checkpoint=args.checkpoint, garbage=garbage,
               garbage_from=args.slow_from,
               tokens=8 * seq_len, note_tokens=tokens is None or tokens.noted)


def hang_options(args: argparse.Namespace, rank: int) -> dict[str, Any]:
    """The monitor's hang report on rank 0: ``on_hang`` appends each report to
    ``--hang-report``. Empty when no report is asked for."""
    if not args.hang_report or rank != 0:
        return {}
    open(args.hang_report, "a").close()  # the launcher's sign that hangs are reported
    return {"on_hang": HangReportWriter(args.hang_report)}


def gpu_state_participants(args: argparse.Namespace) -> list[Any]:
    """With ``--gpu-state``, the GPU-state participant: each rank's (fake) GPU's clock-event
    reasons and SM clock in the window record, named in a compute finding."""
    if not args.gpu_state:
        return []
    from laggard.integrations.gpu_state import GpuStateParticipant

    return [GpuStateParticipant(GpuStateParticipant.Config(sample_interval_seconds=0.05))]


def parallelize(model: ByteLM, args: argparse.Namespace, tracer: CollectiveTracer,
                rank: int = 0) -> tuple[Any, CommTimer | None, Any, Any, HangingHook | None]:
    """Wrap the model for ``--parallel``: ``(model to call, CommTimer or None, hook state or
    None, GradientIntegrity or None, the hang hook or None)``. DDP feeds the tracer through its
    timed hook; FSDP2 through its timed all-gather and reduce-scatter. With ``--inject-hang``
    of kind ``skip`` or ``device`` the DDP hook is wrapped in a :class:`HangingHook`."""
    if args.parallel == "fsdp":
        from laggard.demo.fsdp import shard

        shard(model, tracer, prefetch=args.prefetch)
        return model, None, None, None, None
    # Small buckets (the model has ~0.3 M parameters): several all-reduces per step, so
    # communication can overlap backward as in a large job with 25 MB buckets.
    ddp = DistributedDataParallel(model, bucket_cap_mb=BUCKET_CAP_MB)
    timer = StepCommTimer(tracer=tracer)
    state, integrity = integrity_hook(ddp, args.compression, timer, args.inject_bitflip)
    hang_hook = None
    if integrity is None:
        state, hook = comm_hook(args.compression, timer, model)
        if args.hang is not None and args.hang.kind in ("skip", "device"):
            hang_hook = HangingHook(hook, args.hang, rank, args.hang_marker, timer)
            hook = hang_hook.as_hook()
        ddp.register_comm_hook(state, hook)
    return ddp, timer, state, integrity, hang_hook


class StepCommTimer(CommTimer):
    """A :class:`CommTimer` that keeps the last step it summarised (:attr:`last_step`): the
    demo's per-step trace reads the step's exposed collective wait after the monitor took it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.last_step: CommStep | None = None

    def take_step(self) -> CommStep:
        """:meth:`CommTimer.take_step`, kept in :attr:`last_step`."""
        self.last_step = super().take_step()
        return self.last_step


#: What ``_step_comm`` returns, per step.
STEP_COMM = ("allgather_seconds", "reduce_scatter_seconds", "allreduce_seconds",
             "collective_seconds", "exposed_seconds", "hidden_seconds")


def _step_comm(monitor: TrainingMonitor) -> list[float]:
    """The last step's traced collective seconds, in :data:`STEP_COMM` order."""
    trace = monitor.participant("trace")
    t = trace.last_step if trace is not None else None
    if t is None:
        return [0.0] * len(STEP_COMM)
    return [t.op_seconds("allgather"), t.op_seconds("reduce_scatter"),
            t.op_seconds("allreduce"), t.total_seconds, t.exposed_seconds, t.hidden_seconds]


def load_batch(job: Job) -> tuple[torch.Tensor, torch.Tensor]:
    """The step's ``data`` phase: the next batch (or the injected data hang)."""
    with job.monitor.phase("data"):
        _maybe_hang(job, "data")
        return job.batches.next()


def begin_compute(job: Job) -> None:
    """At the start of the step's first compute phase: the injected Python hangs, and the
    injected rank's cyclic garbage (``--inject gc``)."""
    _maybe_hang(job, "python", "spin")
    if job.garbage is not None and job.step_index >= job.garbage_from:
        job.garbage.build()


def size_garbage(job: Job, step_started: float) -> None:
    """After a step that built garbage (``--inject gc``): size the next step's from this step's
    thread CPU time since ``step_started`` (``time.thread_time()``)."""
    if job.garbage is not None and job.step_index >= job.garbage_from:
        job.garbage.end_step(time.thread_time() - step_started)


def end_of_step(job: Job, loss: float) -> None:
    """Inside the step, after its phases: the loss and tokens notes, the injected checkpoint."""
    job.monitor.note("loss", loss)  # inside the step: it belongs to this step's window
    if job.note_tokens:
        job.monitor.note("tokens", float(job.tokens))
    _maybe_checkpoint(job)


def train_step(job: Job) -> float:
    """One monitored training step; returns this rank's loss."""
    monitor, throttle = job.monitor, job.model.throttle
    started = time.thread_time()
    with monitor.step():
        x, y = load_batch(job)
        with monitor.phase("forward"):
            begin_compute(job)
            loss = F.cross_entropy(job.ddp(x).flatten(0, 1), y.flatten())
        with monitor.phase("backward"):
            loss.backward()
        optimizer_started = time.thread_time()
        with monitor.phase("optimizer"):
            if job.integrity is None or job.integrity.end_step(job.ddp):
                job.optimizer.step()
            job.optimizer.zero_grad(set_to_none=True)
        throttle.optimizer_seconds = time.thread_time() - optimizer_started
        value = loss.item()
        end_of_step(job, value)
    size_garbage(job, started)
    job.per_step.append(_step_comm(monitor))
    return value


def _maybe_hang(job: Job, *kinds: str) -> None:
    """Hang here if ``--inject-hang`` names this rank, this step and one of ``kinds``."""
    hang = job.hang
    if (hang is not None and hang.kind in kinds and hang.rank == job.rank
            and hang.step == job.step_index):
        write_marker(job.hang_marker, hang)
        hang_forever(hang.kind)


def _maybe_checkpoint(job: Job) -> None:
    """With ``--inject-checkpoint``, at its step on every rank: a ``checkpoint`` phase inside
    the step, ``factor - 1`` times this rank's median step so far (the step then takes about
    ``factor`` times the usual)."""
    ckpt = job.checkpoint
    if ckpt is None or ckpt.step != job.step_index or not job.step_times:
        return
    usual = float(np.median(job.step_times))
    started = time.perf_counter()
    with job.monitor.phase("checkpoint"):
        checkpoint_save(job.model, (ckpt.factor - 1.0) * usual)
    if job.rank == 0:
        took = time.perf_counter() - started + usual
        print(f"checkpoint: step {ckpt.step} took about {took:.1f} s, {took / usual:.0f}x the "
              f"usual {usual:.3f} s step, on every rank", flush=True)


def train_step_async(job: Job) -> float:
    """One monitored step on the emulated asynchronous device: the loop only launches the
    forward, the backward (DDP's hooks and collectives, or FSDP2's, run on the stream thread
    with it) and the optimizer step, then reads the loss, which waits for all of them, as
    ``loss.item()`` after ``optimizer.step()`` waits for a GPU. The slowed rank's extra work
    runs inside its backward, on the stream thread: the training thread never sees it."""
    monitor, device = job.monitor, job.device
    with monitor.step():
        with monitor.phase("data"):
            _maybe_hang(job, "data")
            x, y = job.batches.next()
        with monitor.phase("forward"):
            _maybe_hang(job, "python", "spin")
            loss = device.launch(_forward, job, x, y)
        with monitor.phase("backward"):
            device.launch(_backward, loss)
        with monitor.phase("optimizer"):
            device.launch(_optimizer_step, job)
        value = loss.item()  # the synchronisation: outside the phases, as in train_step
        monitor.note("loss", value)
        _maybe_checkpoint(job)  # the stream is idle: everything launched has been read back
    job.per_step.append(_step_comm(monitor))
    return float(value)


def _forward(job: Job, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(job.ddp(x).flatten(0, 1), y.flatten())


def _backward(loss: Any) -> None:
    loss.result().backward()


def _optimizer_step(job: Job) -> None:
    started = time.thread_time()  # the stream thread's: where the optimizer runs
    job.optimizer.step()
    job.optimizer.zero_grad(set_to_none=True)
    job.model.throttle.optimizer_seconds = time.thread_time() - started


#: The columns of each step in :attr:`Job.trace`: the step's wall seconds, the training
#: thread's CPU seconds in it, the exposed collective wait (the training thread blocked in
#: collectives, the tracer's), and the seconds the throttle injected (measured as it ran).
TRACE_COLUMNS = ("step_seconds", "cpu_seconds", "exposed_wait_seconds", "injected_seconds")
#: Steps each rank keeps in its trace (the first ones): rank 0 gathers every rank's at the end.
TRACE_MAX_STEPS = 10_000


def trace_step(job: Job, step: int, wall_seconds: float, cpu_seconds: float) -> None:
    """Keep the step's :data:`TRACE_COLUMNS` (the first :data:`TRACE_MAX_STEPS` steps): what
    the report measures each injection by, step by step."""
    injected = job.model.throttle.take_step_injected()
    if step >= TRACE_MAX_STEPS:
        return
    # DDP: the timing hook's step (the monitor's collective wait); FSDP2 and pipelines: the
    # tracer's (their collectives are timed there)
    comm = getattr(job.monitor.comm_timer, "last_step", None)
    wait = (comm.exposed_seconds if comm is not None else
            job.per_step[-1][STEP_COMM.index("exposed_seconds")] if job.per_step else 0.0)
    job.trace.append((wall_seconds, cpu_seconds, wait, injected))


def run_steps(job: Job, args: argparse.Namespace, rank: int) -> tuple[dict[int, float],
                                                                       list[float]]:
    """Train ``args.steps`` steps, this rank slowed at the steps its :func:`slow_schedule` says;
    rank 0 prints progress. Returns (mean loss over ranks at the first and last step,
    this rank's per-step losses)."""
    schedule = slow_schedule(args, dist.get_world_size())
    throttle = job.model.throttle
    losses: dict[int, float] = {}
    local_losses: list[float] = []
    step_times: list[float] = []
    for step in range(args.steps):
        throttle.factor = schedule.extra(rank, step)
        stall = schedule.stall(rank, step)
        throttle.stall_seconds = stall.seconds if stall is not None else 0.0
        throttle.stall_mode = stall.mode if stall is not None else "compute"
        job.step_index = step
        if job.hang_hook is not None:
            job.hang_hook.step = step
        start, cpu_start = time.perf_counter(), time.thread_time()
        step_fn = job.step_fn or (train_step if job.device is None else train_step_async)
        loss = step_fn(job)
        step_times.append(time.perf_counter() - start)
        job.step_times.append(step_times[-1])
        trace_step(job, step, step_times[-1], time.thread_time() - cpu_start)
        local_losses.append(loss)
        if step == 0 or step == args.steps - 1:
            losses[step] = global_mean(loss)  # same call on every rank
        if rank == 0 and (step % args.print_every == 0 or step == args.steps - 1):
            recent = step_times[-args.print_every:]
            print(f"step {step:5d}/{args.steps}  loss {loss:6.3f}  "
                  f"step {1e3 * float(np.median(recent)):6.1f} ms", flush=True)
    return losses, local_losses


def train(args: argparse.Namespace) -> dict[str, Any]:
    """Build the job, train it, and return what rank 0 writes to ``--result``."""
    rank, world = dist.get_rank(), dist.get_world_size()
    job = build_job(args, rank)
    losses, local_losses = run_steps(job, args, rank)
    if job.device is not None:
        job.device.synchronize()
    job.monitor.close()
    if job.garbage is not None:
        job.garbage.close()
    if job.pipeline is not None:
        job.pipeline.handle.undo()
    if job.hook_state is not None:
        job.hook_state.close()  # a two-stage hook's worker thread and second group
    if job.device is not None:
        job.device.close()
    injected = job.model.throttle.injected_seconds
    collected = job.garbage.gc_seconds if job.garbage is not None else []
    injected_t = torch.tensor([float(np.median(injected)) if injected else 0.0,
                               float(np.median(collected)) if collected else 0.0])
    dist.all_reduce(injected_t, op=dist.ReduceOp.MAX)  # only the slowed rank injects
    tail = local_losses[-args.window:]
    loss = {"first": losses.get(0), "last": losses.get(args.steps - 1),
            "last_window_mean": global_mean(sum(tail) / len(tail))}
    result = result_of(job, args, world, loss, float(injected_t[0]))
    traces: list[Any] = [None] * world
    dist.all_gather_object(traces, job.trace)  # same call on every rank
    # every rank's steps (TRACE_COLUMNS): the report measures each injection on its own steps
    result["step_trace"] = {"columns": list(TRACE_COLUMNS), "ranks": traces}
    result["nodes"] = args.nodes
    # each rank's node as rank 0's gathered windows carry it (what the detectors see)
    last = job.monitor.windows[-1] if job.monitor.windows else None
    result["rank_nodes"] = list(last.nodes) if last is not None and last.nodes else []
    # --inject gc: the injected rank's collector seconds per step (its own gc.callbacks)
    result["injected_gc_seconds_per_step"] = float(injected_t[1])
    return result


def result_of(job: Job, args: argparse.Namespace, world: int, loss: dict[str, Any],
              injected_seconds: float) -> dict[str, Any]:
    """Rank 0's result document: the gathered windows, findings, losses and counters."""
    monitor, integrity = job.monitor, job.integrity
    # a pipeline stage all-reduces its own stage's gradients, over its data-parallel group
    params = job.ddp.parameters() if job.pipeline is not None else job.model.parameters()
    grad_bytes = 4 * sum(p.numel() for p in params)
    dp_world = job.pipeline.dp_size if job.pipeline is not None else world
    names = list(monitor.windows[0].columns) if monitor.windows else list(STEP_COLUMN_NAMES)
    return {
        "rank": dist.get_rank(),
        "world_size": world,
        "steps": args.steps,
        "window": args.window,
        "injected_extra_seconds_per_step": injected_seconds,
        "loss": loss,
        # what an fp32 ring all-reduce of the gradients sends per rank per step
        "fp32_allreduce_bytes": ring_allreduce_bytes(grad_bytes, dp_world),
        "stat_names": names,
        "windows": [{"step": w.step, "medians": _json_floats(w.table(names).tolist())}
                    for w in monitor.windows],
        # the monitor's findings hold the integrity findings of its windows; a standalone
        # integrity gather (skip_step) finds its own
        "findings": [f.to_dict() for f in monitor.findings]
        + [f.to_dict() for f in (integrity.findings if integrity is not None else [])
           if f not in monitor.findings],
        "cleared": [f.to_dict() for f in monitor.cleared],
        "parallel": args.parallel, "prefetch": args.prefetch,
        "peer_groups": peer_groups_doc(job),
        "injections": [i.spec() for i in args.causes],
        "device": args.device,
        "phase_clock": monitor.phase_clock,
        "device_clock": (job.device.default_stream().clock if job.device is not None
                         else None),
        # per step after --slow-from (all steps when it is 0): median seconds of each
        "step_comm": dict(zip(STEP_COMM, np.median(np.array(
            job.per_step[args.slow_from:] or job.per_step), axis=0).tolist(), strict=True)),
        "tracer": dict(job.tracer.stats),
        "monitor": {
            "records_sent": monitor.stats.records_sent,
            "send_dropped": monitor.stats.send_dropped,
            "send_errors": monitor.stats.send_errors,
            "windows": monitor.stats.windows,
            "internal_errors": monitor.stats.internal_errors,
            # windows that could not be appended to --windows, and the first error
            "save_errors": monitor.stats.save_errors,
            "save_error": monitor.save_error,
        },
    }


def peer_groups_doc(job: Job) -> dict[str, Any]:
    """The monitor's peer groups: ``groups``, ``names``, ``stages``, ``source``."""
    groups = job.monitor.peer_groups
    return {"groups": [list(g) for g in groups.groups], "names": list(groups.names),
            "stages": list(groups.stages), "source": groups.source}


def _json_floats(rows: list[list[float]]) -> list[list[float | None]]:
    return [[v if math.isfinite(v) else None for v in row] for row in rows]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s", stream=sys.stdout)
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    try:
        result = train(args)
        # DDP's reducer holds the process group through reference cycles: free it now rather
        # than during interpreter shutdown.
        gc.collect()
        # Every rank past its last step before rank 0 declares the run complete and before any
        # rank tears down: gloo aborts a rank whose peer vanished mid-collective.
        dist.barrier()
        if dist.get_rank() == 0 and args.result:
            tmp = f"{args.result}.tmp"
            with open(tmp, "w") as f:
                json.dump(result, f)
            os.replace(tmp, args.result)
    finally:
        dist.destroy_process_group()
    # Everything is written and torn down: leave without C++ static destructors. gloo's
    # transport threads can still be alive then, and a rank aborts now and then with "terminate
    # called without an active exception" (1 run in 6 here under load) after a complete run.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
