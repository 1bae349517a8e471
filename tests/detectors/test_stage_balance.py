"""StageBalance on hand-built window records: a heavier stage raised once and cleared with
hysteresis, a stage whose one rank is slow left to the straggler detector, the others' p2p wait
in evidence, bad input counted."""

from __future__ import annotations

import numpy as np
import pytest

from laggard.detectors.peer_groups import PeerGroups
from laggard.detectors.stage_balance import StageBalance
from laggard.detectors.window import WindowRecord


def stage_record(index: int, groups: PeerGroups, work: list[float], *,
                 slow: dict[int, float] | None = None, p2p: bool = False) -> WindowRecord:
    """Window ``index``: group g's ranks do ``work[g]`` s of compute per step (x
    ``slow[rank]``), 1% jitter; with ``p2p``, the lighter stages wait for the heaviest."""
    world = groups.world_size
    rng = np.random.default_rng(index)
    compute = np.array([work[groups.group_of(r)] for r in range(world)])
    compute = compute * rng.lognormal(0, 0.01, world)
    for rank, factor in (slow or {}).items():
        compute[rank] *= factor
    columns = {"compute_seconds": compute, "data_seconds": np.full(world, 0.001),
               "step_seconds": np.full(world, compute.max() + 0.01)}
    if p2p:
        columns["p2p_wait_seconds"] = compute.max() - compute
    return WindowRecord(step=10 * index + 9, ranks=np.arange(world), world_size=world,
                        columns=columns)


def feed(detector: StageBalance, groups: PeerGroups, plan: list[list[float]], **kwargs) -> list:
    out = []
    for i, work in enumerate(plan):
        out += [(i, f) for f in detector.update(stage_record(i, groups, work, **kwargs))]
    return out


PP = PeerGroups.from_lists([[0, 1], [2, 3]], 4)


def test_a_heavier_stage_is_raised_in_its_third_window_over_and_clears_after_n_balanced():
    detector = StageBalance(PP)
    plan = [[0.1, 0.1]] * 3 + [[0.1, 0.125]] * 8 + [[0.1, 0.1]] * 7
    events = feed(detector, PP, plan)
    assert [(i, f.kind, f.cleared) for i, f in events] == [
        (5, "stage_imbalance", False), (15, "stage_imbalance", True)]
    first = events[0][1]
    assert first.subject == "peer group group 1 (ranks 2, 3)"
    assert first.evidence["imbalance"] == pytest.approx(0.24, abs=0.03)
    assert first.evidence["peer_group"] == "group 1"


def test_a_stage_whose_one_rank_is_slow_is_a_straggler_not_an_imbalance():
    detector = StageBalance(PP)
    # rank 3 1.3x: the stage's fastest rank is at the others' work
    assert feed(detector, PP, [[0.1, 0.1]] * 10, slow={3: 1.3}) == []
    # a heavier stage with one rank much slower still: its ranks disagree by more than the gap
    detector = StageBalance(PP)
    assert feed(detector, PP, [[0.1, 0.115]] * 10, slow={3: 1.4}) == []


def test_three_stages_compare_with_the_median_of_the_others_and_name_the_p2p_waits():
    groups = PeerGroups.from_lists([[0, 1, 2], [3, 4, 5], [6, 7, 8]], 9)
    detector = StageBalance(groups)
    events = feed(detector, groups, [[0.1, 0.1, 0.13]] * 6, slow={8: 1.2}, p2p=True)
    assert len(events) == 1
    finding = events[0][1]
    assert finding.evidence["peer_group"] == "group 2"
    # groups of 3: the median rank's work, not moved by the slow rank 8
    assert finding.evidence["stage_seconds"]["group 2"] == pytest.approx(0.131, rel=0.03)
    assert set(finding.evidence["p2p_wait_seconds"]) == {"group 0", "group 1"}
    assert finding.evidence["p2p_wait_seconds"]["group 0"] == pytest.approx(0.05, rel=0.3)


def test_bad_input_is_counted_never_raised():
    detector = StageBalance(PP)
    bad = stage_record(0, PP, [0.1, 0.1])
    bad.columns["compute_seconds"][[0, 1]] = np.nan
    assert detector.update(bad) == []
    assert detector.stats["invalid_durations"] == 2
    assert detector.stats["too_few_groups_windows"] == 1
    stray = WindowRecord(step=1, ranks=np.array([0, 9]), world_size=None, columns={
        "compute_seconds": np.array([0.1, -1.0]), "data_seconds": np.zeros(2)})
    assert detector.update(stray) == []
    assert detector.stats["unknown_ranks"] == 1
    assert detector.update(WindowRecord(step=2, ranks=np.arange(4), columns={})) == []
    with pytest.raises(ValueError):
        StageBalance.Config(over_windows=9)


def test_the_agent_counts_a_rank_less_stage_imbalance_and_flags_no_rank():
    from laggard.agent.context import FindingLog
    from laggard.agent.run_metrics import RunMetrics
    from laggard.agent.run_table import RankTable
    from laggard.wire import WindowReport

    detector = StageBalance(PP)
    finding = feed(detector, PP, [[0.1, 0.13]] * 4)[0][1]
    findings = FindingLog()
    table = RankTable(max_ranks=8, findings=findings, default_node="n0")
    table.ingest(WindowReport(step=40, world_size=4, findings=[finding.to_dict()]).encode())
    assert findings.counts() == {("straggler", "stage_imbalance", "warning"): 1}
    names = {s.name for m in RunMetrics(table).collect() for s in m.samples}
    flagged = [s for m in RunMetrics(table).collect() for s in m.samples
               if s.name == "laggard_straggler_active"]
    assert flagged == [] and "laggard_intake_ranks" in names
