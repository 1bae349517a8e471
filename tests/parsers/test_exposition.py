"""Prometheus text exposition as dcgm-exporter writes it: the corpus' dcgm01 with legacy labels
and empty pod/container (answers from corpus/EXPECTED.md), one GPU per label set, malformed and
truncated lines counted and skipped, the agent's own exposition read back. Findings from these
GPUs are tested in tests/analyze/test_analyze_gpu_state.py."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from support import FIXTURES

from laggard.parsers.exposition import dcgm_gpus, parse_exposition


def test_dcgm01_legacy_labels():
    with open(FIXTURES / "analyze" / "dcgm01_exporter_legacy_labels_empty_pod_container.prom") as f:
        exposition = parse_exposition(f)
    assert exposition.malformed == 0
    (gpu,) = dcgm_gpus(exposition)
    assert gpu.gpu == "0" and gpu.uuid == "GPU-00000000-0000-0000-0000-000000000010"
    assert gpu.get("sm_clock_mhz") == 1530 and gpu.get("memory_clock_mhz") == 877
    assert gpu.get("temperature_c") == 55 and gpu.get("memory_temperature_c") == 54
    assert gpu.get("power_w") == pytest.approx(302.206)
    assert gpu.get("energy_mj") == 4335301032 and gpu.get("pcie_replay") == 0
    assert gpu.get("utilization_percent") == 44
    assert gpu.get("last_xid") is None  # no such series in the file


def test_malformed_lines_are_counted_and_the_rest_is_read():
    with open(FIXTURES / "exposition" / "dcgm_xid_clock_reasons_bad_lines.prom") as f:
        exposition = parse_exposition(f)
    assert exposition.malformed == 2  # an unclosed label set and a bare word
    assert [(s.name, s.value) for s in exposition.samples] == [
        ("DCGM_FI_DEV_XID_ERRORS", 79.0), ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", 96.0)]
    (gpu,) = dcgm_gpus(exposition)
    assert (gpu.gpu, gpu.uuid, gpu.pci_bus_id) == ("3", "GPU-3", "00000000:9B:00.0")
    assert gpu.get("last_xid") == 79 and gpu.get("clock_event_reasons") == 96
    assert gpu.get("sm_clock_mhz") is None  # its line was the malformed one


def test_a_file_cut_mid_line_loses_only_that_line():
    text = (FIXTURES / "analyze" / "dcgm01_exporter_legacy_labels_empty_pod_container.prom"
            ).read_text()
    whole = parse_exposition(text.splitlines())
    cut = parse_exposition(text[:text.rindex('{')].splitlines())  # inside the last label set
    assert cut.malformed == 1
    assert len(cut.samples) == len(whole.samples) - 1


def test_gpus_are_told_apart_by_host_index_and_uuid():
    lines = ['DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-a",Hostname="n1"} 40',
             'DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-b",Hostname="n2"} 41',
             'DCGM_FI_DEV_SM_CLOCK{gpu="0",UUID="GPU-a",Hostname="n1"} 1410',
             'nccl_bus_bandwidth_gbs{collective="AllReduce"} 300']  # not a DCGM series
    gpus = dcgm_gpus(parse_exposition(lines))
    assert [(g.hostname, g.uuid, g.get("temperature_c")) for g in gpus] == [
        ("n1", "GPU-a", 40), ("n2", "GPU-b", 41)]
    assert gpus[0].get("sm_clock_mhz") == 1410 and gpus[1].get("sm_clock_mhz") is None


def test_the_agent_side_exposition_reads_back_with_labels_escaped_and_histograms():
    from prometheus_client import Gauge, Histogram

    registry = CollectorRegistry()
    Gauge("laggard_x", "x", ["device"], registry=registry).labels('a"b\\c').set(2.5)
    Histogram("laggard_y_seconds", "y", buckets=(0.1, 1.0), registry=registry).observe(0.5)
    exposition = parse_exposition(generate_latest(registry).decode().splitlines())
    assert exposition.malformed == 0
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value for s in exposition.samples}
    assert samples[("laggard_x", (("device", 'a"b\\c'),))] == 2.5
    assert samples[("laggard_y_seconds_bucket", (("le", "1.0"),))] == 1.0
    assert samples[("laggard_y_seconds_count", ())] == 1.0
