"""NCCL's own per-collective timing through ``ProcessGroup._register_on_completion_hook``,
handed to a :class:`~laggard.integrations.tracer.CollectiveTracer` (NCCL only, opt-in).

:func:`laggard.integrations.trace_sources.attach` registers it on each NCCL group when
``TORCH_NCCL_ENABLE_TIMING=1``.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from laggard.integrations.trace_ops import op_name

if TYPE_CHECKING:
    from laggard.integrations.trace_records import GroupInfo
    from laggard.integrations.tracer import CollectiveTracer


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
            op = op_name(str(work_info.op_type))
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


__all__ = ["NcclCompletionHook"]
