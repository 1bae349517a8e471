"""Plain heartbeat data the heartbeat tests share: a rank's snapshot, the store keys of a job's
ranks, and a job hung in one all-reduce (tests/integrations/test_heartbeat*.py,
test_hang_watch.py)."""

from __future__ import annotations

from laggard.integrations.heartbeat_key import RankSnapshot, encode_key
from laggard.wire import GroupProgress


def make_snapshot(step=7, phase="data", phase_s=30.0, quiet=30.0,
                  groups=(("dp:0", 10, 10, "allreduce"),)) -> RankSnapshot:
    """A rank of group ``dp:0`` (ranks 0-3) with ``(group, issued, completed, op)`` groups."""
    return RankSnapshot(step=step, phase=phase, phase_seconds=phase_s, step_seconds=0.5,
                        quiet_seconds=quiet,
                        groups=tuple(GroupProgress(group=g, issued=i, completed=c, op=o)
                                     for g, i, c, o in groups),
                        members={"dp:0": (0, 1, 2, 3)})


def make_keys(states: dict[int, RankSnapshot], beat: int, run: str = "r1",
              closed: frozenset = frozenset()) -> dict[int, bytes | None]:
    """Each rank's store key (pid ``100 + rank``), ``closed`` ranks marked closed."""
    return {r: encode_key(s, rank=r, run=run, pid=100 + r, beat=beat, closed=r in closed)
            for r, s in states.items()}


def hung_job(missing=(1,), quiet=30.0) -> dict[int, RankSnapshot]:
    """4 ranks, quiet for ``quiet`` s: those in ``missing`` never issued all-reduce #11 of
    ``dp:0`` (in phase data for 95 s), the others wait in it (in backward for 40 s)."""
    out = {}
    for r in range(4):
        if r in missing:
            out[r] = make_snapshot(phase="data", phase_s=95.0, quiet=quiet,
                                   groups=(("dp:0", 10, 10, "allreduce"),))
        else:
            out[r] = make_snapshot(phase="backward", phase_s=40.0, quiet=quiet,
                                   groups=(("dp:0", 11, 10, "allreduce"),))
    return out
