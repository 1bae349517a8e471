"""Which stalled ranks of this node hold their job up, from the agent's own series.

A hung job stalls every rank: the victims wait in a collective for the few ranks that hold it
up, on this node or another. Draining every node whose ranks are stalled would drain the whole
job's nodes for one bad GPU, so a stalled rank of this node counts against the node only when

* it waits in no collective (no group with ``issued > completed``): it is stuck in its own work
  (a kernel that never returns, a GIL held), not waiting for a peer; or
* the hang rules (:func:`laggard.detectors.hang.classify_hang`, the same the in-job watch and
  ``LaggardJobHung`` apply) name it a culprit among the ranks this agent sees, with
  ``absent_are_silent=False``: members on other nodes are unknown, never blamed.

A rank waiting in a collective on a member of another node is a victim here; the cluster-wide
verdict (``LaggardJobHung`` through Prometheus, ``laggard remediate``) names that member.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from laggard.detectors.hang import GroupState, RankState, classify_hang
from laggard.parsers.exposition import Sample

#: The tracer's group label names its members: ``g1[0,2,4,6]`` (docs/metrics.md).
_MEMBERS = re.compile(r"\[([0-9, ]+)\]$")


def _members(group: str) -> tuple[int, ...] | None:
    found = _MEMBERS.search(group)
    if found is None:
        return None
    return tuple(int(m) for m in found.group(1).replace(" ", "").split(",") if m)


def _rank_states(samples: Sequence[Sample]) -> dict[str, dict[int, dict[str, Any]]]:
    """run -> rank -> what the agent's series say of it (groups, silence, liveness, device)."""
    runs: dict[str, dict[int, dict[str, Any]]] = defaultdict(dict)

    def entry(s: Sample) -> dict[str, Any] | None:
        try:
            rank = int(s.labels.get("rank", ""))
        except ValueError:
            return None
        return runs[s.labels.get("run", "")].setdefault(
            rank, {"groups": defaultdict(dict), "silent": None, "alive": None,
                   "world": None, "gpu": False})

    for s in samples:
        if not s.name.startswith("laggard_rank_"):
            continue
        data = entry(s)
        if data is None:
            continue
        group = s.labels.get("group")
        if s.name in ("laggard_rank_collective_issued", "laggard_rank_collective_completed"):
            data["groups"][group][s.name.rsplit("_", 1)[1]] = int(s.value)
        elif s.name == "laggard_rank_collective_inflight_seconds":
            data["groups"][group].update(op=s.labels.get("op"), pending_seconds=s.value)
        elif s.name == "laggard_rank_heartbeat_age_seconds":
            data["silent"] = s.value
        elif s.name == "laggard_rank_process_state":
            state = s.labels.get("state")
            data["alive"] = {"alive": True, "exited": False}.get(str(state))
        elif s.name == "laggard_rank_info":
            data["gpu"] = bool(s.labels.get("gpu"))
            world = s.labels.get("world_size", "")
            data["world"] = int(world) if world.isdigit() else None
    return runs


def local_culprits(samples: Sequence[Sample], stalled: set[tuple[str, int]]
                   ) -> set[tuple[str, int]]:
    """The stalled ranks of this node that hold their job up (see the module docstring).

    Args:
        samples: the agent's ``/metrics``, parsed.
        stalled: (run, rank) of the ranks stalled long enough to consider.

    Returns:
        The subset of ``stalled`` that is stuck in its own work or named a culprit.
    """
    out: set[tuple[str, int]] = set()
    for run, ranks in _rank_states(samples).items():
        states: dict[int, RankState] = {}
        for rank, data in ranks.items():
            groups = tuple(
                GroupState(group=name, issued=g.get("issued", 0), completed=g.get("completed", 0),
                           members=_members(name), op=g.get("op"),
                           pending_seconds=g.get("pending_seconds"))
                for name, g in data["groups"].items() if "issued" in g and "completed" in g)
            states[rank] = RankState(rank=rank, groups=groups, silent_seconds=data["silent"],
                                     alive=data["alive"], world_size=data["world"])
            if (run, rank) in stalled and not any(g.issued > g.completed for g in groups):
                out.add((run, rank))
        if not any(key[0] == run for key in stalled):
            continue
        device = any(data["gpu"] for data in ranks.values())
        verdict = classify_hang(states, absent_are_silent=False, device=device)
        out |= {(run, c.rank) for c in verdict.culprits if (run, c.rank) in stalled}
    return out
