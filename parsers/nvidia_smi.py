"""Pure parsers for ``nvidia-smi -q`` and ``nvidia-smi --query-gpu=... --format=csv`` output.

``nvidia-smi -q`` prints an indented tree: ``GPU 00000000:75:00.0`` opens a GPU block, a line
without `` : `` opens a section, ``Key<spaces>: Value`` is a field. The clock-event section was
called ``Clocks Throttle Reasons`` before driver 530 and ``Clocks Event Reasons`` since; its
``HW Thermal Slowdown`` and ``HW Power Brake Slowdown`` are indented under ``HW Slowdown`` and
reported on their own, as NVML reports each bit (``nvmlDeviceGetCurrentClocksEventReasons``).
An excerpt cut by ``grep`` (no GPU line) still yields one GPU with an unknown bus id.

The CSV form needs its header (``--format=csv`` or ``csv,nounits``; ``noheader`` cannot be
mapped). Field names follow ``nvidia-smi --help-query-gpu``: ``clocks_event_reasons.<name>``
(or ``clocks_throttle_reasons.<name>``) is ``Active``/``Not Active``, and ``.active`` is NVML's
bitmask, decoded with :data:`CLOCK_EVENT_BITS`.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

__all__ = [
    "CLOCK_EVENT_BITS",
    "SmiGpu",
    "parse_nvidia_smi_csv",
    "parse_nvidia_smi_q",
    "reasons_from_bitmask",
]

#: NVML ``nvmlClocksEventReason*`` bits (``nvml.h``) -> the ``reason`` label laggard uses.
CLOCK_EVENT_BITS: dict[int, str] = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal",
    0x40: "hw_thermal",
    0x80: "hw_power_brake",
    0x100: "display_clock_setting",
}

#: ``nvidia-smi -q`` row names and ``--query-gpu`` suffixes -> ``reason`` label.
_REASON_NAMES: dict[str, str] = {
    "idle": "gpu_idle", "gpu_idle": "gpu_idle",
    "applications clocks setting": "applications_clocks_setting",
    "applications_clocks_setting": "applications_clocks_setting",
    "sw power cap": "sw_power_cap", "sw_power_cap": "sw_power_cap",
    "hw slowdown": "hw_slowdown", "hw_slowdown": "hw_slowdown",
    "hw thermal slowdown": "hw_thermal", "hw_thermal_slowdown": "hw_thermal",
    "hw power brake slowdown": "hw_power_brake", "hw_power_brake_slowdown": "hw_power_brake",
    "sync boost": "sync_boost", "sync_boost": "sync_boost",
    "sw thermal slowdown": "sw_thermal", "sw_thermal_slowdown": "sw_thermal",
    "display clock setting": "display_clock_setting",
    "display_clock_setting": "display_clock_setting",
}
_REASON_SECTIONS = ("clocks event reasons", "clocks throttle reasons")

_GPU_HEADER = re.compile(r"^GPU ([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])\s*$")
_FIELD = re.compile(r"^(\s*)([^:]*?\S)\s+:\s?(.*?)\s*$")
_CSV_HEADER = re.compile(r"^[a-z][a-z0-9_.]*(?: \[[^\]]*\])?$")  # "power.draw [W]"
_NUMBER = re.compile(r"^(-?\d+(?:\.\d+)?)")


@dataclass(slots=True)
class SmiGpu:
    """One GPU's state as nvidia-smi printed it.

    Attributes:
        pci_bus_id: ``00000000:75:00.0`` as printed, None for an excerpt without the GPU line.
        product_name, uuid, performance_state: identity and P-state, when printed.
        reasons: reason label -> active (True/False); absent when the row was ``N/A``.
        temperature_c: GPU core temperature (°C); ``power_draw_w``, ``power_limit_w`` (W);
            ``sm_clock_mhz``, ``sm_clock_max_mhz`` (MHz); None when not printed.
        fields: every other field, ``"Section/Key" -> value text``.
    """

    pci_bus_id: str | None = None
    product_name: str | None = None
    uuid: str | None = None
    performance_state: str | None = None
    reasons: dict[str, bool] = field(default_factory=dict)
    temperature_c: float | None = None
    power_draw_w: float | None = None
    power_limit_w: float | None = None
    sm_clock_mhz: float | None = None
    sm_clock_max_mhz: float | None = None
    fields: dict[str, str] = field(default_factory=dict)

    @property
    def active_reasons(self) -> list[str]:
        """Reason labels that are active, in NVML bit order."""
        order = list(CLOCK_EVENT_BITS.values())
        return sorted((r for r, on in self.reasons.items() if on),
                      key=lambda r: order.index(r) if r in order else len(order))


def reasons_from_bitmask(mask: int) -> dict[str, bool]:
    """Decode an NVML clock-event bitmask into ``{reason: active}`` for every known bit."""
    return {label: bool(mask & bit) for bit, label in CLOCK_EVENT_BITS.items()}


def _number(text: str) -> float | None:
    m = _NUMBER.match(text.strip())
    return float(m.group(1)) if m else None


def _state(text: str) -> bool | None:
    value = text.strip().lower()
    if value == "active":
        return True
    if value == "not active":
        return False
    return None


def parse_nvidia_smi_q(lines: Iterable[str]) -> list[SmiGpu]:
    """Parse ``nvidia-smi -q`` output (any driver's naming) into one :class:`SmiGpu` per GPU."""
    gpus: list[SmiGpu] = []
    preamble = SmiGpu()  # fields seen before any GPU line (a grep'd excerpt)
    current = preamble
    sections: list[tuple[int, str]] = []
    for raw in lines:
        line = raw.rstrip("\r\n")
        if not line.strip():
            continue
        m = _GPU_HEADER.match(line)
        if m:
            current = SmiGpu(pci_bus_id=m.group(1))
            gpus.append(current)
            sections = []
            continue
        indent = len(line) - len(line.lstrip())
        while sections and sections[-1][0] >= indent:
            sections.pop()
        f = _FIELD.match(line)
        if f is None:
            sections.append((indent, line.strip()))
            continue
        key, value = f.group(2), f.group(3)
        path = [name for _, name in sections]
        _store(current, path, key, value)
    if not gpus and (preamble.reasons or preamble.temperature_c is not None):
        gpus.append(preamble)
    return gpus


def _store(gpu: SmiGpu, path: list[str], key: str, value: str) -> None:
    section = path[-1].lower() if path else ""
    lowered = [p.lower() for p in path]
    if any(s in _REASON_SECTIONS for s in lowered) and key.lower() in _REASON_NAMES:
        state = _state(value)
        if state is not None:
            gpu.reasons[_REASON_NAMES[key.lower()]] = state
        return
    name = key.lower()
    if name == "product name":
        gpu.product_name = value
    elif name == "gpu uuid":
        gpu.uuid = value
    elif name == "performance state":
        gpu.performance_state = value
    elif name == "gpu current temp":
        gpu.temperature_c = _number(value)
    elif section in ("gpu power readings", "power readings") and name == "power draw":
        gpu.power_draw_w = _number(value)
    elif section in ("gpu power readings", "power readings") and name in (
            "current power limit", "power limit", "enforced power limit"):
        gpu.power_limit_w = gpu.power_limit_w or _number(value)
    elif section == "clocks" and name == "sm":
        gpu.sm_clock_mhz = _number(value)
    elif section == "max clocks" and name == "sm":
        gpu.sm_clock_max_mhz = _number(value)
    gpu.fields["/".join(path + [key])] = value


def _csv_name(header: str) -> str:
    # "power.draw [W]" -> "power.draw"
    return header.split("[", 1)[0].strip().lower()


def parse_nvidia_smi_csv(lines: Iterable[str]) -> list[SmiGpu]:
    """Parse ``nvidia-smi --query-gpu=... --format=csv`` output (header required).

    Raises:
        ValueError: the first row is not a header of ``--query-gpu`` field names, or the text
            is not CSV.
    """
    # A carriage return inside a line (a file saved on Windows, then cut oddly) is csv's
    # "new-line character seen in unquoted field": nvidia-smi never writes one inside a cell.
    reader = csv.reader(line.replace("\r", " ") for line in lines if line.strip())
    try:
        header = next(reader, None)
        if not header or not all(_CSV_HEADER.match(h.strip()) for h in header):
            raise ValueError("nvidia-smi CSV without a header row cannot be mapped to fields")
        rows = list(reader)
    except csv.Error as exc:
        raise ValueError(f"not CSV: {exc}") from None
    names = [_csv_name(h) for h in header]
    gpus = []
    for row in rows:
        if len(row) != len(names):
            continue
        gpu = SmiGpu()
        for name, cell in zip(names, (c.strip() for c in row), strict=True):
            gpu.fields[name] = cell
            group, _, leaf = name.partition(".")
            if group in ("clocks_event_reasons", "clocks_throttle_reasons"):
                if leaf == "active":
                    try:
                        for reason, on in reasons_from_bitmask(int(cell, 16)).items():
                            gpu.reasons.setdefault(reason, on)
                    except ValueError:
                        pass
                elif leaf in _REASON_NAMES and (state := _state(cell)) is not None:
                    gpu.reasons[_REASON_NAMES[leaf]] = state
            elif name in ("pci.bus_id", "gpu_bus_id"):
                gpu.pci_bus_id = cell
            elif name == "name":
                gpu.product_name = cell
            elif name == "uuid":
                gpu.uuid = cell
            elif name == "pstate":
                gpu.performance_state = cell
            elif name == "temperature.gpu":
                gpu.temperature_c = _number(cell)
            elif name == "power.draw":
                gpu.power_draw_w = _number(cell)
            elif name in ("power.limit", "enforced.power.limit"):
                gpu.power_limit_w = _number(cell)
            elif name == "clocks.sm":
                gpu.sm_clock_mhz = _number(cell)
            elif name == "clocks.max.sm":
                gpu.sm_clock_max_mhz = _number(cell)
        gpus.append(gpu)
    return gpus
