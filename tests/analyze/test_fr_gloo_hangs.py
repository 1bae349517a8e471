"""The hang rules on dumps of real gloo hangs of several kinds (``fr_gloo_hangs.py``: 4 ranks,
the world group and a subgroup {2, 3}, each rank's recorder dumped by a watchdog thread with
torch's own dump call), made once per session: the culprit named right and alone, the ranks
waiting for it never named, a point-to-point hang names nobody and says what cannot be told
(gloo records no send/recv), a rank stopped with SIGSTOP is named as stopped (no dump), a clean
job dumped right after a barrier is no hang, and no "device" verdict anywhere (a CPU job)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from support import analyze_json, budget, free_port

from laggard.detectors.flight_recorder import analyze_dumps
from laggard.parsers.flight_recorder import load_dump

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from fr_gloo_hangs import FAULT_STEP, KINDS  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="session")
def gloo_hangs(tmp_path_factory) -> dict[str, Path]:
    """Every kind's dump set, the jobs side by side, generated once per session."""
    root = tmp_path_factory.mktemp("fr_gloo_hangs")
    jobs = {kind: subprocess.Popen(
        [sys.executable, str(HERE / "fr_gloo_hangs.py"), str(root / kind), kind,
         str(free_port())], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        for kind in KINDS}
    failed = {}
    for kind, job in jobs.items():
        try:
            _, err = job.communicate(timeout=budget(240))
        except subprocess.TimeoutExpired:
            job.kill()
            _, err = job.communicate()
        if job.returncode != 0:
            failed[kind] = err[-1500:]
    assert not failed, failed
    return {kind: root / kind for kind in KINDS}


def analysis_of(directory: Path):
    dumps = [load_dump(str(p)) for p in sorted(directory.iterdir())
             if not p.name.startswith(".")]
    assert all(e.backend == "gloo" for d in dumps for e in d.entries)
    return analyze_dumps(dumps)


def named(found: list[dict]) -> set[int]:
    """Every rank the critical findings name as their subject."""
    return {int(r) for f in found if f["severity"] == "critical"
            for r in re.findall(r"\d+", f["subject"])}


# kind -> (culprit -> kind of verdict)
EXPECTED = {"sub_skip": {3: "missing"}, "world_skip": {0: "missing"}, "p2p": {},
            "sigstop": {3: "silent"}, "clean": {}}


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_each_real_hang_names_its_culprit_alone_and_no_device(gloo_hangs, kind):
    analysis = analysis_of(gloo_hangs[kind])
    verdict = analysis.verdict
    assert {c.rank: c.kind for c in verdict.culprits} == EXPECTED[kind]
    assert analysis.stuck == [] and analysis.mismatches == []
    rc, found = analyze_json(str(gloo_hangs[kind]))
    assert named(found) == set(EXPECTED[kind])
    assert not any("device" in f["message"] for f in found)
    assert rc == (0 if kind == "clean" else 1)  # a hang nobody can be named for is a hang


def test_the_rank_waiting_for_a_skipped_subgroup_collective_is_a_victim(gloo_hangs):
    analysis = analysis_of(gloo_hangs["sub_skip"])
    (culprit,) = analysis.verdict.culprits
    # rank 3 skipped sub23's all-reduce of step FAULT_STEP; rank 2 waits there for it, so it
    # never reaches the world's next all-reduce: a victim, never "missing" from the world group
    assert (culprit.rank, culprit.desc, culprit.seq, culprit.waiting) == (
        3, "sub23", FAULT_STEP, (2,))
    assert analysis.verdict.waiting == (0, 1, 2)
    (lag,) = analysis.lagging
    assert (lag.pg_desc, lag.skipped, lag.hung_cpu) == ("sub23", (3,), ())


def test_a_send_that_never_came_names_nobody_and_says_why(gloo_hangs):
    analysis = analysis_of(gloo_hangs["p2p"])
    assert analysis.verdict.culprits == [] and analysis.verdict.undetermined == (2,)
    _, found = analyze_json(str(gloo_hangs["p2p"]))
    (finding,) = [f for f in found if f["evidence"].get("reason") == "p2p_not_recorded"]
    assert finding["severity"] == "warning" and finding["kind"] == "p2p_stall"
    assert finding["evidence"]["ranks"] == [2] and not re.search(r"\d", finding["subject"])
    assert "cannot be told" in finding["message"] and "no rank is named" in finding["message"]


def test_a_stopped_rank_is_named_stopped_and_its_peers_are_not(gloo_hangs):
    analysis = analysis_of(gloo_hangs["sigstop"])
    assert analysis.verdict.ranks == (3,) and analysis.verdict.waiting == (0, 1, 2)
    _, found = analyze_json(str(gloo_hangs["sigstop"]))
    assert any("stopped or dead" in f["message"] for f in found)


def test_a_clean_job_dumped_after_its_barrier_is_no_hang(gloo_hangs):
    analysis = analysis_of(gloo_hangs["clean"])
    assert analysis.verdict.culprits == [] and analysis.verdict.waiting == ()
    assert analysis.lagging == [] and analysis.p2p == []
