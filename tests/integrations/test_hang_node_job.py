"""Real 4-rank gloo jobs (torchrun) laid out as two nodes of two ranks: node leaders write one
hang key each for their ranks; a member that hangs is named through its leader's key, and a
leader whose whole process stops is named alone: its member, which then writes its own key,
is read as the victim it is (without that fallback it would be named silent too: the control).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support import budget, torchrun

pytest.importorskip("torch")

HERE = Path(__file__).resolve().parent
pytestmark = pytest.mark.slow


def _run(out: Path, scenario: str, rank: int, no_fallback: bool = False) -> dict:
    cfg = {"scenario": scenario, "rank": rank, "step": 5, "no_fallback": no_fallback,
           "deadline": budget(90)}
    proc = torchrun(HERE / "hang_node_worker.py", 4, str(out), json.dumps(cfg), timeout=180)
    report = out / "report.json"
    assert (out / "hang_start.json").exists(), proc.stderr[-3000:]
    assert report.exists(), proc.stderr[-3000:]
    return json.loads(report.read_text())


def test_a_member_hung_in_its_data_loading_is_named_through_its_leaders_key(tmp_path):
    report = _run(tmp_path, "data", rank=3)
    assert report["culprits"] == [{"rank": 3, "kind": "missing"}], report


def test_a_stopped_leader_is_named_alone_its_member_writing_its_own_key(tmp_path):
    report = _run(tmp_path, "stop", rank=2)
    assert report["culprits"] == [{"rank": 2, "kind": "silent"}], report


def test_without_the_fallback_the_stopped_leaders_member_would_read_silent(tmp_path):
    report = _run(tmp_path, "stop", rank=2, no_fallback=True)
    assert report["ranks"] == [2, 3], report
