"""benchmarks/scale.py's rank-0 path at a test's size: synthetic gathered rows stacked and
unpacked by the monitor's window layout, then ``TrainingMonitor.analyse``, with peer groups;
the slow rank is named at the first window its evidence allows (3 slowed windows), no other
rank, and the per-group detector objects it replaced name it at the same window."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
scale = pytest.importorskip("scale")


@pytest.mark.parametrize("groups", [1, 8])
def test_the_slow_rank_is_named_at_the_first_window_it_can_be_and_no_other(groups: int):
    job = scale.Job(256, groups, onset=6)
    result = scale.run_monitor(job, 12, history_windows=4)
    assert result.named_at == 8 and result.others == set()  # slowed windows 6, 7, 8
    if groups > 1:
        objects = scale.run_per_group_objects(job, 12)
        assert (objects.named_at, objects.others) == (result.named_at, set())
