"""GpuIndex: a rank's CUDA device (UUID, PCI bus id) -> the NVML index its GPU series carry.

The training side knows its device's UUID and PCI bus id (``torch.cuda``); the agent's GPU series
are labelled with NVML's index (``gpu``). This maps one to the other through the NVML wrapper the
``nvml`` collector uses (:func:`laggard.collectors.nvml_library.shared_library`), so that
``laggard_rank_info{run, rank, gpu}`` joins a rank with ``laggard_gpu_*{gpu}`` in PromQL.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from laggard.collectors.base import NoDataError
from laggard.collectors.nvml_library import NvmlLibrary, normalise_bus_id

#: Seconds a map read from NVML is used before it is read again (GPUs do not move; a reset or
#: a driver that came up late does change the answer).
REFRESH_SECONDS = 30.0


class GpuIndex:
    """Thread-safe, cached ``(uuid, pci_bus_id) -> NVML index`` lookups.

    Args:
        library: the NVML wrapper shared with the GPU collector (real or fake NVML).
        refresh_seconds: how long one reading of NVML's GPUs is used.
        clock: monotonic clock in seconds (tests pass a fake one).
    """

    def __init__(self, library: NvmlLibrary, *, refresh_seconds: float = REFRESH_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._library = library
        self._refresh = refresh_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._read_at: float | None = None
        self._by_uuid: dict[str, int] | None = None
        self._by_pci: dict[str, int] = {}

    def __call__(self, uuid: str | None, pci_bus_id: str | None) -> str | None:
        """The NVML index (as a label value) of the GPU with this UUID, else this PCI bus id.

        Args:
            uuid: ``GPU-...`` as NVML prints it, or None.
            pci_bus_id: any form NVML or the kernel prints (``00000000:9B:00.0``,
                ``0000:9b:00``), or None.

        Returns:
            The index as a string; ``""`` when NVML lists no such GPU; None when NVML is not
            available on this agent (no driver, no library). Never raises.
        """
        with self._lock:
            now = self._clock()
            if self._read_at is None or now - self._read_at >= self._refresh:
                self._read(now)
            if self._by_uuid is None:
                return None
            if uuid and uuid in self._by_uuid:
                return str(self._by_uuid[uuid])
            if pci_bus_id:
                try:
                    index = self._by_pci.get(normalise_bus_id(pci_bus_id))
                except (ValueError, IndexError):
                    index = None
                if index is not None:
                    return str(index)
            return ""

    def _read(self, now: float) -> None:
        self._read_at = now
        try:
            count = self._library.start()
        except NoDataError:
            self._by_uuid, self._by_pci = None, {}
            return
        by_uuid: dict[str, int] = {}
        for index in range(count):
            try:
                value: Any = self._library.call(index, "nvmlDeviceGetUUID")
            except Exception:  # noqa: BLE001 - a lost GPU is simply not mapped
                continue
            if value is not None:
                by_uuid[value.decode() if isinstance(value, bytes) else str(value)] = index
        self._by_uuid, self._by_pci = by_uuid, self._library.pci_bus_ids()
