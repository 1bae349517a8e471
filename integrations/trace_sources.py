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

**Entry points** (what a training job imports, from here or from :mod:`laggard.integrations`):
:func:`attach` (defined here), :func:`instrument_fsdp` and :func:`instrument_pipeline`. Each
source lives in a module of its own: :mod:`laggard.integrations.fsdp_trace`,
:mod:`laggard.integrations.pipeline_trace` (with ``track_p2p_ops`` for a job's own
``batch_isend_irecv``), :mod:`laggard.integrations.nccl_completion`
(:class:`~laggard.integrations.nccl_completion.NcclCompletionHook`),
:mod:`laggard.integrations.flight_recorder_source`
(:class:`~laggard.integrations.flight_recorder_source.FlightRecorderReader`); the op names and
bytes on the wire they share are :mod:`laggard.integrations.trace_ops`'s.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from laggard.integrations.flight_recorder_source import FlightRecorderReader
from laggard.integrations.fsdp_trace import instrument_fsdp
from laggard.integrations.nccl_completion import NcclCompletionHook
from laggard.integrations.pipeline_trace import instrument_pipeline

if TYPE_CHECKING:
    from laggard.integrations.tracer import CollectiveTracer


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


#: The entry points a training job calls: :func:`attach` (defined here), :func:`instrument_fsdp`
#: (:mod:`laggard.integrations.fsdp_trace`), :func:`instrument_pipeline`
#: (:mod:`laggard.integrations.pipeline_trace`).
__all__ = ["attach", "instrument_fsdp", "instrument_pipeline"]
