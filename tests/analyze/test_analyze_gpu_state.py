"""nvidia-smi (-q, both namings, and CSV) and dcgm-exporter output (answers from
corpus/EXPECTED.md)."""

from __future__ import annotations

import pytest
from support import FIXTURES

from laggard.analyze.gpu import clock_event_findings, dcgm_findings
from laggard.parsers.exposition import dcgm_gpus, parse_exposition
from laggard.parsers.nvidia_smi import (
    parse_nvidia_smi_csv,
    parse_nvidia_smi_q,
    reasons_from_bitmask,
)

DIR = FIXTURES / "analyze"


def smi(name: str):
    with open(DIR / name, encoding="utf-8") as f:
        return parse_nvidia_smi_q(f)


def test_smi01_clocks_event_reasons_with_nested_hw_slowdown():
    (gpu,) = smi("smi01_nvidia_smi_q_h100_clocks_event_reasons_swpowercap_swthermal_active.txt")
    assert gpu.pci_bus_id == "00000000:75:00.0"
    assert gpu.product_name == "NVIDIA H100 80GB HBM3" and gpu.performance_state == "P0"
    assert sorted(gpu.active_reasons) == ["hw_power_brake", "sw_power_cap", "sw_thermal"]
    assert gpu.reasons["hw_slowdown"] is False  # the parent is not active
    assert (gpu.temperature_c, gpu.power_draw_w, gpu.power_limit_w) == (39, 118.01, 700)
    assert (gpu.sm_clock_mhz, gpu.sm_clock_max_mhz) == (1980, 1980)
    (f,) = clock_event_findings("x", [gpu])
    assert f.kind == "clock_event" and f.severity.value == "critical"  # hw_power_brake
    assert sorted(f.evidence["reasons"]) == ["hw_power_brake", "sw_power_cap", "sw_thermal"]
    assert "contradict" in f.message  # flags reported literally, clocks at max


def test_smi03_legacy_throttle_naming_only_idle_active():
    (gpu,) = smi("smi03_nvidia_smi_q_legacy_clocks_throttle_reasons_naming.txt")
    assert gpu.pci_bus_id is None
    assert gpu.active_reasons == ["gpu_idle"]
    assert {r for r, on in gpu.reasons.items() if not on} == {
        "applications_clocks_setting", "sw_power_cap", "hw_slowdown", "hw_thermal",
        "hw_power_brake", "sync_boost", "sw_thermal"}
    assert clock_event_findings("x", [gpu]) == []  # idle is not a slowdown


def test_smi_csv_query_form_with_units_and_bitmask():
    lines = [
        "index, pci.bus_id, clocks_event_reasons.active, clocks_throttle_reasons.hw_slowdown,"
        " temperature.gpu, power.draw [W], clocks.sm [MHz], clocks.max.sm [MHz]",
        "0, 00000000:18:00.0, 0x0000000000000004, Not Active, 61, 698.12 W, 1410 MHz, 1980 MHz",
        "1, 00000000:2A:00.0, 0x0000000000000000, Active, 88, 300.00 W, 1200 MHz, 1980 MHz",
    ]
    g0, g1 = parse_nvidia_smi_csv(lines)
    assert g0.active_reasons == ["sw_power_cap"] and g0.sm_clock_mhz == 1410
    assert g1.active_reasons == ["hw_slowdown"] and g1.temperature_c == 88
    findings = clock_event_findings("x", [g0, g1])
    assert [(f.subject, f.severity.value) for f in findings] == [
        ("GPU 0000:18:00", "warning"), ("GPU 0000:2a:00", "critical")]
    assert findings[1].evidence["pci_bus_id_full"] == "00000000:2A:00.0"


def test_smi_csv_without_header_is_refused():
    with pytest.raises(ValueError, match="header"):
        parse_nvidia_smi_csv(["0, 00000000:18:00.0, 61"])


def test_dcgm01_legacy_labels():
    with open(DIR / "dcgm01_exporter_legacy_labels_empty_pod_container.prom") as f:
        exposition = parse_exposition(f)
    assert exposition.malformed == 0
    (gpu,) = dcgm_gpus(exposition)
    assert gpu.gpu == "0" and gpu.uuid == "GPU-00000000-0000-0000-0000-000000000010"
    assert gpu.get("sm_clock_mhz") == 1530 and gpu.get("memory_clock_mhz") == 877
    assert gpu.get("temperature_c") == 55 and gpu.get("memory_temperature_c") == 54
    assert gpu.get("power_w") == pytest.approx(302.206)
    assert gpu.get("energy_mj") == 4335301032 and gpu.get("pcie_replay") == 0
    assert gpu.get("utilization_percent") == 44
    assert dcgm_findings("x", [gpu]) == []  # nothing wrong in this sample


def test_dcgm_xid_and_clock_reasons_bitmask_and_bad_lines():
    lines = [
        "# HELP DCGM_FI_DEV_XID_ERRORS Value of the last XID error encountered.",
        'DCGM_FI_DEV_XID_ERRORS{gpu="3",UUID="GPU-3",pci_bus_id="00000000:9B:00.0"} 79',
        'DCGM_FI_DEV_CLOCKS_EVENT_REASONS{gpu="3",UUID="GPU-3",pci_bus_id="00000000:9B:00.0"} 96',
        'DCGM_FI_DEV_SM_CLOCK{gpu="3" 1410',
        "garbage",
    ]
    exposition = parse_exposition(lines)
    assert exposition.malformed == 2
    findings = dcgm_findings("x", dcgm_gpus(exposition))
    kinds = {f.kind: f for f in findings}
    assert kinds["xid"].evidence["xid"] == 79 and kinds["xid"].evidence["pci_bus_id"] == \
        "0000:9b:00"
    assert kinds["clock_event"].evidence["reasons"] == ["sw_thermal", "hw_thermal"]  # 0x20|0x40


def test_bitmask_decoding_follows_nvml_bits():
    assert [r for r, on in reasons_from_bitmask(0x1 | 0x80).items() if on] == [
        "gpu_idle", "hw_power_brake"]


def test_two_gpu_blocks_each_with_its_own_reasons():
    text = (DIR / "smi01_nvidia_smi_q_h100_clocks_event_reasons_swpowercap_swthermal_active.txt"
            ).read_text()
    block = text[text.index("GPU 00000000:75:00.0"):]
    second = (block.replace("00000000:75:00.0", "00000000:86:00.0")
              .replace("SW Power Cap                      : Active",
                       "SW Power Cap                      : Not Active")
              .replace("HW Power Brake Slowdown       : Active",
                       "HW Power Brake Slowdown       : Not Active")
              .replace("SW Thermal Slowdown               : Active",
                       "SW Thermal Slowdown               : Not Active"))
    gpus = parse_nvidia_smi_q((text + second).splitlines())
    assert [g.pci_bus_id for g in gpus] == ["00000000:75:00.0", "00000000:86:00.0"]
    assert gpus[1].active_reasons == [] and len(gpus[0].active_reasons) == 3
    assert [f.subject for f in clock_event_findings("x", gpus)] == ["GPU 0000:75:00"]
