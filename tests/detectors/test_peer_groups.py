"""Peer groups: built from a mesh or lists (bad input raises at construction), and the straggler
detector run per peer group on hand-built window records: a rank is compared with the ranks
doing its work, a heavier stage is no straggler, a slow rank of a 2-rank stage is named.

The records follow a job whose groups each synchronise in their own gradient collective (a
pipeline's data-parallel groups): inside a group every rank waits for the group's slowest.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from laggard.detectors.finding import JOB_FINDING_KINDS
from laggard.detectors.peer_groups import PeerGroups
from laggard.detectors.window import WindowRecord
from laggard.integrations.participants import MonitorContext, StragglerParticipant
from laggard.wire import WindowReport, decode_datagram

WINDOWS = 16


def record(index: int, groups: PeerGroups, *, work: dict[int, float],
           slow: dict[int, float] | None = None, jitter: float = 0.01,
           seed: int = 0) -> WindowRecord:
    """Window ``index``: group g's ranks do ``work[g]`` seconds of compute per step (x
    ``slow[rank]``), data 2% of it; each waits in its group's collective for the group's
    slowest rank; the step is the slowest rank's work plus the collective."""
    world = groups.world_size
    rng = np.random.default_rng(seed * 10_007 + index)
    base = np.array([work[groups.group_of(r)] for r in range(world)])
    compute = base * rng.lognormal(0, jitter, world)
    for rank, factor in (slow or {}).items():
        compute[rank] *= factor
    data = 0.02 * base * rng.lognormal(0, jitter, world)
    total = compute + data
    wait = np.empty(world)
    for ranks in groups.groups:
        members = list(ranks)
        wait[members] = total[members].max() - total[members] + 0.002
    step = np.full(world, total.max() + 0.003)
    return WindowRecord(step=20 * index + 19, ranks=np.arange(world), world_size=world, columns={
        "compute_seconds": compute, "data_seconds": data, "collective_wait_seconds": wait,
        "transfer_seconds": np.full(world, np.nan), "step_seconds": step})


def participant(groups: PeerGroups | None, world: int) -> StragglerParticipant:
    p = StragglerParticipant(None, peer_groups=groups)
    p.attach(MonitorContext(rank=0, world_size=world, node="n0", local_rank=0, window_steps=20,
                            group=lambda: None, log_once=lambda *a: None,
                            count_error=lambda where, exc: None))
    return p


def run(p: StragglerParticipant, groups: PeerGroups, **kwargs) -> list:
    found = []
    for i in range(WINDOWS):
        outcome = p.on_window(record(i, groups, **kwargs))
        found += outcome.findings if outcome is not None else []
    return found


def raised(findings: list) -> list:
    return [f for f in findings if not f.cleared]


# -- construction -------------------------------------------------------------------------

def fake_mesh(shape: tuple[int, ...], names: tuple[str, ...] | None, ranks=None):
    ranks = np.arange(int(np.prod(shape))).reshape(shape) if ranks is None else ranks
    return SimpleNamespace(mesh=ranks, mesh_dim_names=names)


def test_a_pp_dp_mesh_makes_one_group_per_stage():
    groups = PeerGroups.from_mesh(fake_mesh((2, 2), ("pp", "dp")), 4)
    assert groups.groups == ((0, 1), (2, 3))
    assert groups.names == ("pp=0", "pp=1")
    assert groups.stages == (0, 1)
    assert groups.source == "mesh"
    assert groups.group_of(3) == 1 and groups.peers_of(2) == (2, 3)
    assert groups.describe(1) == "pipeline stage 1 (pp=1: ranks 2, 3)"


def test_pp_and_tp_separate_groups_and_every_data_parallel_dim_joins_them():
    groups = PeerGroups.from_mesh(fake_mesh((2, 2, 2), ("pp", "dp_shard", "tp")), 8)
    # coordinates (pp, dp_shard, tp) -> rank 4 pp + 2 dp + tp: peers share pp and tp
    assert groups.groups == ((0, 2), (1, 3), (4, 6), (5, 7))
    assert groups.names == ("pp=0,tp=0", "pp=0,tp=1", "pp=1,tp=0", "pp=1,tp=1")
    assert groups.stages == (0, 0, 1, 1)
    hsdp = PeerGroups.from_mesh(fake_mesh((2, 2, 2), ("dp_replicate", "dp_shard", "cp")), 8)
    assert hsdp.groups == (tuple(range(8)),) and hsdp.names == ("all",) and hsdp.is_all
    # a job that says cp changes the work keeps its cp ranks apart
    split = PeerGroups.from_mesh(fake_mesh((2, 2), ("dp", "cp")), 4, peer_dims={"dp"})
    assert split.groups == ((0, 2), (1, 3)) and split.stages == (None, None)


def test_the_mesh_may_be_a_tensor_like_any_device_mesh():
    torch = pytest.importorskip("torch")
    mesh = SimpleNamespace(mesh=torch.arange(4).reshape(2, 2).T.contiguous(),
                           mesh_dim_names=("pp", "dp"))  # stage 0 = ranks 0, 2
    assert PeerGroups.from_mesh(mesh, 4).groups == ((0, 2), (1, 3))


@pytest.mark.parametrize(("mesh", "world", "words"), [
    (fake_mesh((2, 2), None), 4, "no mesh_dim_names"),
    (fake_mesh((2, 2), ("pp",)), 4, "2 dimensions but 1 names"),
    (fake_mesh((2, 2), ("pp", "pp")), 4, "repeat"),
    (fake_mesh((2,), ("dp",), ranks=np.array([2, 3])), 4, "not range(4)"),  # a sub-mesh
    (fake_mesh((2, 2), ("pp", "dp")), 8, "not range(8)"),
    (SimpleNamespace(mesh_dim_names=("dp",)), 4, "not a DeviceMesh"),
])
def test_a_mesh_that_does_not_map_to_the_job_raises(mesh, world, words):
    with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)")):
        PeerGroups.from_mesh(mesh, world)


@pytest.mark.parametrize(("lists", "world", "words"), [
    ([[0, 1], [1, 2, 3]], 4, "lists a rank twice|in group 0 and group 1"),
    ([[0, 1], [2]], 4, "in no group|cover 3 ranks"),
    ([[0, 1], [2, 7]], 4, "outside range"),
    ([[0, 0, 1], [2, 3]], 4, "twice"),
    ([[0, 1], []], 2, "empty"),
    ([[0, 1.5]], 2, "not an int"),
    ("0123", 4, "sequence of rank lists"),
    ([[0, 1], [-1, 2, 3]], 4, "outside range"),
])
def test_peer_group_lists_that_overlap_or_miss_ranks_raise(lists, world, words):
    with pytest.raises(ValueError, match=words):
        PeerGroups.from_lists(lists, world)


def test_lists_are_named_and_sorted():
    groups = PeerGroups.from_lists([[3, 2], [1, 0]], 4)
    assert groups.groups == ((2, 3), (0, 1)) and groups.names == ("group 0", "group 1")
    assert groups.describe(0) == "peer group group 0 (ranks 2, 3)"
    with pytest.raises(ValueError):
        groups.group_of(4)
    assert PeerGroups.all(3).groups == ((0, 1, 2),)
    with pytest.raises(ValueError):
        PeerGroups.all(0)


def test_stage_imbalance_is_a_straggler_finding_kind():
    assert "stage_imbalance" in JOB_FINDING_KINDS["straggler"]


# -- detection per peer group ---------------------------------------------------------------

def test_groups_of_four_are_each_compared_within_themselves():
    groups = PeerGroups.from_lists([[0, 1, 2, 3], [4, 5, 6, 7]], 8)
    work = {0: 0.100, 1: 0.130}  # group 1 does 30% more work per step
    found = raised(run(participant(groups, 8), groups, work=work, slow={5: 1.15}))
    ranked = [f for f in found if f.rank is not None]
    assert [(f.rank, f.kind) for f in ranked] == [(5, "compute")]
    assert ranked[0].evidence["peer_group"] == "group 1"
    assert ranked[0].evidence["compared"] == "within peer group"
    assert "peer group group 1" in ranked[0].message
    # its excess over its group's median, 15% of 0.13 s, is what the others wait per step
    assert ranked[0].evidence["lost_seconds_per_step"] == pytest.approx(0.15 * 0.1326, rel=0.25)
    # the heavier group is a stage imbalance, raised once
    assert [f.kind for f in found if f.rank is None] == ["stage_imbalance"]
    # compared with every rank, the slow rank hides in a median of two kinds of work (and in
    # a wait that does not match that median's critical path): nobody is named
    plain = raised(run(participant(None, 8), groups, work=work, slow={5: 1.15}))
    assert [f.rank for f in plain] == []
    # a slow rank of the light group is found within it as well
    light = raised(run(participant(groups, 8), groups, work=work, slow={1: 1.15}))
    assert [(f.rank, f.evidence["peer_group"]) for f in light if f.rank is not None] == [
        (1, "group 0")]


def test_a_heavier_stage_of_two_ranks_is_a_stage_imbalance_and_no_straggler():
    groups = PeerGroups.from_mesh(fake_mesh((2, 2), ("pp", "dp")), 4)
    p = participant(groups, 4)
    assert set(p.detectors) == {"pooled"} and p.stage_balance is not None
    found = raised(run(p, groups, work={0: 0.100, 1: 0.130}))
    assert [f.kind for f in found] == ["stage_imbalance"]
    # what the monitor sends the agent with it parses there (at most 16 counters, a rank-less
    # finding with a dict in its evidence)
    outcome = p.on_window(record(WINDOWS, groups, work={0: 0.100, 1: 0.130}))
    report = WindowReport(step=99, world_size=4, scores=outcome.scores,
                          detector_stats=outcome.detector_stats,
                          findings=[found[0].to_dict()])
    assert decode_datagram(report.encode()).findings[0]["kind"] == "stage_imbalance"
    imbalance = found[0]
    assert imbalance.rank is None and imbalance.detector == "straggler"
    assert imbalance.subject == "pipeline stage 1 (pp=1: ranks 2, 3)"
    assert imbalance.evidence["stage_seconds"]["pp=1"] == pytest.approx(0.1326, rel=0.03)
    assert imbalance.evidence["stage_seconds"]["pp=0"] == pytest.approx(0.102, rel=0.03)
    # every stage at the mean saves the heavy stage's excess over it: 0.015 s per step
    assert imbalance.evidence["lost_seconds_per_step"] == pytest.approx(0.0153, rel=0.1)
    step = imbalance.evidence["step_seconds"]
    assert imbalance.evidence["balanced_step_seconds"] == pytest.approx(step - 0.0153, rel=0.02)
    assert imbalance.evidence["lost_seconds_per_hour"] == pytest.approx(
        3600 * imbalance.evidence["lost_seconds_per_step"] / step, rel=1e-3)
    assert "costs the job" in imbalance.message and "no rank is a straggler" in imbalance.message


def test_a_slow_rank_of_a_two_rank_stage_is_named_with_its_group():
    groups = PeerGroups.from_mesh(fake_mesh((2, 2), ("pp", "dp")), 4)
    found = run(participant(groups, 4), groups, work={0: 0.100, 1: 0.105}, slow={3: 1.25})
    up = raised(found)
    assert [(f.rank, f.kind) for f in up] == [(3, "compute")]
    finding = up[0]
    assert finding.evidence["peer_group"] == "pp=1"
    assert finding.evidence["compared"] == "across groups, work-normalised"
    # in its own seconds: 25% of its stage's 0.107 s of work
    assert finding.evidence["lost_seconds_per_step"] == pytest.approx(0.25 * 0.107, rel=0.2)
    assert "ms per step" in finding.message and "costs the job" in finding.message


def test_the_same_slow_rank_of_the_light_stage_is_named_too():
    groups = PeerGroups.from_mesh(fake_mesh((2, 2), ("pp", "dp")), 4)
    found = raised(run(participant(groups, 4), groups, work={0: 0.100, 1: 0.130},
                       slow={0: 1.25}))
    assert [(f.rank, f.kind) for f in found if f.rank is not None] == [(0, "compute")]


def test_without_groups_the_participant_is_one_detector_over_all_ranks():
    p = participant(None, 4)
    assert p.detector is not None and not p.detectors and p.stage_balance is None
    groups = PeerGroups.all(4)
    found = raised(run(p, groups, work={0: 0.1}, slow={2: 1.3}))
    assert [(f.rank, f.evidence["peer_group"], f.evidence["compared"]) for f in found] == [
        (2, "all", "within peer group")]


def test_a_record_of_another_world_size_is_counted_not_raised():
    groups = PeerGroups.from_lists([[0, 1], [2, 3]], 4)
    p = participant(groups, 4)
    other = record(0, PeerGroups.all(6), work={0: 0.1})
    outcome = p.on_window(other)
    assert outcome is not None and outcome.findings == []
    assert outcome.detector_stats["peer_group_mismatch_windows"] == 1
    # and a group whose ranks give NaN is absent, counted by the detector
    bad = record(1, groups, work={0: 0.1, 1: 0.1})
    bad.columns["compute_seconds"][2:] = np.nan
    outcome = p.on_window(bad)
    assert outcome is not None and outcome.detector_stats["invalid_durations"] >= 2


def test_peer_groups_of_another_job_raise_at_attach():
    with pytest.raises(ValueError, match="cover 4 ranks"):
        participant(PeerGroups.from_lists([[0, 1], [2, 3]], 4), 8)


def test_counters_over_groups_are_cumulative_and_count_each_window_once():
    groups = PeerGroups.from_lists([[0, 1, 2], [3, 4, 5]], 6)
    p = participant(groups, 6)
    for i in range(3):
        partial = record(i, groups, work={0: 0.1, 1: 0.1})
        keep = np.array([0, 1, 2, 3, 4])  # rank 5 missing every window
        partial = WindowRecord(step=partial.step, ranks=np.array([0, 1, 2, 3, 4]),
                               world_size=6, columns={k: v[keep] for k, v in
                                                      partial.columns.items()})
        if i == 2:
            partial.ranks[0] = 99  # a rank in no group
        stats = p.on_window(partial).detector_stats
    assert stats["windows"] == 3
    assert stats["missing_rank_reports"] == 1 + 1 + 2
    assert stats["invalid_ranks"] == 1


def test_a_failing_cause_attribution_is_counted_and_the_findings_still_go_out():
    errors = []
    p = StragglerParticipant(None)
    p.attach(MonitorContext(rank=0, world_size=4, node="n0", local_rank=0, window_steps=20,
                            group=lambda: None, log_once=lambda *a: None,
                            count_error=lambda where, exc: errors.append(where)))

    class Broken:
        def apply(self, findings, record, peers_of):
            assert peers_of(1) == (0, 1, 2, 3)
            raise RuntimeError("boom")

    p._causes = Broken()
    found = raised(run(p, PeerGroups.all(4), work={0: 0.1}, slow={2: 1.3}))
    assert [f.rank for f in found] == [2]
    assert set(errors) == {"cause_attribution"}
