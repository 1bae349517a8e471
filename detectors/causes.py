"""Why a compute straggler is slow: Python GC, more work than its peers, or the rank itself.

The straggler detector (:mod:`laggard.detectors.straggler`) names the rank whose compute holds
the job up; it cannot say why. ByteDance's study of 3,079 production jobs (Lin et al.,
"Understanding Stragglers in Large Model Training Using What-if Analysis", OSDI'25) found most
stragglers were not slow GPUs but Python garbage collection, uneven sequence lengths and
unbalanced pipeline stages. Sending an operator to swap a healthy GPU for either of the first two
is the costly mistake this module prevents.

For a raised finding of kind ``"compute"`` on rank r, compared with its peers P (the ranks
doing the same work, r among them), r's excess compute per step over the median of the
others of P (P itself when r is alone) is split into three parts, in seconds per step:

* **GC**: r's ``gc_seconds`` (the training thread's garbage collection inside its compute,
  :mod:`laggard.integrations.gc_timing`) minus the median of P's;
* **work**: when every rank of P noted its work this window (``tokens``, else ``samples``:
  ``TrainingMonitor.note``), P's median seconds per unit of work times r's units beyond the
  median's: the time r's extra work costs at the typical speed;
* **the rest**: what neither explains, the rank being slow per unit of work (a slow GPU).

Each part is the median over the last ``history_windows`` windows (the detector's own evidence
spans several windows; one window's noise on a loaded host should not decide the cause). The
finding becomes kind ``"gc"`` when GC is the largest part and at least ``min_share`` of the
excess, ``"load_imbalance"`` when the work part is; otherwise it stays ``"compute"``, and
when work was noted its message says the rank is slow per token. The message says what helps;
the evidence gains ``cause`` (the kind) and the decomposition. The rank's later clear gets the
same kind, so the agent's ``laggard_straggler_active{kind}`` series rises and falls together.

A work note on some ranks of P only (or a negative, NaN or infinite one in the record) is no
basis for a comparison: that window is not work-normalised, and it is counted
(``stats["partial_work_notes"]``; the caller logs :data:`PARTIAL_NOTES_MESSAGE` once).
Without any note, nothing about work changes.
"""

from __future__ import annotations

import collections
import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from laggard.detectors.finding import Finding
from laggard.detectors.stats import evidence_round, nanmedian
from laggard.detectors.straggler import lost_text
from laggard.detectors.window import WindowRecord

#: The detector whose findings are attributed.
DETECTOR = "straggler"
#: The kinds a compute finding may become.
GC_KIND, LOAD_KIND, COMPUTE_KIND = "gc", "load_imbalance", "compute"
#: The work columns, in the order they are tried.
WORK_COLUMNS = ("tokens", "samples")
#: Logged once by the caller when ``stats["partial_work_notes"]`` first counts.
PARTIAL_NOTES_MESSAGE = (
    "laggard: some ranks noted their work (monitor.note('tokens'/'samples', n)) and others did "
    "not, or noted values that are not finite numbers >= 0: compute is not compared per unit of "
    "work in those windows (counted); note it on every rank, every step")
#: What helps, per cause (the message's last clause).
GC_ADVICE = (
    "call gc.freeze() after start-up (the long-lived objects leave the collector's "
    "generations), or collect on a fixed step on every rank, as Megatron-LM's manual GC does "
    "(gc.disable(), then gc.collect() every N steps), so no rank pauses alone")
LOAD_ADVICE = (
    "balance the work per rank: sequence packing, or length-balanced batching (buckets of "
    "similar lengths, the same tokens per rank and step)")
#: The clear's words, per cause.
_CLEARED_WHAT = {GC_KIND: "Python GC slowdown", LOAD_KIND: "load imbalance (extra work)"}


@dataclass(slots=True)
class _Window:
    """The columns one window's attribution reads, by global rank (rows looked up lazily)."""

    ranks: np.ndarray
    compute: np.ndarray
    gc: np.ndarray
    gc_generation: np.ndarray
    work: dict[str, np.ndarray]
    _rows: dict[int, int] | None = None

    def rows(self, ranks: Sequence[int]) -> np.ndarray:
        """Rows of the given global ranks that reported (order kept)."""
        if self._rows is None:
            self._rows = {}
            for row, rank in enumerate(self.ranks.tolist()):
                self._rows.setdefault(int(rank), row)
        found = [self._rows.get(int(r)) for r in ranks]
        return np.array([row for row in found if row is not None], dtype=np.int64)

    def row(self, rank: int) -> int | None:
        rows = self.rows([rank])
        return int(rows[0]) if rows.size else None


@dataclass(frozen=True, slots=True)
class Decomposition:
    """A rank's compute excess over its peers' median, split (seconds per step; medians over
    the windows kept).

    Attributes:
        excess_seconds: the rank's compute minus its peers' median compute.
        gc_seconds: the part its extra garbage collection explains.
        work_seconds: the part its extra work explains; None when not work-normalised.
        other_seconds: the rest (``excess - gc - work``).
        rank_gc_seconds: the rank's own GC per step; peer_gc_seconds: the peers' median.
        gc_generation: the highest generation the rank collected in the current window (-1
            none; None not measured).
        work_unit: ``"tokens"`` or ``"samples"``; None when not work-normalised.
        work_ratio: the rank's work over the peers' median work.
        work_share: the rank's share of its peers' total work (0-1).
        seconds_per_unit: the peers' median compute seconds per unit of work.
        rank_seconds_per_unit: the rank's own.
        windows: windows the medians were taken over.
    """

    excess_seconds: float
    gc_seconds: float
    work_seconds: float | None
    other_seconds: float
    rank_gc_seconds: float
    peer_gc_seconds: float
    gc_generation: int | None
    work_unit: str | None = None
    work_ratio: float | None = None
    work_share: float | None = None
    seconds_per_unit: float | None = None
    rank_seconds_per_unit: float | None = None
    windows: int = 1

    def evidence(self) -> dict[str, Any]:
        """The JSON evidence entry (seconds per step; None for what was not measured)."""
        return {key: evidence_round(value) if isinstance(value, float) else value
                for key, value in dataclasses.asdict(self).items()}


class CauseAttribution:
    """Turns a compute straggler finding into ``gc`` or ``load_imbalance`` when that is what its
    excess is (module docstring). Stateful: it keeps the last windows' columns and the kind each
    rank's finding was given, so its clear gets the same kind. Call :meth:`apply` on every
    window, with or without findings.

    Args:
        config: :class:`CauseAttribution.Config`; defaults when None.

    Attributes:
        stats: counters: ``windows``, ``attributed`` (compute findings decomposed), ``gc``,
            ``load_imbalance`` (findings turned into each), ``partial_work_notes`` (windows in
            which some ranks noted work and others did not), ``invalid_work_values`` (negative or
            infinite values in a work column: treated as not noted),
            ``unattributed`` (no excess over the peers to split, or the rank absent),
            ``errors`` (a finding that could not be attributed is passed on unchanged).
        kinds: global rank -> the kind its active finding was given (``gc`` or
            ``load_imbalance``).
    """

    @dataclass(kw_only=True, slots=True)
    class Config:
        """Settings of :class:`CauseAttribution`."""

        history_windows: int = 5
        """Windows whose per-window decomposition is reduced to medians (the straggler
        detector's ``persistence_windows``: the windows its own figures span)."""

        min_share: float = 0.5
        """The least share of the excess the largest part must explain to name the cause."""

        def __post_init__(self) -> None:
            if self.history_windows < 1:
                raise ValueError("history_windows must be >= 1")
            if not 0 < self.min_share <= 1:
                raise ValueError("min_share must be in (0, 1]")

    def __init__(self, config: CauseAttribution.Config | None = None) -> None:
        self.config = config or CauseAttribution.Config()
        self._windows: collections.deque[_Window] = collections.deque(
            maxlen=self.config.history_windows)
        self.kinds: dict[int, str] = {}
        self.stats: dict[str, int] = dict.fromkeys(
            ("windows", "attributed", GC_KIND, LOAD_KIND, "partial_work_notes",
             "invalid_work_values", "unattributed", "errors"), 0)

    def apply(self, findings: list[Finding], record: WindowRecord,
              peers_of: Callable[[int], Sequence[int]]) -> list[Finding]:
        """Attribute the window's compute straggler findings; keep the window.

        Args:
            findings: what the straggler detector (or any participant) found in ``record``.
            record: the gathered window; reads ``compute_seconds``, ``gc_seconds``,
                ``gc_generation``, ``tokens``, ``samples`` (a column it lacks counts as not
                measured).
            peers_of: global rank -> the global ranks it is compared with (its peer group,
                itself included).

        Returns:
            The findings in order: raised compute findings of detector ``straggler``
            attributed (kind ``gc``, ``load_imbalance`` or ``compute`` with the decomposition
            in the evidence), their later clears given the same kind; every other finding as
            it was. Never raises: a finding that cannot be attributed passes unchanged
            (``stats["errors"]``).
        """
        try:
            self._keep(record)
        except Exception:  # noqa: BLE001 - a malformed record attributes nothing
            self.stats["errors"] += 1
            self._windows.clear()
        out = []
        for finding in findings:
            try:
                out.append(self._attribute(finding, peers_of))
            except Exception:  # noqa: BLE001 - the finding goes on as the detector made it
                self.stats["errors"] += 1
                out.append(finding)
        return out

    # ----------------------------------------------------------------------- the window
    def _keep(self, record: WindowRecord) -> None:
        """Keep the columns of ``record`` the attribution reads; count partial work notes."""
        ranks = np.asarray(record.ranks, dtype=np.int64).ravel()
        size = ranks.size

        def column(name: str) -> np.ndarray:
            values = record.get(name)
            if values is None or np.ndim(values) != 1 or len(values) != size:
                return np.full(size, np.nan)
            return np.asarray(values, dtype=np.float64)

        work = {}
        partial = False
        for name in WORK_COLUMNS:
            values = column(name).copy()
            with np.errstate(invalid="ignore"):
                invalid = ~np.isnan(values) & ~(np.isfinite(values) & (values >= 0))
            if invalid.any():
                self.stats["invalid_work_values"] += int(invalid.sum())
                values[invalid] = np.nan
            noted = np.isfinite(values)
            partial |= bool(noted.any() and not noted.all())
            work[name] = values
        self.stats["windows"] += 1
        self.stats["partial_work_notes"] += partial
        self._windows.append(_Window(ranks=ranks, compute=column("compute_seconds"),
                                     gc=column("gc_seconds"),
                                     gc_generation=column("gc_generation"), work=work))

    # ---------------------------------------------------------------------- a finding
    def _attribute(self, finding: Finding, peers_of: Callable[[int], Sequence[int]]) -> Finding:
        if finding.detector != DETECTOR or finding.kind != COMPUTE_KIND or finding.rank is None:
            return finding
        rank = int(finding.rank)
        if finding.cleared:
            kind = self.kinds.pop(rank, None)
            if kind is None:
                return finding
            reason = str(finding.evidence.get("reason", "recovered"))
            return dataclasses.replace(
                finding, kind=kind, evidence={**finding.evidence, "cause": kind},
                message=f"rank {rank}: {_CLEARED_WHAT[kind]} cleared "
                        f"({reason.replace('_', ' ')})")
        self.kinds.pop(rank, None)
        parts = self._decompose(rank, [int(p) for p in peers_of(rank)])
        if parts is None:
            self.stats["unattributed"] += 1
            return finding
        self.stats["attributed"] += 1
        kind = _cause(parts, self.config.min_share)
        evidence = {**finding.evidence, "cause": kind, "decomposition": parts.evidence()}
        if kind == COMPUTE_KIND:
            message = finding.message
            if parts.work_unit is not None:
                message += f"; {_slow_per_unit_text(parts)}"
            return dataclasses.replace(finding, message=message, evidence=evidence)
        self.stats[kind] += 1
        self.kinds[rank] = kind
        text = _gc_text(parts) if kind == GC_KIND else _load_text(parts)
        message = (f"{_where(finding)}: {text}{_cost_text(finding.evidence)}: "
                   f"{GC_ADVICE if kind == GC_KIND else LOAD_ADVICE}"
                   f"{_group_suffix(finding.message)}")
        return dataclasses.replace(finding, kind=kind, message=message, evidence=evidence)

    def _decompose(self, rank: int, peers: list[int]) -> Decomposition | None:
        """The rank's excess split into GC, work and the rest, medians over the kept windows;
        None when the current window has no excess to split (or lacks the rank)."""
        if not self._windows:
            return None
        if rank not in peers:
            peers = [*peers, rank]
        rows: list[dict[str, Any]] = []
        for window in self._windows:
            parts = _window_parts(window, rank, peers)
            if parts is not None:
                rows.append(parts)
        current = _window_parts(self._windows[-1], rank, peers)
        if current is None or not rows:
            return None
        excess = nanmedian([r["excess"] for r in rows])
        if not excess > 0:
            return None
        gc_part = nanmedian([r["gc"] for r in rows])
        unit = current["unit"]
        work_part: float | None = None
        extra: dict[str, Any] = {}
        if unit is not None:
            # only windows normalised by the same unit as the current one
            same = [r for r in rows if r["unit"] == unit]
            work_part = nanmedian([r["work"] for r in same])
            extra = {key: nanmedian([r[key] for r in same])
                     for key in ("work_ratio", "work_share", "seconds_per_unit",
                                 "rank_seconds_per_unit")}
        return Decomposition(
            excess_seconds=excess, gc_seconds=gc_part, work_seconds=work_part,
            other_seconds=excess - gc_part - (work_part or 0.0),
            rank_gc_seconds=nanmedian([r["rank_gc"] for r in rows]),
            peer_gc_seconds=nanmedian([r["peer_gc"] for r in rows]),
            gc_generation=current["generation"], work_unit=unit, windows=len(rows), **extra)


def _window_parts(window: _Window, rank: int, peers: Sequence[int]) -> dict[str, Any] | None:
    """One window's split of the rank's excess; None when the rank or a peer median is
    missing."""
    me = window.row(rank)
    rows = window.rows(peers)
    if me is None or rows.size == 0:
        return None
    compute = window.compute
    with np.errstate(invalid="ignore"):
        usable = rows[np.isfinite(compute[rows]) & (compute[rows] >= 0)]
    mine = float(compute[me])
    if usable.size == 0 or not (math.isfinite(mine) and mine >= 0):
        return None
    # The reference is the *other* ranks of P: in a 2-rank peer group (a pipeline stage of 2
    # data-parallel ranks) a median with the rank in it is the pair's mean, which halves the
    # excess and gives a healthy peer half the rank's GC (a new user's pp demo read "its
    # peers' median 9.9 ms" of GC beside a 24 ms cost).
    others = usable[usable != me]
    if others.size:
        usable = others
    median = float(np.median(compute[usable]))
    rank_gc, peer_gc = float(window.gc[me]), nanmedian(window.gc[usable])
    gc_part = rank_gc - peer_gc if math.isfinite(rank_gc) and math.isfinite(peer_gc) else 0.0
    generation = float(window.gc_generation[me])
    out: dict[str, Any] = {
        "excess": mine - median, "gc": gc_part, "unit": None, "work": None,
        "rank_gc": rank_gc if math.isfinite(rank_gc) else 0.0,
        "peer_gc": peer_gc if math.isfinite(peer_gc) else 0.0,
        "generation": int(generation) if math.isfinite(generation) else None,
    }
    for unit in WORK_COLUMNS:
        work = window.work[unit]
        if not np.isfinite(work[rows]).all() or not math.isfinite(work[me]):
            continue  # not noted on every peer (partial notes are counted per window)
        work_rows = usable[work[usable] > 0]
        if work_rows.size == 0:
            continue
        per_unit = float(np.median(compute[work_rows] / work[work_rows]))
        median_work = float(np.median(work[usable]))
        total = float(work[rows].sum())
        out.update(
            unit=unit, work=per_unit * (float(work[me]) - median_work),
            work_ratio=float(work[me]) / median_work if median_work > 0 else math.nan,
            work_share=float(work[me]) / total if total > 0 else math.nan,
            seconds_per_unit=per_unit,
            rank_seconds_per_unit=mine / float(work[me]) if work[me] > 0 else math.nan)
        break
    return out


def _cause(parts: Decomposition, min_share: float) -> str:
    """The kind: the largest part, when it is GC or work and at least ``min_share`` of the
    excess; else compute."""
    candidates = {GC_KIND: parts.gc_seconds, COMPUTE_KIND: parts.other_seconds}
    if parts.work_seconds is not None:
        candidates[LOAD_KIND] = parts.work_seconds
    kind = max(candidates, key=candidates.__getitem__)
    if kind != COMPUTE_KIND and candidates[kind] >= min_share * parts.excess_seconds:
        return kind
    return COMPUTE_KIND


# --------------------------------------------------------------------------- messages
def _where(finding: Finding) -> str:
    where = f"rank {finding.rank}"
    if finding.node is not None:
        where += f" on {finding.node}"
    if finding.local_rank is not None:
        where += f" (local rank {finding.local_rank})"
    return where


def _gc_text(parts: Decomposition) -> str:
    generation = ("" if parts.gc_generation is None or parts.gc_generation < 0
                  else f", collections up to generation {parts.gc_generation}")
    return (f"Python garbage collection, not a slow GPU: its training thread pauses "
            f"{_ms(parts.rank_gc_seconds)} per step collecting (its peers' median "
            f"{_ms(parts.peer_gc_seconds)}{generation}), {_ms(parts.gc_seconds)} of its "
            f"{_ms(parts.excess_seconds)} per step over its peers' median compute, and every "
            "other rank waits for it")


def _load_text(parts: Decomposition) -> str:
    unit = parts.work_unit or "tokens"
    work = parts.work_seconds or 0.0
    # the median's time per unit includes its fixed cost per step (optimizer, launches), so
    # the extra units can cost more at that rate than the whole excess
    share = (f"all of its {_ms(parts.excess_seconds)}" if work >= parts.excess_seconds
             else f"{_ms(work)} of its {_ms(parts.excess_seconds)}")
    return (f"more work, not a slow GPU: {_ratio(parts.work_ratio)} the median rank's {unit} "
            f"per step ({_pct(parts.work_share)} of its peer group's); at the median's "
            f"{_per_unit(parts.seconds_per_unit)} per {unit[:-1]} its extra {unit} cost "
            f"{_ms(work)} per step, {share} per step over its peers' median compute, and every "
            "other rank waits for it")


def _slow_per_unit_text(parts: Decomposition) -> str:
    unit = (parts.work_unit or "tokens")[:-1]
    mine, median = parts.rank_seconds_per_unit, parts.seconds_per_unit
    slower = (f"{100 * (mine / median - 1):.0f}% slower" if mine is not None
              and median is not None and median > 0 and math.isfinite(mine) else "slower")
    return (f"per {unit} it is {slower} than its peers' median ({_per_unit(mine)} vs "
            f"{_per_unit(median)} per {unit}, with {_ratio(parts.work_ratio)} the median "
            f"rank's {unit}s): not its work, the rank itself is slow")


def _cost_text(evidence: dict[str, Any]) -> str:
    """``" (costs the job 0.031 s per step, 9.4 min per hour)"`` from the detector's time-lost
    evidence (:func:`~laggard.detectors.straggler.lost_text`), "" without it."""
    if not isinstance(evidence.get("lost_seconds_per_step"), (int, float)):
        return ""
    return f" ({lost_text(evidence)})"


def _group_suffix(message: str) -> str:
    """The detector's ``" [compared within its peer group pp=1]"`` ending, if any, to keep."""
    start = message.rfind(" [")
    return message[start:] if start >= 0 and message.endswith("]") else ""


def _ms(seconds: float) -> str:
    return f"{1e3 * seconds:.1f} ms"


def _per_unit(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "?"
    if seconds >= 1e-3:
        return f"{1e3 * seconds:.2f} ms"
    if seconds >= 1e-6:
        return f"{1e6 * seconds:.2f} µs"
    return f"{1e9 * seconds:.1f} ns"


def _ratio(value: float | None) -> str:
    return f"{value:.2f}x" if value is not None and math.isfinite(value) else "?x"


def _pct(value: float | None) -> str:
    return f"{100 * value:.1f}%" if value is not None and math.isfinite(value) else "?%"


__all__ = ["COMPUTE_KIND", "GC_ADVICE", "GC_KIND", "LOAD_ADVICE", "LOAD_KIND",
           "PARTIAL_NOTES_MESSAGE", "WORK_COLUMNS", "CauseAttribution", "Decomposition"]
