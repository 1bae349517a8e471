"""Where a rank is and what it times on: its place in the job, its device, and the phase clock.

What :class:`~laggard.integrations.monitor.TrainingMonitor` finds out once, at construction:
the rank, world size and local rank (from ``torch.distributed``, else the launcher's
environment), this rank's CUDA identity for the agent's ``laggard_rank_info``, and which clock
times the phases (``MonitorConfig.phase_clock``, ``"auto"`` resolved; docs/gpu.md says what
each clock measures on a GPU). Nothing here raises: a device clock that cannot start is refused
with a reason and the wall clock is used.
"""

from __future__ import annotations

import itertools
import os
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from laggard.integrations.run_identity import device_identity

#: ``MonitorConfig.phase_clock`` (resolved) -> clock of the phase timers, in seconds (the
#: device clock keeps the wall clock beside its events).
PHASE_CLOCKS: dict[str, Callable[[], float]] = {
    "wall": time.perf_counter,
    "thread_cpu": time.thread_time,
    "device": time.perf_counter,
}
#: Backends whose collectives the device clock's markers are known to order on the stream.
DEVICE_BACKENDS = frozenset({"nccl", "gloo"})


@dataclass(slots=True)
class PhaseClock:
    """The resolved phase clock.

    Attributes:
        name: ``"wall"``, ``"thread_cpu"`` or ``"device"``.
        device_clock: the :class:`~laggard.integrations.device_clock.DeviceClock` on the
            device clock, else None.
        fsdp_markers: the installed FSDP2 stall markers on the device clock with FSDP2 loaded
            (:class:`~laggard.integrations.fsdp_device.FsdpStallMarkers`), else None.
        refused: why the device clock was refused ("" if it was not): the wall clock is used.
    """

    name: str
    device_clock: Any = None
    fsdp_markers: Any = None
    refused: str = ""


def initialized_dist() -> Any:
    """``torch.distributed`` when a default process group exists, else None."""
    try:
        import torch.distributed as dist
    except ImportError:
        return None
    return dist if dist.is_available() and dist.is_initialized() else None


def job_position(rank: int | None, world_size: int | None, local_rank: int | None,
                 dist_mod: Any, environ: Mapping[str, str] = os.environ,
                 ) -> tuple[int, int, int | None]:
    """``(rank, world_size, local_rank)``: each as given, else from ``dist_mod`` (an initialised
    ``torch.distributed``, or None), else ``$RANK`` (0), ``$WORLD_SIZE`` (1), ``$LOCAL_RANK``
    (None).

    Raises:
        ValueError: one of those variables is not an integer.
    """
    if rank is None:
        rank = dist_mod.get_rank() if dist_mod else int(environ.get("RANK", 0))
    if world_size is None:
        world_size = (dist_mod.get_world_size() if dist_mod
                      else int(environ.get("WORLD_SIZE", 1)))
    if local_rank is None:
        env_local = environ.get("LOCAL_RANK")
        local_rank = int(env_local) if env_local is not None else None
    return rank, world_size, local_rank


def model_devices(model: Any) -> set[str]:
    """The device types and indices (``"cuda:0"``, ``"cpu"``) of a model's parameters and
    buffers (a module or a sequence of modules); empty for None."""
    if model is None:
        return set()
    modules = model if isinstance(model, (list, tuple)) else [model]
    out: set[str] = set()
    for module in modules:
        for tensor in itertools.chain(module.parameters(), module.buffers()):
            out.add(str(tensor.device))
    return out


def cuda_initialized() -> bool:
    """True when torch is loaded and the job has initialised CUDA (its tensors are there)."""
    torch = sys.modules.get("torch")
    try:
        return torch is not None and bool(torch.cuda.is_initialized())
    except Exception:  # noqa: BLE001
        return False


def rank_device(model: Any) -> Any:
    """This rank's CUDA device identity (UUID, PCI bus id) for the agent's
    ``laggard_rank_info``: the model's device, else the current CUDA device; None on CPU."""
    try:
        import torch
    except ImportError:
        return None
    try:
        if not torch.cuda.is_available():
            return None
        if model is not None:
            param = next(iter(model.parameters()), None)
            if param is not None and param.device.type == "cuda":
                return device_identity(param.device)
        return device_identity(torch.cuda.current_device())
    except Exception:  # noqa: BLE001 - identity is optional, never a failure
        return None


def resolve_phase_clock(wanted: str, *, device: Any, model: Any, dist_mod: Any,
                        comm_timer: Any, window_steps: int, pool_events: int,
                        log_once: Callable[..., Any]) -> PhaseClock:
    """The phase clock to use; on the device clock, build it (never raises).

    Args:
        wanted: ``MonitorConfig.phase_clock``: ``"wall"``, ``"thread_cpu"``, ``"device"``
            or ``"auto"`` (device when the job's tensors are on CUDA: ``model`` on a CUDA
            device, a ``device`` module given, or ``torch.cuda`` initialised).
        device: the ``torch.cuda``-like module to record on, or None for ``torch.cuda``.
        model: the job's model (a module or a sequence of them), or None.
        dist_mod: an initialised ``torch.distributed``, or None.
        comm_timer: the job's CommTimer, or None; its process group's backend must be NCCL or
            gloo, and it is given the device clock (``attach_device_clock``).
        window_steps: steps per window (the device clock's ring of steps).
        pool_events: timing events made up front (``MonitorConfig.device_pool_events``).
        log_once: ``(key, msg, *args)``, the monitor's once-only log.

    Returns:
        The clock; a refused device clock is ``"wall"`` with ``refused`` set (the caller
        counts it; the reason is logged here once).
    """
    if wanted in ("wall", "thread_cpu"):
        return PhaseClock(wanted)
    try:
        devices = model_devices(model)
        cuda_model = bool(devices) and all(d.startswith("cuda") for d in devices)
        if wanted == "auto" and not (
                device is not None or cuda_model or (model is None and cuda_initialized())):
            return PhaseClock("wall")
        if len(devices) > 1:
            return _refuse(wanted, f"the model is on several devices ({sorted(devices)})",
                           log_once)
        if dist_mod is not None:
            backend = str(dist_mod.get_backend(getattr(comm_timer, "process_group", None)))
            names = {part.rsplit(":", 1)[-1] for part in backend.split(",")}
            if not names <= DEVICE_BACKENDS:
                return _refuse(wanted, f"backend {backend!r} is neither NCCL nor gloo", log_once)
        if device is None:
            from laggard.integrations.device_events import cuda_if_available

            device = cuda_if_available()
            if device is None:
                return _refuse(wanted, "no CUDA device", log_once)
        from laggard.integrations.device_clock import DeviceClock

        clock = DeviceClock(device, window_steps=window_steps, pool_events=pool_events,
                            log_once=log_once)
    except Exception as exc:  # noqa: BLE001 - a device clock that cannot start is refused
        return _refuse(wanted, f"the device clock could not start ({exc!r})", log_once)
    if comm_timer is not None and hasattr(comm_timer, "attach_device_clock"):
        comm_timer.attach_device_clock(clock)
    markers = None
    if "torch.distributed.fsdp._fully_shard._fsdp_param_group" in sys.modules:
        from laggard.integrations.fsdp_device import FsdpStallMarkers

        markers = FsdpStallMarkers(clock, log_once=log_once)
        markers.install()
    return PhaseClock("device", device_clock=clock, fsdp_markers=markers)


def _refuse(wanted: str, reason: str, log_once: Callable[..., Any]) -> PhaseClock:
    """Log once a refused device clock; the wall clock is used instead."""
    log_once("device-refused", "laggard: phase_clock=%r: %s; phases are timed on the wall "
             "clock instead (see docs/gpu.md)", wanted, reason)
    return PhaseClock("wall", refused=reason)


__all__ = ["DEVICE_BACKENDS", "PHASE_CLOCKS", "PhaseClock", "cuda_initialized",
           "initialized_dist", "job_position", "model_devices", "rank_device",
           "resolve_phase_clock"]
