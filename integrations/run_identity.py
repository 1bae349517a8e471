"""Which training run a rank belongs to, and which CUDA device it drives.

The node agent keeps each run's ranks apart and labels their series with ``run``
(``laggard.wire.StepRecord.run``); it joins a rank to its GPU's series through the device's UUID
and PCI bus id. This module finds both on the training side:

* :func:`resolve_run` (pure): ``TrainingMonitor.Config(run=...)``, else ``TORCHELASTIC_RUN_ID``
  (torchrun's rendezvous id), else ``SLURM_JOB_ID`` (with ``.SLURM_STEP_ID``), else None;
* :func:`agree_run` (one collective at start): every rank takes rank 0's id, which rank 0 makes
  when nothing above named one; :func:`job_run` chooses between the two for the monitor;
* :func:`device_identity`: the UUID and PCI bus id of a CUDA device, None on CPU.

No torch import at module level: :func:`resolve_run` works anywhere.
"""

from __future__ import annotations

import time
import uuid as uuid_mod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from laggard.wire import sanitise_run

#: ``TORCHELASTIC_RUN_ID`` values that name no run: torchrun's default ``--rdzv-id``.
_NO_ELASTIC_RUN = frozenset({"", "none"})


def resolve_run(config_run: str | None, env: Mapping[str, str]) -> str | None:
    """The run id this rank's configuration and environment name, or None.

    Args:
        config_run: ``TrainingMonitor.Config.run``; None or ``""`` when not set.
        env: the environment (``os.environ``).

    Returns:
        The first of: ``config_run``; ``TORCHELASTIC_RUN_ID`` (unless torchrun's default
        ``none``); ``SLURM_JOB_ID``, with ``"." + SLURM_STEP_ID`` when that is set (a job's
        steps are separate runs); made wire-safe by :func:`laggard.wire.sanitise_run` (other
        characters become ``_``, a long id is cut and suffixed with a hash). None when none of
        them is set: then :func:`agree_run` has rank 0 make one.
    """
    if config_run:
        return sanitise_run(config_run)
    elastic = env.get("TORCHELASTIC_RUN_ID", "")
    if elastic.strip().lower() not in _NO_ELASTIC_RUN:
        return sanitise_run(elastic.strip())
    job = env.get("SLURM_JOB_ID", "").strip()
    if job:
        step = env.get("SLURM_STEP_ID", "").strip()
        return sanitise_run(f"{job}.{step}" if step else job)
    return None


def new_run_id() -> str:
    """A fresh run id: UTC start time and 8 random hex digits (``20261201T204512-1a2b3c4d``)."""
    return f"{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{uuid_mod.uuid4().hex[:8]}"


def agree_run(resolved: str | None, dist: Any, group: Any = None) -> str:
    """The run id every rank of ``group`` uses: rank 0's, broadcast once.

    A collective: every rank of the group calls it, once, at start (before the first step).
    Rank 0 sends what it resolved, or a :func:`new_run_id` when it resolved nothing; every
    rank returns what rank 0 sent, so the ranks agree even where their environments differ.
    Without an initialised process group (or with one rank) nothing is sent: the resolved id,
    or a fresh one, is returned.

    Args:
        resolved: this rank's :func:`resolve_run` answer.
        dist: ``torch.distributed`` (or a stand-in with ``is_initialized``, ``get_rank``,
            ``get_world_size``, ``get_global_rank`` and ``broadcast_object_list``).
        group: the process group to agree over; None for the default group.

    Returns:
        A run id :func:`laggard.wire.check_run` accepts.

    Raises:
        RuntimeError: what ``broadcast_object_list`` raises (the caller decides; the monitor
            falls back to ``resolved or ""`` and logs).
    """
    if not dist.is_available() or not dist.is_initialized() \
            or dist.get_world_size(group) <= 1:
        return resolved or new_run_id()
    src = dist.get_global_rank(group, 0) if group is not None else 0
    mine = (resolved or new_run_id()) if dist.get_rank(group) == 0 else None
    box: list[Any] = [mine]
    dist.broadcast_object_list(box, src=src, group=group)
    # What arrives is another rank's pickled object: check it as the agent would.
    return sanitise_run(str(box[0])) if box[0] else ""


def job_run(config_run: str, env: Mapping[str, str], dist: Any, group: Any, *, agree: bool,
            count_error: Callable[[str, BaseException], None]) -> str:
    """The run id a monitor uses: with ``agree`` (a monitor that gathers windows), rank 0's,
    broadcast over ``group`` (:func:`agree_run`, a collective: every rank builds its monitor at
    the same point); else what this rank's config and environment say (:func:`resolve_run`;
    "" if nothing). A failed broadcast is counted (``count_error("run", exc)``) and loses the
    agreement, not the job: the rank's own id is used.
    """
    resolved = resolve_run(config_run or None, env)
    if dist is None or not agree:
        return resolved or ""
    try:
        return agree_run(resolved, dist, group)
    except Exception as exc:  # noqa: BLE001 - a failed broadcast loses the id, not the job
        count_error("run", exc)
        return resolved or ""


@dataclass(frozen=True, slots=True)
class DeviceIdentity:
    """A CUDA device as NVML names it.

    Attributes:
        uuid: ``GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`` (``nvidia-smi --query-gpu=uuid``),
            or ``MIG-...`` for a MIG instance.
        pci_bus_id: ``dddddddd:bb:dd.f`` (``nvidia-smi --query-gpu=pci.bus_id``), or None
            where torch does not say.
    """

    uuid: str | None
    pci_bus_id: str | None


def device_identity(device: Any) -> DeviceIdentity | None:
    """The UUID and PCI bus id of the CUDA device ``device`` (``torch.cuda.get_device_properties``).

    Args:
        device: a ``torch.device``, a device index or a string (``"cuda:3"``); a CPU device
            (or a machine without CUDA) has none.

    Returns:
        The identity, or None on CPU, without CUDA, or when torch cannot say (never raises:
        the agent then leaves the rank's ``gpu`` label empty).
    """
    try:
        import torch

        dev = torch.device(device) if not isinstance(device, int) else torch.device("cuda", device)
        if dev.type != "cuda" or not torch.cuda.is_available():
            return None
        index = dev.index if dev.index is not None else torch.cuda.current_device()
        props = torch.cuda.get_device_properties(index)
    except Exception:  # noqa: BLE001 - an identity is a nicety; training goes on without it
        return None
    return identity_from_properties(props)


def identity_from_properties(props: Any) -> DeviceIdentity:
    """The identity in one ``torch.cuda.get_device_properties`` answer (or a stand-in with its
    ``uuid``, ``pci_domain_id``, ``pci_bus_id``, ``pci_device_id``); fields torch lacks are
    None."""
    return DeviceIdentity(uuid=_nvml_uuid(getattr(props, "uuid", None)),
                          pci_bus_id=_pci_bus_id(props))


def _nvml_uuid(value: Any) -> str | None:
    """torch prints a device UUID bare (``5d1c...``); NVML and nvidia-smi prefix ``GPU-``."""
    if value is None:
        return None
    text = str(value).strip()
    if not text:
        return None
    return text if text.startswith(("GPU-", "MIG-")) else f"GPU-{text}"


def _pci_bus_id(props: Any) -> str | None:
    """NVML's ``dddddddd:bb:dd.0`` from ``pci_domain_id``, ``pci_bus_id``, ``pci_device_id``."""
    try:
        domain, bus, device = (int(getattr(props, name)) for name in
                               ("pci_domain_id", "pci_bus_id", "pci_device_id"))
    except (AttributeError, TypeError, ValueError):
        return None
    return f"{domain:08X}:{bus:02X}:{device:02X}.0"
