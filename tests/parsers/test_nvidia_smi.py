"""nvidia-smi output: ``-q`` with both namings of the clock reasons (the corpus' smi01 and smi03,
answers from corpus/EXPECTED.md), two GPU blocks, a cut-off output, the ``--query-gpu`` CSV form
with units and a bitmask, and NVML's reason bits. Findings from these GPUs are tested in
tests/analyze/test_analyze_gpu_state.py."""

from __future__ import annotations

import pytest
from support import FIXTURES

from laggard.parsers.nvidia_smi import (
    parse_nvidia_smi_csv,
    parse_nvidia_smi_q,
    reasons_from_bitmask,
)

SMI01 = FIXTURES / "analyze" / "smi01_nvidia_smi_q_h100_clocks_event_reasons_swpowercap_swthermal_active.txt"  # noqa: E501
SMI03 = FIXTURES / "analyze" / "smi03_nvidia_smi_q_legacy_clocks_throttle_reasons_naming.txt"


def test_smi01_clocks_event_reasons_with_nested_hw_slowdown():
    (gpu,) = parse_nvidia_smi_q(SMI01.read_text().splitlines())
    assert gpu.pci_bus_id == "00000000:75:00.0"
    assert gpu.product_name == "NVIDIA H100 80GB HBM3" and gpu.performance_state == "P0"
    assert sorted(gpu.active_reasons) == ["hw_power_brake", "sw_power_cap", "sw_thermal"]
    assert gpu.reasons["hw_slowdown"] is False  # the parent is not active
    assert (gpu.temperature_c, gpu.power_draw_w, gpu.power_limit_w) == (39, 118.01, 700)
    assert (gpu.sm_clock_mhz, gpu.sm_clock_max_mhz) == (1980, 1980)


def test_smi03_legacy_throttle_naming_only_idle_active():
    with open(SMI03, encoding="utf-8") as f:
        (gpu,) = parse_nvidia_smi_q(f)
    assert gpu.pci_bus_id is None
    assert gpu.active_reasons == ["gpu_idle"]
    assert {r for r, on in gpu.reasons.items() if not on} == {
        "applications_clocks_setting", "sw_power_cap", "hw_slowdown", "hw_thermal",
        "hw_power_brake", "sync_boost", "sw_thermal"}


def test_two_gpu_blocks_each_with_its_own_reasons():
    # smi01 followed by a copy of its GPU block for 00000000:86:00.0 with every reason off
    with open(FIXTURES / "nvidia_smi" / "smi01_two_gpus_second_not_throttled.txt") as f:
        gpus = parse_nvidia_smi_q(f)
    assert [g.pci_bus_id for g in gpus] == ["00000000:75:00.0", "00000000:86:00.0"]
    assert gpus[1].active_reasons == [] and len(gpus[0].active_reasons) == 3
    assert gpus[1].temperature_c == 39  # each block keeps its own fields


def test_output_cut_inside_a_section_keeps_what_was_read():
    text = SMI01.read_text()
    cut = text[:text.index("Temperature") + 30]  # ends inside "GPU Current Temp"
    (gpu,) = parse_nvidia_smi_q(cut.splitlines())
    assert sorted(gpu.active_reasons) == ["hw_power_brake", "sw_power_cap", "sw_thermal"]
    assert gpu.temperature_c is None and gpu.power_draw_w is None


def test_text_without_a_gpu_is_no_gpu():
    assert parse_nvidia_smi_q(["==============NVSMI LOG==============", "",
                               "Driver Version : 550.54.15"]) == []


def test_smi_csv_query_form_with_units_and_bitmask():
    with open(FIXTURES / "nvidia_smi" / "query_gpu_units_bitmask.csv") as f:
        g0, g1 = parse_nvidia_smi_csv(f)
    assert g0.pci_bus_id == "00000000:18:00.0" and g1.pci_bus_id == "00000000:2A:00.0"
    assert g0.active_reasons == ["sw_power_cap"] and g0.sm_clock_mhz == 1410
    assert g0.power_draw_w == 698.12 and g0.sm_clock_max_mhz == 1980  # units stripped
    assert g1.active_reasons == ["hw_slowdown"] and g1.temperature_c == 88


def test_smi_csv_rows_of_the_wrong_width_are_skipped():
    lines = (FIXTURES / "nvidia_smi" / "query_gpu_units_bitmask.csv").read_text().splitlines()
    (gpu,) = parse_nvidia_smi_csv([lines[0], lines[1], "2, 00000000:3C:00.0, 0x0"])  # cut row
    assert gpu.pci_bus_id == "00000000:18:00.0"


def test_smi_csv_without_header_is_refused():
    with pytest.raises(ValueError, match="header"):
        parse_nvidia_smi_csv(["0, 00000000:18:00.0, 61"])


def test_bitmask_decoding_follows_nvml_bits():
    assert [r for r, on in reasons_from_bitmask(0x1 | 0x80).items() if on] == [
        "gpu_idle", "hw_power_brake"]
    assert [r for r, on in reasons_from_bitmask(0x20 | 0x40).items() if on] == [
        "sw_thermal", "hw_thermal"]
    assert not any(reasons_from_bitmask(0).values())
