"""Flight-recorder dumps of NCCL jobs written to the schema PyTorch documents
(``torch/csrc/distributed/c10d/FlightRecorder.cpp``; the tutorial's "unpickled dump"): a
``version``, ``pg_config`` {name: {name, desc, ranks}}, ``pg_status`` {uid:
{last_enqueued_collective, last_started_collective, last_completed_collective}} and ``entries``
with ``profiling_name`` ``nccl:<op>`` (point-to-point: ``nccl:send r->p`` / ``nccl:recv r<-p``,
group-local ranks). For what a gloo job cannot show: states, completions, p2p records."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any


class Rank:
    """One rank's recorder, filled by recording operations."""

    def __init__(self, rank: int, groups: dict[str, tuple[str, list[int]]],
                 version: str = "2.10") -> None:
        self.rank = rank
        self.groups = groups
        self.version = version
        self.entries: list[dict[str, Any]] = []
        self.seq = {name: 0 for name in groups}
        self.p2p = {name: 0 for name in groups}
        self.done = {name: 0 for name in groups}

    def collective(self, pg: str, op: str, sizes=((1024, 1024),), dtype="BFloat16",
                   state: str = "completed") -> None:
        self.seq[pg] += 1
        if state == "completed":
            self.done[pg] = self.seq[pg]
        self._entry(pg, op, sizes, dtype, state, is_p2p=False)

    def p2p_op(self, pg: str, kind: str, peer_global: int, state: str = "completed",
               sizes=((4, 2048, 4096),)) -> None:
        members = self.groups[pg][1]
        me, peer = members.index(self.rank), members.index(peer_global)
        self.p2p[pg] += 1
        name = f"send {me}->{peer}" if kind == "send" else f"recv {me}<-{peer}"
        self._entry(pg, name, sizes, "BFloat16", state, is_p2p=True)

    def _entry(self, pg: str, op: str, sizes, dtype: str, state: str, is_p2p: bool) -> None:
        uid = list(self.groups).index(pg)
        self.entries.append({
            "record_id": len(self.entries), "pg_id": uid,
            "process_group": (pg, self.groups[pg][0]), "collective_seq_id": self.seq[pg],
            "p2p_seq_id": self.p2p[pg], "op_id": self.seq[pg] + self.p2p[pg],
            "profiling_name": f"nccl:{op}", "time_created_ns": 1_790_000_000_000_000_000
            + 1_000_000 * len(self.entries) + self.rank,
            "input_sizes": [list(s) for s in sizes], "input_dtypes": [dtype] * len(sizes),
            "output_sizes": [list(s) for s in sizes], "output_dtypes": [dtype] * len(sizes),
            "state": state, "retired": state == "completed", "is_p2p": is_p2p,
            "timeout_ms": 600000, "frames": [],
            "time_discovered_started_ns": None, "time_discovered_completed_ns": None})

    def dump(self, **extra: Any) -> dict[str, Any]:
        return {
            "version": self.version,
            "pg_config": {name: {"name": name, "desc": desc, "ranks": str(members)}
                          for name, (desc, members) in self.groups.items()
                          if self.rank in members},
            "pg_status": {str(list(self.groups).index(name)): {
                "last_enqueued_collective": self.seq[name],
                "last_started_collective": self.seq[name],
                "last_completed_collective": self.done[name]}
                for name, (_, members) in self.groups.items() if self.rank in members},
            "entries": self.entries, "nccl_version": "2.27.3", **extra}


def write(ranks: list[Rank], directory: Path, prefix: str = "nccl_trace_rank_",
          **extra: Any) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for r in ranks:
        (directory / f"{prefix}{r.rank}").write_bytes(pickle.dumps(r.dump(**extra)))
    return directory
