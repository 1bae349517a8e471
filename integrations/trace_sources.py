"""Sources that feed a :class:`~laggard.integrations.tracer.CollectiveTracer`, chosen per backend.

============================  ==========  ====================================================
source                        backend     what it measures, and its cost
============================  ==========  ====================================================
:func:`instrument_fsdp`       any         FSDP2's all-gather and reduce-scatter, issue to
                                          completion. CPU tensors: a synchronous call is timed
                                          around the call (two ``perf_counter`` calls), an
                                          async one (``Work``) by its future. CUDA tensors:
                                          pooled timing events on the stream the call runs on
                                          (FSDP2's all-gather / reduce-scatter stream), before
                                          and after the call or in the future's ``then()``,
                                          read without blocking at a later step.
``CommTimer(tracer=...)``     any         DDP gradient buckets, launch to completion
                                          (:mod:`~laggard.integrations.comm_timing`).
:func:`instrument_pipeline`   any         ``torch.distributed.pipelining`` schedules: each
                                          send and receive per peer (``track(..., peer=)``),
                                          and the training thread's block in the schedules'
                                          waits as exposed P2P wait per peer. gloo's P2P
                                          ``Work`` has no future: an op completes when the
                                          schedule's wait returns (or is seen completed at the
                                          next step). Costs two ``perf_counter`` calls per
                                          wait and a dict entry per op.
``CollectiveTracer.track``    any         any ``async_op=True`` collective. gloo on CPU
                                          tensors: by its future (done when the collective
                                          is). NCCL or CUDA tensors: the future is done at
                                          *enqueue*, so by two pooled events (issue, and the
                                          ``then()`` callback's stream, which waited for the
                                          collective), every ``device_sample_every``-th.
:class:`NcclCompletionHook`   NCCL        ``ProcessGroup._register_on_completion_hook``: NCCL's
                                          own CUDA-event duration per collective, on its own
                                          ``pt_nccl_runhook`` thread. Needs
                                          ``TORCH_NCCL_ENABLE_TIMING=1`` (two more CUDA events
                                          around every collective of the job; breaks overlap
                                          with ``CUDA_DEVICE_MAX_CONNECTIONS=1``,
                                          pytorch#143890), so opt-in; registration raises
                                          without it and newer torch warns it is deprecated
                                          for the flight recorder: both counted, never raised.
:class:`FlightRecorderReader` NCCL, gloo  the in-process flight recorder
                                          (``TORCH_FR_BUFFER_SIZE=N``), read every
                                          ``interval_s`` on its own thread, never the training
                                          thread. NCCL with timing fills start and completion
                                          times; without ``TORCH_NCCL_ENABLE_TIMING`` the start
                                          is ``null`` and there is no ``duration_ms``: entries
                                          are counted and sized (``untimed``), not timed. gloo
                                          records only ``time_created_ns`` (state stays
                                          ``scheduled``): good for counting and sizing what a
                                          group issued and for its enqueue cadence, not for
                                          durations, so on gloo it only counts.
============================  ==========  ====================================================

:func:`attach` picks for each watched group what its backend supports and says what it chose.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from laggard.integrations.tracer import CollectiveTracer, GroupInfo

log = logging.getLogger(__name__)

#: Flight-recorder ``profiling_name`` suffix -> tracer op.
_FR_OPS = {"all_reduce": "allreduce", "allreduce": "allreduce", "_allgather_base": "allgather",
           "all_gather": "allgather", "allgather": "allgather",
           "all_gather_into_tensor_coalesced": "allgather",
           "_reduce_scatter_base": "reduce_scatter", "reduce_scatter": "reduce_scatter",
           "reduce_scatter_tensor_coalesced": "reduce_scatter", "broadcast": "broadcast",
           "all_to_all": "alltoall", "alltoallbase": "alltoall", "barrier": "barrier"}
#: Bytes per element of the flight recorder's dtype names.
_DTYPE_BYTES = {"Float": 4, "Half": 2, "BFloat16": 2, "Double": 8, "Long": 8, "Int": 4,
                "Byte": 1, "Char": 1, "Bool": 1, "Short": 2, "Float8_e4m3fn": 1,
                "Float8_e5m2": 1}


def wire_bytes(op: str, nbytes: int, world_size: int) -> int:
    """Bytes one rank sends under the op's bandwidth-optimal algorithm.

    Args:
        op: ``allreduce`` (ring: ``2 (W-1)/W n``), ``allgather`` (``n`` = the rank's own input:
            ``(W-1) n``), ``reduce_scatter`` (``n`` = the full input: ``(W-1)/W n``),
            ``alltoall`` (``(W-1)/W n``), anything else: ``n``.
        nbytes: bytes of the tensor as described for each op.
        world_size: ranks in the group.

    Source: Thakur, Rabenseifner & Gropp, "Optimization of Collective Communication Operations
    in MPICH", IJHPCA 2005 (ring all-gather / reduce-scatter; all-reduce = both).
    """
    w = max(1, world_size)
    if op == "allreduce":
        return 2 * (w - 1) * nbytes // w
    if op == "allgather":
        return (w - 1) * nbytes
    if op in ("reduce_scatter", "alltoall"):
        return (w - 1) * nbytes // w
    return nbytes


def _tensor_bytes(tensor: torch.Tensor) -> int:
    return int(tensor.numel() * tensor.element_size())


# ---------------------------------------------------------------------------------- FSDP2
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
            nbytes = wire_bytes("allgather", _tensor_bytes(input_tensor), group.size())
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
            nbytes = wire_bytes("reduce_scatter", _tensor_bytes(input_tensor), group.size())
            if async_op:
                work = self.inner(output_tensor, input_tensor, group, op, async_op)
                return self.tracer.track(work, "reduce_scatter", group, nbytes,
                                         tensor=input_tensor)
            with self.tracer.timed("reduce_scatter", group, nbytes, tensor=input_tensor):
                return self.inner(output_tensor, input_tensor, group, op, async_op)

    return TimedAllGather, TimedReduceScatter


# ----------------------------------------------------------------------------- pipelining
#: The module globals of ``torch.distributed.pipelining.schedules`` that every schedule looks up
#: at call time for its point-to-point ops (torch 2.4 to 2.13 at least): issue a batch, wait.
PIPELINE_FUNCTIONS = ("_batch_p2p", "_wait_batch_p2p")


class PipelineInstrumentation:
    """What :func:`instrument_pipeline` did; :meth:`undo` puts torch's functions back.

    Attributes:
        installed: the schedules' P2P functions are wrapped (by this or an earlier call for
            the same tracer); False when this torch has no such functions (counted, logged).
        tracer: the tracer the wrappers feed.
    """

    def __init__(self, tracer: CollectiveTracer, module: Any = None,
                 wrappers: tuple[Any, Any] | None = None) -> None:
        self.tracer, self._module, self._wrappers = tracer, module, wrappers

    @property
    def installed(self) -> bool:
        module, wrappers = self._module, self._wrappers
        return bool(module is not None and wrappers is not None and tuple(
            getattr(module, n, None) for n in PIPELINE_FUNCTIONS) == wrappers)

    def __bool__(self) -> bool:
        return self.installed

    def undo(self) -> bool:
        """Restore torch's own ``_batch_p2p`` / ``_wait_batch_p2p``; True when restored.

        Only wrappers that are still in place are taken out (a later
        :func:`instrument_pipeline` for another tracer replaced them: that one's handle undoes
        its own). Never raises."""
        if not self.installed:
            return False
        for name, wrapper in zip(PIPELINE_FUNCTIONS, self._wrappers or (), strict=True):
            setattr(self._module, name, wrapper.__wrapped__)
        return True


def instrument_pipeline(tracer: CollectiveTracer) -> PipelineInstrumentation:
    """Time every send and receive of ``torch.distributed.pipelining``'s schedules, per peer.

    Wraps the schedules module's ``_batch_p2p`` (issues one batch of ``P2POp``: each returned
    ``Work`` is tracked with ``tracer.track(work, "send" | "recv", group, nbytes, peer=GLOBAL
    PEER)``) and ``_wait_batch_p2p`` (the training thread's wait for them: timed with
    :meth:`~laggard.integrations.tracer.CollectiveTracer.p2p_wait`, the exposed P2P wait of the
    peer the batch is for). Every schedule (``Schedule1F1B``, ``ScheduleGPipe``, the
    interleaved and runtime ones) looks both up as module globals at call time, so a schedule
    built before or after this call is traced alike. The wrappers call torch's functions
    unchanged: training is the same. Call after the tracer (which must already watch the
    pipeline's process group), any time before the first ``schedule.step()``.

    Idempotent (a second call for the same tracer changes nothing; for another tracer, the
    new one replaces the old, wrapping torch's originals again, never a wrapper) and undone by
    the returned handle's ``undo()``. On NCCL the waits return at enqueue: the exposed wait is
    then the CPU's (the launch), and the ops are timed on the device by ``track``.

    Args:
        tracer: where the timings go; its groups must include the pipeline's group.

    Returns:
        A :class:`PipelineInstrumentation` (true when installed). A torch without these private
        functions (another version) gets nothing wrapped: counted in ``tracer.stats["errors"]``
        and logged once; a batch whose ops or works the wrapper cannot read is issued and waited
        for as usual, untracked, counted in ``tracer.stats["p2p_unmapped"]``. Never raises.
    """
    try:
        from torch.distributed.pipelining import schedules
    except Exception as exc:  # noqa: BLE001 - no pipelining in this torch
        tracer._count("errors", "pipeline_import", "laggard: torch.distributed.pipelining is "
                      "not importable (%r); pipeline send/recv not traced", exc)
        return PipelineInstrumentation(tracer)
    current = [getattr(schedules, name, None) for name in PIPELINE_FUNCTIONS]
    if not all(callable(f) for f in current):
        tracer._count("errors", "pipeline_api", "laggard: this torch's pipelining schedules "
                      "have no %s; pipeline send/recv not traced", " and ".join(
                          n for n, f in zip(PIPELINE_FUNCTIONS, current, strict=True)
                          if not callable(f)))
        return PipelineInstrumentation(tracer)
    if all(getattr(f, "_laggard_tracer", None) is tracer for f in current):
        return PipelineInstrumentation(tracer, schedules, (current[0], current[1]))
    batch, wait = (getattr(f, "__wrapped__", f) if hasattr(f, "_laggard_tracer") else f
                   for f in current)
    wrappers = (_traced_batch(batch, tracer), _traced_wait(wait, tracer))
    for name, wrapper in zip(PIPELINE_FUNCTIONS, wrappers, strict=True):
        setattr(schedules, name, wrapper)
    return PipelineInstrumentation(tracer, schedules, wrappers)


def _traced_batch(original: Callable[..., Any], tracer: CollectiveTracer) -> Callable[..., Any]:
    """``_batch_p2p`` that tracks each returned work per peer."""
    import functools

    @functools.wraps(original)
    def batch_p2p(*args: Any, **kwargs: Any) -> Any:
        works = original(*args, **kwargs)
        try:
            ops = args[0] if args else kwargs.get("p2p_ops", ())
            track_p2p_ops(tracer, list(ops), works)
        except Exception as exc:  # noqa: BLE001 - never raise into the schedule
            tracer._count("p2p_unmapped", "pipeline_track", "laggard: cannot track a "
                          "pipeline P2P batch (%r); its ops are not traced", exc)
        return works

    batch_p2p._laggard_tracer = tracer  # type: ignore[attr-defined]
    return batch_p2p


def _traced_wait(original: Callable[..., Any], tracer: CollectiveTracer) -> Callable[..., Any]:
    """``_wait_batch_p2p`` whose block is the exposed P2P wait of the works' peer."""
    import functools

    @functools.wraps(original)
    def wait_batch_p2p(*args: Any, **kwargs: Any) -> Any:
        works = args[0] if args else kwargs.get("work", ())
        try:
            waited = list(works) if isinstance(works, (list, tuple)) else []
        except Exception:  # noqa: BLE001
            waited = []
        with tracer.p2p_wait(waited):
            return original(*args, **kwargs)

    wait_batch_p2p._laggard_tracer = tracer  # type: ignore[attr-defined]
    return wait_batch_p2p


def track_p2p_ops(tracer: CollectiveTracer, ops: list[Any], works: Any) -> int:
    """Track the works of one batch of ``torch.distributed.P2POp`` (what ``_batch_p2p`` or
    ``batch_isend_irecv`` returned for ``ops``); returns the works tracked.

    One work per op (gloo, and homogeneous batches on any backend): each is tracked as its op's
    ``send`` / ``recv`` with the op's peer (``P2POp.peer``, a global rank) and bytes. One work
    for a coalesced batch (NCCL's ``batch_isend_irecv``): tracked once, ``recv`` when the batch
    receives anything (the wait is for the data), the bytes summed, the peer the ops share
    (None if they do not). Anything else is counted in ``tracer.stats["p2p_unmapped"]``.
    """
    if not works or not ops:
        return 0
    works = list(works)
    described = []
    for op in ops:
        name = str(getattr(getattr(op, "op", None), "__name__", ""))
        kind = "send" if "send" in name else "recv" if "recv" in name else None
        tensor = getattr(op, "tensor", None)
        if kind is None or tensor is None:
            tracer._count("p2p_unmapped", "pipeline_op", "laggard: a pipeline P2P op of an "
                          "unknown kind (%r) is not traced", op)
            return 0
        described.append((kind, getattr(op, "group", None), _tensor_bytes(tensor),
                          getattr(op, "peer", None), tensor))
    if len(works) == len(described):
        for work, (kind, group, nbytes, peer, tensor) in zip(works, described, strict=True):
            tracer.track(work, kind, group, nbytes, tensor=tensor, peer=peer)
        return len(works)
    if len(works) == 1:
        kinds = {d[0] for d in described}
        peers = {d[3] for d in described}
        tracer.track(works[0], "recv" if "recv" in kinds else "send", described[0][1],
                     sum(d[2] for d in described), tensor=described[0][4],
                     peer=peers.pop() if len(peers) == 1 else None)
        return 1
    tracer._count("p2p_unmapped", "pipeline_works", "laggard: a pipeline P2P batch of %d ops "
                  "returned %d works; not traced", len(described), len(works))
    return 0


# ----------------------------------------------------------------------------------- NCCL
class NcclCompletionHook:
    """Feeds a tracer from ``ProcessGroup._register_on_completion_hook`` (NCCL only, opt-in).

    ProcessGroupNCCL calls the hook once per completed collective, on a thread of its own
    (``pt_nccl_runhook``; not the watchdog, not the training thread), with a ``WorkInfo``:
    ``op_type``, ``seq``, ``time_started`` / ``time_finished`` (host clock) and
    ``active_duration`` (CUDA-event time of the collective's kernel; it includes the kernel's
    wait for the last peer). The tracer gets ``active_duration`` when it is non-zero, else
    finish minus start; no bytes (WorkInfo has none: pair with the flight recorder for sizes).

    Registration raises unless NCCL timing is on (``TORCH_NCCL_ENABLE_TIMING=1``), and newer
    torch builds warn that the hook is being deprecated in favour of the flight recorder; both
    are counted and logged once by :meth:`register`, never raised. Cost, and why it is opt-in:
    ``TORCH_NCCL_ENABLE_TIMING=1`` records two more CUDA events around every collective of the
    job (not only the traced ones), and with ``CUDA_DEVICE_MAX_CONNECTIONS=1`` (Megatron-LM's
    setting for tensor-parallel overlap) it breaks compute/communication overlap
    (pytorch#143890). Without it, :meth:`CollectiveTracer.track` and FSDP2's comms are timed
    by laggard's own sampled events instead.

    Args:
        tracer: where the timings go.
        info: the watched group.
    """

    def __init__(self, tracer: CollectiveTracer, info: GroupInfo) -> None:
        self.tracer, self.info = tracer, info

    def register(self, pg: Any) -> bool:
        """Register on ``pg``.

        Returns:
            True when registered. False when the backend refused (gloo, old torch, NCCL timing
            off: counted in ``tracer.stats["unknown_backend"]``, logged once). A deprecation
            warning the registration raises is caught, counted once in
            ``tracer.stats["errors"]`` and logged once; the hook stays registered. Never raises.
        """
        import warnings

        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                pg._register_on_completion_hook(self)
        except Exception as exc:  # noqa: BLE001 - gloo, old torch, timing off raise here
            self.tracer._count("unknown_backend", "completion_hook", "laggard: completion "
                               "hook refused by group %s (%r); set TORCH_NCCL_ENABLE_TIMING=1 "
                               "to use it, or leave it to laggard's own events", self.info.label,
                               exc)
            return False
        for warning in caught:
            self.tracer._count("errors", "completion_hook_warning", "laggard: registering the "
                               "NCCL completion hook warned (%s); it is kept, the flight "
                               "recorder and laggard's own events are the lasting sources",
                               warning.message)
            break
        return True

    def __call__(self, work_info: Any) -> None:
        try:
            seconds = _seconds(getattr(work_info, "active_duration", 0))
            if seconds <= 0:
                seconds = max(0.0, _seconds(work_info.time_finished)
                              - _seconds(work_info.time_started))
            end = time.perf_counter()
            op = _op_name(str(work_info.op_type))
            self.tracer.record(op, None, end - seconds, end, 0, index=self.info.index)
        except Exception as exc:  # noqa: BLE001 - never raise into NCCL's hook thread
            self.tracer._count("errors", "completion_hook_call", "laggard: completion hook "
                               "failed (%r)", exc)


def _seconds(value: Any) -> float:
    """A ``datetime.timedelta``, a ``datetime`` or a number of seconds -> float seconds."""
    if hasattr(value, "total_seconds"):
        return float(value.total_seconds())
    if hasattr(value, "timestamp"):
        return float(value.timestamp())
    return float(value)


def _op_name(op_type: str) -> str:
    """``OpType.ALLREDUCE`` / ``nccl:all_reduce`` -> ``allreduce``."""
    name = op_type.rsplit(".", 1)[-1].rsplit(":", 1)[-1].lower()
    return _FR_OPS.get(name, name.replace("_", ""))


class FlightRecorderReader:
    """Reads the in-process flight recorder incrementally, on its own thread.

    Every ``interval_s`` it dumps the recorder (``_dump_fr_trace_json``; a copy of a ring of
    ``TORCH_FR_BUFFER_SIZE`` entries, no collective is stopped), and hands the tracer each entry
    completed since the last read: op, group, bytes from ``input_sizes`` and ``input_dtypes``,
    and the duration from ``duration_ms`` or completed minus started (NCCL with
    ``TORCH_NCCL_ENABLE_TIMING=1``). Without NCCL timing the recorder writes
    ``time_discovered_started_ns: null`` and no ``duration_ms``: such an entry is counted in
    :attr:`untimed` and sized in :attr:`untimed_bytes` (and ``tracer.stats["untimed"]``, logged
    once), never timed. gloo entries never complete in the recorder: they are counted in
    :attr:`seen` and not timed. An entry left uncompleted for ``stall_seconds`` is given up
    (``never_completed``).

    Args:
        tracer: where the timings go.
        interval_s: seconds between reads.
        dump: returns the recorder's JSON text; defaults to torch's
            ``_dump_fr_trace_json(includeCollectives=True, onlyActive=False)`` (a fake in tests).
    """

    def __init__(self, tracer: CollectiveTracer, *, interval_s: float = 1.0,
                 dump: Callable[[], str] | None = None) -> None:
        self.tracer = tracer
        self.interval_s = interval_s
        self._dump = dump if dump is not None else _torch_fr_dump
        self._next_id = 0  # first record_id not yet handed over
        self.seen = 0
        self.untimed = 0
        self.untimed_bytes = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._by_name = {g.name: g for g in tracer.groups}

    def start(self) -> FlightRecorderReader:
        """Start the reader thread (daemon); returns self."""
        self._thread = threading.Thread(target=self._run, name="laggard-fr", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the thread after one last read."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.poll()
        self.poll()

    def poll(self) -> int:
        """One read; returns the entries handed to the tracer. Never raises."""
        try:
            entries = json.loads(self._dump()).get("entries", [])
        except Exception as exc:  # noqa: BLE001
            self.tracer._count("errors", "fr_dump", "laggard: flight recorder read failed "
                               "(%r)", exc)
            return 0
        handed = 0
        now_ns = time.time_ns()
        stall_ns = int(self.tracer.config.stall_seconds * 1e9)
        for entry in sorted(entries, key=lambda e: e.get("record_id", -1)):
            rid = entry.get("record_id", -1)
            if not isinstance(rid, int) or rid < self._next_id:
                continue
            if entry.get("state") != "completed":
                if now_ns - int(entry.get("time_created_ns", now_ns)) > stall_ns:
                    self.tracer.stats["never_completed"] += 1
                    self._next_id = rid + 1
                    continue
                break  # in order: wait for it (gloo stops here: its entries never complete)
            self._next_id = rid + 1
            handed += self._hand_over(entry)
        self.seen += sum(1 for e in entries if isinstance(e.get("record_id"), int))
        return handed

    def _hand_over(self, entry: dict[str, Any]) -> int:
        group = entry.get("process_group") or ["", ""]
        info = self._by_name.get(str(group[0]))
        if info is None:
            self.tracer._count("unknown_group", "fr_group", "laggard: flight recorder entry of "
                               "an unwatched group %r skipped", group)
            return 0
        op = _op_name(str(entry.get("profiling_name", "")))
        seconds = _entry_seconds(entry)
        raw = 0
        for size, dtype in zip(entry.get("input_sizes", []), entry.get("input_dtypes", []),
                               strict=False):
            numel = 1
            for dim in size:
                numel *= int(dim)
            raw += numel * _DTYPE_BYTES.get(str(dtype), 4)
        nbytes = wire_bytes(op, raw, len(info.ranks))
        if seconds is None:
            # NCCL without TORCH_NCCL_ENABLE_TIMING: no start, no duration. Counted and sized,
            # never timed (completed - 0 would be ~1.7e9 s, the epoch).
            self.untimed += 1
            self.untimed_bytes += nbytes
            self.tracer._count("untimed", "fr_untimed", "laggard: flight-recorder entries have "
                               "no start time (TORCH_NCCL_ENABLE_TIMING is off): counted and "
                               "sized, not timed")
            return 0
        end = time.perf_counter()
        self.tracer.record(op, None, end - seconds, end, nbytes, index=info.index)
        return 1


def _entry_seconds(entry: dict[str, Any]) -> float | None:
    """A completed flight-recorder entry's duration, seconds; None when it has none.

    ``duration_ms`` (CUDA-event time, only with ``TORCH_NCCL_ENABLE_TIMING=1``) first, else
    ``time_discovered_completed_ns - time_discovered_started_ns`` when both are set and ordered.
    Without timing the recorder writes ``time_discovered_started_ns: null`` (0 in some builds)
    and no ``duration_ms``: None, never ``completed - 0``.
    """
    duration_ms = entry.get("duration_ms")
    if duration_ms is not None:
        try:
            value = float(duration_ms)
        except (TypeError, ValueError):
            return None
        return value / 1e3 if value >= 0 and value == value else None
    try:
        started = int(entry.get("time_discovered_started_ns") or 0)
        completed = int(entry.get("time_discovered_completed_ns") or 0)
    except (TypeError, ValueError):
        return None
    if started <= 0 or completed < started:
        return None
    return (completed - started) / 1e9


def _torch_fr_dump() -> str:
    import torch

    return str(torch._C._distributed_c10d._dump_fr_trace_json(
        includeCollectives=True, onlyActive=False))


# ------------------------------------------------------------------------- the chooser
def attach(tracer: CollectiveTracer, *, env: dict[str, str] | None = None,
           groups: list[Any] | None = None) -> list[str]:
    """Attach the backend-side sources each watched group's backend supports.

    NCCL groups get the completion hook when ``TORCH_NCCL_ENABLE_TIMING=1`` (opt-in: it costs
    overlap, pytorch#143890), else the flight-recorder reader when ``TORCH_FR_BUFFER_SIZE`` > 0,
    else nothing backend-side (the Python-side sources still time what they wrap, on the device
    by laggard's own sampled events). gloo groups need nothing here: their collectives are timed
    by the Python-side sources. Unknown backends are counted.

    Args:
        tracer: the tracer whose groups to attach to.
        env: environment to read (default ``os.environ``).
        groups: the process-group objects in ``tracer.groups`` order (default: the tracer's).

    Returns:
        One line per group saying which source it got, for the job's log.
    """
    env = dict(os.environ if env is None else env)
    objects = groups if groups is not None else tracer._keep
    lines, reader_needed = [], False
    for info, pg in zip(tracer.groups, objects, strict=False):
        if "nccl" in info.backend:
            if env.get("TORCH_NCCL_ENABLE_TIMING") == "1" and NcclCompletionHook(
                    tracer, info).register(pg):
                lines.append(f"{info.label} nccl: completion hook (CUDA-event timing)")
            elif int(env.get("TORCH_FR_BUFFER_SIZE", "0") or 0) > 0:
                reader_needed = True
                lines.append(f"{info.label} nccl: flight recorder, read off the training thread"
                             + ("" if env.get("TORCH_NCCL_ENABLE_TIMING") == "1" else
                                " (no start times without TORCH_NCCL_ENABLE_TIMING=1: counts "
                                "and sizes only)"))
            else:
                lines.append(f"{info.label} nccl: Python-side sources only, timed by "
                             "laggard's sampled device events (TORCH_NCCL_ENABLE_TIMING=1 adds "
                             "the completion hook, TORCH_FR_BUFFER_SIZE the flight recorder)")
        elif info.backend == "gloo":
            lines.append(f"{info.label} gloo: Python-side sources (FSDP comms, DDP hook, "
                         "Work futures)")
        else:
            lines.append(f"{info.label} {info.backend}: no source")
    if reader_needed:
        tracer._fr_reader = FlightRecorderReader(tracer).start()  # type: ignore[attr-defined]
    return lines


__all__ = ["PIPELINE_FUNCTIONS", "FlightRecorderReader", "NcclCompletionHook",
           "PipelineInstrumentation", "attach", "instrument_fsdp", "instrument_pipeline",
           "track_p2p_ops", "wire_bytes"]
