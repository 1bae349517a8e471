"""``laggard report WINDOWS.jsonl --html PATH``: a run's straggler report as one HTML page.

Reads the windows a :class:`~laggard.integrations.TrainingMonitor` saved
(``Config(windows_path=...)``; ``laggard demo --windows``): one JSON line per detection window
with each rank's window statistics (columns named by ``stat_names``), the findings raised or
cleared in it, and the loop's noted values (``loss``). Writes a self-contained page (CSS inline,
figures as inline PNG; no script, no network) with three panels:

1. **Excess per rank and window**: for compute, data loading and collective transfer, a heatmap
   of each rank's excess over the median rank in each window, as a percentage of the median
   rank's work per step (what the straggler detector compares). Red is slower than the median
   rank, blue faster, against the training step. Jobs of more than :data:`MAX_HEATMAP_RANKS`
   ranks show the ranks with the largest excess. A signal not measured in the run, or with
   every rank at the median throughout, gets a line instead of a panel.
2. **Findings over the loss**: each finding as a bar from the step it was raised to the step it
   cleared (or the end of the run), one row per rank (and one for the whole job), over the loss
   curve when the loop noted one.
3. **Phases per rank**: each rank's median compute, data and collective wait per step over the
   run, stacked, with its median step time marked and the gap to it (time outside the timed
   phases) hatched.

Bad lines (not JSON, missing fields, ragged rows) are counted and skipped; the page and the
terminal say how many (the terminal also which).
"""

from __future__ import annotations

import argparse
import base64
import html
import io
import json
import math
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from laggard.detectors.window import WindowRecord

#: Most ranks drawn in a heatmap; larger jobs show those with the largest excess.
MAX_HEATMAP_RANKS = 64
#: Unreadable lines named by number in the terminal.
MAX_BAD_LINE_NUMBERS = 5
#: A heatmap whose every cell is within this many percent of the median rank is said in a
#: line, not drawn: a blank panel tells nothing the line does not.
FLAT_PERCENT = 0.1
#: Heatmap rows: (column, title).
EXCESS_PANELS = (
    ("compute_seconds", "compute (phases other than data)"),
    ("data_seconds", "data loading"),
    ("transfer_seconds", "collective transfer (link)"),
)


@dataclass(slots=True)
class RunWindows:
    """The saved windows of one run.

    Attributes:
        steps: (W,) int, last step of each window.
        values: name -> (W, R) float64 per-rank window values (NaN where absent).
        findings: every finding document raised or cleared, in order.
        loss: (W,) float64 mean loss noted in each window (NaN where none).
        bad_lines: lines skipped as unreadable.
        ranks: the job's world size (rows of ``values``).
        notes: free-form notes of the run.
        bad_line_numbers: the first :data:`MAX_BAD_LINE_NUMBERS` of them, 1-based.
        lines: lines read, blank ones included.
        last_line_bad: the last line that is not blank is one of the unreadable ones.
    """

    steps: np.ndarray
    values: dict[str, np.ndarray]
    findings: list[dict[str, Any]]
    loss: np.ndarray
    bad_lines: int = 0
    ranks: int = 0
    notes: dict[str, Any] = field(default_factory=dict)
    bad_line_numbers: list[int] = field(default_factory=list)
    lines: int = 0
    last_line_bad: bool = False


def load_windows(path: Path) -> RunWindows:
    """Read a windows JSON-lines file.

    Raises:
        OSError: the file cannot be read.
        ValueError: no line of it is a window.
    """
    docs, records, bad, bad_numbers, number, last_bad = [], [], 0, [], 0, False
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            last_bad = True  # until the line is read
            try:
                doc = json.loads(line)
                rows = doc["medians"]
                if not (isinstance(rows, list) and rows and isinstance(doc["stat_names"], list)
                        and len({len(r) for r in rows}) == 1):
                    raise ValueError("ragged rows")
                # by name: older files have fewer columns
                records.append(WindowRecord.from_saved(doc))
                docs.append(doc)
                last_bad = False
            except (ValueError, KeyError, TypeError):
                bad += 1
                if len(bad_numbers) < MAX_BAD_LINE_NUMBERS:
                    bad_numbers.append(number)
    if not docs:
        if not bad:
            raise ValueError(f"{path}: no window found (an empty file)")
        raise ValueError(f"{path}: no window found ({_unreadable(bad)})")
    ranks = max(len(d["medians"]) for d in docs)
    names = ("compute_seconds", "data_seconds", "collective_wait_seconds", "transfer_seconds",
             "step_seconds")
    values = {n: np.full((len(docs), ranks), np.nan) for n in names}
    for i, record in enumerate(records):
        for name in names:
            column = record.get(name)
            if column is not None:
                values[name][i, : column.size] = column
    loss = np.array([float((d.get("notes") or {}).get("loss", math.nan)) for d in docs])
    findings = [f for d in docs for f in d.get("findings", []) if isinstance(f, dict)]
    return RunWindows(steps=np.array([int(d["step"]) for d in docs]), values=values,
                      findings=findings, loss=loss, bad_lines=bad, ranks=ranks,
                      bad_line_numbers=bad_numbers, lines=number, last_line_bad=last_bad)


def _unreadable(count: int) -> str:
    return f"{count} unreadable line" if count == 1 else f"{count} unreadable lines"


def skipped_note(run: RunWindows) -> str:
    """The unreadable lines skipped, for the terminal: ``"1 unreadable line skipped (line 8
    of 121)"``; empty when none."""
    if not run.bad_lines:
        return ""
    numbers = ", ".join(map(str, run.bad_line_numbers))
    more = ", ..." if run.bad_lines > len(run.bad_line_numbers) else ""
    which = "line" if run.bad_lines == 1 else "lines"
    cut = ("; the last line is cut short: the run was still writing, or stopped mid-line"
           if run.last_line_bad else "")
    return f"{_unreadable(run.bad_lines)} skipped ({which} {numbers}{more} of {run.lines}){cut}"


def excess(run: RunWindows, name: str) -> np.ndarray:
    """(W, R) excess of each rank over the median rank, as a fraction of the median rank's
    work per step (compute + data), as the straggler detector compares it."""
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN rows: an absent window
        work = np.nanmedian(run.values["compute_seconds"] + run.values["data_seconds"], axis=1)
        values = run.values[name]
        if np.isnan(values).all():
            return values
        return (values - np.nanmedian(values, axis=1, keepdims=True)) / work[:, None]


# -- figures ----------------------------------------------------------------------------------

def _png(fig: Any) -> str:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=90, bbox_inches="tight")
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def heatmaps(run: RunWindows) -> tuple[str | None, str, list[str]]:
    """The excess heatmaps of the signals that vary, as one PNG (base64).

    Returns:
        (the PNG, None when no signal has anything to draw; a caption; one line per signal
        not drawn: not measured in this run, or every rank at the median rank throughout).
    """
    import matplotlib.pyplot as plt

    fig, caption, notes = heatmap_figure(run)
    if fig is None:
        return None, caption, notes
    out = _png(fig)
    plt.close(fig)
    return out, caption, notes


def heatmap_figure(run: RunWindows) -> tuple[Any, str, list[str]]:
    """The figure of :func:`heatmaps` (a matplotlib Figure, or None), its caption and notes."""
    import matplotlib.pyplot as plt

    shown = np.arange(run.ranks)
    caption = ""
    if run.ranks > MAX_HEATMAP_RANKS:
        worst = np.nanmax(np.abs(np.nan_to_num(excess(run, "compute_seconds"))), axis=0)
        shown = np.sort(np.argsort(-worst)[:MAX_HEATMAP_RANKS])
        caption = f" Showing the {MAX_HEATMAP_RANKS} of {run.ranks} ranks with the largest excess."
    drawn, notes = [], []
    for name, title in EXCESS_PANELS:
        grid = 100 * excess(run, name)[:, shown].T  # (ranks, windows), percent
        if np.isnan(grid).all():
            notes.append(f"{title}: not measured in this run.")
        elif float(np.nanmax(np.abs(grid))) < FLAT_PERCENT:
            notes.append(f"{title}: every rank within {FLAT_PERCENT}% of the median rank in "
                         "every window.")
        else:
            drawn.append((title, grid))
    if not drawn:
        return None, caption, notes
    fig, axes = plt.subplots(len(drawn), 1, figsize=(10, 1.2 + 2.1 * len(drawn)),
                             squeeze=False, sharex=True)
    for ax, (title, grid) in zip(axes[:, 0], drawn, strict=True):
        limit = max(float(np.nanpercentile(np.abs(grid), 99)), 1.0)
        image = ax.imshow(grid, aspect="auto", cmap="RdBu_r", vmin=-limit, vmax=limit,
                          interpolation="nearest",
                          extent=(run.steps[0] - 0.5, run.steps[-1] + 0.5, shown.size - 0.5, -0.5))
        ax.set_title(f"{title}: excess over the median rank (% of a step's work)", fontsize=10)
        ax.set_ylabel("rank")
        if shown.size <= 16:
            ax.set_yticks(range(shown.size), [str(r) for r in shown])
        ax.tick_params(labelbottom=True)  # every panel keeps its step axis
        ax.set_xlabel("training step (end of window)")
        fig.colorbar(image, ax=ax, label="%")
    fig.tight_layout()
    return fig, caption, notes


def _finding_spans(run: RunWindows) -> list[tuple[str, float, float, str]]:
    """(row label, raised step, cleared step or end, kind) of each raised finding."""
    spans = []
    end = float(run.steps[-1])
    for i, f in enumerate(run.findings):
        if f.get("cleared") or f.get("step") is None:
            continue
        label = f"rank {f['rank']}" if f.get("rank") is not None else "whole job"
        cleared = next((c.get("step") for c in run.findings[i + 1:]
                        if c.get("cleared") and c.get("rank") == f.get("rank")
                        and c.get("kind") == f.get("kind")), None)
        spans.append((label, float(f["step"]), float(cleared) if cleared is not None else end,
                      str(f.get("kind"))))
    return spans


def timeline(run: RunWindows) -> str:
    """Findings (raised to cleared) over the loss curve, as a PNG (base64)."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 3.2))
    spans = _finding_spans(run)
    labels = sorted({s[0] for s in spans}, key=lambda s: (s == "whole job", s))
    colors = {"compute": "tab:red", "data": "tab:orange", "communication": "tab:purple",
              "job_slowdown": "tab:gray"}
    for label, start, stop, kind in spans:
        row = labels.index(label)
        ax.barh(row, max(stop - start, 1.0), left=start, height=0.5,
                color=colors.get(kind, "tab:blue"), alpha=0.8)
        ax.text(start, row + 0.33, f"{kind} @ {start:.0f}", fontsize=8)
    ax.set_yticks(range(len(labels)), labels)
    ax.set_ylim(-0.8, max(len(labels), 1) - 0.2)
    ax.set_xlim(0, float(run.steps[-1]) + 1)
    ax.set_xlabel("step")
    if not spans:
        ax.text(0.5, 0.5, "no finding", ha="center", va="center", transform=ax.transAxes)
    if np.isfinite(run.loss).any():
        loss_ax = ax.twinx()
        loss_ax.plot(run.steps, run.loss, color="black", linewidth=1, label="loss")
        loss_ax.set_ylabel("loss (mean over the window)")
    ax.set_title("findings, raised → cleared, over the loss", fontsize=10)
    fig.tight_layout()
    out = _png(fig)
    plt.close(fig)
    return out


def phase_bars(run: RunWindows) -> str:
    """Each rank's median phases per step, stacked, with its median step time."""
    import matplotlib.pyplot as plt

    ranks = min(run.ranks, MAX_HEATMAP_RANKS)
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a column never measured
        medians = {n: 1e3 * np.nan_to_num(np.nanmedian(v[:, :ranks], axis=0))
                   for n, v in run.values.items()}
    fig, ax = plt.subplots(figsize=(10, 1.2 + 0.35 * ranks))
    left = np.zeros(ranks)
    for name, color in (("compute_seconds", "tab:red"), ("data_seconds", "tab:orange"),
                        ("collective_wait_seconds", "tab:blue")):
        ax.barh(range(ranks), medians[name], left=left, color=color,
                label=name.replace("_seconds", "").replace("_", " "))
        left += medians[name]
    # What the step's wall time holds beyond the timed phases (the loop's own code between
    # them, the optimizer step or logging where no phase times it): drawn, not left blank.
    outside = np.clip(medians["step_seconds"] - left, 0, None)
    if outside.any():
        ax.barh(range(ranks), outside, left=left, color="none", edgecolor="tab:gray",
                hatch="//", linewidth=0.5, label="outside the timed phases")
    ax.scatter(medians["step_seconds"], range(ranks), marker="|", s=200, color="black",
               label="step (wall)")
    ax.set_yticks(range(ranks), [str(r) for r in range(ranks)])
    ax.invert_yaxis()
    ax.set_ylabel("rank")
    ax.set_xlabel("ms per step (median over the run)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    fig.tight_layout()
    out = _png(fig)
    plt.close(fig)
    return out


# -- the page ---------------------------------------------------------------------------------

_CSS = ("body{font-family:sans-serif;max-width:1000px;margin:2em auto;color:#222}"
        "h1{font-size:1.4em}h2{font-size:1.1em;margin-top:1.6em}p.note{color:#555}"
        "img{max-width:100%}li{margin:.2em 0}")


def render_html(run: RunWindows, *, title: str, summary: list[str] | None = None) -> str:
    """The report page (self-contained HTML)."""
    heat, caption, not_drawn = heatmaps(run)
    heat_figure = (f"<img alt='excess heatmaps' src='data:image/png;base64,{heat}'>"
                   if heat is not None else "")
    heat_notes = "".join(f"<p class=note>{html.escape(n)}</p>" for n in not_drawn)
    raised = [f for f in run.findings if not f.get("cleared")]
    items = "".join(f"<li>step {html.escape(str(f.get('step')))} "
                    f"({html.escape(str(f.get('kind', '')))}): "
                    f"{html.escape(str(f.get('message', '')))}</li>" for f in raised)
    lines = "".join(f"<p>{html.escape(s)}</p>" for s in summary or [])
    bad = (f"<p class=note>{_unreadable(run.bad_lines)} skipped.</p>"
           if run.bad_lines else "")
    return (
        f"<!DOCTYPE html><html><head><meta charset=utf-8><title>{html.escape(title)}</title>"
        f"<style>{_CSS}</style></head><body><h1>{html.escape(title)}</h1>{lines}"
        f"<p>{run.ranks} ranks, {run.steps.size} windows, steps up to {run.steps[-1]}.</p>{bad}"
        f"<h2>Findings</h2><ul>{items or '<li>none</li>'}</ul>"
        "<h2>1. Excess per rank and window</h2><p class=note>Each cell: the rank's window "
        "median over the median rank's, as a percentage of the median rank's work per step "
        "(what the straggler detector accumulates). Red: slower than the median rank; blue: "
        f"faster.{html.escape(caption)}</p>{heat_figure}{heat_notes}"
        "<h2>2. Findings over the loss</h2><p class=note>Each bar runs from the step a finding "
        "was raised to the step it cleared (or the end of the run).</p>"
        f"<img alt='finding timeline' src='data:image/png;base64,{timeline(run)}'>"
        "<h2>3. Phases per rank</h2><p class=note>Median per step over the run: compute, data "
        "loading and collective wait stacked; the mark is the median step wall time. The "
        "hatched gap between them is time outside the timed phases: the step's wall time "
        "minus compute, data and wait (the loop's code between phases, work no phase times; "
        "medians, so the parts need not add up exactly). The rank the others wait for has "
        "the longest compute and the shortest wait.</p>"
        f"<img alt='phase bars' src='data:image/png;base64,{phase_bars(run)}'>"
        "</body></html>\n"
    )


def write_report(windows: Path, out: Path, *, title: str = "laggard run report",
                 summary: list[str] | None = None) -> int:
    """Write the HTML report of a windows file; returns its size in bytes.

    Raises:
        OSError: a file cannot be read or written.
        ValueError: the windows file holds no window.
        ImportError: matplotlib is not installed (``pip install 'laggard[report]'``).
    """
    return write_page(load_windows(windows), out, title=title, summary=summary)


def write_page(run: RunWindows, out: Path, *, title: str = "laggard run report",
               summary: list[str] | None = None) -> int:
    """Write the HTML report of windows already loaded; returns its size in bytes.

    Raises:
        OSError: the page cannot be written.
        ImportError: matplotlib is not installed.
    """
    import matplotlib

    matplotlib.use("Agg")
    _say_font_cache(Path(matplotlib.get_cachedir()))
    page = render_html(run, title=title, summary=summary)
    out.write_text(page, encoding="utf-8")
    return len(page.encode("utf-8"))


def _say_font_cache(cache_dir: Path) -> None:
    """Say, before it happens, that matplotlib is about to build its font cache.

    Its first ``import matplotlib.pyplot`` per user scans every system font and writes
    ``fontlist-v*.json`` under ``cache_dir`` (``matplotlib.get_cachedir()``); on a busy host that
    took 40 s of the first ``laggard report``, silently but for matplotlib's own late line. Later
    runs read the file, so this prints at most once per user.
    """
    if not any(cache_dir.glob("fontlist-v*.json")):
        print(f"laggard report: matplotlib is building its font cache in {cache_dir} (once per "
              f"user; the first report can take up to a minute)", file=sys.stderr, flush=True)


# -- command line ----------------------------------------------------------------------------

def run(args: argparse.Namespace) -> int:
    """0 written, 1 no window in the file, 2 a file cannot be read or written."""
    try:
        windows = load_windows(Path(args.windows))
        size = write_page(windows, Path(args.html), title=args.title)
    except ImportError as exc:
        print(f"laggard report: {exc}: install matplotlib (pip install 'laggard[report]')",
              file=sys.stderr)
        return 2
    except UnicodeDecodeError:
        print(f"laggard report: {args.windows}: not a windows file (binary, not JSON lines)",
              file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"laggard report: {exc.filename or args.windows}: {exc.strerror or exc}",
              file=sys.stderr)
        return 2
    except ValueError as exc:  # its message names the file
        print(f"laggard report: {exc}", file=sys.stderr)
        return 1
    if note := skipped_note(windows):
        print(f"laggard report: {args.windows}: {note}", file=sys.stderr)
    print(f"laggard report: wrote {args.html} ({size / 1e3:.0f} kB)")
    return 0
