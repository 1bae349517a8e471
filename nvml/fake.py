"""A fake NVML: the functions and constants of ``pynvml`` that laggard calls, playing a scenario.

Used by ``laggard agent --collector.nvml.fake-gpus N`` (as dcgm-exporter's ``--fake-gpus``) and
by the tests, so every GPU series can be seen and tested without a GPU. It is not a simulator of
GPU physics: it replays a short, fixed story, the same for every run.

The scenario repeats every :data:`PERIOD` steps (one step per ``step_seconds`` of ``clock``, or
per :meth:`FakeNvml.advance` when no clock is given). With ``i`` the GPU index:

* steps 10-19, GPU 0: software power cap (``sw_power_cap``), SM clock 1410 of 1980 MHz, power at
  the 700 W limit, power-violation time accumulating;
* steps 30-34, GPU 1: thermal slowdown (``sw_thermal`` + ``hw_thermal``), 88 C, SM 1200 MHz;
* GPU 2 (if any) is idle throughout: ``gpu_idle``, SM 345 MHz, utilisation 0;
* step 20: Xid 13 on the last GPU (an NVML critical-XID event);
* step 40: Xid 48 on GPU 0 with one uncorrected ECC error and a pending row remap;
* steps 50-59, last GPU (when there are two or more): lost; every call on it raises
  ``NVMLError_GpuIsLost``, until the period wraps round (a GPU reset).

That is the ``default`` scenario. Two more (:func:`parse_scenario`,
``--collector.nvml.fake-gpus-scenario``):

* ``steady``: every GPU at its maximum SM clock, no clock-event reason, no XID, no ECC error,
  no lost GPU: the baseline in which a slow rank has no GPU cause;
* ``throttle:G[:REASON]``: ``steady``, except that GPU ``G`` is held at 1410 of 1980 MHz with
  ``REASON`` active all the time (one of ``sw_power_cap``, ``hw_slowdown``, ``sw_thermal``,
  ``hw_thermal``, ``hw_power_brake``; default ``sw_thermal``, then at 88 C): the GPU whose rank
  ``laggard demo --throttle-slow-gpu`` slows.

Fields left unsupported on purpose (they raise ``NVMLError_NotSupported``, as on many boards):
the reliability violation counter, and NVLink on odd-numbered GPUs. Even-numbered GPUs have 18
NVLink links, one of them down.

Why one module of ~540 lines: it mirrors pynvml's flat namespace (the functions, constants and
error classes laggard calls), which a test swaps in for ``pynvml`` as one module object.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

PERIOD = 60
MAX_SM_MHZ = 1980
MAX_MEM_MHZ = 2619
POWER_LIMIT_MW = 700_000
NVLINKS_PER_GPU = 18  # as on H100 SXM
NVLINKS_UP = 17  # one link of every NVLink GPU is down

# Constants, with pynvml's names and values.
NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_UNKNOWN = 999
NVML_CLOCK_SM = 1
NVML_CLOCK_MEM = 2
NVML_TEMPERATURE_GPU = 0
NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_VOLATILE_ECC = 0
NVML_AGGREGATE_ECC = 1
NVML_PCIE_UTIL_TX_BYTES = 0
NVML_PCIE_UTIL_RX_BYTES = 1
NVML_NVLINK_MAX_LINKS = 36
NVML_FEATURE_DISABLED = 0
NVML_FEATURE_ENABLED = 1
NVML_FI_DEV_ECC_SBE_VOL_TOTAL = 3
NVML_FI_DEV_ECC_DBE_VOL_TOTAL = 4
NVML_FI_DEV_PERF_POLICY_POWER = 74
NVML_FI_DEV_PERF_POLICY_THERMAL = 75
NVML_FI_DEV_PERF_POLICY_SYNC_BOOST = 76
NVML_FI_DEV_PERF_POLICY_BOARD_LIMIT = 77
NVML_FI_DEV_PERF_POLICY_LOW_UTILIZATION = 78
NVML_FI_DEV_PERF_POLICY_RELIABILITY = 79
NVML_FI_DEV_PERF_POLICY_TOTAL_APP_CLOCKS = 80
NVML_FI_DEV_PERF_POLICY_TOTAL_BASE_CLOCKS = 81
NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION = 83
NVML_FI_DEV_PCIE_REPLAY_COUNTER = 94
NVML_FI_DEV_REMAPPED_COR = 142
NVML_FI_DEV_REMAPPED_UNC = 143
NVML_FI_DEV_REMAPPED_PENDING = 144
NVML_FI_DEV_REMAPPED_FAILURE = 145
NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL = 38
NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL = 45
NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL = 52
NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL = 59
NVML_FI_DEV_NVLINK_LINK_COUNT = 91
NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX = 138
NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX = 139
NVML_PERF_POLICY_POWER = 0
NVML_PERF_POLICY_THERMAL = 1
NVML_PERF_POLICY_SYNC_BOOST = 2
NVML_PERF_POLICY_BOARD_LIMIT = 3
NVML_PERF_POLICY_LOW_UTILIZATION = 4
NVML_PERF_POLICY_RELIABILITY = 5
NVML_PERF_POLICY_TOTAL_APP_CLOCKS = 10
NVML_PERF_POLICY_TOTAL_BASE_CLOCKS = 11
nvmlEventTypeXidCriticalError = 0x8
nvmlClocksEventReasonGpuIdle = 0x1
nvmlClocksEventReasonApplicationsClocksSetting = 0x2
nvmlClocksEventReasonSwPowerCap = 0x4
nvmlClocksEventReasonHwSlowdown = 0x8
nvmlClocksEventReasonSyncBoost = 0x10
nvmlClocksEventReasonSwThermalSlowdown = 0x20
nvmlClocksEventReasonHwThermalSlowdown = 0x40
nvmlClocksEventReasonHwPowerBrakeSlowdown = 0x80
nvmlClocksEventReasonDisplayClockSetting = 0x100

_CONSTANTS = {k: v for k, v in dict(globals()).items() if k.startswith(("NVML_", "nvml"))}

#: Scenario names :class:`FakeNvml` plays (module docstring).
SCENARIOS = ("default", "steady", "throttle")
#: SM clock of the throttled GPU in the ``throttle`` scenario, MHz.
THROTTLED_SM_MHZ = 1410
#: Reasons the ``throttle`` scenario may hold on (the limits of NVML's clock-event bits).
_THROTTLE_BITS = {
    "sw_power_cap": nvmlClocksEventReasonSwPowerCap,
    "hw_slowdown": nvmlClocksEventReasonHwSlowdown,
    "sw_thermal": nvmlClocksEventReasonSwThermalSlowdown,
    "hw_thermal": nvmlClocksEventReasonHwThermalSlowdown,
    "hw_power_brake": nvmlClocksEventReasonHwPowerBrakeSlowdown,
}


@dataclass(frozen=True, slots=True)
class Scenario:
    """What a :class:`FakeNvml` plays.

    Attributes:
        name: one of :data:`SCENARIOS`.
        gpu: the throttled GPU (``throttle``), else None.
        reason: the reason held on that GPU (``throttle``), else None.
    """

    name: str = "default"
    gpu: int | None = None
    reason: str | None = None

    def __str__(self) -> str:
        return self.name if self.gpu is None else f"{self.name}:{self.gpu}:{self.reason}"


def parse_scenario(spec: str) -> Scenario:
    """``default``, ``steady`` or ``throttle:G[:REASON]`` -> a :class:`Scenario`.

    Raises:
        ValueError: an unknown scenario or reason, or a GPU that is not a non-negative integer.
    """
    name, _, rest = (spec or "default").strip().partition(":")
    if name not in SCENARIOS:
        raise ValueError(f"unknown fake NVML scenario {name!r} (one of {', '.join(SCENARIOS)})")
    if name != "throttle":
        if rest:
            raise ValueError(f"fake NVML scenario {name!r} takes no arguments")
        return Scenario(name)
    gpu_text, _, reason = rest.partition(":")
    if not gpu_text.isdigit():
        raise ValueError("throttle scenario: give the GPU, e.g. throttle:1 or "
                         "throttle:1:sw_thermal")
    reason = reason or "sw_thermal"
    if reason not in _THROTTLE_BITS:
        raise ValueError(f"throttle scenario: reason must be one of {', '.join(_THROTTLE_BITS)}")
    return Scenario(name, int(gpu_text), reason)


class NVMLError(Exception):
    """pynvml's error type: ``NVMLError(value)`` becomes the subclass for that value."""

    _value_class: dict[int, type[NVMLError]] = {}
    value: int

    def __new__(cls, value: int) -> NVMLError:  # noqa: D102 - mirrors pynvml
        if cls is NVMLError:
            cls = NVMLError._value_class.get(value, cls)
        obj = Exception.__new__(cls)
        obj.value = value
        return obj

    def __init__(self, value: int) -> None:
        super().__init__(value)

    def __str__(self) -> str:
        return f"fake NVML error {self.value}"


def _error_class(name: str, value: int) -> type[NVMLError]:
    cls = type(f"NVMLError_{name}", (NVMLError,), {})
    NVMLError._value_class[value] = cls
    return cls


NVMLError_Uninitialized = _error_class("Uninitialized", NVML_ERROR_UNINITIALIZED)
NVMLError_NotSupported = _error_class("NotSupported", NVML_ERROR_NOT_SUPPORTED)
NVMLError_NoPermission = _error_class("NoPermission", NVML_ERROR_NO_PERMISSION)
NVMLError_DriverNotLoaded = _error_class("DriverNotLoaded", NVML_ERROR_DRIVER_NOT_LOADED)
NVMLError_Timeout = _error_class("Timeout", NVML_ERROR_TIMEOUT)
NVMLError_LibraryNotFound = _error_class("LibraryNotFound", NVML_ERROR_LIBRARY_NOT_FOUND)
NVMLError_GpuIsLost = _error_class("GpuIsLost", NVML_ERROR_GPU_IS_LOST)
NVMLError_Unknown = _error_class("Unknown", NVML_ERROR_UNKNOWN)


@dataclass(slots=True)
class _Gpu:
    index: int
    energy_mj: float = 0.0
    power_violation_ns: int = 0
    thermal_violation_ns: int = 0
    ecc_uncorrected: int = 0
    ecc_corrected: int = 0
    remap_pending: bool = False
    pcie_replays: int = 0
    nvlink_tx_kib: int = 0
    nvlink_rx_kib: int = 0
    events: deque[tuple[int, int]] = field(default_factory=deque)  # (event type, xid)


@dataclass(frozen=True, slots=True)
class _Handle:
    index: int


class FakeNvml:
    """An object that looks like the ``pynvml`` module for the calls laggard makes.

    Args:
        gpus: number of fake GPUs (>= 1).
        clock: when given (e.g. ``time.monotonic``), the scenario advances one step every
            ``step_seconds`` of it; when None, only :meth:`advance` moves it (tests).
        step_seconds: seconds per scenario step with a clock.
        driver: ``"ok"``, ``"no_library"`` or ``"no_driver"``: what ``nvmlInit`` does.
        scenario: what the GPUs do: a :class:`Scenario` or its text (:func:`parse_scenario`).

    Raises:
        ValueError: no GPU, an unknown scenario, or a throttled GPU that does not exist.

    Attributes:
        calls: number of NVML calls made (the benchmark subtracts the fake's own cost).
    """

    def __init__(self, gpus: int, *, clock: Callable[[], float] | None = None,
                 step_seconds: float = 1.0, driver: str = "ok",
                 scenario: Scenario | str = "default") -> None:
        if gpus < 1:
            raise ValueError("a fake NVML needs at least one GPU")
        self.scenario = scenario if isinstance(scenario, Scenario) else parse_scenario(scenario)
        if self.scenario.gpu is not None and self.scenario.gpu >= gpus:
            raise ValueError(f"fake NVML scenario {self.scenario}: there are only {gpus} GPUs")
        self.__dict__.update(_CONSTANTS)
        for name, value in globals().items():
            if name.startswith("NVMLError"):
                setattr(self, name, value)
        self._gpus = [_Gpu(i) for i in range(gpus)]
        self._clock = clock
        self._start = clock() if clock else 0.0
        self._step_seconds = step_seconds
        self._manual_step = 0
        self._seen_step = 0
        self._driver = driver
        self._initialised = 0
        self._lock = threading.Condition()
        self.calls = 0

    # -- scenario ------------------------------------------------------------------------------

    def advance(self, steps: int = 1) -> None:
        """Move the scenario on by ``steps`` (tests; without a clock)."""
        with self._lock:
            self._manual_step += steps
            self._catch_up()
            self._lock.notify_all()

    @property
    def step(self) -> int:
        """Scenario steps since the start."""
        if self._clock is None:
            return self._manual_step
        return int((self._clock() - self._start) / self._step_seconds)

    def _to_next_step(self) -> float:
        if self._clock is None:
            return float("inf")
        elapsed = self._clock() - self._start
        return self._step_seconds - elapsed % self._step_seconds + 1e-3

    def _catch_up(self) -> None:
        # Accumulate counters and queue events for every step passed since the last call.
        now = self.step
        while self._seen_step < now:
            self._seen_step += 1
            s = self._seen_step % PERIOD
            for gpu in self._gpus:
                state = self._state(gpu.index, s)
                gpu.energy_mj += state["power_mw"] * self._step_seconds
                gpu.nvlink_tx_kib += 8_000_000 if state["util"] else 0
                gpu.nvlink_rx_kib += 7_900_000 if state["util"] else 0
                if state["reasons"] & nvmlClocksEventReasonSwPowerCap:
                    gpu.power_violation_ns += int(self._step_seconds * 1e9)
                if state["reasons"] & nvmlClocksEventReasonHwThermalSlowdown:
                    gpu.thermal_violation_ns += int(self._step_seconds * 1e9)
                if s == 0:
                    gpu.remap_pending = False  # the period wraps: GPUs were reset
            if self.scenario.name != "default":
                continue  # the other scenarios have no XID, ECC or replay events
            last = len(self._gpus) - 1
            if s == 20:
                self._gpus[last].events.append((nvmlEventTypeXidCriticalError, 13))
            if s == 40:
                self._gpus[0].events.append((nvmlEventTypeXidCriticalError, 48))
                self._gpus[0].ecc_uncorrected += 1
                self._gpus[0].remap_pending = True
            if s % 15 == 0:
                self._gpus[0].pcie_replays += 1
                self._gpus[0].ecc_corrected += 3

    def _state(self, i: int, s: int) -> dict[str, Any]:
        if self.scenario.name != "default":
            return self._steady_state(i)
        idle = i == 2
        sm, reasons, temp, power, util = MAX_SM_MHZ, 0, 41 + i, 450_000 + 10_000 * i, 0.93
        if idle:
            sm, reasons, temp, power, util = 345, nvmlClocksEventReasonGpuIdle, 33, 70_000, 0.0
        if i == 0 and 10 <= s < 20:
            sm, reasons, power = 1410, nvmlClocksEventReasonSwPowerCap, POWER_LIMIT_MW
        if i == 1 and 30 <= s < 35:
            sm, temp = 1200, 88
            reasons = (nvmlClocksEventReasonSwThermalSlowdown
                       | nvmlClocksEventReasonHwThermalSlowdown)
        return {"sm": sm, "reasons": reasons, "temp": temp, "power_mw": power, "util": util}

    def _steady_state(self, i: int) -> dict[str, Any]:
        state = {"sm": MAX_SM_MHZ, "reasons": 0, "temp": 41 + i, "power_mw": 450_000 + 10_000 * i,
                 "util": 0.93}
        reason = self.scenario.reason
        if i == self.scenario.gpu and reason is not None:
            state.update(sm=THROTTLED_SM_MHZ, reasons=_THROTTLE_BITS[reason])
            if "thermal" in reason:
                state["temp"] = 88
            if reason == "sw_power_cap":
                state["power_mw"] = POWER_LIMIT_MW
        return state

    def _lost(self, i: int) -> bool:
        if self.scenario.name != "default":
            return False
        return len(self._gpus) >= 2 and i == len(self._gpus) - 1 and 50 <= self.step % PERIOD

    def _gpu(self, handle: _Handle) -> _Gpu:
        self.calls += 1
        if not self._initialised:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        with self._lock:
            self._catch_up()
        if self._lost(handle.index):
            raise NVMLError(NVML_ERROR_GPU_IS_LOST)
        return self._gpus[handle.index]

    def _now(self, handle: _Handle) -> dict[str, Any]:
        gpu = self._gpu(handle)
        return self._state(gpu.index, self.step % PERIOD)

    # -- library -------------------------------------------------------------------------------

    def nvmlInit(self) -> None:  # noqa: N802 - pynvml's names
        self.calls += 1
        if self._driver == "no_library":
            raise NVMLError(NVML_ERROR_LIBRARY_NOT_FOUND)
        if self._driver == "no_driver":
            raise NVMLError(NVML_ERROR_DRIVER_NOT_LOADED)
        self._initialised += 1

    def nvmlShutdown(self) -> None:  # noqa: N802
        self.calls += 1
        if not self._initialised:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        self._initialised -= 1

    def nvmlSystemGetDriverVersion(self) -> str:  # noqa: N802
        self.calls += 1
        return "570.158.01"

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        self.calls += 1
        if not self._initialised:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        return len(self._gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:  # noqa: N802
        self.calls += 1
        if not 0 <= index < len(self._gpus):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return _Handle(index)

    # -- identity ------------------------------------------------------------------------------

    def nvmlDeviceGetIndex(self, handle: _Handle) -> int:  # noqa: N802
        self.calls += 1
        return handle.index

    def nvmlDeviceGetUUID(self, handle: _Handle) -> str:  # noqa: N802
        return f"GPU-fa4e0000-0000-0000-0000-{self._gpu(handle).index:012d}"

    def nvmlDeviceGetName(self, handle: _Handle) -> str:  # noqa: N802
        self._gpu(handle)
        return "NVIDIA H100 80GB HBM3 (fake)"

    def nvmlDeviceGetPciInfo(self, handle: _Handle) -> SimpleNamespace:  # noqa: N802
        i = self._gpu(handle).index
        # NVML gives an 8-digit domain, upper case, as bytes.
        return SimpleNamespace(busId=f"00000000:{0x18 + 0x10 * i:02X}:00.0".encode(),
                               domain=0, bus=0x18 + 0x10 * i, device=0)

    # -- clocks, power, temperature ---------------------------------------------------------------

    def nvmlDeviceGetClockInfo(self, handle: _Handle, clock: int) -> int:  # noqa: N802
        state = self._now(handle)
        return state["sm"] if clock == NVML_CLOCK_SM else MAX_MEM_MHZ

    def nvmlDeviceGetMaxClockInfo(self, handle: _Handle, clock: int) -> int:  # noqa: N802
        self._gpu(handle)
        return MAX_SM_MHZ if clock == NVML_CLOCK_SM else MAX_MEM_MHZ

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: _Handle) -> int:  # noqa: N802
        return int(self._now(handle)["reasons"])

    def nvmlDeviceGetViolationStatus(self, handle: _Handle,  # noqa: N802
                                     policy: int) -> SimpleNamespace:
        gpu = self._gpu(handle)
        if policy == NVML_PERF_POLICY_RELIABILITY:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        violation = {NVML_PERF_POLICY_POWER: gpu.power_violation_ns,
                     NVML_PERF_POLICY_THERMAL: gpu.thermal_violation_ns}.get(policy, 0)
        return SimpleNamespace(referenceTime=int(self.step * self._step_seconds * 1e6),
                               violationTime=violation)

    def nvmlDeviceGetTemperature(self, handle: _Handle, sensor: int) -> int:  # noqa: N802
        return int(self._now(handle)["temp"])

    def nvmlDeviceGetPowerUsage(self, handle: _Handle) -> int:  # noqa: N802
        return int(self._now(handle)["power_mw"])

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: _Handle) -> int:  # noqa: N802
        self._gpu(handle)
        return POWER_LIMIT_MW

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: _Handle) -> int:  # noqa: N802
        return int(self._gpu(handle).energy_mj)

    def nvmlDeviceGetUtilizationRates(self, handle: _Handle) -> SimpleNamespace:  # noqa: N802
        util = self._now(handle)["util"]
        return SimpleNamespace(gpu=round(util * 100), memory=round(util * 40))

    def nvmlDeviceGetMemoryInfo(self, handle: _Handle) -> SimpleNamespace:  # noqa: N802
        used = 0 if self._now(handle)["util"] == 0 else 61 * 2**30
        return SimpleNamespace(total=80 * 2**30, used=used, free=80 * 2**30 - used)

    # -- errors --------------------------------------------------------------------------------

    def nvmlDeviceGetTotalEccErrors(self, handle: _Handle, error_type: int,  # noqa: N802
                                    counter_type: int) -> int:
        gpu = self._gpu(handle)
        return gpu.ecc_uncorrected if error_type == NVML_MEMORY_ERROR_TYPE_UNCORRECTED else (
            gpu.ecc_corrected)

    def nvmlDeviceGetRemappedRows(self, handle: _Handle) -> tuple[int, int, int, int]:  # noqa: N802
        gpu = self._gpu(handle)
        return (0, gpu.ecc_uncorrected, int(gpu.remap_pending), 0)

    def nvmlDeviceGetPcieReplayCounter(self, handle: _Handle) -> int:  # noqa: N802
        return self._gpu(handle).pcie_replays

    def nvmlDeviceGetPcieThroughput(self, handle: _Handle, counter: int) -> int:  # noqa: N802
        util = self._now(handle)["util"]
        return int(util * (2_000_000 if counter == NVML_PCIE_UTIL_TX_BYTES else 3_000_000))

    # -- NVLink ---------------------------------------------------------------------------------

    def _nvlink(self, handle: _Handle, link: int) -> _Gpu:
        gpu = self._gpu(handle)
        if gpu.index % 2 == 1:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        if link >= NVML_NVLINK_MAX_LINKS:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return gpu

    def nvmlDeviceGetNvLinkState(self, handle: _Handle, link: int) -> int:  # noqa: N802
        self._nvlink(handle, link)
        return NVML_FEATURE_ENABLED if link < NVLINKS_UP else NVML_FEATURE_DISABLED

    def nvmlDeviceGetFieldValues(self, handle: _Handle,  # noqa: N802
                                 field_ids: list[Any]) -> list[SimpleNamespace]:
        """pynvml's batched read: one ``nvmlFieldValue_t``-like answer per field id (an int, or
        a ``(field id, scope id)`` pair), each with its own ``nvmlReturn``: NVLink fields are
        unsupported on odd GPUs, the reliability policy counter on every GPU."""
        gpu = self._gpu(handle)
        device = {
            NVML_FI_DEV_ECC_SBE_VOL_TOTAL: gpu.ecc_corrected,
            NVML_FI_DEV_ECC_DBE_VOL_TOTAL: gpu.ecc_uncorrected,
            NVML_FI_DEV_PERF_POLICY_POWER: gpu.power_violation_ns,
            NVML_FI_DEV_PERF_POLICY_THERMAL: gpu.thermal_violation_ns,
            NVML_FI_DEV_PERF_POLICY_SYNC_BOOST: 0,
            NVML_FI_DEV_PERF_POLICY_BOARD_LIMIT: 0,
            NVML_FI_DEV_PERF_POLICY_LOW_UTILIZATION: 0,
            NVML_FI_DEV_PERF_POLICY_TOTAL_APP_CLOCKS: 0,
            NVML_FI_DEV_PERF_POLICY_TOTAL_BASE_CLOCKS: 0,
            NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION: int(gpu.energy_mj),
            NVML_FI_DEV_PCIE_REPLAY_COUNTER: gpu.pcie_replays,
            NVML_FI_DEV_REMAPPED_COR: 0,
            NVML_FI_DEV_REMAPPED_UNC: gpu.ecc_uncorrected,
            NVML_FI_DEV_REMAPPED_PENDING: int(gpu.remap_pending),
            NVML_FI_DEV_REMAPPED_FAILURE: 0,
        }
        nvlink = {
            NVML_FI_DEV_NVLINK_LINK_COUNT: NVLINKS_PER_GPU,
            NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL: self._seen_step // 10 if gpu.index == 0
            else 0,
            NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL: 0,
            NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL: 0,
            NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL: 0,
            NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX: gpu.nvlink_tx_kib,
            NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX: gpu.nvlink_rx_kib,
        }
        out = []
        for requested in field_ids:
            field_id = requested[0] if isinstance(requested, tuple) else requested
            value = device.get(field_id)
            if value is None and gpu.index % 2 == 0:
                value = nvlink.get(field_id)
            ret = NVML_SUCCESS if value is not None else NVML_ERROR_NOT_SUPPORTED
            out.append(SimpleNamespace(fieldId=field_id, nvmlReturn=ret, valueType=3,
                                       value=SimpleNamespace(ullVal=value or 0)))
        return out

    # -- events -------------------------------------------------------------------------------

    def nvmlEventSetCreate(self) -> list[_Handle]:  # noqa: N802
        self.calls += 1
        return []

    def nvmlDeviceRegisterEvents(self, handle: _Handle, event_types: int,  # noqa: N802
                                 event_set: list[_Handle]) -> None:
        self._gpu(handle)
        event_set.append(handle)

    def nvmlDeviceGetSupportedEventTypes(self, handle: _Handle) -> int:  # noqa: N802
        self._gpu(handle)
        return nvmlEventTypeXidCriticalError

    def nvmlEventSetWait_v2(self, event_set: list[_Handle],  # noqa: N802
                            timeout_ms: int) -> SimpleNamespace:
        self.calls += 1
        deadline = time.monotonic() + timeout_ms / 1000
        with self._lock:
            while True:
                self._catch_up()
                for handle in event_set:
                    gpu = self._gpus[handle.index]
                    if gpu.events:
                        event_type, xid = gpu.events.popleft()
                        return SimpleNamespace(device=handle, eventType=event_type,
                                               eventData=xid, gpuInstanceId=0xFFFFFFFF,
                                               computeInstanceId=0xFFFFFFFF)
                left = deadline - time.monotonic()
                if left <= 0:
                    raise NVMLError(NVML_ERROR_TIMEOUT)
                # advance() notifies; with a clock, wake at the next step boundary.
                self._lock.wait(min(left, self._to_next_step()))

    def nvmlEventSetFree(self, event_set: list[_Handle]) -> None:  # noqa: N802
        self.calls += 1
        event_set.clear()
