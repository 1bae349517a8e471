"""detectors/group_straggler.py on hand-built windows: the slicing and work normalisation of peer
groups, the job's median step time, and the detectors' inputs passed to update() (the
end-to-end behaviour per peer group is in test_peer_groups.py)."""
import math

import numpy as np
import pytest

from laggard.detectors.group_straggler import (
    ACROSS,
    WITHIN,
    PeerGroupStraggler,
    median_step,
    normalised,
    tagged,
    window_rows,
)
from laggard.detectors.peer_groups import PeerGroups
from laggard.detectors.straggler import RankWindow, StragglerDetector
from laggard.detectors.window import WindowRecord


def rank_window(compute: list[float], *, data: float = 0.0) -> RankWindow:
    r = len(compute)
    return RankWindow(
        step=9, ranks=np.arange(r, dtype=np.int64),
        compute_seconds=np.array(compute, dtype=np.float64)[:, None],
        data_seconds=np.full((r, 1), data), collective_wait_seconds=np.full((r, 1), 0.01),
        transfer_seconds=None, world_size=r, nodes=[f"n{i}" for i in range(r)],
        local_ranks=np.arange(r, dtype=np.int64))


def slowed_windows(count: int = 12) -> list[RankWindow]:
    """8 ranks, rank 3 at twice the work from window 5, each rank waiting for the slowest."""
    windows = []
    for i in range(count):
        compute = [0.1] * 8
        if i >= 5:
            compute[3] = 0.2
        window = rank_window(compute, data=0.005)
        work = window.compute_seconds + window.data_seconds
        window.collective_wait_seconds[:] = work.max() - work
        windows.append(window)
    return windows


def step_record(steps: list[float]) -> WindowRecord:
    return WindowRecord(step=9, ranks=np.arange(len(steps)), world_size=len(steps),
                        columns={"step_seconds": np.array(steps, dtype=np.float64)})


def test_median_step_is_the_median_of_the_finite_positive_steps():
    # an even count: the mean of the two middle values (the old code took the upper one)
    assert median_step(step_record([0.1, 0.4, 0.2, 0.3])) == pytest.approx(0.25)
    assert median_step(step_record([0.1, np.nan, 0.3, np.inf, 0.0, -1.0])) == pytest.approx(0.2)
    assert median_step(step_record([np.nan, 0.0])) is None
    assert median_step(WindowRecord(step=1, ranks=np.arange(2), world_size=2, columns={})) is None


def test_window_rows_keeps_global_ranks_and_forgets_the_world_size():
    window = rank_window([1.0, 2.0, 3.0, 4.0])
    part = window_rows(window, np.array([1, 3]))
    assert part.ranks.tolist() == [1, 3] and part.world_size is None
    assert part.compute_seconds[:, 0].tolist() == [2.0, 4.0]
    assert part.nodes == ["n1", "n3"] and part.local_ranks.tolist() == [1, 3]
    assert part.transfer_seconds is None


def test_normalised_divides_by_the_groups_fastest_rank_and_says_the_unit():
    groups = PeerGroups.from_lists([[0, 1], [2, 3], [4, 5]], 6)
    window = rank_window([0.10, 0.125, 0.20, 0.21, math.nan, -1.0], data=0.0)
    part, units = normalised(window, np.arange(6), groups, [0, 1, 2])
    assert units == {0: 0.10, 1: 0.10, 2: 0.20, 3: 0.20}  # group 2 has no valid reference
    np.testing.assert_allclose(part.compute_seconds[:4, 0], [1.0, 1.25, 1.0, 1.05])
    assert np.isnan(part.compute_seconds[4:, 0]).all()  # absent for the detector
    np.testing.assert_allclose(part.collective_wait_seconds[:4, 0],
                               [0.1, 0.1, 0.05, 0.05])
    # only the pooled groups' rows
    only, _ = normalised(window, np.arange(6), groups, [1])
    assert only.ranks.tolist() == [2, 3]


def test_tagged_names_the_group_and_how_it_was_compared():
    detector = StragglerDetector()
    found = [f for window in slowed_windows() for f in detector.update(window)]
    (finding,) = found
    within = tagged(finding, "pp=1", WITHIN)
    assert within.evidence["peer_group"] == "pp=1" and within.evidence["compared"] == WITHIN
    assert within.message.endswith("[compared within its peer group pp=1]")
    across = tagged(finding, "pp=0", ACROSS)
    assert across.message.endswith(f"[peer group pp=0; compared {ACROSS}]")
    plain = tagged(finding, "all", WITHIN)
    assert plain.message == finding.message and plain.evidence["peer_group"] == "all"


def test_step_seconds_is_an_argument_of_update_and_sets_the_cost_per_hour():
    def first_finding(**kwargs) -> dict:
        detector = StragglerDetector()
        for window in slowed_windows():
            for f in detector.update(window, **kwargs):
                return f.evidence
        raise AssertionError("no finding")

    given = first_finding(step_seconds=0.5)
    assert given["step_seconds"] == 0.5
    assert given["lost_seconds_per_hour"] == pytest.approx(
        3600 * given["lost_seconds_per_step"] / 0.5, rel=1e-5)
    estimated = first_finding()
    assert estimated["step_seconds"] != 0.5
    assert not hasattr(StragglerDetector(), "step_seconds")
    # work-normalised durations: the finding's seconds are the rank's own (x its unit)
    units = dict.fromkeys(range(8), 2.0)
    scaled = first_finding(unit_seconds=units)
    assert scaled["lost_seconds_per_step"] == pytest.approx(
        2 * estimated["lost_seconds_per_step"], rel=1e-5)
    assert scaled["step_seconds"] == pytest.approx(2 * estimated["step_seconds"], rel=1e-5)
    # a given step time is already in seconds: not scaled
    both = first_finding(unit_seconds=units, step_seconds=0.5)
    assert both["step_seconds"] == 0.5


def test_detectors_are_built_per_group_with_the_false_alarm_budget_split():
    big_and_small = PeerGroups.from_lists([[0, 1, 2, 3], [4, 5, 6, 7], [8, 9], [10, 11]], 12)
    grouped = PeerGroupStraggler(big_and_small)
    assert set(grouped.detectors) == {"group 0", "group 1", PeerGroupStraggler.POOLED}
    base = StragglerDetector.Config().false_alarm_windows
    assert all(d.config.false_alarm_windows == 3 * base for d in grouped.detectors.values())
    assert [note[0] for note in grouped.notes] == ["peer-groups-pooled"]
    too_small = PeerGroupStraggler(PeerGroups.from_lists([[0, 1, 2], [3]], 4))
    assert set(too_small.detectors) == {"group 0"}
    assert [note[0] for note in too_small.notes] == ["peer-groups-small"]


def grouped_record(index: int, world: int = 16, *, slow: int | None = None,
                   drop: tuple[int, ...] = (), nan_rows: tuple[int, ...] = ()) -> WindowRecord:
    """Window ``index`` of 4 groups of 4 (group g's work 0.1 x (1 + g / 50)), ``slow`` 30%
    slower from window 6, each rank waiting for its group's slowest; rows ``drop`` absent,
    rows ``nan_rows`` all NaN (a rank whose gathered row is garbage)."""
    rng = np.random.default_rng(index)
    base = np.repeat(0.1 * (1 + np.arange(world // 4) / 50), 4)
    compute = base * rng.lognormal(0, 0.01, world)
    if slow is not None and index >= 6:
        compute[slow] *= 1.3
    data = 0.02 * base
    work = (compute + data).reshape(-1, 4)
    wait = (work.max(axis=1, keepdims=True) - work).ravel() + 0.002
    columns = {"compute_seconds": compute, "data_seconds": data,
               "collective_wait_seconds": wait, "step_seconds": np.full(world, 0.2)}
    for row in nan_rows:
        for values in columns.values():
            values[row] = np.nan
    keep = np.setdiff1d(np.arange(world), drop)
    return WindowRecord(step=20 * index + 19, ranks=keep, world_size=world,
                        columns={k: v[keep] for k, v in columns.items()})


def four_by_four() -> PeerGroups:
    return PeerGroups.from_lists([list(range(4 * g, 4 * g + 4)) for g in range(4)], 16)


def test_one_detector_compares_every_group_with_state_sized_to_the_job():
    grouped = PeerGroupStraggler(four_by_four())
    assert grouped.compared == ["group 0", "group 1", "group 2", "group 3"]
    assert {id(d) for d in grouped.detectors.values()} == {id(grouped.detector)}
    found = [f for i in range(12) for f in grouped.update(grouped_record(i, slow=9)).findings]
    assert [(f.rank, f.kind, f.evidence["peer_group"]) for f in found] == [
        (9, "compute", "group 2")]
    # one per-rank state for all groups, sized to the ranks seen (not groups x highest rank)
    assert grouped.detector._ring.shape[1] == 16


def test_a_nan_row_is_counted_and_the_other_ranks_still_compared():
    grouped = PeerGroupStraggler(four_by_four())
    found = []
    for i in range(12):
        outcome = grouped.update(grouped_record(i, slow=9, nan_rows=(5,)))
        found += outcome.findings
    assert [(f.rank, f.kind) for f in found] == [(9, "compute")]
    # rank 5's compute, data and wait NaN in each of 12 windows
    assert outcome.stats["invalid_durations"] == 3 * 12
    assert 5 not in outcome.scores


def test_a_rank_missing_from_a_group_is_counted_never_raised():
    grouped = PeerGroupStraggler(four_by_four())
    found = []
    for i in range(12):
        # rank 2 absent from window 3 on; from window 8, group 3 keeps 2 ranks: too few
        drop = (2,) if 3 <= i < 8 else (2, 12, 13)
        outcome = grouped.update(grouped_record(i, slow=9, drop=drop if i >= 3 else ()))
        found += outcome.findings
    assert [(f.rank, f.kind) for f in found] == [(9, "compute")]
    assert outcome.stats["missing_rank_reports"] == 5 * 1 + 4 * 3
    assert outcome.stats["too_few_ranks_windows"] == 4  # group 3, windows 8-11
    assert {0, 1, 3} <= set(outcome.scores) and 2 not in outcome.scores


def test_bad_rows_through_the_participant_are_counted_not_raised():
    from laggard.integrations.participants import MonitorContext, StragglerParticipant

    errors: list = []
    participant = StragglerParticipant(None, peer_groups=four_by_four())
    participant.attach(MonitorContext(
        rank=0, world_size=16, node="n0", local_rank=0, window_steps=20, group=lambda: None,
        log_once=lambda *a: None, count_error=lambda where, exc: errors.append(exc)))
    stray = grouped_record(3)
    stray.ranks = np.array([*range(15), 99])  # a row of a rank past the world size
    for record in (grouped_record(0, nan_rows=tuple(range(16))), grouped_record(1, drop=(4,)),
                   grouped_record(2, nan_rows=(0, 1, 2)), stray):
        outcome = participant.on_window(record)
        assert outcome is not None and outcome.findings == []
    assert errors == []
    stats = outcome.detector_stats
    assert stats["invalid_ranks"] == 1 and stats["missing_rank_reports"] == 1 + 1
    assert stats["too_few_ranks_windows"] == 4 + 1  # every group of window 0, group 0 of 2


def test_one_pass_equals_a_detector_per_group_fed_its_rows():
    """Groups of uneven sizes, random NaN cells, a group short of ranks for two windows and a
    raised rank that stops reporting (cleared ``not_reporting``): the one detector's findings
    and scores equal those of one single-group detector per group, each fed its group's rows
    (the single-group detector is what test_straggler_replay.py checks against the old code)."""
    groups = PeerGroups.from_lists([list(range(0, 5)), list(range(5, 11)),
                                    list(range(11, 18))], 18)
    grouped = PeerGroupStraggler(groups)
    config = grouped.detector.config
    alone = [StragglerDetector(config) for _ in groups.groups]
    rng = np.random.default_rng(7)
    raised = []
    for i in range(32):
        compute = 0.1 * rng.lognormal(0, 0.01, 18)
        compute[2] *= 1.3 if i >= 5 else 1.0
        compute[13] *= 1.2 if 9 <= i < 16 else 1.0
        wait = np.zeros(18)
        for ranks in groups.groups:
            members = list(ranks)
            wait[members] = compute[members].max() - compute[members] + 0.002
        columns = {"compute_seconds": compute, "data_seconds": np.full(18, 0.002),
                   "collective_wait_seconds": wait}
        columns["data_seconds"][rng.random(18) < 0.05] = np.nan
        keep = np.ones(18, dtype=bool)
        if i >= 12:
            keep[2] = False  # the slow rank stops reporting
        if i in (8, 9):
            keep[[5, 6, 7, 8]] = False  # group 1 keeps 2 ranks: too few
        ranks = np.flatnonzero(keep)
        record = WindowRecord(step=20 * i + 19, ranks=ranks, world_size=18,
                              columns={k: v[keep] for k, v in columns.items()})
        outcome = grouped.update(record)
        window = RankWindow.from_record(record)
        expected, scores = [], {}
        for g, detector in enumerate(alone):
            rows = np.flatnonzero(np.isin(ranks, groups.groups[g]))
            expected += [tagged(f, groups.names[g], WITHIN)
                         for f in detector.update(window_rows(window, rows))]
            scores.update(detector.scores)
        found = [f for f in outcome.findings if f.kind != "stage_imbalance"]
        assert [f.to_dict() for f in found] == [f.to_dict() for f in expected], i
        assert outcome.scores == scores, i
        raised += found
    assert [(f.rank, f.kind, f.cleared) for f in raised] == [
        (2, "compute", False), (13, "compute", False), (2, "compute", True),
        (13, "compute", True)]
    assert raised[2].evidence["reason"] == "not_reporting"
