"""A real 4-rank gloo job whose rank-0 analysis is slow on purpose (slow_analysis_worker.py):
the training thread's step times stay those of the same job without the slow participant, the
late windows are coalesced and counted, the findings still come, a rank's row of NaNs is
counted and never raised; the same participant run inline is the control."""

from __future__ import annotations

import json
from pathlib import Path

from support import torchrun

HERE = Path(__file__).parent
RANKS = 4
WINDOWS = 12  # slow_analysis_worker: 60 steps, windows of 5


def test_a_slow_rank0_analysis_costs_windows_not_step_time(tmp_path):
    proc = torchrun(HERE / "slow_analysis_worker.py", RANKS, str(tmp_path), timeout=240)
    assert proc.returncode == 0, proc.stderr[-4000:]
    ranks = [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in range(RANKS)]
    # the job's time per phase: its slowest rank's loop (they sync at every step anyway)
    wall = {phase: max(r[phase]["wall_seconds"] for r in ranks)
            for phase in ("base", "thread", "inline")}
    detail = json.dumps({"wall": wall, "rank0": ranks[0]}, indent=1)[:4000]
    # control: on the training thread, two windows' sleep per window makes the job ~3x longer
    assert wall["inline"] / wall["base"] > 2.0, detail
    # on rank 0's analysis thread the same sleep leaves the steps as they were
    assert wall["thread"] / wall["base"] < 1.5, detail
    thread = ranks[0]["thread"]
    assert thread["windows"] == WINDOWS, detail
    assert thread["coalesced"] > 0, detail  # the analysis took two windows' time
    assert thread["analysed"] + thread["coalesced"] == WINDOWS, detail  # every one accounted
    slow = [f for f in thread["findings"] if f["kind"] == "slow_analysis"]
    assert len(slow) == thread["analysed"] >= 2, detail  # findings still raised, by the thread
    assert thread["bad_rows"] == 1 and thread["internal_errors"] == 0, detail  # the NaN row
    assert thread["kept_windows"] == thread["summaries"] == thread["analysed"], detail
    inline = ranks[0]["inline"]
    assert inline["analysed"] + inline["coalesced"] == inline["windows"] == WINDOWS, detail
    assert len([f for f in inline["findings"] if f["kind"] == "slow_analysis"]) == WINDOWS
