"""``laggard report WINDOWS.jsonl --html PATH``: a run's straggler report as one HTML page.

Reads the windows a :class:`~laggard.integrations.TrainingMonitor` saved
(``Config(windows_path=...)``; ``laggard demo --windows``): one JSON line per detection window
with each rank's window statistics (columns named by ``stat_names``), the findings raised or
cleared in it, and the loop's noted values (``loss``). Writes a self-contained page (CSS inline,
figures as inline PNG; no script, no network) with three panels:

1. **Excess per rank and window**: for compute, data loading and collective transfer, a heatmap
   of each rank's excess over the median rank in each window, as a percentage of the median
   rank's work per step (what the straggler detector compares). Red is slower than the median
   rank, blue faster. Jobs of more than :data:`MAX_HEATMAP_RANKS` ranks show the ranks with the
   largest excess.
2. **Findings over the loss**: each finding as a bar from the step it was raised to the step it
   cleared (or the end of the run), one row per rank (and one for the whole job), over the loss
   curve when the loop noted one.
3. **Phases per rank**: each rank's median compute, data and collective wait per step over the
   run, stacked, with its median step time marked.

Bad lines (not JSON, missing fields, ragged rows) are counted and skipped; the page says how many.
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
    """

    steps: np.ndarray
    values: dict[str, np.ndarray]
    findings: list[dict[str, Any]]
    loss: np.ndarray
    bad_lines: int = 0
    ranks: int = 0
    notes: dict[str, Any] = field(default_factory=dict)


def load_windows(path: Path) -> RunWindows:
    """Read a windows JSON-lines file.

    Raises:
        OSError: the file cannot be read.
        ValueError: no line of it is a window.
    """
    docs, records, bad = [], [], 0
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            try:
                doc = json.loads(line)
                rows = doc["medians"]
                if not (isinstance(rows, list) and rows and isinstance(doc["stat_names"], list)
                        and len({len(r) for r in rows}) == 1):
                    raise ValueError("ragged rows")
                # by name: older files have fewer columns
                records.append(WindowRecord.from_saved(doc))
                docs.append(doc)
            except (ValueError, KeyError, TypeError):
                bad += 1
    if not docs:
        raise ValueError(f"{path}: no window found ({bad} unreadable lines)")
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
                      findings=findings, loss=loss, bad_lines=bad, ranks=ranks)


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


def heatmaps(run: RunWindows) -> tuple[str, str]:
    """The excess heatmaps as a PNG (base64) and a caption."""
    import matplotlib.pyplot as plt

    shown = np.arange(run.ranks)
    caption = ""
    if run.ranks > MAX_HEATMAP_RANKS:
        worst = np.nanmax(np.abs(np.nan_to_num(excess(run, "compute_seconds"))), axis=0)
        shown = np.sort(np.argsort(-worst)[:MAX_HEATMAP_RANKS])
        caption = f" Showing the {MAX_HEATMAP_RANKS} of {run.ranks} ranks with the largest excess."
    fig, axes = plt.subplots(len(EXCESS_PANELS), 1, figsize=(10, 2 + 1.6 * len(EXCESS_PANELS)),
                             squeeze=False)
    for ax, (name, title) in zip(axes[:, 0], EXCESS_PANELS, strict=True):
        grid = 100 * excess(run, name)[:, shown].T  # (ranks, windows), percent
        if np.isnan(grid).all():
            ax.text(0.5, 0.5, f"{title}: not measured", ha="center", va="center",
                    transform=ax.transAxes)
            ax.set_axis_off()
            continue
        limit = max(float(np.nanpercentile(np.abs(grid), 99)), 1.0)
        image = ax.imshow(grid, aspect="auto", cmap="RdBu_r", vmin=-limit, vmax=limit,
                          interpolation="nearest",
                          extent=(run.steps[0] - 0.5, run.steps[-1] + 0.5, shown.size - 0.5, -0.5))
        ax.set_title(f"{title}: excess over the median rank (% of a step's work)", fontsize=10)
        ax.set_ylabel("rank")
        if shown.size <= 16:
            ax.set_yticks(range(shown.size), [str(r) for r in shown])
        fig.colorbar(image, ax=ax, label="%")
    axes[-1, 0].set_xlabel("step (end of window)")
    fig.tight_layout()
    out = _png(fig)
    plt.close(fig)
    return out, caption


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
    heat, caption = heatmaps(run)
    raised = [f for f in run.findings if not f.get("cleared")]
    items = "".join(f"<li>step {html.escape(str(f.get('step')))}: "
                    f"{html.escape(str(f.get('message', '')))}</li>" for f in raised)
    lines = "".join(f"<p>{html.escape(s)}</p>" for s in summary or [])
    bad = (f"<p class=note>{run.bad_lines} unreadable lines skipped.</p>"
           if run.bad_lines else "")
    return (
        f"<!DOCTYPE html><html><head><meta charset=utf-8><title>{html.escape(title)}</title>"
        f"<style>{_CSS}</style></head><body><h1>{html.escape(title)}</h1>{lines}"
        f"<p>{run.ranks} ranks, {run.steps.size} windows, steps up to {run.steps[-1]}.</p>{bad}"
        f"<h2>Findings</h2><ul>{items or '<li>none</li>'}</ul>"
        "<h2>1. Excess per rank and window</h2><p class=note>Each cell: the rank's window "
        "median over the median rank's, as a percentage of the median rank's work per step "
        "(what the straggler detector accumulates). Red: slower than the median rank; blue: "
        f"faster.{html.escape(caption)}</p><img alt='excess heatmaps' "
        f"src='data:image/png;base64,{heat}'>"
        "<h2>2. Findings over the loss</h2><p class=note>Each bar runs from the step a finding "
        "was raised to the step it cleared (or the end of the run).</p>"
        f"<img alt='finding timeline' src='data:image/png;base64,{timeline(run)}'>"
        "<h2>3. Phases per rank</h2><p class=note>Median per step over the run: compute, data "
        "loading and collective wait stacked; the mark is the median step wall time. The "
        "rank the others wait for has the longest compute and the shortest wait.</p>"
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
    import matplotlib

    matplotlib.use("Agg")
    page = render_html(load_windows(windows), title=title, summary=summary)
    out.write_text(page, encoding="utf-8")
    return len(page.encode("utf-8"))


# -- command line ----------------------------------------------------------------------------

def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``laggard report``."""
    parser.add_argument("windows", metavar="WINDOWS.jsonl",
                        help="windows saved by TrainingMonitor(Config(windows_path=...)) or "
                             "`laggard demo --windows`")
    parser.add_argument("--html", required=True, metavar="PATH", help="where to write the page")
    parser.add_argument("--title", default="laggard run report")


def run(args: argparse.Namespace) -> int:
    """0 written, 1 no window in the file, 2 a file cannot be read or written."""
    try:
        size = write_report(Path(args.windows), Path(args.html), title=args.title)
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
    except ValueError as exc:
        print(f"laggard report: {args.windows}: {exc}", file=sys.stderr)
        return 1
    print(f"laggard report: wrote {args.html} ({size / 1e3:.0f} kB)")
    return 0
