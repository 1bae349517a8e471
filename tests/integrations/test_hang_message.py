"""The hang report's line (laggard.integrations.hang_message): every group and kind named, and a
silent culprit's stale key giving neither the step nor a phase age."""

from __future__ import annotations

from laggard.detectors.hang import HangCulprit, HangVerdict, RankState
from laggard.integrations.hang_message import hang_message


def test_the_message_names_every_group_and_kind():
    states = {12: RankState(rank=12, step=4812, phase="data", phase_seconds=95.2),
              14: RankState(rank=14, step=4812, phase="data", phase_seconds=94.0),
              3: RankState(rank=3, step=4813, phase="backward", phase_seconds=2.0),
              9: RankState(rank=9, silent_seconds=41.0)}
    verdict = HangVerdict(culprits=[
        HangCulprit(rank=3, kind="device", group="tp:4", desc="tp", seq=9, op="allgather"),
        HangCulprit(rank=9, kind="silent"),
        HangCulprit(rank=12, kind="missing", group="dp:3", desc="dp", seq=20537,
                    op="allreduce"),
        HangCulprit(rank=14, kind="missing", group="dp:3", desc="dp", seq=20537,
                    op="allreduce")])
    assert hang_message(verdict, states, own_step=1) == (
        "hung since step 4,812 in allgather #9 of group tp: rank 3 issued it and never "
        "completed it (stuck on the device) (last in phase backward for 2 s); rank 9 stopped "
        "reporting 41 s ago (holding the GIL, stuck in native code, or gone); in allreduce "
        "#20,537 of group dp: ranks 12 and 14 never issued it (last in phase data for 95 s)")



def test_a_silent_culprits_stale_key_gives_neither_the_step_nor_a_phase_age():
    """A rank that froze holding the GIL wrote its last key long before (here at step 0, before
    its store thread could run again): the job is hung in the step its peers report, and its
    phase is where it was last heard, with no age (seen from a new user's job: "hung since
    step 0 rank 1 ... (last in phase backward for 0 s)")."""
    states = {0: RankState(rank=0, step=30, phase="collective_wait", phase_seconds=12.0),
              1: RankState(rank=1, step=0, phase="backward", phase_seconds=0.0,
                           silent_seconds=8.0),
              2: RankState(rank=2, step=30, phase="collective_wait", phase_seconds=12.0)}
    verdict = HangVerdict(culprits=[HangCulprit(rank=1, kind="silent")])
    assert hang_message(verdict, states, own_step=30) == (
        "hung since step 30: rank 1 stopped reporting 8 s ago (holding the GIL, stuck in "
        "native code, or gone) (last heard at step 0, in phase backward)")
