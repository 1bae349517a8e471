"""GPU state over a window: the GPU-state participant's columns, and the cause they name.

The GPU-state participant (:mod:`laggard.integrations.gpu_state`) samples its rank's GPU during
each window and adds :data:`GPU_STATE_COLUMNS` to the window record: the SM clock (current and
maximum, hertz; their ratio) and, per NVML clock-event reason, the fraction of the window's
samples in which that reason was active (a ratio in [0, 1]). This module is the pure half:
the columns, the per-window accumulator (:class:`GpuStateWindow`), and :func:`describe_cause`,
which turns one rank's row into the sentence a compute straggler finding carries ("GPU 3
(node07) sw_thermal active in 100% of the window, SM clock 1.41 of 1.98 GHz").

Reasons are NVML's clock-event reason bits (``nvmlClocksEventReason*`` in nvml.h, "Clocks Event
Reasons" in NVIDIA's NVML API reference; ``nvidia-smi --query-gpu=clocks_event_reasons.*``),
named as the agent's ``laggard_gpu_clock_event_active{reason}`` labels them. The limits among
them (what the finding names as a cause) are
:data:`~laggard.detectors.throttle.LIMITING_REASONS`; idle, application clocks and sync boost
are choices, not limits.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from laggard.detectors.throttle import LIMITING_REASONS
from laggard.detectors.window import WindowColumn, WindowRecord

#: NVML's clock-event reasons, as laggard labels them (``laggard.nvml.library.CLOCK_EVENT_REASONS``
#: has the same names, in the same order, with their NVML constants).
REASONS: tuple[str, ...] = (
    "gpu_idle", "applications_clocks_setting", "sw_power_cap", "hw_slowdown", "sync_boost",
    "sw_thermal", "hw_thermal", "hw_power_brake", "display_clock",
)

#: ``gpu_state_source`` codes: where the window's GPU state came from.
SOURCE_NONE = 0.0  # no GPU: a CPU job
SOURCE_NVML = 1.0  # NVML: clocks and clock-event reasons
SOURCE_TORCH = 2.0  # torch.cuda only: clocks where torch has them, reasons unknown
SOURCE_UNAVAILABLE = 3.0  # a GPU job whose GPU gave no state (NVML lost it, device unknown)
SOURCE_NAMES = {SOURCE_NONE: "none", SOURCE_NVML: "nvml", SOURCE_TORCH: "torch",
                SOURCE_UNAVAILABLE: "unavailable"}

#: Fraction of a window's samples a limiting reason must be active in to be named a cause.
MIN_REASON_RATIO = 0.1


def reason_column(reason: str) -> str:
    """The window column of one clock-event reason: ``gpu_<reason>_ratio``."""
    return f"gpu_{reason}_ratio"


#: What the GPU-state participant adds to every rank's window record (one value per window,
#: so ``reduce="last"``; NaN where not measured).
GPU_STATE_COLUMNS: tuple[WindowColumn, ...] = (
    WindowColumn("gpu_state_source", "code", "last",
                 "where the GPU state came from: 0 CPU job, 1 NVML, 2 torch.cuda (reasons "
                 "unknown), 3 a GPU that gave no state"),
    WindowColumn("gpu_index", "index", "last",
                 "NVML index of the rank's GPU (the agent's gpu label); NaN when unknown"),
    WindowColumn("gpu_state_samples", "count", "last", "GPU samples taken in the window"),
    WindowColumn("gpu_sm_clock_hertz", "hertz", "last", "mean SM clock over the window's samples"),
    WindowColumn("gpu_sm_clock_max_hertz", "hertz", "last", "maximum SM clock of the GPU"),
    WindowColumn("gpu_sm_clock_ratio", "ratio", "last",
                 "mean of SM clock / maximum SM clock over the window's samples"),
    *(WindowColumn(reason_column(r), "ratio", "last",
                   f"fraction of the window's samples with NVML clock-event reason {r} active")
      for r in REASONS),
)
#: Names of :data:`GPU_STATE_COLUMNS`.
GPU_STATE_COLUMN_NAMES: tuple[str, ...] = tuple(c.name for c in GPU_STATE_COLUMNS)


@dataclass(slots=True)
class GpuStateWindow:
    """One rank's GPU samples during one window, reduced to :data:`GPU_STATE_COLUMNS`.

    Attributes:
        samples: samples added.
        clock_sum: sum of SM clocks, hertz, over samples that had one.
        ratio_sum: sum of clock / max clock over samples that had both.
        clocked: samples with an SM clock; ``ratioed``: with a ratio.
        max_hertz: the last maximum SM clock seen, hertz (NaN: none).
        reason_counts: per :data:`REASONS`, samples in which it was active.
        reasoned: samples with a known reason mask.
    """

    samples: int = 0
    clock_sum: float = 0.0
    ratio_sum: float = 0.0
    clocked: int = 0
    ratioed: int = 0
    max_hertz: float = math.nan
    reason_counts: list[int] = field(default_factory=lambda: [0] * len(REASONS))
    reasoned: int = 0

    def add(self, *, sm_clock_hertz: float | None, sm_clock_max_hertz: float | None,
            reasons: Iterable[str] | None) -> None:
        """One sample: SM clock and its maximum (hertz; None: not known), the active reasons
        (laggard names; None: not known, as with torch.cuda alone)."""
        self.samples += 1
        if sm_clock_max_hertz is not None and sm_clock_max_hertz > 0:
            self.max_hertz = float(sm_clock_max_hertz)
        if sm_clock_hertz is not None and math.isfinite(sm_clock_hertz):
            self.clock_sum += float(sm_clock_hertz)
            self.clocked += 1
            if math.isfinite(self.max_hertz):
                self.ratio_sum += float(sm_clock_hertz) / self.max_hertz
                self.ratioed += 1
        if reasons is not None:
            self.reasoned += 1
            active = set(reasons)
            for i, reason in enumerate(REASONS):
                if reason in active:
                    self.reason_counts[i] += 1

    def values(self, *, source: float, gpu_index: int | None) -> dict[str, float]:
        """Column name -> value for the window record (NaN where not measured)."""
        nan = math.nan
        out = {
            "gpu_state_source": source,
            "gpu_index": float(gpu_index) if gpu_index is not None else nan,
            "gpu_state_samples": float(self.samples),
            "gpu_sm_clock_hertz": self.clock_sum / self.clocked if self.clocked else nan,
            "gpu_sm_clock_max_hertz": self.max_hertz,
            "gpu_sm_clock_ratio": self.ratio_sum / self.ratioed if self.ratioed else nan,
        }
        for reason, count in zip(REASONS, self.reason_counts, strict=True):
            out[reason_column(reason)] = count / self.reasoned if self.reasoned else nan
        return out


@dataclass(frozen=True, slots=True)
class GpuCause:
    """What one rank's GPU state says about a compute slowdown.

    Attributes:
        text: the sentence (``"GPU 3 (node07) sw_thermal active in 100% of the window, SM
            clock 1.41 of 1.98 GHz"``, ``"no clock event on its GPU ..."``, ``"no GPU state:
            CPU job"``).
        gpu: NVML index of the rank's GPU, if known.
        reasons: limiting reasons named, with the fraction of the window each was active.
        evidence: the numbers behind it (JSON-serialisable; None for NaN).
    """

    text: str
    gpu: int | None
    reasons: dict[str, float]
    evidence: dict[str, Any]


def describe_cause(record: WindowRecord, rank: int, *,
                   min_reason_ratio: float = MIN_REASON_RATIO) -> GpuCause | None:
    """The GPU cause of a compute slowdown of ``rank``, read from the record's GPU-state columns.

    Args:
        record: a gathered window record.
        rank: the global rank of the straggler.
        min_reason_ratio: fraction of the window a limiting reason must be active to be named.

    Returns:
        The cause; None when the record has no GPU-state columns (no GPU-state participant) or
        no row for ``rank``.
    """
    source_column = record.get("gpu_state_source")
    if source_column is None:
        return None
    rows = np.flatnonzero(np.asarray(record.ranks) == rank)
    if not rows.size:
        return None
    row = int(rows[0])

    def value(name: str) -> float:
        column = record.get(name)
        return float(column[row]) if column is not None and row < len(column) else math.nan

    source = value("gpu_state_source")
    index = value("gpu_index")
    gpu = int(index) if math.isfinite(index) else None
    node = str(record.nodes[row]) if record.nodes is not None and row < len(record.nodes) else None
    ratios = {r: value(reason_column(r)) for r in REASONS}
    clock, clock_max = value("gpu_sm_clock_hertz"), value("gpu_sm_clock_max_hertz")
    evidence: dict[str, Any] = {
        "source": SOURCE_NAMES.get(source, "unknown") if math.isfinite(source) else "unknown",
        "gpu": gpu,
        "samples": _finite(value("gpu_state_samples")),
        "sm_clock_hertz": _finite(clock),
        "sm_clock_max_hertz": _finite(clock_max),
        "sm_clock_ratio": _finite(value("gpu_sm_clock_ratio")),
        "reasons": {r: round(v, 4) for r, v in ratios.items() if math.isfinite(v) and v > 0},
    }
    named = {r: v for r, v in ratios.items()
             if r in LIMITING_REASONS and math.isfinite(v) and v >= min_reason_ratio}
    named = dict(sorted(named.items(), key=lambda kv: (-kv[1], kv[0])))
    evidence["cause"] = list(named) or None

    if source == SOURCE_NONE:
        return GpuCause("no GPU state: CPU job", None, {}, evidence)
    if source == SOURCE_UNAVAILABLE or not math.isfinite(source):
        return GpuCause("no GPU state: its GPU gave none in this window (NVML lost it or does "
                        "not know it)", gpu, {}, evidence)
    where = f"GPU {gpu}" if gpu is not None else "its GPU"
    if node:
        where += f" ({node})"
    clocks = _clock_text(clock, clock_max)
    if source == SOURCE_TORCH:
        return GpuCause(f"{where}: clock-event reasons unknown (no NVML in the job)"
                        + (f", SM clock {clocks}" if clocks else ""), gpu, {}, evidence)
    if named:
        first, *rest = named.items()
        text = f"{where} {first[0]} active in {100 * first[1]:.0f}%"
        text += "".join(f", {r} in {100 * v:.0f}%" for r, v in rest)
        text += " of the window" + (f", SM clock {clocks}" if clocks else "")
        return GpuCause(text, gpu, named, evidence)
    detail = [f"GPU {gpu}" + (f" on {node}" if node else "")] if gpu is not None else []
    detail += [f"SM clock {clocks}"] if clocks else []
    return GpuCause("no clock event on its GPU" + (f" ({', '.join(detail)})" if detail else ""),
                    gpu, {}, evidence)


def _clock_text(clock: float, clock_max: float) -> str:
    """``"1.41 of 1.98 GHz"``; ``""`` when the clock is unknown."""
    if not math.isfinite(clock):
        return ""
    if not math.isfinite(clock_max):
        return f"{clock / 1e9:.2f} GHz"
    return f"{clock / 1e9:.2f} of {clock_max / 1e9:.2f} GHz"


def _finite(value: float) -> float | None:
    return float(f"{value:.6g}") if math.isfinite(value) else None
