"""Pure parser for Prometheus text exposition, read per GPU as dcgm-exporter writes it.

dcgm-exporter (NVIDIA/dcgm-exporter, ``etc/default-counters.csv``) names each series after its
DCGM field (``DCGM_FI_DEV_SM_CLOCK``) with labels ``gpu`` (index), ``UUID``, ``device``,
``pci_bus_id``, ``Hostname``, ``modelName`` and, on Kubernetes, ``container``/``namespace``/
``pod`` (empty strings outside a pod). Old versions print no ``# HELP``/``# TYPE`` lines.

Each line is parsed on its own with prometheus_client's parser, so one malformed line is counted
and skipped instead of spoiling the file. The same reader serves NCCL Inspector's Prometheus
textfile output (``nccl_bus_bandwidth_gbs{collective=...}``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

__all__ = ["DcgmGpu", "Exposition", "Sample", "dcgm_gpus", "parse_exposition", "DCGM_FIELDS"]

#: DCGM field -> (attribute of :class:`DcgmGpu`, unit) (DCGM ``dcgm_fields.h``).
DCGM_FIELDS: dict[str, tuple[str, str]] = {
    "DCGM_FI_DEV_SM_CLOCK": ("sm_clock_mhz", "MHz"),
    "DCGM_FI_DEV_MEM_CLOCK": ("memory_clock_mhz", "MHz"),
    "DCGM_FI_DEV_GPU_TEMP": ("temperature_c", "C"),
    "DCGM_FI_DEV_MEMORY_TEMP": ("memory_temperature_c", "C"),
    "DCGM_FI_DEV_POWER_USAGE": ("power_w", "W"),
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": ("energy_mj", "mJ"),
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": ("pcie_replay", "count"),
    "DCGM_FI_DEV_GPU_UTIL": ("utilization_percent", "%"),
    "DCGM_FI_DEV_XID_ERRORS": ("last_xid", "xid"),
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": ("clock_event_reasons", "bitmask"),
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": ("clock_event_reasons", "bitmask"),
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": ("ecc_dbe_volatile", "count"),
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": ("row_remap_failure", "bool"),
}


@dataclass(frozen=True, slots=True)
class Sample:
    """One exposition sample: metric name, labels, value."""

    name: str
    labels: dict[str, str]
    value: float


@dataclass(slots=True)
class Exposition:
    """Samples of one file and the number of lines that did not parse."""

    samples: list[Sample] = field(default_factory=list)
    malformed: int = 0


#: Most samples kept from one file (a node's dcgm-exporter output is a few thousand).
MAX_SAMPLES = 1_000_000


def parse_exposition(lines: Iterable[str]) -> Exposition:
    """Parse Prometheus text-format lines; comments are skipped, bad lines counted."""
    out = Exposition()
    for line in lines:
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        try:
            families = list(text_string_to_metric_families(text + "\n"))
        except (ValueError, IndexError, TypeError):
            out.malformed += 1
            continue
        for family in families:
            for s in family.samples:
                if len(out.samples) < MAX_SAMPLES:
                    out.samples.append(Sample(s.name, dict(s.labels), float(s.value)))
    return out


@dataclass(slots=True)
class DcgmGpu:
    """One GPU's DCGM fields (None where the file has no such series).

    Attributes:
        gpu: the ``gpu`` label (index); ``uuid``, ``pci_bus_id``, ``hostname``: identity labels.
        values: DCGM field name -> value for every ``DCGM_FI_*`` series of this GPU.
    """

    gpu: str
    uuid: str | None = None
    pci_bus_id: str | None = None
    hostname: str | None = None
    values: dict[str, float] = field(default_factory=dict)

    def get(self, attribute: str) -> float | None:
        """Value of a :data:`DCGM_FIELDS` attribute (``"sm_clock_mhz"``), None if absent."""
        for dcgm_name, (attr, _) in DCGM_FIELDS.items():
            if attr == attribute and dcgm_name in self.values:
                return self.values[dcgm_name]
        return None


def dcgm_gpus(exposition: Exposition) -> list[DcgmGpu]:
    """Group ``DCGM_FI_*`` samples by GPU (``Hostname``, ``gpu``, ``UUID``)."""
    gpus: dict[tuple[str, str, str], DcgmGpu] = {}
    for s in exposition.samples:
        if not s.name.startswith("DCGM_FI_"):
            continue
        labels = s.labels
        key = (labels.get("Hostname", ""), labels.get("gpu", ""), labels.get("UUID", ""))
        gpu = gpus.get(key)
        if gpu is None:
            gpu = gpus[key] = DcgmGpu(
                gpu=labels.get("gpu", "?"), uuid=labels.get("UUID") or None,
                pci_bus_id=labels.get("pci_bus_id") or None,
                hostname=labels.get("Hostname") or None)
        gpu.values[s.name] = s.value
    return list(gpus.values())
