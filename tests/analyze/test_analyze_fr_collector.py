"""The ``flight_recorder`` collector on a real directory where dumps appear, as PyTorch writes
them on a timeout (node02's ranks 8-15 of NVRx's GPU_ERROR set)."""

from __future__ import annotations

import shutil

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from support import FIXTURES

from laggard.agent.context import FindingLog
from laggard.collectors.base import NoDataError
from laggard.collectors.flight_recorder import FlightRecorderCollector

NVRX = FIXTURES / "analyze" / "fr_nvrx_gpu_error_2nd"


def scrape(collector) -> dict[str, float]:
    registry = CollectorRegistry()

    class Adapter:
        def collect(self):
            return list(collector.collect())

    registry.register(Adapter())
    values = {}
    for line in generate_latest(registry).decode().splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    return values


def test_dumps_of_this_nodes_ranks_name_9_and_14_once(tmp_path):
    for rank in range(8, 16):
        shutil.copy(NVRX / f"_dump_{rank}", tmp_path / f"nccl_trace_rank_{rank}")
    (tmp_path / "unrelated.txt").write_text("not a dump")
    log = FindingLog()
    collector = FlightRecorderCollector(str(tmp_path / "nccl_trace_rank_"), log, "node02")
    values = scrape(collector)
    assert values["laggard_flight_recorder_dumps"] == 8
    assert values["laggard_flight_recorder_unreadable_dumps"] == 0
    # 72, 37, 64, 69, 90 from entries; the default group 0 from pg_status (its entry is gone)
    assert values['laggard_collective_lagging_groups{rank="9"}'] == 6
    assert values['laggard_collective_lagging_groups{rank="14"}'] == 6
    assert values['laggard_collective_lagging_groups{rank="8"}'] == 0
    first = log.recent()[0]
    assert (first["kind"], first["severity"], first["node"]) == (
        "collective_timeout", "critical", "node02")
    assert first["evidence"]["pg"] == "72" and first["evidence"]["missing_ranks"] == [9, 14]
    assert first["evidence"]["likely_stragglers"] == [9, 14]
    reported = len(log.recent())
    scrape(collector)  # nothing changed: nothing reported again
    assert len(log.recent()) == reported


def test_a_dump_being_written_is_counted_and_retried(tmp_path):
    data = (NVRX / "_dump_9").read_bytes()
    partial = tmp_path / "nccl_trace_rank_9"
    partial.write_bytes(data[:500])
    collector = FlightRecorderCollector(str(tmp_path), FindingLog())
    assert scrape(collector)["laggard_flight_recorder_unreadable_dumps"] == 1
    partial.write_bytes(data)
    values = scrape(collector)
    assert values["laggard_flight_recorder_dumps"] == 1
    assert values["laggard_flight_recorder_unreadable_dumps"] == 0


def test_no_directory_is_no_data(tmp_path):
    with pytest.raises(NoDataError):
        list(FlightRecorderCollector(str(tmp_path / "nope" / "trace_")).collect())
    with pytest.raises(NoDataError):
        list(FlightRecorderCollector("").collect())


def test_exposition_passes_promtool(tmp_path):
    import subprocess

    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (make test installs it)")
    shutil.copy(NVRX / "_dump_9", tmp_path / "nccl_trace_rank_9")
    collector = FlightRecorderCollector(str(tmp_path))
    registry = CollectorRegistry()

    class Adapter:
        def collect(self):
            return list(collector.collect())

    registry.register(Adapter())
    result = subprocess.run([promtool, "check", "metrics"], input=generate_latest(registry),
                            capture_output=True, timeout=30)
    assert result.returncode == 0, result.stdout + result.stderr


def test_golden_exposition_for_node02(tmp_path):
    for rank in range(8, 16):
        shutil.copy(NVRX / f"_dump_{rank}", tmp_path / f"nccl_trace_rank_{rank}")
    collector = FlightRecorderCollector(str(tmp_path))
    registry = CollectorRegistry()

    class Adapter:
        def collect(self):
            return list(collector.collect())

    registry.register(Adapter())
    golden = (FIXTURES / "analyze_golden" / "flight_recorder.prom").read_text()
    assert generate_latest(registry).decode() == golden
