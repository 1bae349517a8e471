"""GPU-state findings (``laggard.analyze.gpu``) from nvidia-smi (-q, both namings, and CSV) and
dcgm-exporter output (answers from corpus/EXPECTED.md). The formats themselves are parsed in
tests/parsers/test_nvidia_smi.py and tests/parsers/test_exposition.py."""

from __future__ import annotations

from support import FIXTURES

from laggard.analyze.gpu import clock_event_findings, dcgm_findings
from laggard.parsers.exposition import dcgm_gpus, parse_exposition
from laggard.parsers.nvidia_smi import parse_nvidia_smi_csv, parse_nvidia_smi_q

DIR = FIXTURES / "analyze"


def smi(path):
    with open(path, encoding="utf-8") as f:
        return parse_nvidia_smi_q(f)


def test_smi01_power_brake_is_critical_and_the_contradiction_is_said():
    gpus = smi(DIR / "smi01_nvidia_smi_q_h100_clocks_event_reasons_swpowercap_swthermal_active.txt")
    (f,) = clock_event_findings("x", gpus)
    assert f.kind == "clock_event" and f.severity.value == "critical"  # hw_power_brake
    assert sorted(f.evidence["reasons"]) == ["hw_power_brake", "sw_power_cap", "sw_thermal"]
    assert "contradict" in f.message  # flags reported literally, clocks at max


def test_smi03_idle_is_not_a_slowdown():
    assert clock_event_findings(
        "x", smi(DIR / "smi03_nvidia_smi_q_legacy_clocks_throttle_reasons_naming.txt")) == []


def test_smi_csv_power_cap_warns_and_hw_slowdown_is_critical():
    with open(FIXTURES / "nvidia_smi" / "query_gpu_units_bitmask.csv") as f:
        findings = clock_event_findings("x", parse_nvidia_smi_csv(f))
    assert [(f.subject, f.severity.value) for f in findings] == [
        ("GPU 0000:18:00", "warning"), ("GPU 0000:2a:00", "critical")]
    assert findings[1].evidence["pci_bus_id_full"] == "00000000:2A:00.0"


def test_dcgm01_sample_has_nothing_wrong():
    with open(DIR / "dcgm01_exporter_legacy_labels_empty_pod_container.prom") as f:
        assert dcgm_findings("x", dcgm_gpus(parse_exposition(f))) == []


def test_dcgm_xid_and_clock_reasons_bitmask():
    with open(FIXTURES / "exposition" / "dcgm_xid_clock_reasons_bad_lines.prom") as f:
        findings = dcgm_findings("x", dcgm_gpus(parse_exposition(f)))
    kinds = {f.kind: f for f in findings}
    assert kinds["xid"].evidence["xid"] == 79 and kinds["xid"].evidence["pci_bus_id"] == \
        "0000:9b:00"
    assert kinds["clock_event"].evidence["reasons"] == ["sw_thermal", "hw_thermal"]  # 0x20|0x40


def test_only_the_throttled_gpu_of_two_is_reported():
    gpus = smi(FIXTURES / "nvidia_smi" / "smi01_two_gpus_second_not_throttled.txt")
    assert [f.subject for f in clock_event_findings("x", gpus)] == ["GPU 0000:75:00"]
