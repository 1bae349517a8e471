"""GPU collector (``nvml``): per-GPU state through NVML, in base units.

What it exports (NVML call, ``nvidia-smi --query-gpu`` field, conversion at the edge):

* ``laggard_gpu_info{uuid,model,pci_bus_id,driver_version}``: GetUUID, GetName, GetPciInfo.
* ``laggard_gpu_{sm,memory}_clock_hertz``, ``..._clock_max_hertz``: GetClockInfo,
  GetMaxClockInfo (clocks.sm, clocks.mem, clocks.max.*), MHz x 1e6.
* ``laggard_gpu_clock_event_active{reason}``: GetCurrentClocksEventReasons
  (clocks_event_reasons.*), one 0/1 series per bit.
* ``laggard_gpu_clock_violation_seconds_total{reason}``: GetViolationStatus per perf policy,
  ``violationTime`` ns / 1e9.
* ``laggard_gpu_temperature_celsius``: GetTemperature (temperature.gpu).
* ``laggard_gpu_power_watts``, ``laggard_gpu_power_limit_watts``: GetPowerUsage,
  GetEnforcedPowerLimit (power.draw, enforced.power.limit), mW / 1e3.
* ``laggard_gpu_energy_joules_total``: GetTotalEnergyConsumption, mJ / 1e3.
* ``laggard_gpu_utilization_ratio``, ``laggard_gpu_memory_utilization_ratio``:
  GetUtilizationRates (utilization.gpu, utilization.memory), percent / 100.
* ``laggard_gpu_memory_{used,total}_bytes``: GetMemoryInfo (memory.used, memory.total).
* ``laggard_gpu_ecc_errors_total{type}``: GetTotalEccErrors, volatile counts
  (ecc.errors.{corrected,uncorrected}.volatile.total).
* ``laggard_gpu_remapped_rows{type}``, ``laggard_gpu_row_remap_{pending,failure}``:
  GetRemappedRows.
* ``laggard_gpu_pcie_replay_total``: GetPcieReplayCounter.
* ``laggard_gpu_pcie_throughput_bytes_per_second{direction}``: GetPcieThroughput, KiB/s x 1024.
* ``laggard_gpu_nvlink_links``, ``laggard_gpu_nvlink_active_links``: GetFieldValues
  (``NVML_FI_DEV_NVLINK_LINK_COUNT``), GetNvLinkState per link.
* ``laggard_gpu_nvlink_errors_total{type}``: GetFieldValues (``..._REPLAY/RECOVERY/CRC_FLIT/
  CRC_DATA_ERROR_COUNT_TOTAL``, all links).
* ``laggard_gpu_nvlink_{transmitted,received}_bytes_total``: GetFieldValues
  (``NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX/RX``), KiB x 1024.
* ``laggard_gpu_lost``: 1 when a call answers ``NVML_ERROR_GPU_IS_LOST``.

A field NVML does not support on a GPU is left out for that GPU. Clock-event reasons use the NVML
constants (``nvmlClocksEventReason*``, or the pre-530 ``nvmlClocksThrottleReason*`` names).
Each GPU's clocks feed the :class:`~laggard.detectors.throttle.ThrottleDetector`; a lost GPU raises
one ``gpu_lost`` finding per loss, and the others go on reporting.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from laggard.collectors.base import AgentSettings, CollectorSpec, Flag
from laggard.detectors.finding import Finding, Severity
from laggard.detectors.throttle import ClockSample, ThrottleDetector
from laggard.nvml.library import (
    CLOCK_EVENT_REASONS,
    GpuLostError,
    NvmlLibrary,
    first_constant,
    normalise_bus_id,
    shared_library,
)

log = logging.getLogger(__name__)

# The collector's flags. The fake GPUs stand in for NVML everywhere the agent uses it (this
# collector, the xid collector's events, the intake's rank-to-GPU index): see library().
FAKE_GPUS = Flag("collector.nvml.fake-gpus", 0, type=int, metavar="N",
                 help="serve N fake GPUs playing a scenario instead of real NVML (default "
                      "%(default)s: the real NVML)")
FAKE_GPUS_SCENARIO = Flag(
    "collector.nvml.fake-gpus-scenario", "default", metavar="SCENARIO",
    help="what the fake GPUs play: default (a short story of throttles, XIDs and a lost GPU), "
         "steady (nothing happens) or throttle:G[:REASON] (GPU G held at 1.41 GHz by REASON, "
         "default sw_thermal)")


#: label value -> NVML perf policy constant of nvmlDeviceGetViolationStatus.
VIOLATION_POLICIES: dict[str, str] = {
    "power": "NVML_PERF_POLICY_POWER",
    "thermal": "NVML_PERF_POLICY_THERMAL",
    "sync_boost": "NVML_PERF_POLICY_SYNC_BOOST",
    "board_limit": "NVML_PERF_POLICY_BOARD_LIMIT",
    "low_utilization": "NVML_PERF_POLICY_LOW_UTILIZATION",
    "reliability": "NVML_PERF_POLICY_RELIABILITY",
    "total_app_clocks": "NVML_PERF_POLICY_TOTAL_APP_CLOCKS",
    "total_base_clocks": "NVML_PERF_POLICY_TOTAL_BASE_CLOCKS",
}

#: NVLink fields read in one nvmlDeviceGetFieldValues call (nvml.h ``NVML_FI_DEV_NVLINK_*``):
#: link count, data-link error totals over all links, and data throughput in KiB.
NVLINK_FIELDS: dict[str, str] = {
    "links": "NVML_FI_DEV_NVLINK_LINK_COUNT",
    "replay": "NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
    "recovery": "NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
    "crc_flit": "NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
    "crc_data": "NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
    "transmitted": "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX",
    "received": "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX",
}
#: nvmlValueType_t -> member of the nvmlValue_t union
_VALUE_MEMBERS = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal"}

MHZ = 1e6
KIB = 1024
#: HELP of laggard_gpu_lost, written in two places.
_LOST_HELP = "1 when NVML reports the GPU lost, 0 otherwise."


class _Families:
    """The metric families of one round, created on first use so absent fields leave no
    empty family behind."""

    def __init__(self) -> None:
        self._families: dict[str, GaugeMetricFamily | CounterMetricFamily] = {}

    def add(self, kind: type[GaugeMetricFamily] | type[CounterMetricFamily], name: str, doc: str,
            labels: dict[str, str], value: float) -> None:
        family = self._families.get(name)
        if family is None:
            family = kind(name, doc, labels=list(labels))
            self._families[name] = family
        family.add_metric(list(labels.values()), value)

    def gauge(self, name: str, doc: str, labels: dict[str, str], value: float) -> None:
        self.add(GaugeMetricFamily, name, doc, labels, value)

    def counter(self, name: str, doc: str, labels: dict[str, str], value: float) -> None:
        # prometheus_client appends "_total" to counter samples itself.
        self.add(CounterMetricFamily, name.removesuffix("_total"), doc, labels, value)

    def __iter__(self) -> Any:
        return iter(self._families.values())


class NvmlCollector:
    """Samples every GPU through an :class:`NvmlLibrary`.

    Args:
        library: the NVML wrapper (real or fake module inside).
        findings: where throttle and GPU-lost findings go (``FindingLog``-like: ``add``), or None.
        throttle: the throttle detector to feed (default settings when None).
        node: node name put on findings.
    """

    name = "nvml"

    def __init__(self, library: NvmlLibrary, *, findings: Any = None,
                 throttle: ThrottleDetector | None = None, node: str | None = None) -> None:
        self.library = library
        self.findings = findings
        self.node = node
        self.throttle = throttle or ThrottleDetector(node=node)
        self._lost: set[int] = set()

    def collect(self) -> Iterable[Metric]:
        """One sampling round over every GPU.

        Raises:
            NoDataError: NVML is not available here (no driver, no library, backoff).
        """
        count = self.library.start()
        families = _Families()
        for index in range(count):
            gpu = {"gpu": str(index)}
            try:
                self._collect_gpu(index, gpu, families)
            except GpuLostError:
                self._mark_lost(index)
                families.gauge("laggard_gpu_lost", _LOST_HELP, gpu, 1)
                continue
            if index in self._lost:
                self._lost.discard(index)
                log.warning("GPU %d answers NVML again", index)
            families.gauge("laggard_gpu_lost", _LOST_HELP, gpu, 0)
        if self._lost:
            self.library.reinit()  # a lost GPU needs fresh handles once it is reset
        else:
            self.library.healthy()
        for function, count in sorted(self.library.errors.items()):
            families.counter("laggard_nvml_errors_total",
                             "NVML calls that failed with an unexpected error (the field left "
                             "out), by function.",
                             {"function": function}, count)
        return list(families)

    def _mark_lost(self, index: int) -> None:
        self.throttle.forget(index)
        if index in self._lost:
            return
        self._lost.add(index)
        log.error("GPU %d is lost (NVML_ERROR_GPU_IS_LOST)", index)
        self._report(Finding(
            detector="nvml", kind="gpu_lost", severity=Severity.CRITICAL, node=self.node,
            gpu=index, message=f"GPU {index} is lost: NVML cannot reach it; drain the node and "
                               f"reset the GPU or reboot",
            evidence={"nvml_error": "NVML_ERROR_GPU_IS_LOST"},
        ))

    def _report(self, finding: Finding) -> None:
        if self.findings is not None:
            self.findings.add(finding)

    def _collect_gpu(self, index: int, gpu: dict[str, str], out: _Families) -> None:
        lib = self.library
        nvml = lib.module

        def get(function: str, *args: Any) -> Any:
            return lib.call(index, function, *args)

        uuid, model, pci = get("nvmlDeviceGetUUID"), get("nvmlDeviceGetName"), get(
            "nvmlDeviceGetPciInfo")
        out.gauge("laggard_gpu_info", "GPU identity (value 1).",
                  {**gpu, "uuid": _text(uuid), "model": _text(model),
                   "pci_bus_id": normalise_bus_id(pci.busId) if pci is not None else "",
                   "driver_version": lib.driver_version or ""}, 1)

        sm, sm_max = get("nvmlDeviceGetClockInfo", nvml.NVML_CLOCK_SM), get(
            "nvmlDeviceGetMaxClockInfo", nvml.NVML_CLOCK_SM)
        mem, mem_max = get("nvmlDeviceGetClockInfo", nvml.NVML_CLOCK_MEM), get(
            "nvmlDeviceGetMaxClockInfo", nvml.NVML_CLOCK_MEM)
        for name, doc, value in (
            ("laggard_gpu_sm_clock_hertz", "SM clock", sm),
            ("laggard_gpu_sm_clock_max_hertz", "Maximum SM clock", sm_max),
            ("laggard_gpu_memory_clock_hertz", "Memory clock", mem),
            ("laggard_gpu_memory_clock_max_hertz", "Maximum memory clock", mem_max),
        ):
            if value is not None:
                out.gauge(name, f"{doc}, in hertz.", gpu, value * MHZ)

        mask = get("nvmlDeviceGetCurrentClocksEventReasons")
        if mask is None:
            mask = get("nvmlDeviceGetCurrentClocksThrottleReasons")
        active: set[str] = set()
        if mask is not None:
            for reason, names in CLOCK_EVENT_REASONS.items():
                bit = first_constant(nvml, *names)
                if bit is None:
                    continue
                on = bool(mask & bit)
                if on:
                    active.add(reason)
                out.gauge("laggard_gpu_clock_event_active",
                          "1 while NVML reports this clock-event (throttle) reason, 0 otherwise.",
                          {**gpu, "reason": reason}, int(on))
        if sm is not None and sm_max:
            for finding in self.throttle.update(
                    ClockSample(index, sm * MHZ, sm_max * MHZ, frozenset(active))):
                self._report(finding)

        for reason, constant in VIOLATION_POLICIES.items():
            policy = getattr(nvml, constant, None)
            status = None if policy is None else get("nvmlDeviceGetViolationStatus", policy)
            if status is not None:
                out.counter("laggard_gpu_clock_violation_seconds_total",
                            "Time the clocks were held below target by this policy, in seconds.",
                            {**gpu, "reason": reason}, status.violationTime / 1e9)

        self._health(get, nvml, gpu, out)
        self._links(get, nvml, gpu, out)

    def _health(self, get: Any, nvml: Any, gpu: dict[str, str], out: _Families) -> None:
        if (temp := get("nvmlDeviceGetTemperature", nvml.NVML_TEMPERATURE_GPU)) is not None:
            out.gauge("laggard_gpu_temperature_celsius",
                      "GPU core temperature, in degrees Celsius.", gpu, temp)
        if (power := get("nvmlDeviceGetPowerUsage")) is not None:
            out.gauge("laggard_gpu_power_watts", "Power draw, in watts.", gpu, power / 1e3)
        if (limit := get("nvmlDeviceGetEnforcedPowerLimit")) is not None:
            out.gauge("laggard_gpu_power_limit_watts", "Enforced power limit, in watts.", gpu,
                      limit / 1e3)
        if (energy := get("nvmlDeviceGetTotalEnergyConsumption")) is not None:
            out.counter("laggard_gpu_energy_joules_total",
                        "Energy used since the driver loaded, in joules.", gpu,
                        energy / 1e3)
        if (util := get("nvmlDeviceGetUtilizationRates")) is not None:
            out.gauge("laggard_gpu_utilization_ratio",
                      "Fraction of the last sample period a kernel was running (ratio, "
                      "0 to 1).", gpu,
                      util.gpu / 100)
            out.gauge("laggard_gpu_memory_utilization_ratio",
                      "Fraction of the last sample period device memory was read or written "
                      "(ratio, 0 to 1).",
                      gpu, util.memory / 100)
        if (memory := get("nvmlDeviceGetMemoryInfo")) is not None:
            out.gauge("laggard_gpu_memory_used_bytes", "Device memory in use, in bytes.", gpu,
                      memory.used)
            out.gauge("laggard_gpu_memory_total_bytes", "Device memory, in bytes.", gpu,
                      memory.total)
        for kind, constant in (("corrected", "NVML_MEMORY_ERROR_TYPE_CORRECTED"),
                               ("uncorrected", "NVML_MEMORY_ERROR_TYPE_UNCORRECTED")):
            count = get("nvmlDeviceGetTotalEccErrors", getattr(nvml, constant),
                        nvml.NVML_VOLATILE_ECC)
            if count is not None:
                out.counter("laggard_gpu_ecc_errors_total",
                            "ECC errors since the driver loaded, by type.",
                            {**gpu, "type": kind}, count)
        if (rows := get("nvmlDeviceGetRemappedRows")) is not None:
            correctable, uncorrectable, pending, failure = rows
            for kind, value in (("correctable", correctable), ("uncorrectable", uncorrectable)):
                out.gauge("laggard_gpu_remapped_rows", "Memory rows remapped, by type.",
                          {**gpu, "type": kind}, value)
            out.gauge("laggard_gpu_row_remap_pending", "1 when a row remap waits for a GPU reset.",
                      gpu, int(bool(pending)))
            out.gauge("laggard_gpu_row_remap_failure", "1 when a row remap failed.", gpu,
                      int(bool(failure)))
        if (replays := get("nvmlDeviceGetPcieReplayCounter")) is not None:
            out.counter("laggard_gpu_pcie_replay_total", "PCIe replays.", gpu, replays)
        for direction, constant in (("transmit", "NVML_PCIE_UTIL_TX_BYTES"),
                                    ("receive", "NVML_PCIE_UTIL_RX_BYTES")):
            rate = get("nvmlDeviceGetPcieThroughput", getattr(nvml, constant))
            if rate is not None:
                out.gauge("laggard_gpu_pcie_throughput_bytes_per_second",
                          "PCIe throughput over NVML's last 20 ms window, in bytes per second.",
                          {**gpu, "direction": direction}, rate * KIB)

    def _links(self, get: Any, nvml: Any, gpu: dict[str, str], out: _Families) -> None:
        # One nvmlDeviceGetFieldValues call gives the link count and every total (dcgm-exporter
        # reads the same fields); per-link calls would be 4 x 18 per GPU per round.
        fields = {name: getattr(nvml, constant, None) for name, constant in NVLINK_FIELDS.items()}
        if None in fields.values():
            return  # an nvidia-ml-py too old to name these fields
        values = get("nvmlDeviceGetFieldValues", list(fields.values()))
        answers = {name: _field_value(nvml, v) for name, v in zip(fields, values or (),
                                                                   strict=False)}
        links = answers.get("links")
        if not links:
            return  # no NVLink on this GPU
        active = sum(get("nvmlDeviceGetNvLinkState", link) == nvml.NVML_FEATURE_ENABLED
                     for link in range(int(links)))
        out.gauge("laggard_gpu_nvlink_links", "NVLink links of the GPU.", gpu, links)
        out.gauge("laggard_gpu_nvlink_active_links", "NVLink links up.", gpu, active)
        for kind in ("replay", "recovery", "crc_flit", "crc_data"):
            if (count := answers.get(kind)) is not None:
                out.counter("laggard_gpu_nvlink_errors_total",
                            "NVLink data-link errors, all links, by type.",
                            {**gpu, "type": kind}, count)
        for name in ("transmitted", "received"):
            if (kib := answers.get(name)) is not None:
                out.counter(f"laggard_gpu_nvlink_{name}_bytes_total",
                            f"NVLink data {name}, in bytes.",
                            gpu, kib * KIB)


def _field_value(nvml: Any, value: Any) -> float | None:
    """The number in one ``nvmlFieldValue_t``, None when NVML did not answer that field."""
    if value.nvmlReturn != nvml.NVML_SUCCESS:
        return None
    member = _VALUE_MEMBERS.get(getattr(value, "valueType", 3), "ullVal")
    return float(getattr(value.value, member))



def _text(value: Any) -> str:
    if value is None:
        return ""
    return value.decode() if isinstance(value, bytes) else str(value)


def library(settings: AgentSettings) -> NvmlLibrary:
    """The process-wide NVML the flags ask for: the real one, or fake GPUs with
    ``--collector.nvml.fake-gpus``. The xid collector and the agent's rank-to-GPU index share it.

    Raises:
        ValueError: an unknown fake scenario.
    """
    return shared_library(settings.flag(FAKE_GPUS), settings.flag(FAKE_GPUS_SCENARIO))


def check_flags(settings: AgentSettings) -> None:
    """Check the fake-GPU flags together.

    Raises:
        ValueError: a negative count, an unknown scenario, or a scenario's GPU past the count.
    """
    fake_gpus = settings.flag(FAKE_GPUS)
    if fake_gpus < 0:
        raise ValueError(f"--{FAKE_GPUS.name} {fake_gpus}: must be >= 0")
    from laggard.nvml.fake import parse_scenario  # the fake is not loaded unless asked for

    scenario = parse_scenario(settings.flag(FAKE_GPUS_SCENARIO))
    if fake_gpus and scenario.gpu is not None and scenario.gpu >= fake_gpus:
        raise ValueError(f"--{FAKE_GPUS_SCENARIO.name} {scenario}: only {fake_gpus} fake GPUs")


def from_config(settings: AgentSettings, context: Any) -> NvmlCollector:
    """Registry factory: the real NVML, or the fake one with ``--collector.nvml.fake-gpus``."""
    return NvmlCollector(library(settings), findings=context.findings, node=context.node)


COLLECTOR = CollectorSpec(
    name="nvml", build=from_config, default=True, flags=(FAKE_GPUS, FAKE_GPUS_SCENARIO),
    check=check_flags,
    help="GPU clocks, clock-event reasons, temperature, power, ECC via NVML")
