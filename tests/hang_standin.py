"""A stand-in for ``laggard.detectors.hang.classify_hang`` while the real rules are not merged.

The simplest reading of the shapes (one collective group at a time, P2P pairs left out): the
members behind the group's highest issued count are *missing*, those level with it that have
not completed what a peer completed are *device*, a rank with ``silent_seconds`` is *silent*.
:func:`rules` gives the real rules once they stop raising ``NotImplementedError``, else this;
:func:`install` puts it in place of the real one for a worker process.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from laggard.detectors import hang
from laggard.detectors.hang import HangCulprit, HangVerdict, RankState


def classify(ranks: Mapping[int, RankState], *, world_size: int | None = None) -> HangVerdict:
    """The stand-in rules (see the module docstring)."""
    verdict = HangVerdict()
    groups: dict[str, dict[int, tuple[int, int, str | None, str]]] = {}
    for rank, state in ranks.items():
        for g in state.groups:
            if g.peer is None:
                groups.setdefault(g.group, {})[rank] = (g.issued, g.completed, g.op, g.desc)
    named: set[int] = set()
    for group, members in sorted(groups.items()):
        verdict.groups_checked += 1
        top = max(issued for issued, _, _, _ in members.values())
        done = max(completed for _, completed, _, _ in members.values())
        op = next(o for issued, _, o, _ in members.values() if issued == top)
        for rank, (issued, completed, _, desc) in sorted(members.items()):
            if issued < top:
                waiting = tuple(r for r, m in members.items() if m[0] == top)
                verdict.culprits.append(HangCulprit(rank=rank, kind="missing", group=group,
                                                    desc=desc, seq=issued + 1, op=op,
                                                    waiting=waiting))
                named.add(rank)
            elif completed < done:
                verdict.culprits.append(HangCulprit(rank=rank, kind="device", group=group,
                                                    desc=desc, seq=completed + 1, op=op))
                named.add(rank)
    for rank, state in sorted(ranks.items()):
        if state.silent_seconds is not None and rank not in named:
            verdict.culprits.append(HangCulprit(rank=rank, kind="silent"))
    verdict.culprits.sort(key=lambda c: (c.rank, c.group))
    return verdict


def rules() -> Callable[..., HangVerdict]:
    """The real ``classify_hang`` once it is implemented, else :func:`classify`."""
    try:
        hang.classify_hang({}, world_size=1)
    except NotImplementedError:
        return classify
    return hang.classify_hang


def install() -> None:
    """Use :func:`rules` as ``laggard.detectors.hang.classify_hang`` in this process."""
    hang.classify_hang = rules()  # type: ignore[assignment]
