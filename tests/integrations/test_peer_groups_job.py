"""Peer groups in a real 4-rank gloo job (peer_groups_worker.py): two groups of different work
and one slowed rank; the slowed rank is named with its group, no other rank, and the heavier
group is a stage imbalance. The same job builds a DeviceMesh and maps it to groups."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support import torchrun

pytest.importorskip("torch")

HERE = Path(__file__).parent


@pytest.fixture(scope="module")
def peer_job(tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("peer_groups")
    proc = torchrun(HERE / "peer_groups_worker.py", 4, str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(4)]


def test_the_slowed_rank_is_named_with_its_peer_group_and_no_other_rank(peer_job):
    rank0 = peer_job[0]
    assert rank0["errors"] == 0
    assert rank0["detectors"] == ["pooled"]  # two groups of 2: compared across groups
    ranked = [f for f in rank0["findings"] if f.get("rank") is not None]
    assert {(f["rank"], f["kind"]) for f in ranked} == {(1, "compute")}, rank0["findings"]
    evidence = ranked[0]["evidence"]
    assert evidence["peer_group"] == "group 0"
    assert evidence["compared"] == "across groups, work-normalised"
    # 30% of group 0's 12 ms: about 3.6 ms per step the others wait
    assert 0.001 < evidence["lost_seconds_per_step"] < 0.008
    assert evidence["lost_seconds_per_hour"] > 0


def test_the_heavier_group_is_a_stage_imbalance_not_a_straggler(peer_job):
    stages = [f for f in peer_job[0]["findings"] if f["kind"] == "stage_imbalance"]
    assert [f["evidence"]["peer_group"] for f in stages] == ["group 1"]
    assert stages[0]["rank"] is None
    seconds = stages[0]["evidence"]["stage_seconds"]
    assert seconds["group 1"] > 1.3 * seconds["group 0"]


def test_a_device_mesh_maps_to_one_group_per_pipeline_stage(peer_job):
    for result in peer_job:
        mesh = result["mesh"]
        assert mesh["groups"] == [[0, 1], [2, 3]]
        assert mesh["names"] == ["pp=0", "pp=1"] and mesh["stages"] == [0, 1]
        assert mesh["source"] == "mesh"
        assert "not both" in mesh["both"]


@pytest.mark.parametrize(("groups", "words"), [
    ([[0, 1], [1, 2, 3]], "group 0 and group 1|twice"),
    ([[0, 1], [2]], "in no group|cover 3"),
    ([[0, 1], [2, 3, 4]], "outside range"),
])
def test_the_monitor_refuses_peer_groups_that_do_not_partition_the_job(groups, words):
    from laggard.integrations.monitor import TrainingMonitor

    with pytest.raises(ValueError, match=words):
        TrainingMonitor(TrainingMonitor.Config(agent_address="", heartbeat_seconds=0,
                                               hang_store_seconds=0, peer_groups=groups),
                        rank=0, world_size=4)


def test_a_monitor_without_groups_compares_every_rank():
    from laggard.integrations.monitor import TrainingMonitor

    monitor = TrainingMonitor(TrainingMonitor.Config(agent_address="", heartbeat_seconds=0,
                                                     hang_store_seconds=0),
                              rank=0, world_size=4)
    assert monitor.peer_groups.source == "all" and monitor.peer_groups.groups == ((0, 1, 2, 3),)
    assert monitor.participant("straggler").peer_groups is monitor.peer_groups
    monitor.close()
