"""The straggler detector replayed on recorded windows against the outputs the per-group
detectors gave them before the vectorised detector (tests/straggler_replay.py wrote
both): the synthetic job of 12 peer groups with bad input (a NaN row, an absent rank, a
duplicate and stray rows, a group with no valid row, another world size, the step counter
going back), the same windows without groups, and two real ``laggard demo --parallel pp``
runs. Findings (every field, in order), scores and counters must be what they were.
"""
from __future__ import annotations

import json

import pytest
from straggler_replay import FIXTURES, cases, run_participant

from laggard.detectors.group_straggler import PeerGroupStraggler

#: Counters the per-group detectors counted once per detector per window; the vectorised one
#: counts them once per window (one step counter for the job).
PER_DETECTOR = ("step_regressions", "window_length_changes")


def expected(name: str) -> list[dict]:
    return [json.loads(line) for line in
            (FIXTURES / f"{name}_expected.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("name", ["synthetic", "synthetic_all", "demo_pp4", "demo_pp8"])
def test_replayed_windows_give_the_recorded_findings_scores_and_counters(name: str) -> None:
    records, groups, world = cases()[name]
    old = expected(name)
    # JSON round trip: the recorded outputs went through it (tuples become lists)
    new = json.loads(json.dumps(run_participant(records, groups, world)))
    assert len(new) == len(old)
    # the old per-group detectors, one per comparison
    detectors = 1 if groups is None else len(PeerGroupStraggler(groups).compared)
    for before, after in zip(old, new, strict=True):
        assert after.get("findings") == before.get("findings"), before["step"]
        assert after.get("scores") == before.get("scores"), before["step"]
        stats_before, stats_after = before.get("stats") or {}, after.get("stats") or {}
        for key in stats_before:
            if key in PER_DETECTOR and groups is not None:
                assert stats_after[key] * detectors == stats_before[key], (before["step"], key)
            else:
                assert stats_after.get(key) == stats_before[key], (before["step"], key)
    raised = [f for doc in old for f in doc.get("findings", []) if not f.get("cleared")]
    assert raised, "the recording has findings to compare"


def test_the_synthetic_recording_names_its_injected_stragglers() -> None:
    """What the replay compares is worth comparing: each injected cause named on its rank."""
    named = {(f["rank"], f["kind"]) for doc in expected("synthetic")
             for f in doc.get("findings", []) if not f.get("cleared")}
    assert {(5, "compute"), (30, "data"), (50, "communication"),
            (None, "stage_imbalance"), (None, "job_slowdown")} <= named
