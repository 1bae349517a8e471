"""The hang rules (``laggard.detectors.hang.classify_hang``) on heartbeat-shaped states: counters
only (issued and completed per group and per P2P pair, silence, liveness), no pending list. Each
kind, root cause against consequence across groups, P2P pairs, and bad input."""

from __future__ import annotations

from laggard.detectors.hang import GroupState, RankState, classify_hang

# 8 ranks, TP=2 x DP=4: tp {0,1} {2,3} {4,5} {6,7}, dp {0,2,4,6} {1,3,5,7}
TP = {r: (f"tp{r // 2}", (r // 2 * 2, r // 2 * 2 + 1)) for r in range(8)}
DP = {r: (f"dp{r % 2}", tuple(range(r % 2, 8, 2))) for r in range(8)}


def beat(rank: int, tp: tuple[int, int], dp: tuple[int, int], **kw) -> RankState:
    """A heartbeat: (issued, completed) in the rank's tp and dp groups."""
    groups = (GroupState(TP[rank][0], *tp, desc="tp", members=TP[rank][1], op="allreduce"),
              GroupState(DP[rank][0], *dp, desc="dp", members=DP[rank][1], op="allreduce"))
    return RankState(rank=rank, groups=groups, world_size=8, **kw)


def level(tp: int = 10, dp: int = 5) -> dict[int, RankState]:
    return {r: beat(r, (tp, tp), (dp, dp)) for r in range(8)}


def kinds(verdict) -> dict[int, set[str]]:
    out: dict[int, set[str]] = {}
    for c in verdict.culprits:
        out.setdefault(c.rank, set()).add(c.kind)
    return out


def test_a_level_job_has_no_culprit():
    verdict = classify_hang(level())
    assert verdict.culprits == [] and verdict.waiting == ()
    assert verdict.groups_checked == 6  # 4 tp groups, 2 dp groups


def test_missing_rank_with_nothing_pending_is_named_and_its_victims_are_not():
    for culprit in range(8):
        partner = culprit ^ 1
        # the culprit never issued tp #11 and has nothing pending; its tp partner waits in it,
        # so never issued dp #6, which the rest of its dp group issued and waits in
        states = {r: beat(r, (11, 11), (6, 5)) for r in range(8)}
        states[culprit] = beat(culprit, (10, 10), (5, 5))
        states[partner] = beat(partner, (11, 10), (5, 5))
        verdict = classify_hang(states, world_size=8)
        assert kinds(verdict) == {culprit: {"missing"}}, culprit
        tp = next(c for c in verdict.culprits if c.desc == "tp")
        assert (tp.seq, tp.waiting, tp.op, tp.issued, tp.group_issued) == (
            11, (partner,), "allreduce", 10, 11)
        dp = next(c for c in verdict.culprits if c.desc == "dp")
        assert dp.seq == 6 and partner not in dp.waiting
        assert verdict.waiting == tuple(r for r in range(8) if r != culprit)


def test_device_stuck_rank_issued_what_its_peers_completed():
    states = {r: beat(r, (11, 11), (6, 5)) for r in range(8)}
    states[3] = beat(3, (11, 10), (5, 5))  # its tp partner 2 completed #11, it did not
    verdict = classify_hang(states)
    assert kinds(verdict) == {3: {"device"}}
    device = next(c for c in verdict.culprits if c.group == "tp1")
    assert (device.seq, device.waiting, device.issued, device.completed) == (11, (2,), 11, 10)


def test_silent_and_exited_ranks_and_ranks_that_never_reported():
    states = level()
    states[5] = beat(5, (10, 10), (5, 5), silent_seconds=42.0, alive=True)
    states[6] = beat(6, (10, 10), (5, 5), alive=False)
    del states[7]
    verdict = classify_hang(states, world_size=8, silent_after_seconds=10.0)
    assert kinds(verdict) == {5: {"silent"}, 6: {"silent"}, 7: {"silent"}}
    states[5] = beat(5, (10, 10), (5, 5), silent_seconds=2.0)  # 2 s old is not silence
    assert 5 not in classify_hang(states, world_size=8).ranks


def test_a_silent_rank_behind_names_the_group_it_holds_up():
    states = level()
    states[4] = beat(4, (10, 10), (5, 5), silent_seconds=30.0)  # holding the GIL since
    states[5] = beat(5, (11, 10), (5, 5))
    verdict = classify_hang(states)
    (culprit,) = [c for c in verdict.culprits if c.group]
    assert (culprit.rank, culprit.kind, culprit.desc, culprit.seq) == (4, "silent", "tp", 11)


def pipeline(counts: dict[tuple[int, int], tuple[int, int]], stages: int = 4) -> dict:
    """A pipeline group pp of ``stages`` ranks: (rank, peer) -> (issued, completed) of the pair."""
    states = {}
    for r in range(stages):
        pairs = tuple(GroupState("pp", *counts[(r, p)], desc="pp", peer=p,
                                 members=tuple(range(stages)))
                      for p in (r - 1, r + 1) if 0 <= p < stages)
        states[r] = RankState(rank=r, groups=pairs)
    return states


def test_p2p_is_counted_per_pair_never_across_the_group():
    # the middle stages talk to two neighbours: twice the operations of the end stages. A
    # comparison across the group would read the end stages as behind.
    counts = {(0, 1): (8, 8), (1, 0): (8, 8), (1, 2): (8, 8), (2, 1): (8, 8),
              (2, 3): (8, 8), (3, 2): (8, 8)}
    assert classify_hang(pipeline(counts)).culprits == []
    # stage 2 stops in Python: stage 1's send to it and stage 3's receive from it wait
    counts.update({(1, 2): (9, 8), (3, 2): (9, 8)})
    verdict = classify_hang(pipeline(counts))
    assert kinds(verdict) == {2: {"missing"}}
    assert {c.peer for c in verdict.culprits} == {1, 3}
    assert verdict.waiting == (1, 3)


def test_p2p_completion_out_of_order_is_not_stuck_work():
    # both sides posted the pair's 9th operation; one side completed it, the other not yet
    # (a send completes on its own): no device verdict from a pair, nobody blamed
    counts = {(0, 1): (9, 8), (1, 0): (9, 9), (1, 2): (8, 8), (2, 1): (8, 8),
              (2, 3): (8, 8), (3, 2): (8, 8)}
    verdict = classify_hang(pipeline(counts))
    assert verdict.culprits == [] and verdict.waiting == (0,)


def test_a_restarted_group_is_counted_not_a_hang():
    before = level(tp=500)
    now = level(tp=500)
    now[2] = beat(2, (1, 1), (5, 5))  # its tp group was re-created: its sequence restarted
    verdict = classify_hang(now, previous=before)
    assert verdict.culprits == [] and (2, "tp1") in verdict.restarted
    # the same told by a generation the sender raised
    states = level(tp=500)
    states[2] = RankState(rank=2, groups=(
        GroupState("tp1", 1, 1, desc="tp", members=(2, 3), generation=1),
        states[2].groups[1]), world_size=8)
    verdict = classify_hang(states)
    assert verdict.culprits == [] and verdict.restarted == [(3, "tp1")]


def test_a_rank_of_another_world_size_is_left_out():
    states = level()
    states[3] = RankState(rank=3, groups=(GroupState("tp1", 1, 0),), world_size=16)
    states[12] = RankState(rank=12, groups=(GroupState("dp0", 900, 900),), world_size=16)
    verdict = classify_hang(states)
    assert set(verdict.foreign_ranks) == {3, 12}
    # rank 3 of this job sent nothing of this job's: silent, and nobody else is blamed
    assert kinds(verdict) == {3: {"silent"}}


def test_empty_input_and_bad_counters_never_raise():
    assert classify_hang({}).culprits == []
    assert classify_hang({}, world_size=2).ranks == (0, 1)  # nobody reported: all silent
    states = level()
    states[1] = RankState(rank=1, groups=(GroupState("tp0", -3, -5), GroupState("dp1", 4, 9)),
                          world_size=8)
    verdict = classify_hang(states)
    assert verdict.bad_states == 2 and verdict.culprits == []


def test_a_wait_cycle_is_broken_at_its_oldest_wait():
    # rank 0 skipped a's #5 and went on to wait in b's #3; rank 1 waits in a's #5 for it, so
    # never issues b's #3: each waits on the other. The older wait (rank 1's) began the hang.
    def states(age_1, age_0):
        return {0: RankState(rank=0, groups=(GroupState("a", 4, 4),
                                             GroupState("b", 3, 2, pending_seconds=age_0))),
                1: RankState(rank=1, groups=(GroupState("a", 5, 4, pending_seconds=age_1),
                                             GroupState("b", 2, 2)))}
    verdict = classify_hang(states(9.0, 3.0))
    assert verdict.cycle and kinds(verdict) == {0: {"missing"}}
    (culprit,) = verdict.culprits
    assert (culprit.group, culprit.seq, culprit.waiting) == ("a", 5, (1,))
    # without ages the cycle cannot be ordered: every rank its waits point at is named
    verdict = classify_hang(states(None, None))
    assert verdict.cycle and verdict.ranks == (0, 1)


# --- issue 32: a victim is never the culprit -----------------------------------------------

def subgroup_skip(history: bool) -> dict[int, RankState]:
    """4 ranks, world group w and subgroup s = {2, 3}; each step issues w then (2, 3) s. Rank 3
    skipped s #4 and waits in w #5; rank 2 waits in s #4, so never issues w #5, in which 0, 1
    and 3 wait for it. Ranks 0 and 1 began their wait first (oldest), so the ages alone would
    point at rank 2."""
    w = tuple(range(4))
    hist = {2: ("w", "s") * 4, 3: ("w", "s") * 3 + ("w", "w")}

    def state(rank, wi, wc, si=None, sc=None, age_w=None, age_s=None):
        groups = [GroupState("w", wi, wc, members=w, pending_seconds=age_w)]
        if si is not None:
            groups.append(GroupState("s", si, sc, members=(2, 3), pending_seconds=age_s))
        return RankState(rank=rank, groups=tuple(groups),
                         history=hist.get(rank, ()) if history else ())
    return {0: state(0, 5, 4, age_w=9.0), 1: state(1, 5, 4, age_w=9.0),
            2: state(2, 4, 4, 4, 3, age_s=5.0), 3: state(3, 5, 4, 3, 3, age_w=5.0)}


def test_a_rank_that_skipped_a_subgroup_collective_is_named_not_the_one_waiting_for_it():
    verdict = classify_hang(subgroup_skip(history=True))
    assert kinds(verdict) == {3: {"missing"}}
    (culprit,) = verdict.culprits
    assert (culprit.group, culprit.seq, culprit.waiting) == ("s", 4, (2,))
    assert verdict.waiting == (0, 1, 2)


def test_without_histories_only_the_cycle_s_own_waits_are_aged():
    # the victims' older waits in w (0 and 1) are outside the cycle 2 <-> 3: they say nothing
    # of where it began; equal ages inside the cycle name both ends, never rank 0 or 1
    verdict = classify_hang(subgroup_skip(history=False))
    assert verdict.cycle and set(verdict.ranks) <= {2, 3} and 3 in verdict.ranks


def test_a_host_job_has_no_device_verdict():
    states = {r: beat(r, (11, 11), (6, 5)) for r in range(8)}
    states[3] = beat(3, (11, 10), (5, 5))  # its tp partner completed #11, it did not
    verdict = classify_hang(states, device=False)
    assert "device" not in {k for ks in kinds(verdict).values() for k in ks}
    assert 3 not in verdict.ranks and 3 in verdict.in_progress
    # the same ranks with a stopped (silent) peer: it is named, the others are its victims
    states = {r: beat(r, (11, 11), (6, 5)) for r in range(8)}
    states[3] = beat(3, (10, 10), (5, 5), silent_seconds=60.0)
    states[2] = beat(2, (11, 10), (6, 5))
    verdict = classify_hang(states, device=False)
    assert kinds(verdict) == {3: {"silent"}} and 2 in verdict.waiting


def test_a_clean_host_job_dumped_before_its_barrier_retired_is_no_hang():
    states = {r: RankState(rank=r, groups=(GroupState("w", 7, 7 if r % 2 else 6,
                                                      members=(0, 1, 2, 3)),))
              for r in range(4)}
    verdict = classify_hang(states, device=False)
    assert verdict.culprits == [] and verdict.waiting == ()


def test_a_rank_blocked_in_an_unrecorded_operation_names_nobody():
    # rank 2 waits in a receive gloo does not record; 0, 1 and 3 wait in w #4 for it
    w = (0, 1, 2, 3)
    states = {r: RankState(rank=r, groups=(GroupState("w", 4, 3, members=w),)) for r in w}
    states[2] = RankState(rank=2, groups=(GroupState("w", 3, 3, members=w),), unrecorded=("w",))
    verdict = classify_hang(states)
    assert verdict.culprits == [] and verdict.undetermined == (2,)
    assert verdict.waiting == (0, 1, 3)


def test_on_a_host_job_a_collective_a_peer_completed_waits_on_the_stopped_member():
    # dp1 = {1, 3, 5, 7}: 1 and 3 completed dp #6 (gloo's ring let them), 5 did not, and 7,
    # which stopped (SIGSTOP) inside it, no longer reports
    states = {r: beat(r, (11, 11), (6, 6)) for r in range(8)}
    states[5] = beat(5, (11, 11), (6, 5))
    states[7] = beat(7, (11, 11), (6, 5), silent_seconds=60.0)
    verdict = classify_hang(states, device=False)
    assert kinds(verdict) == {7: {"silent"}}
    (held,) = verdict.culprits
    assert (held.group, held.seq, held.waiting) == ("dp1", 6, (5,))
    # with NCCL the same counters say rank 5 is stuck on the device
    assert kinds(classify_hang(states)) == {5: {"device"}, 7: {"silent"}}
