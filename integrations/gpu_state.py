"""This rank's GPU state in the window record: clock-event reasons and SM clock, per window.

:class:`GpuStateParticipant` is a window participant
(:mod:`laggard.integrations.participants`). A small daemon thread samples the rank's GPU every
``sample_interval_seconds`` (NVML calls never run on the training thread, so the loop never
waits on the driver); at each window gather it hands over what it saw since the last one as the
columns of :data:`~laggard.detectors.gpu_state.GPU_STATE_COLUMNS`: the SM clock's mean and
maximum (hertz), their mean ratio, and per NVML clock-event reason the fraction of the samples in
which it was active (``gpu_sw_thermal_ratio``...). The straggler participant reads them by name
to say why a compute straggler is slow (:func:`~laggard.detectors.gpu_state.describe_cause`).

Where the state comes from, in order:

1. **NVML**, through laggard's one NVML wrapper (:class:`laggard.nvml.library.NvmlLibrary`;
   the job never imports ``pynvml`` itself): ``nvmlDeviceGetCurrentClocksEventReasons`` (bits
   of nvml.h's ``nvmlClocksEventReason*``; the pre-530 ``...ThrottleReasons`` where that is what
   the driver has), ``nvmlDeviceGetClockInfo`` / ``nvmlDeviceGetMaxClockInfo`` for
   ``NVML_CLOCK_SM`` (MHz, turned into hertz). The rank's GPU is found by its CUDA device UUID
   (``torch.cuda.get_device_properties(current_device()).uuid``), else its PCI bus id, never by
   index: ``CUDA_VISIBLE_DEVICES`` renumbers CUDA devices, NVML does not.
2. **torch.cuda** alone (no NVML in the job): the SM clock where torch offers one
   (``torch.cuda.clock_rate``, MHz; the device properties' ``clock_rate``, kHz, as the
   maximum); the reasons are unknown, and the finding says so.
3. **Nothing** on a CPU job: the columns are NaN and the finding says "no GPU state: CPU job".

What goes wrong is counted in :attr:`GpuStateParticipant.stats` and logged once, never raised
into the loop: NVML missing, a device NVML does not know (``unknown_device``), a GPU lost
mid-run (``gpu_lost``; sampling resumes once NVML answers again), a bad fake-NVML hook.

Demo and test hook: with ``LAGGARD_FAKE_NVML=N[:SCENARIO]`` in the environment the participant uses
:class:`laggard.nvml.fake.FakeNvml` with ``N`` GPUs playing ``SCENARIO``
(:func:`laggard.nvml.fake.parse_scenario`) instead of the real NVML, as ``laggard agent
--collector.nvml.fake-gpus N --collector.nvml.fake-gpus-scenario SCENARIO`` does, so the job and the
agent see the same fake GPUs. Without CUDA, the rank's GPU is then fake GPU ``local_rank % N`` (one
GPU per local rank, as torchrun jobs use them). ``laggard demo --throttle-slow-gpu`` sets it.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from laggard.detectors.gpu_state import (
    GPU_STATE_COLUMNS,
    SOURCE_NONE,
    SOURCE_NVML,
    SOURCE_TORCH,
    SOURCE_UNAVAILABLE,
    GpuStateWindow,
)
from laggard.detectors.window import WindowRecord
from laggard.integrations.participants import MonitorContext, WindowOutcome, WindowParticipant
from laggard.log_once import LogOnce
from laggard.nvml import library as nvml_library
from laggard.nvml.library import GpuLostError, NoDataError, NvmlLibrary

log = logging.getLogger(__name__)

#: Environment variable of the fake-NVML hook (module docstring): ``N[:SCENARIO]``.
FAKE_NVML_ENV = "LAGGARD_FAKE_NVML"
MHZ = 1e6
KHZ = 1e3


def fake_nvml_from_env(value: str) -> Any:
    """The fake NVML module a ``LAGGARD_FAKE_NVML`` value asks for.

    Args:
        value: ``N`` or ``N:SCENARIO`` (e.g. ``4:throttle:2:sw_thermal``).

    Raises:
        ValueError: not a GPU count >= 1, or an unknown scenario.
    """
    from laggard.nvml.fake import FakeNvml

    count, _, scenario = value.strip().partition(":")
    if not count.isdigit() or int(count) < 1:
        raise ValueError(f"{FAKE_NVML_ENV}={value!r}: want N[:SCENARIO] with N >= 1")
    return FakeNvml(int(count), clock=time.monotonic, scenario=scenario or "default")


class GpuStateParticipant(WindowParticipant):
    """Adds this rank's GPU clock-event reasons and SM clock to the window record.

    Args:
        config: :class:`GpuStateParticipant.Config`; None for its defaults.

    Attributes:
        stats: counters: ``samples``, ``nvml_unavailable``, ``unknown_device``, ``gpu_lost``,
            ``sample_errors``, ``fake_nvml_invalid``, ``windows``.
        source: where the state comes from (``gpu_state_source`` code); NaN until resolved.
        gpu_index: NVML index of the rank's GPU, once resolved (None: unknown).
    """

    name = "gpu_state"
    columns = GPU_STATE_COLUMNS

    @dataclass(kw_only=True, slots=True)
    class Config:
        """Configuration of :class:`GpuStateParticipant`."""

        sample_interval_seconds: float = 0.1
        """Seconds between samples on the sampler thread (each sample is two or three NVML
        calls, tens of microseconds on a real GPU). 0: no thread, one sample per step on the
        training thread, for tests and fakes only."""

        nvml: Any = None
        """An NVML module (``pynvml``, or a stand-in such as ``laggard.nvml.fake.FakeNvml``);
        None: the ``LAGGARD_FAKE_NVML`` hook if set, else ``pynvml`` via laggard.nvml."""

        cuda: Any = None
        """A ``torch.cuda``-like module (tests pass a fake one); None: ``torch.cuda``."""

        def __post_init__(self) -> None:
            if not 0 <= self.sample_interval_seconds <= 60:
                raise ValueError("sample_interval_seconds must be in [0, 60]")

    def __init__(self, config: GpuStateParticipant.Config | None = None) -> None:
        super().__init__()
        self.config = config if config is not None else GpuStateParticipant.Config()
        self.stats: Counter[str] = Counter()
        self.source = math.nan  # not resolved yet (the sampler thread's first act)
        self.gpu_index: int | None = None
        self._library: NvmlLibrary | None = None
        self._cuda: Any = None
        self._device: int | None = None
        self._uuid: str | None = None
        self._pci: str | None = None
        self._lost = False
        self._window = GpuStateWindow()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # once per key: this participant's own until attached, then the monitor's (which
        # counts and names them; a participant uses only its context)
        self._log_once: Callable[..., object] = LogOnce(log)

    # ------------------------------------------------------------------ participant protocol
    def attach(self, context: MonitorContext) -> None:
        super().attach(context)
        self._log_once = functools.partial(_prefixed, context.log_once)
        if self.config.sample_interval_seconds == 0:
            self._resolve()
            return
        self._thread = threading.Thread(target=self._run, name="laggard-gpu-state", daemon=True)
        self._thread.start()

    def end_step(self, step: int, column: int) -> None:
        if self._thread is None and self.config.sample_interval_seconds == 0:
            self.sample()

    def contribute(self, step: int) -> Mapping[str, object]:
        with self._lock:
            window, self._window = self._window, GpuStateWindow()
            source, index = self.source, self.gpu_index
        self.stats["windows"] += 1
        if source in (SOURCE_NVML, SOURCE_TORCH) and window.samples == 0 and self._lost:
            source = SOURCE_UNAVAILABLE
        return window.values(source=source, gpu_index=index)

    def on_window(self, record: WindowRecord) -> WindowOutcome | None:
        return None

    def close(self) -> None:
        """Stop the sampler thread (it is a daemon thread: a job that never calls this exits
        all the same)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)

    # --------------------------------------------------------------------------- sampling
    def _run(self) -> None:
        try:
            self._resolve()
            if self.source == SOURCE_NONE:
                return  # a CPU job: nothing to sample
            while not self._stop.wait(self.config.sample_interval_seconds):
                self.sample()
        except Exception as exc:  # noqa: BLE001 - the sampler never takes the job down
            self._count_error("gpu_state", exc)

    def sample(self) -> None:
        """Take one sample of the rank's GPU into the current window. Never raises."""
        try:
            self._sample()
        except Exception as exc:  # noqa: BLE001 - never raise into the loop
            self.stats["sample_errors"] += 1
            self._count_error("gpu_state.sample", exc)

    def _sample(self) -> None:
        if self.source == SOURCE_NVML:
            self._sample_nvml()
        elif self.source == SOURCE_TORCH:
            clock = self._torch_clock()
            with self._lock:
                self._window.add(sm_clock_hertz=clock, sm_clock_max_hertz=self._torch_max(),
                                 reasons=None)
            self.stats["samples"] += 1

    def _sample_nvml(self) -> None:
        library = self._library
        assert library is not None
        if self._lost:
            # After GpuIsLost: wait for NVML's re-init (with its backoff), then find the GPU
            # again by UUID or PCI id (its index may have changed).
            try:
                library.start()
            except NoDataError:
                return
            index = self._find_index(library)
            if index is None:
                return
            with self._lock:
                self.gpu_index, self._lost = index, False
            log.warning("laggard: GPU %d answers NVML again; GPU state resumed", index)
        index = self.gpu_index
        assert index is not None
        nvml = library.module
        try:
            mask = library.call(index, "nvmlDeviceGetCurrentClocksEventReasons")
            if mask is None:
                mask = library.call(index, "nvmlDeviceGetCurrentClocksThrottleReasons")
            sm = library.call(index, "nvmlDeviceGetClockInfo", nvml.NVML_CLOCK_SM)
            sm_max = library.call(index, "nvmlDeviceGetMaxClockInfo", nvml.NVML_CLOCK_SM)
        except GpuLostError:
            self.stats["gpu_lost"] += 1
            with self._lock:
                self._lost = True
            library.reinit()
            self._log_once("gpu_lost", "laggard: GPU %d is lost (NVML_ERROR_GPU_IS_LOST); "
                           "GPU state off until it answers again", index)
            return
        reasons = None if mask is None else _reasons(nvml, int(mask))
        with self._lock:
            self._window.add(sm_clock_hertz=None if sm is None else sm * MHZ,
                             sm_clock_max_hertz=None if sm_max is None else sm_max * MHZ,
                             reasons=reasons)
        self.stats["samples"] += 1

    # ------------------------------------------------------------------------- resolution
    def _resolve(self) -> None:
        """Find this rank's GPU and the source of its state (on the sampler thread)."""
        cuda = self._cuda_module()
        fake_env = os.environ.get(FAKE_NVML_ENV, "") if self.config.nvml is None else ""
        if cuda is not None:
            self._device, self._uuid, self._pci = _cuda_identity(cuda)
            self._cuda = cuda
        elif not fake_env and self.config.nvml is None:
            self._set_source(SOURCE_NONE)  # a CPU job
            return
        module = self.config.nvml
        if fake_env:
            try:
                module = fake_nvml_from_env(fake_env)
            except (ValueError, ImportError) as exc:
                self.stats["fake_nvml_invalid"] += 1
                self._log_once("fake_nvml", "laggard: %s ignored: %s", FAKE_NVML_ENV, exc)
                self._set_source(SOURCE_TORCH if cuda is not None else SOURCE_UNAVAILABLE)
                return
        library = NvmlLibrary(module)
        try:
            count = library.start()
        except NoDataError as exc:
            self.stats["nvml_unavailable"] += 1
            self._log_once("nvml", "laggard: no NVML in the job (%s): GPU state from torch.cuda, "
                           "clock-event reasons unknown", exc)
            self._set_source(SOURCE_TORCH if cuda is not None else SOURCE_UNAVAILABLE)
            return
        if cuda is None and self._uuid is None and count:
            # The fake hook without CUDA: one fake GPU per local rank.
            context = self.context
            local = context.local_rank if context and context.local_rank is not None else (
                context.rank if context else 0)
            self._uuid = _text(library.call(local % count, "nvmlDeviceGetUUID"))
        index = self._find_index(library)
        if index is None:
            self.stats["unknown_device"] += 1
            self._log_once("unknown_device", "laggard: NVML knows no GPU with UUID %s / PCI "
                           "bus id %s; GPU state from torch.cuda", self._uuid, self._pci)
            self._set_source(SOURCE_TORCH if cuda is not None else SOURCE_UNAVAILABLE)
            return
        self._library = library
        with self._lock:
            self.gpu_index = index
        self._set_source(SOURCE_NVML)

    def _find_index(self, library: NvmlLibrary) -> int | None:
        """NVML index of the GPU with this rank's UUID, else its PCI bus id; None if none."""
        try:
            count = library.start()
        except NoDataError:
            return None
        for index in range(count):
            try:
                uuid = _text(library.call(index, "nvmlDeviceGetUUID"))
            except GpuLostError:
                continue
            if uuid and self._uuid and uuid.lower() == self._uuid.lower():
                return index
        if self._pci:
            try:
                wanted = nvml_library.normalise_bus_id(self._pci)
            except (ValueError, IndexError):
                return None
            return library.pci_bus_ids().get(wanted)
        return None

    def _cuda_module(self) -> Any:
        cuda = self.config.cuda
        if cuda is None:
            try:
                import torch

                cuda = torch.cuda
            except ImportError:
                return None
        try:
            return cuda if cuda.is_available() else None
        except Exception:  # noqa: BLE001 - a broken CUDA runtime is a job without GPU state
            return None

    def _torch_clock(self) -> float | None:
        try:
            return float(self._cuda.clock_rate(self._device)) * MHZ
        except Exception:  # noqa: BLE001 - torch needs pynvml/amdsmi for this; may be absent
            return None

    def _torch_max(self) -> float | None:
        try:
            khz = getattr(self._cuda.get_device_properties(self._device), "clock_rate", None)
        except Exception:  # noqa: BLE001
            return None
        return float(khz) * KHZ if khz else None

    def _set_source(self, source: float) -> None:
        with self._lock:
            self.source = source

    def _count_error(self, where: str, exc: BaseException) -> None:
        if self.context is not None:
            self.context.count_error(where, exc)
        else:
            log.warning("laggard: %s: %s", where, exc)


def _prefixed(log_once: Callable[..., object], key: str, message: str, *args: object) -> None:
    """``log_once`` with the key in this participant's namespace of the monitor's keys."""
    log_once(f"gpu_state.{key}", message, *args)


def _cuda_identity(cuda: Any) -> tuple[int | None, str | None, str | None]:
    """(CUDA device index, UUID as NVML prints it, PCI bus id) of the current device."""
    from laggard.integrations.run_identity import identity_from_properties

    try:
        device = int(cuda.current_device())
        identity = identity_from_properties(cuda.get_device_properties(device))
    except Exception:  # noqa: BLE001 - identity unknown: matched by nothing, counted later
        return None, None, None
    return device, identity.uuid, identity.pci_bus_id


def _reasons(nvml: Any, mask: int) -> list[str]:
    """Laggard names of the reason bits set in ``mask``."""
    out = []
    for reason, names in nvml_library.CLOCK_EVENT_REASONS.items():
        bit = nvml_library.first_constant(nvml, *names)
        if bit is not None and mask & bit:
            out.append(reason)
    return out


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)


__all__ = ["FAKE_NVML_ENV", "GpuStateParticipant", "fake_nvml_from_env"]
