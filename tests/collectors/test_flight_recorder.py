"""The ``flight_recorder`` collector on a real directory where dumps appear, as PyTorch writes
them on a timeout (node02's ranks 8-15 of NVRx's GPU_ERROR set): golden exposition, no
directory, a dump still being written."""

from __future__ import annotations

import shutil

import pytest
from support import FIXTURES

from laggard.agent.context import FindingLog
from laggard.collectors.base import NoDataError
from laggard.collectors.flight_recorder import FlightRecorderCollector

NVRX = FIXTURES / "analyze" / "fr_nvrx_gpu_error_2nd"


def node02_dumps(directory) -> None:
    """Copy node02's dumps (ranks 8-15) under the names PyTorch gives them."""
    for rank in range(8, 16):
        shutil.copy(NVRX / f"_dump_{rank}", directory / f"nccl_trace_rank_{rank}")


def test_dumps_of_this_nodes_ranks_name_9_and_14_once(tmp_path, expose, value):
    node02_dumps(tmp_path)
    (tmp_path / "unrelated.txt").write_text("not a dump")
    log = FindingLog()
    collector = FlightRecorderCollector(str(tmp_path / "nccl_trace_rank_"), log, "node02")
    text = expose(collector)
    assert value(text, "laggard_flight_recorder_dumps") == 8
    assert value(text, "laggard_flight_recorder_unreadable_dumps") == 0
    # 72, 37/38, 64, 69/70, 90; the default group 0 counts P2P here (not compared), and the
    # pipeline peers that wait on 9 and 14 are on the other node
    assert value(text, 'laggard_collective_lagging_groups{rank="9"}') == 5
    assert value(text, 'laggard_collective_lagging_groups{rank="14"}') == 5
    assert value(text, 'laggard_collective_lagging_groups{rank="8"}') == 0
    first = log.recent()[0]
    assert (first["kind"], first["severity"], first["node"]) == (
        "collective_timeout", "critical", "node02")
    assert first["evidence"]["pg"] == "72" and first["evidence"]["missing_ranks"] == [9, 14]
    assert first["evidence"]["likely_stragglers"] == [9, 14]
    reported = len(log.recent())
    expose(collector)  # nothing changed: nothing reported again
    assert len(log.recent()) == reported


def test_a_dump_being_written_is_counted_and_retried(tmp_path, expose, value):
    data = (NVRX / "_dump_9").read_bytes()
    partial = tmp_path / "nccl_trace_rank_9"
    partial.write_bytes(data[:500])
    collector = FlightRecorderCollector(str(tmp_path), FindingLog())
    assert value(expose(collector), "laggard_flight_recorder_unreadable_dumps") == 1
    partial.write_bytes(data)
    text = expose(collector)
    assert value(text, "laggard_flight_recorder_dumps") == 1
    assert value(text, "laggard_flight_recorder_unreadable_dumps") == 0


def test_no_directory_is_no_data(tmp_path):
    with pytest.raises(NoDataError):
        list(FlightRecorderCollector(str(tmp_path / "nope" / "trace_")).collect())
    with pytest.raises(NoDataError):
        list(FlightRecorderCollector("").collect())


def test_golden_exposition_for_node02(tmp_path, expose, golden):
    node02_dumps(tmp_path)
    golden("flight_recorder/node02.prom", expose(FlightRecorderCollector(str(tmp_path))))


def test_exposition_passes_promtool(tmp_path, expose, promtool):
    node02_dumps(tmp_path)
    promtool(expose(FlightRecorderCollector(str(tmp_path))))
