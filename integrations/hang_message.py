"""The hang report's text: the one line rank 0 logs per hang episode (logger ``laggard.hang``),
built from the verdict of :func:`laggard.detectors.hang.classify_hang` and the rank states it
was read from, e.g.::

    hung since step 4,812 in allreduce #20,537 of group dp: ranks 12 and 14 never issued it
    (last in phase data for 95 s)

Pure functions of plain data; :class:`~laggard.integrations.hang_watch.HangWatch` calls
:func:`hang_message` and :func:`hung_step` when it reports.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from laggard.detectors.hang import HangCulprit, HangVerdict, RankState
from laggard.wire import group_desc

__all__ = ["hang_message", "hung_step"]


def hang_message(verdict: HangVerdict, states: Mapping[int, RankState], own_step: int) -> str:
    """The one line that says who holds the job up, e.g. ``hung since step 4,812 in allreduce
    #20,537 of group dp: ranks 12 and 14 never issued it (last in phase data for 95 s)``;
    clauses of several groups or kinds joined by ``; ``.

    Args:
        verdict: the hang rules' verdict (its culprits: rank, kind, group, seq, op, peer).
        states: the rank states the verdict was read from, by rank.
        own_step: rank 0's step (the step named when no culprit or rank reports one).

    Returns:
        The line, without the ``laggard:`` prefix the log adds.
    """
    clauses: dict[tuple[Any, ...], list[HangCulprit]] = {}
    for c in verdict.culprits:
        clauses.setdefault((c.kind, c.group, c.seq, c.op, c.peer), []).append(c)
    parts = []
    for (kind, group, seq, op, peer), culprits in clauses.items():
        ranks = sorted({c.rank for c in culprits})
        who = _ranks_text(ranks)
        desc = culprits[0].desc or group_desc(group)
        where = ""
        if seq is not None:
            where = f"{op or 'collective'} #{seq:,} of group {desc}"
            if peer is not None:
                where += f" (with rank {peer})"
        if kind == "missing":
            text = f"{who} never issued it" if where else f"{who} never issued the next"
        elif kind == "device":
            text = f"{who} issued it and never completed it (stuck on the device)"
        else:
            seconds = max((states[r].silent_seconds or 0.0) for r in ranks if r in states)
            text = (f"{who} stopped reporting {seconds:.0f} s ago (holding the GIL, stuck in "
                    "native code, or gone)")
        text += _phase_text(ranks, states)
        parts.append(f"in {where}: {text}" if where else text)
    sep = " " if parts and parts[0].startswith("in ") else ": "
    return f"hung since step {hung_step(verdict, states, own_step):,}{sep}" + "; ".join(parts)


def hung_step(verdict: HangVerdict, states: Mapping[int, RankState], own_step: int) -> int:
    """The step the job stopped in: the lowest step of the culprits that still report, else of
    every rank that still reports (a silent rank's last key may be from long before it froze:
    its store thread could not run), else rank 0's own (``own_step``)."""
    def fresh_steps(ranks: Iterable[int]) -> list[int]:
        return [s.step for r in ranks if (s := states.get(r)) is not None
                and s.step is not None and s.silent_seconds is None]
    steps = fresh_steps(verdict.ranks) or fresh_steps(states)
    return min(steps) if steps else own_step


def _phase_text(ranks: Sequence[int], states: Mapping[int, RankState]) -> str:
    """`` (last in phase data for 95 s)`` for culprits sharing a phase, per rank otherwise;
    for silent ranks `` (last heard at step 29, in phase backward)``: their last key is from
    before they froze, so its phase age says nothing of now."""
    known = [(r, s) for r in ranks if (s := states.get(r)) is not None and s.phase is not None]
    if not known:
        return ""
    if any(s.silent_seconds is not None for _, s in known):
        shown = ", ".join(f"rank {r} at step {s.step}, in phase {s.phase}" if len(known) > 1
                          else f"at step {s.step}, in phase {s.phase}" for r, s in known[:4])
        return f" (last heard {shown}{', ...' if len(known) > 4 else ''})"
    phases = {s.phase for _, s in known}
    if len(phases) == 1:
        seconds = max(s.phase_seconds or 0.0 for _, s in known)
        return f" (last in phase {known[0][1].phase} for {seconds:.0f} s)"
    shown = ", ".join(f"rank {r} in {s.phase} for {s.phase_seconds or 0.0:.0f} s"
                      for r, s in known[:4])
    return f" (last {shown}{', ...' if len(known) > 4 else ''})"


def _ranks_text(ranks: Sequence[int]) -> str:
    """``rank 3``, ``ranks 12 and 14``, ``ranks 1, 2 and 5``; beyond 8, ``... and N more``."""
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    if len(ranks) > 8:
        return f"ranks {', '.join(map(str, ranks[:6]))} and {len(ranks) - 6} more"
    return f"ranks {', '.join(map(str, ranks[:-1]))} and {ranks[-1]}"
