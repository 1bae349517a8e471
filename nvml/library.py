"""The one module that imports ``pynvml`` (package ``nvidia-ml-py``): a thin, safe NVML wrapper.

It lives in :mod:`laggard.nvml`, a package of its own below the collectors, so that both the
node agent's collectors and the training job's GPU-state participant
(:mod:`laggard.integrations.gpu_state`) reach NVML through this one module.

Modelled on nvitop's ``api/libnvml.py``:

* lazy: nothing is loaded or initialised until the first :meth:`NvmlLibrary.start`;
* ``nvmlShutdown`` is registered with :mod:`atexit` once NVML is up;
* a call that raises ``NVMLError_NotSupported`` (or ``FunctionNotFound`` on an older driver,
  ``NoPermission`` without root) returns None: the field is left out for that GPU, never
  reported as 0; any other error does the same and is counted per function;
* ``LibraryNotFound`` / ``DriverNotLoaded`` at init become :class:`NoDataError` ("no GPU
  here"), and init is retried with exponential backoff (1 s doubling to 5 min), so a node whose
  driver comes up later is picked up without a restart;
* ``GpuIsLost`` becomes :class:`GpuLostError` naming the GPU, so the caller marks that GPU lost and
  goes on with the others. :meth:`NvmlLibrary.reinit` schedules a shutdown and a fresh init (after
  a GPU reset, handles are stale), with the same backoff.

Any object with pynvml's function names and constants can stand in for the module (see
:mod:`laggard.nvml.fake`).
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from types import ModuleType
from typing import Any

log = logging.getLogger(__name__)


class NoDataError(Exception):
    """The source a collector reads does not exist on this machine (no GPU, no InfiniBand).

    The agent's exporter sets ``laggard_collector_success{collector}`` to 0, logs it once, and
    goes on. Defined here, beside the NVML wrapper (the lowest layer that raises it), so that the
    collectors (:mod:`laggard.collectors.base` re-exports it) and the training side catch one
    class.

    Attributes:
        absent: True (the class's value) when the hardware is not there at all: the agent
            reports the collector absent (``laggard_collector_absent``), not failing.
    """

    absent = True


#: Backoff between init attempts after a failure: first and largest delay, in seconds.
BACKOFF_FIRST_SECONDS = 1.0
BACKOFF_MAX_SECONDS = 300.0


class NvmlStartError(NoDataError):
    """NVML is installed and a driver loaded, yet it failed to start or to list the GPUs: a
    broken GPU node, not a node without GPUs (``absent`` False), so the agent counts the
    collector as failing. A :class:`NoDataError` still, so every caller that waits for NVML
    (the job's GPU-state sampler) catches one class."""

    absent = False


class GpuLostError(Exception):
    """NVML answered ``GPU_IS_LOST`` for one GPU.

    Attributes:
        index: NVML index of the lost GPU.
    """

    def __init__(self, index: int) -> None:
        super().__init__(f"GPU {index} is lost (NVML_ERROR_GPU_IS_LOST)")
        self.index = index


class NvmlLibrary:
    """Lazy, shared access to NVML with per-field error handling.

    Args:
        module: the ``pynvml`` module or a stand-in with the same names; None imports ``pynvml``
            at the first :meth:`start`.
        clock: monotonic clock for the backoff (tests pass a fake one).

    Attributes:
        module: the NVML module in use (for its constants), None before the first start.
    """

    def __init__(self, module: Any = None, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.module: Any = module
        self._clock = clock
        self._lock = threading.RLock()
        self._initialised = False
        self._handles: list[Any] = []
        self._next_attempt = 0.0
        self._backoff = BACKOFF_FIRST_SECONDS
        self._last_error: Exception = NoDataError("")
        self._reinit_wanted = False
        self._atexit_registered = False
        self.driver_version: str | None = None
        #: Incremented by every successful init: what a caller caches per GPU (identity,
        #: maximum clocks) is valid while it stays the same (handles change on re-init).
        self.generation = 0
        self.errors: Counter[str] = Counter()
        self._lost_at_init: dict[int, bool] = {}

    # -- life cycle ---------------------------------------------------------------------------

    def start(self) -> int:
        """Make sure NVML is initialised; return the number of GPUs.

        Raises:
            NoDataError: no NVML library or no driver on this machine (no GPU here), or the
                backoff after such a failure has not expired yet.
            NvmlStartError: NVML failed to start or to list the GPUs for another reason, or
                the backoff after such a failure has not expired yet.
        """
        with self._lock:
            waiting = self._clock() < self._next_attempt
            if self._initialised and (not self._reinit_wanted or waiting):
                return len(self._handles)  # a pending re-init waits; the other GPUs go on
            if waiting:
                # The same class and text as the failure itself, so the agent logs it once,
                # not twice, and reports absent or failing alike.
                raise type(self._last_error)(str(self._last_error))
            if self._initialised:
                self._shutdown_locked()
            self._reinit_wanted = False
            try:
                self._init_locked()
            except NoDataError as exc:
                self._last_error = exc
                self._next_attempt = self._clock() + self._backoff
                self._backoff = min(self._backoff * 2, BACKOFF_MAX_SECONDS)
                raise
            return len(self._handles)

    def _init_locked(self) -> None:
        if self.module is None:
            try:
                import pynvml  # the only import of pynvml in laggard
            except ImportError as exc:  # nvidia-ml-py not installed
                raise NoDataError(f"pynvml not importable: {exc}") from None
            self.module = pynvml
        nvml = self.module
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as exc:
            absent = getattr(exc, "value", None) in (nvml.NVML_ERROR_LIBRARY_NOT_FOUND,
                                                     nvml.NVML_ERROR_DRIVER_NOT_LOADED)
            error = NoDataError if absent else NvmlStartError
            raise error(f"nvmlInit failed: {_describe(nvml, exc)}") from None
        self._initialised = True
        self.generation += 1
        if not self._atexit_registered:
            atexit.register(self.shutdown)
            self._atexit_registered = True
        try:
            count = nvml.nvmlDeviceGetCount()
            self._handles = [self._handle_or_none(i) for i in range(count)]
            version = nvml.nvmlSystemGetDriverVersion()
            self.driver_version = version.decode() if isinstance(version, bytes) else version
        except nvml.NVMLError as exc:
            self._shutdown_locked()
            raise NvmlStartError(
                f"NVML device enumeration failed: {_describe(nvml, exc)}") from None

    def _handle_or_none(self, index: int) -> Any:
        # One lost or hidden GPU (NO_PERMISSION in a container) must not cost the others.
        nvml = self.module
        try:
            return nvml.nvmlDeviceGetHandleByIndex(index)
        except nvml.NVMLError as exc:
            log.warning("GPU %d: no NVML handle (%s)", index, _describe(nvml, exc))
            self._lost_at_init[index] = exc.value == nvml.NVML_ERROR_GPU_IS_LOST
            return None

    def reinit(self) -> None:
        """Ask for a shutdown and fresh init at the next :meth:`start` (after a GPU was lost)."""
        with self._lock:
            if not self._reinit_wanted:
                self._reinit_wanted = True
                self._next_attempt = self._clock() + self._backoff
                self._backoff = min(self._backoff * 2, BACKOFF_MAX_SECONDS)

    def healthy(self) -> None:
        """Every GPU answered this round: the next failure starts the backoff afresh."""
        with self._lock:
            if not self._reinit_wanted:
                self._backoff = BACKOFF_FIRST_SECONDS

    def shutdown(self) -> None:
        """Shut NVML down if it is up (registered with :mod:`atexit`)."""
        with self._lock:
            if self._initialised:
                self._shutdown_locked()

    def _shutdown_locked(self) -> None:
        self._initialised = False
        self._handles = []
        self._lost_at_init = {}
        try:
            self.module.nvmlShutdown()
        except Exception as exc:  # noqa: BLE001 - shutting down a broken library must not raise
            log.debug("nvmlShutdown: %s", exc)

    # -- calls --------------------------------------------------------------------------------

    def handle(self, index: int) -> Any:
        """The NVML device handle of GPU ``index`` (valid until the next re-init)."""
        return self._handles[index]

    def call(self, index: int, function: str, *args: Any) -> Any:
        """Call ``nvmlDevice<function>(handle_of(index), *args)``.

        Args:
            index: NVML GPU index.
            function: pynvml function name, e.g. ``"nvmlDeviceGetTemperature"``.
            args: further arguments after the handle.

        Returns:
            NVML's answer, or None when the field is not supported on this GPU or driver, or
            when NVML answered another error (counted in :attr:`errors` by function name, so one
            failing field never costs the others).

        Raises:
            GpuLostError: NVML says the GPU is lost.
        """
        nvml = self.module
        fn = getattr(nvml, function, None)
        handle = self._handles[index]
        if handle is None:
            if self._lost_at_init.get(index):
                raise GpuLostError(index)
            return None
        if fn is None:  # an older nvidia-ml-py without this binding
            return None
        try:
            return fn(handle, *args)
        except nvml.NVMLError as exc:
            if exc.value == nvml.NVML_ERROR_GPU_IS_LOST:
                raise GpuLostError(index) from None
            if exc.value not in _UNSUPPORTED_CODES(nvml):
                with self._lock:
                    self.errors[function] += 1
            return None

    def pci_bus_ids(self) -> dict[str, int]:
        """``"dddd:bb:dd"`` (lower case, as the kernel log prints it) -> NVML index, for the GPUs
        that answer; empty when NVML is not up."""
        out: dict[str, int] = {}
        with self._lock:
            if not self._initialised:
                return out
            for index in range(len(self._handles)):
                try:
                    info = self.call(index, "nvmlDeviceGetPciInfo")
                except Exception:  # noqa: BLE001 - a lost GPU is simply not mapped
                    continue
                if info is not None:
                    out[normalise_bus_id(info.busId)] = index
        return out


def normalise_bus_id(bus_id: bytes | str) -> str:
    """NVML's ``"00000000:9B:00.0"`` -> the kernel log's ``"0000:9b:00"``.

    Args:
        bus_id: ``nvmlPciInfo_t.busId`` (bytes in older nvidia-ml-py, str in newer).

    Returns:
        ``"dddd:bb:dd"``: domain as 4 hex digits (more only when it does not fit), lower case,
        no function number.
    """
    text = bus_id.decode() if isinstance(bus_id, bytes) else bus_id
    domain, bus, rest = text.strip().lower().split(":", 2)
    return f"{int(domain, 16):04x}:{bus}:{rest.split('.')[0]}"


#: label value -> (current constant name, pre-530 "throttle reasons" name), NVML nvml.h.
CLOCK_EVENT_REASONS: dict[str, tuple[str, str]] = {
    "gpu_idle": ("nvmlClocksEventReasonGpuIdle", "nvmlClocksThrottleReasonGpuIdle"),
    "applications_clocks_setting": ("nvmlClocksEventReasonApplicationsClocksSetting",
                                    "nvmlClocksThrottleReasonApplicationsClocksSetting"),
    "sw_power_cap": ("nvmlClocksEventReasonSwPowerCap", "nvmlClocksThrottleReasonSwPowerCap"),
    "hw_slowdown": ("nvmlClocksEventReasonHwSlowdown", "nvmlClocksThrottleReasonHwSlowdown"),
    "sync_boost": ("nvmlClocksEventReasonSyncBoost", "nvmlClocksThrottleReasonSyncBoost"),
    "sw_thermal": ("nvmlClocksEventReasonSwThermalSlowdown",
                   "nvmlClocksThrottleReasonSwThermalSlowdown"),
    "hw_thermal": ("nvmlClocksEventReasonHwThermalSlowdown",
                   "nvmlClocksThrottleReasonHwThermalSlowdown"),
    "hw_power_brake": ("nvmlClocksEventReasonHwPowerBrakeSlowdown",
                       "nvmlClocksThrottleReasonHwPowerBrakeSlowdown"),
    "display_clock": ("nvmlClocksEventReasonDisplayClockSetting",
                      "nvmlClocksThrottleReasonDisplayClockSetting"),
}


def first_constant(nvml: Any, *names: str) -> int | None:
    """The first of ``names`` the NVML module defines (e.g. a reason bit under its current and
    its pre-530 name), or None."""
    for name in names:
        value = getattr(nvml, name, None)
        if value is not None:
            return int(value)
    return None


def _UNSUPPORTED_CODES(nvml: Any) -> tuple[int, ...]:  # noqa: N802 - reads as a constant
    return (nvml.NVML_ERROR_NOT_SUPPORTED, nvml.NVML_ERROR_FUNCTION_NOT_FOUND,
            nvml.NVML_ERROR_NO_PERMISSION)


def _describe(nvml: Any, exc: Exception) -> str:
    value = getattr(exc, "value", None)
    if value == nvml.NVML_ERROR_LIBRARY_NOT_FOUND:
        return "NVML shared library not found (no NVIDIA driver installed)"
    if value == nvml.NVML_ERROR_DRIVER_NOT_LOADED:
        return "NVIDIA driver not loaded"
    return f"{type(exc).__name__}: {exc}"


_SHARED: dict[tuple[int, str], NvmlLibrary] = {}
_SHARED_LOCK = threading.Lock()


def shared_library(fake_gpus: int = 0, scenario: str = "default") -> NvmlLibrary:
    """The process-wide :class:`NvmlLibrary`: the real NVML, or a fake one with ``fake_gpus``.

    The GPU and XID collectors share it, so both see the same handles (and, with
    ``--collector.nvml.fake-gpus``, the same scenario).

    Args:
        fake_gpus: 0 for the real NVML, else the number of fake GPUs.
        scenario: the fake GPUs' scenario (:func:`laggard.nvml.fake.parse_scenario`).

    Raises:
        ValueError: an unknown scenario (fake GPUs only).
    """
    key = (fake_gpus, scenario if fake_gpus > 0 else "")
    with _SHARED_LOCK:
        library = _SHARED.get(key)
        if library is None:
            module: ModuleType | Any = None
            if fake_gpus > 0:
                from laggard.nvml.fake import FakeNvml

                module = FakeNvml(fake_gpus, clock=time.monotonic, scenario=scenario)
            library = _SHARED[key] = NvmlLibrary(module)
        return library
