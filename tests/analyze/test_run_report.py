"""`laggard report`: the run report page from saved windows, its size, and that it renders
offline in headless Chromium (skipped where Debian's chromium is not installed)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from support import budget

pytest.importorskip("matplotlib")

from laggard.analyze.run_report import (  # noqa: E402
    heatmap_figure,
    load_windows,
    render_html,
    write_report,
)
from laggard.detectors.window import STEP_COLUMN_NAMES  # noqa: E402

STAT = {name: i for i, name in enumerate(STEP_COLUMN_NAMES)}


def write_windows(path: Path, *, ranks: int = 4, windows: int = 120, k: int = 5,
                  slow_rank: int = 2, onset: int = 40) -> None:
    """A 600-step run's windows as the monitor saves them, rank ``slow_rank`` 25% slower from
    window ``onset``, with a finding raised and later cleared, a loss note and one bad line."""
    rng = np.random.default_rng(0)
    lines = []
    for w in range(windows):
        rows = np.zeros((ranks, len(STEP_COLUMN_NAMES)))
        rows[:, STAT["compute_seconds"]] = 0.020 * rng.lognormal(0, 0.02, ranks)
        rows[:, STAT["data_seconds"]] = 0.001
        rows[:, STAT["collective_wait_seconds"]] = 0.010
        rows[:, STAT["step_seconds"]] = 0.035
        if onset <= w < windows - 20:
            rows[slow_rank, STAT["compute_seconds"]] *= 1.25
            rows[slow_rank, STAT["collective_wait_seconds"]] = 0.005
        medians = [[None if c == STAT["transfer_seconds"] else float(v) for c, v in
                    enumerate(row)] for row in rows]
        findings = []
        if w == onset + 3:
            findings.append({"detector": "straggler", "kind": "compute", "rank": slow_rank,
                             "step": w * k + k - 1, "message": "rank 2: forward+backward 25% "
                             "slower than the median rank", "cleared": False})
        if w == windows - 17:
            findings.append({"detector": "straggler", "kind": "compute", "rank": slow_rank,
                             "step": w * k + k - 1, "message": "cleared", "cleared": True})
        lines.append(json.dumps({"step": w * k + k - 1, "world_size": ranks,
                                 "stat_names": list(STEP_COLUMN_NAMES), "medians": medians,
                                 "scores": {}, "findings": findings,
                                 "notes": {"loss": 5.0 - w / windows}}))
    lines.insert(7, "{not json")
    path.write_text("\n".join(lines) + "\n")


def test_report_of_a_600_step_run_is_self_contained_and_small(tmp_path: Path) -> None:
    windows = tmp_path / "windows.jsonl"
    write_windows(windows)
    run = load_windows(windows)
    assert (run.ranks, run.steps.size, run.bad_lines) == (4, 120, 1)
    page = tmp_path / "report.html"
    size = write_report(windows, page, title="test run", summary=["rank 2 slowed 25%"])
    text = page.read_text()
    assert size == len(text.encode()) and size < 2_000_000
    assert text.count("data:image/png;base64,") == 3
    # nothing fetched from anywhere: no external source, link or script
    assert not re.search(r"(src|href)=['\"]?(https?:|//)", text)
    assert "<script" not in text
    assert "rank 2: forward+backward 25% slower" in text
    assert "1 unreadable line skipped" in text
    # transfer was not measured, data loading is the same on every rank: a line each, and
    # only compute drawn
    assert "collective transfer (link): not measured in this run." in text
    assert "data loading: every rank within 0.1% of the median rank" in text
    assert "time outside the timed phases" in text


def test_every_heatmap_has_a_step_axis_and_unmeasured_signals_take_no_panel(
        tmp_path: Path) -> None:
    windows = tmp_path / "windows.jsonl"
    write_windows(windows)
    run = load_windows(windows)
    run.values["data_seconds"][:, 1] *= 3  # rank 1 loads slower: a second panel
    fig, _, notes = heatmap_figure(run)
    fig.canvas.draw()
    panels = [ax for ax in fig.axes if ax.images]
    assert len(panels) == 2 and notes == ["collective transfer (link): not measured in this run."]
    for ax in panels:
        assert "step" in ax.get_xlabel()
        assert any(t.get_visible() and t.get_text() for t in ax.get_xticklabels())
    run.values["compute_seconds"][:] = np.nan
    run.values["data_seconds"][:] = np.nan
    fig, _, notes = heatmap_figure(run)
    assert fig is None and len(notes) == 3
    page = render_html(run, title="nothing measured")
    assert page.count("data:image/png;base64,") == 2  # the timeline and the phases only


def test_report_command_errors_are_clear(tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("garbage\n")
    cmd = [sys.executable, "-m", "laggard.cli", "report"]
    out = subprocess.run([*cmd, str(empty), "--html", str(tmp_path / "a.html")],
                         capture_output=True, text=True, check=False)
    assert out.returncode == 1 and "no window found (1 unreadable line)" in out.stderr
    nothing = tmp_path / "nothing.jsonl"
    nothing.write_text("")
    out = subprocess.run([*cmd, str(nothing), "--html", str(tmp_path / "a.html")],
                         capture_output=True, text=True, check=False)
    assert out.returncode == 1 and "an empty file" in out.stderr
    assert out.stderr.count(str(nothing)) == 1  # the path once
    out = subprocess.run([*cmd, str(tmp_path / "missing.jsonl"), "--html",
                          str(tmp_path / "b.html")], capture_output=True, text=True, check=False)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "missing.jsonl" in out.stderr
    binary = tmp_path / "bad.bin"
    binary.write_bytes(b"\x00\x01garbage\xff\xfe" * 10)
    out = subprocess.run([*cmd, str(binary), "--html", str(tmp_path / "c.html")],
                         capture_output=True, text=True, check=False)
    assert out.returncode == 2 and "bad.bin" in out.stderr and "Traceback" not in out.stderr


def test_a_truncated_windows_file_says_in_the_terminal_what_was_skipped(tmp_path: Path) -> None:
    windows = tmp_path / "windows.jsonl"
    write_windows(windows)
    windows.write_bytes(windows.read_bytes()[:-40])  # the last line cut mid-write
    out = subprocess.run([sys.executable, "-m", "laggard.cli", "report", str(windows), "--html",
                          str(tmp_path / "r.html")], capture_output=True, text=True, check=False)
    assert out.returncode == 0
    assert ("2 unreadable lines skipped (lines 8, 121 of 121); the last line is cut short"
            in out.stderr)
    assert "wrote" in out.stdout
    assert "2 unreadable lines skipped." in (tmp_path / "r.html").read_text()


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("chromium") is None, reason="Debian's chromium not installed")
def test_report_renders_in_headless_chromium_without_network(tmp_path: Path) -> None:
    import matplotlib.image

    windows = tmp_path / "windows.jsonl"
    write_windows(windows)
    page = tmp_path / "report.html"
    write_report(windows, page)
    shot = tmp_path / "shot.png"
    # Every host name resolves to nothing: a page that needed the network would show holes.
    subprocess.run(
        ["chromium", "--headless", "--no-sandbox", "--disable-gpu",
         "--host-resolver-rules=MAP * ~NOTFOUND", "--window-size=1000,2400",
         f"--screenshot={shot}", page.as_uri()],
        capture_output=True, timeout=budget(120), check=True, cwd=tmp_path,
    )
    pixels = matplotlib.image.imread(shot)  # (H, W, 3 or 4) floats in [0, 1]
    assert pixels.shape[0] >= 2000 and pixels.shape[1] >= 900
    # The heatmaps' reds and blues are on screen: saturated pixels, not a blank page.
    rgb = pixels[..., :3]
    red = (rgb[..., 0] > 0.6) & (rgb[..., 2] < 0.4)
    blue = (rgb[..., 2] > 0.6) & (rgb[..., 0] < 0.4)
    assert red.sum() > 500 and blue.sum() > 500
