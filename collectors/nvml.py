"""GPU collector (``nvml``): per-GPU state through NVML, in base units.

**Series budget.** By default 22 series per GPU with NVLink (19 without), and sparse ones: two
per clock-event reason (its ``active`` while it holds, its time from the first time it is
seen), one per violation policy and per NVLink error type once non-zero. A GPU held down by
one limit, with an NVLink error counted, has 26: dcgm-exporter's default of 26 fields per GPU
(its ``etc/default-counters.csv``). ``--collector.nvml.all-fields`` adds the rest (constant or
routine values, and the dense 0 series of every reason and counter).

What it exports (NVML call, ``nvidia-smi --query-gpu`` field, conversion at the edge); *opt-in*
marks what only ``--collector.nvml.all-fields`` exports:

* ``laggard_gpu_info{uuid,model,pci_bus_id,driver_version}``: GetUUID, GetName, GetPciInfo
  (read once per NVML init: they do not change while the handles live).
* ``laggard_gpu_sm_clock_hertz`` (the last sample), ``laggard_gpu_sm_clock_min_hertz`` (the
  lowest sample of the last ``--collector.nvml.clock-window`` seconds, default 15: a dip
  between two 15 s scrapes still reaches Prometheus), ``laggard_gpu_sm_clock_max_hertz``,
  ``laggard_gpu_memory_clock_hertz``, opt-in ``laggard_gpu_memory_clock_max_hertz``:
  GetClockInfo, GetMaxClockInfo (clocks.sm, clocks.mem, clocks.max.*), MHz x 1e6.
* ``laggard_gpu_clock_event_active{reason}``: GetCurrentClocksEventReasons
  (clocks_event_reasons.*): 1 for each reason active at the last sample, no series for the
  others (opt-in: a 0 series for each).
* ``laggard_gpu_clock_event_seconds_total{reason}``: time each reason was active, from the
  samples at the collector's interval (each sample credits its reasons with the time since the
  previous one: off by at most one interval per episode); a series from the first time the
  reason is seen (opt-in: every reason from the start).
* ``laggard_gpu_clock_violation_seconds_total{reason}``: the driver's own violation time per
  perf policy (GetFieldValues ``NVML_FI_DEV_PERF_POLICY_*``, the counters
  GetViolationStatus' ``violationTime`` gives, ns / 1e9; GetViolationStatus where the field is
  not answered); a series once non-zero (opt-in: every supported policy).
* ``laggard_gpu_temperature_celsius``: GetTemperature (temperature.gpu).
* ``laggard_gpu_power_watts``, opt-in ``laggard_gpu_power_limit_watts``: GetPowerUsage,
  GetEnforcedPowerLimit (power.draw, enforced.power.limit), mW / 1e3.
* ``laggard_gpu_energy_joules_total``: ``NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION``, mJ / 1e3.
* ``laggard_gpu_utilization_ratio``, ``laggard_gpu_memory_utilization_ratio``:
  GetUtilizationRates (utilization.gpu, utilization.memory), percent / 100.
* ``laggard_gpu_memory_used_bytes``, opt-in ``laggard_gpu_memory_total_bytes``: GetMemoryInfo.
* ``laggard_gpu_ecc_errors_total{type}``: ``NVML_FI_DEV_ECC_DBE_VOL_TOTAL`` (uncorrected) and,
  opt-in, ``..._SBE_VOL_TOTAL`` (corrected: routine on HBM, acted on by nobody; row remaps
  are what NVIDIA's memory-error guidance acts on).
* ``laggard_gpu_remapped_rows{type}`` (``uncorrectable``; opt-in ``correctable``: remaps
  of correctable errors are routine until remapping fails), ``laggard_gpu_row_remap_{pending,
  failure}``: ``NVML_FI_DEV_REMAPPED_{COR,UNC,PENDING,FAILURE}``.
* ``laggard_gpu_pcie_replay_total``: ``NVML_FI_DEV_PCIE_REPLAY_COUNTER``.
* ``laggard_gpu_pcie_throughput_bytes_per_second{direction}``: GetPcieThroughput, KiB/s x 1024.
* ``laggard_gpu_nvlink_active_links``, opt-in ``laggard_gpu_nvlink_links``: GetFieldValues
  (``NVML_FI_DEV_NVLINK_LINK_COUNT``), GetNvLinkState per link.
* ``laggard_gpu_nvlink_errors_total{type}``: ``..._REPLAY/RECOVERY/CRC_FLIT/
  CRC_DATA_ERROR_COUNT_TOTAL`` (all links); a series once non-zero (opt-in: every type).
* ``laggard_gpu_nvlink_{transmitted,received}_bytes_total``:
  ``NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX/RX``, KiB x 1024.
* ``laggard_gpu_lost``: 1 when a call answers ``NVML_ERROR_GPU_IS_LOST``.

**Two paces.** Every interval (``--collector.nvml.interval``, e.g. 0.1 s) each GPU's SM clock
and clock-event reasons are read (two NVML calls) into the minimum and the per-reason time;
the other fields are read, and the families built, at most once a second (the counters and
gauges above change no faster than a scrape can see), with every device field in one
``nvmlDeviceGetFieldValues`` call per GPU (NVML answers each field with its own return code:
a field NVML does not answer is left out for that GPU, never a made-up 0). Between full
rounds the collector returns its last families unchanged, so the agent renders them once.

Clock-event reasons use the NVML constants (``nvmlClocksEventReason*``, or the pre-530
``nvmlClocksThrottleReason*`` names). Each GPU's clocks feed the
:class:`~laggard.detectors.throttle.ThrottleDetector` once per full round; a lost GPU raises
one ``gpu_lost`` finding per loss, and the others go on reporting.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from laggard.collectors.base import AgentSettings, CollectorSpec, Flag
from laggard.collectors.gpu_track import GpuTrack
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
ALL_FIELDS = Flag("collector.nvml.all-fields", False, switch=True,
                  help="export every GPU field: also the constant ones (maximum memory clock, "
                       "power limit, memory total, NVLink link count), corrected ECC errors "
                       "and correctable row remaps, and a 0 series for every clock-event "
                       "reason, violation policy and NVLink error type (default: 22 series per "
                       "GPU, plus reasons while active and counters once non-zero)")
CLOCK_WINDOW = Flag("collector.nvml.clock-window", 15.0, type=float, metavar="SECONDS",
                    help="laggard_gpu_sm_clock_min_hertz is the lowest SM clock sampled in the "
                         "last this many seconds; at least the scrape interval, so no dip falls "
                         "between two scrapes (default %(default)s)")

#: Least seconds between two full rounds (every field read, families built): counters and
#: gauges a 15 s scrape reads need no more, and the families are then built once a second at
#: most whatever the sampling interval (a scrape never builds them).
FULL_ROUND_SECONDS = 1.0


#: label value -> NVML perf policy constant of nvmlDeviceGetViolationStatus. Its field
#: (``NVML_FI_DEV_PERF_POLICY_<same suffix>``, nvml.h: "Perf Policy Counter", the same
#: violation time in ns; nvml.h aliases ``NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP`` to the
#: power one) is read in the batch.
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

#: Device fields read in the same nvmlDeviceGetFieldValues call as the NVLink ones (nvml.h
#: ``NVML_FI_DEV_*``; dcgm-exporter reads the same through DCGM): name -> constant.
DEVICE_FIELDS: dict[str, str] = {
    "energy": "NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
    "pcie_replay": "NVML_FI_DEV_PCIE_REPLAY_COUNTER",
    "ecc_uncorrected": "NVML_FI_DEV_ECC_DBE_VOL_TOTAL",
    "ecc_corrected": "NVML_FI_DEV_ECC_SBE_VOL_TOTAL",
    "remapped_correctable": "NVML_FI_DEV_REMAPPED_COR",
    "remapped_uncorrectable": "NVML_FI_DEV_REMAPPED_UNC",
    "remap_pending": "NVML_FI_DEV_REMAPPED_PENDING",
    "remap_failure": "NVML_FI_DEV_REMAPPED_FAILURE",
    **{f"violation_{reason}": constant.replace("NVML_PERF_POLICY_", "NVML_FI_DEV_PERF_POLICY_")
       for reason, constant in VIOLATION_POLICIES.items()},
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


@dataclass(slots=True)
class _Known:
    """What is read once per NVML init for one GPU (valid while the library's generation
    stays): identity and maximum clocks, and the batch's field ids."""

    generation: int
    info: dict[str, str]
    sm_max: float | None
    mem_max: float | None
    seen: set[str] = field(default_factory=set)  # sparse series shown once, kept


class NvmlCollector:
    """Samples every GPU through an :class:`NvmlLibrary`.

    Args:
        library: the NVML wrapper (real or fake module inside).
        findings: where throttle and GPU-lost findings go (``FindingLog``-like: ``add``), or None.
        throttle: the throttle detector to feed (default settings when None).
        node: node name put on findings.
        all_fields: export every field (``--collector.nvml.all-fields``), not the budget.
        clock_window: seconds of ``laggard_gpu_sm_clock_min_hertz``'s window.
        interval: the collector's sampling interval in seconds (a sample credits its reasons
            with at most three of them: a longer gap is not guessed).
        clock: monotonic clock in seconds (tests pass a fake one).
    """

    name = "nvml"

    def __init__(self, library: NvmlLibrary, *, findings: Any = None,
                 throttle: ThrottleDetector | None = None, node: str | None = None,
                 all_fields: bool = False, clock_window: float = 15.0, interval: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.library = library
        self.findings = findings
        self.node = node
        self.throttle = throttle or ThrottleDetector(node=node)
        self.all_fields = all_fields
        self._clock_window = clock_window
        self._max_gap = max(3 * interval, FULL_ROUND_SECONDS * 1.5)
        self._clock = clock
        self._lost: set[int] = set()
        self._tracks: dict[int, GpuTrack] = {}
        self._known: dict[int, _Known] = {}
        self._reasons: list[tuple[str, int]] | None = None
        self._families: list[Metric] | None = None
        self._full_at = -float("inf")

    def collect(self) -> Iterable[Metric]:
        """One sampling round over every GPU: the fast samples always, every field and new
        families at most once per :data:`FULL_ROUND_SECONDS` (else the last families, the
        same list object).

        Raises:
            NoDataError: NVML is not available here (no driver, no library, backoff).
        """
        count = self.library.start()
        now = self._clock()
        for index in range(count):
            if index in self._lost:
                continue  # the full round retries it
            try:
                self._sample_fast(index, now)
            except GpuLostError:
                self._mark_lost(index)
        # 5 % early: a 0.1 s interval's tenth round lands a hair before the second is up
        if self._families is not None and now - self._full_at < FULL_ROUND_SECONDS * 0.95:
            return self._families
        self._full_at = now
        families = _Families()
        for index in range(count):
            gpu = {"gpu": str(index)}
            try:
                if index in self._lost:
                    self._sample_fast(index, now)  # raises while it stays lost
                self._collect_gpu(index, gpu, families, now)
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
        self._families = list(families)
        return self._families

    def _reason_bits(self) -> list[tuple[str, int]]:
        if self._reasons is None:
            nvml = self.library.module
            self._reasons = [(reason, bit) for reason, names in CLOCK_EVENT_REASONS.items()
                             if (bit := first_constant(nvml, *names)) is not None]
        return self._reasons

    def _sample_fast(self, index: int, now: float) -> None:
        """Two NVML calls: the SM clock and the clock-event reasons, into the GPU's track."""
        lib = self.library
        sm = lib.call(index, "nvmlDeviceGetClockInfo", lib.module.NVML_CLOCK_SM)
        mask = lib.call(index, "nvmlDeviceGetCurrentClocksEventReasons")
        if mask is None:
            mask = lib.call(index, "nvmlDeviceGetCurrentClocksThrottleReasons")
        track = self._tracks.get(index)
        if track is None:
            track = self._tracks[index] = GpuTrack(self._reason_bits(), self._clock_window,
                                                   self._max_gap)
        track.add(now, None if sm is None else float(sm), None if mask is None else int(mask))

    def _mark_lost(self, index: int) -> None:
        self.throttle.forget(index)
        if (track := self._tracks.get(index)) is not None:
            track.forget_times()
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

    def _known_for(self, index: int, get: Any) -> _Known:
        """Identity and maximum clocks, read once per NVML init."""
        lib = self.library
        known = self._known.get(index)
        if known is None or known.generation != lib.generation:
            nvml = lib.module
            uuid, model, pci = get("nvmlDeviceGetUUID"), get("nvmlDeviceGetName"), get(
                "nvmlDeviceGetPciInfo")
            info = {"uuid": _text(uuid), "model": _text(model),
                    "pci_bus_id": normalise_bus_id(pci.busId) if pci is not None else "",
                    "driver_version": lib.driver_version or ""}
            seen = known.seen if known is not None else set()
            known = self._known[index] = _Known(
                lib.generation, info, get("nvmlDeviceGetMaxClockInfo", nvml.NVML_CLOCK_SM),
                get("nvmlDeviceGetMaxClockInfo", nvml.NVML_CLOCK_MEM), seen)
        return known

    def _collect_gpu(self, index: int, gpu: dict[str, str], out: _Families,
                     now: float) -> None:
        lib = self.library
        nvml = lib.module

        def get(function: str, *args: Any) -> Any:
            return lib.call(index, function, *args)

        known = self._known_for(index, get)
        out.gauge("laggard_gpu_info", "GPU identity (value 1).", {**gpu, **known.info}, 1)
        track = self._tracks[index]
        sm, sm_max = track.last_sm_mhz, known.sm_max
        mem = get("nvmlDeviceGetClockInfo", nvml.NVML_CLOCK_MEM)
        for name, doc, value in (
            ("laggard_gpu_sm_clock_hertz", "SM clock at the last sample", sm),
            ("laggard_gpu_sm_clock_min_hertz", "Lowest SM clock sampled in the collector's "
             "clock window (--collector.nvml.clock-window)", track.min_sm_mhz(now)),
            ("laggard_gpu_sm_clock_max_hertz", "Maximum SM clock", sm_max),
            ("laggard_gpu_memory_clock_hertz", "Memory clock", mem),
            ("laggard_gpu_memory_clock_max_hertz", "Maximum memory clock",
             known.mem_max if self.all_fields else None),
        ):
            if value is not None:
                out.gauge(name, f"{doc}, in hertz.", gpu, value * MHZ)
        self._reasons_out(gpu, track, out)
        active = frozenset(track.active())
        if sm is not None and sm_max:
            for finding in self.throttle.update(
                    ClockSample(index, sm * MHZ, sm_max * MHZ, active)):
                self._report(finding)
        answers = self._read_fields(index, get, nvml)
        self._violations(index, get, nvml, gpu, known, answers, out)
        self._health(get, nvml, gpu, answers, out)
        self._links(get, nvml, gpu, known, answers, out)

    def _reasons_out(self, gpu: dict[str, str], track: GpuTrack, out: _Families) -> None:
        active = set(track.active())
        for reason, _ in self._reason_bits():
            if reason in active or self.all_fields:
                out.gauge("laggard_gpu_clock_event_active",
                          "1 while NVML reports this clock-event (throttle) reason at the last "
                          "sample; no series for a reason not active (0 with "
                          "--collector.nvml.all-fields).",
                          {**gpu, "reason": reason}, int(reason in active))
            seconds = track.reason_seconds.get(reason)
            if seconds is not None or self.all_fields:
                out.counter("laggard_gpu_clock_event_seconds_total",
                            "Time this clock-event reason was active, from samples at the "
                            "collector's interval, in seconds; a series from the first time "
                            "the reason is seen.",
                            {**gpu, "reason": reason}, seconds or 0.0)

    def _read_fields(self, index: int, get: Any, nvml: Any) -> dict[str, float]:
        """Every device and NVLink field in one nvmlDeviceGetFieldValues call: name -> value,
        for the fields NVML answered (each has its own return code)."""
        ids = {name: getattr(nvml, constant, None)
               for name, constant in (*DEVICE_FIELDS.items(), *NVLINK_FIELDS.items())}
        wanted = {name: fid for name, fid in ids.items() if fid is not None}
        values = get("nvmlDeviceGetFieldValues", list(wanted.values())) if wanted else None
        answers: dict[str, float] = {}
        for name, value in zip(wanted, values or (), strict=False):
            number = _field_value(nvml, value)
            if number is not None:
                answers[name] = number
        return answers

    def _violations(self, index: int, get: Any, nvml: Any, gpu: dict[str, str],
                    known: _Known, answers: dict[str, float], out: _Families) -> None:
        for reason, constant in VIOLATION_POLICIES.items():
            ns = answers.get(f"violation_{reason}")
            if ns is None and (policy := getattr(nvml, constant, None)) is not None:
                # the field is not answered (an older driver): the per-policy call
                status = get("nvmlDeviceGetViolationStatus", policy)
                ns = None if status is None else status.violationTime
            if ns is None:
                continue
            key = f"violation:{reason}"
            if ns:
                known.seen.add(key)
            if key in known.seen or self.all_fields:
                out.counter("laggard_gpu_clock_violation_seconds_total",
                            "Time the clocks were held below target by this policy (NVML's "
                            "violation time), in seconds; a series once non-zero.",
                            {**gpu, "reason": reason}, ns / 1e9)

    def _health(self, get: Any, nvml: Any, gpu: dict[str, str], answers: dict[str, float],
                out: _Families) -> None:
        if (temp := get("nvmlDeviceGetTemperature", nvml.NVML_TEMPERATURE_GPU)) is not None:
            out.gauge("laggard_gpu_temperature_celsius",
                      "GPU core temperature, in degrees Celsius.", gpu, temp)
        if (power := get("nvmlDeviceGetPowerUsage")) is not None:
            out.gauge("laggard_gpu_power_watts", "Power draw, in watts.", gpu, power / 1e3)
        if self.all_fields and (limit := get("nvmlDeviceGetEnforcedPowerLimit")) is not None:
            out.gauge("laggard_gpu_power_limit_watts", "Enforced power limit, in watts.", gpu,
                      limit / 1e3)
        if (energy := answers.get("energy")) is not None:
            out.counter("laggard_gpu_energy_joules_total",
                        "Energy used since the driver loaded, in joules.", gpu, energy / 1e3)
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
            if self.all_fields:
                out.gauge("laggard_gpu_memory_total_bytes", "Device memory, in bytes.", gpu,
                          memory.total)
        for kind in ("corrected", "uncorrected"):
            count = answers.get(f"ecc_{kind}")
            if count is not None and (kind == "uncorrected" or self.all_fields):
                out.counter("laggard_gpu_ecc_errors_total",
                            "ECC errors since the driver loaded, by type.",
                            {**gpu, "type": kind}, count)
        for kind in ("correctable", "uncorrectable"):
            rows = answers.get(f"remapped_{kind}")
            if rows is not None and (kind == "uncorrectable" or self.all_fields):
                out.gauge("laggard_gpu_remapped_rows", "Memory rows remapped, by type.",
                          {**gpu, "type": kind}, rows)
        if (pending := answers.get("remap_pending")) is not None:
            out.gauge("laggard_gpu_row_remap_pending", "1 when a row remap waits for a GPU reset.",
                      gpu, int(bool(pending)))
        if (failure := answers.get("remap_failure")) is not None:
            out.gauge("laggard_gpu_row_remap_failure", "1 when a row remap failed.", gpu,
                      int(bool(failure)))
        if (replays := answers.get("pcie_replay")) is not None:
            out.counter("laggard_gpu_pcie_replay_total", "PCIe replays.", gpu, replays)
        for direction, constant in (("transmit", "NVML_PCIE_UTIL_TX_BYTES"),
                                    ("receive", "NVML_PCIE_UTIL_RX_BYTES")):
            rate = get("nvmlDeviceGetPcieThroughput", getattr(nvml, constant))
            if rate is not None:
                out.gauge("laggard_gpu_pcie_throughput_bytes_per_second",
                          "PCIe throughput over NVML's last 20 ms window, in bytes per second.",
                          {**gpu, "direction": direction}, rate * KIB)

    def _links(self, get: Any, nvml: Any, gpu: dict[str, str], known: _Known,
               answers: dict[str, float], out: _Families) -> None:
        links = answers.get("links")
        if not links:
            return  # no NVLink on this GPU (or an nvidia-ml-py too old to name the field)
        active = sum(get("nvmlDeviceGetNvLinkState", link) == nvml.NVML_FEATURE_ENABLED
                     for link in range(int(links)))
        if self.all_fields:
            out.gauge("laggard_gpu_nvlink_links", "NVLink links of the GPU.", gpu, links)
        out.gauge("laggard_gpu_nvlink_active_links", "NVLink links up.", gpu, active)
        for kind in ("replay", "recovery", "crc_flit", "crc_data"):
            if (count := answers.get(kind)) is None:
                continue
            key = f"nvlink:{kind}"
            if count:
                known.seen.add(key)
            if key in known.seen or self.all_fields:
                out.counter("laggard_gpu_nvlink_errors_total",
                            "NVLink data-link errors, all links, by type; a series once "
                            "non-zero.",
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
    if not 0.1 <= settings.flag(CLOCK_WINDOW) <= 3600:
        raise ValueError(f"--{CLOCK_WINDOW.name} {settings.flag(CLOCK_WINDOW)}: outside "
                         "[0.1, 3600] s")
    if fake_gpus < 0:
        raise ValueError(f"--{FAKE_GPUS.name} {fake_gpus}: must be >= 0")
    from laggard.nvml.fake import parse_scenario  # the fake is not loaded unless asked for

    scenario = parse_scenario(settings.flag(FAKE_GPUS_SCENARIO))
    if fake_gpus and scenario.gpu is not None and scenario.gpu >= fake_gpus:
        raise ValueError(f"--{FAKE_GPUS_SCENARIO.name} {scenario}: only {fake_gpus} fake GPUs")


def from_config(settings: AgentSettings, context: Any) -> NvmlCollector:
    """Registry factory: the real NVML, or the fake one with ``--collector.nvml.fake-gpus``."""
    interval = settings.flag(COLLECTOR.interval_flag)
    return NvmlCollector(library(settings), findings=context.findings, node=context.node,
                         all_fields=settings.flag(ALL_FIELDS),
                         clock_window=settings.flag(CLOCK_WINDOW),
                         interval=getattr(settings, "collect_interval", 1.0)
                         if interval is None else interval)


COLLECTOR = CollectorSpec(
    name="nvml", build=from_config, default=True,
    flags=(FAKE_GPUS, FAKE_GPUS_SCENARIO, ALL_FIELDS, CLOCK_WINDOW),
    check=check_flags,
    help="GPU clocks, clock-event reasons, temperature, power, ECC via NVML")
