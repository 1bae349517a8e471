"""Recorded windows for the straggler detector's replay test
(tests/detectors/test_straggler_replay.py): the synthetic job's windows (the simulator's
timings per peer group, with bad input), their storage in tests/fixtures/straggler_groups/,
and one detector run's outputs as plain data.

``python tests/straggler_replay.py`` wrote the fixtures with the per-group detectors
of commit 1271479 (one ``StragglerDetector`` per group, before the vectorised detector); the
test replays the same windows through today's code and compares its outputs with those.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from laggard.detectors.peer_groups import PeerGroups
from laggard.detectors.window import WindowRecord

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "straggler_groups"
COLUMNS = ("compute_seconds", "data_seconds", "collective_wait_seconds", "transfer_seconds",
           "step_seconds")

#: The synthetic job: 4 groups of 12 ranks (stage 1 does 30% more work: a stage imbalance)
#: and 8 groups of 2 (pooled across groups by work-normalised time, each with its own work).
BIG, SMALL = 4, 8
WORK = [1.0, 1.3, 1.0, 1.0] + [0.8, 1.0, 1.2, 1.6, 0.9, 1.1, 1.0, 1.4]


def synthetic_groups() -> PeerGroups:
    lists = [list(range(12 * g, 12 * g + 12)) for g in range(BIG)]
    lists += [[48 + 2 * g, 49 + 2 * g] for g in range(SMALL)]
    return PeerGroups.from_lists(lists, 64)


def synthetic_records() -> list[WindowRecord]:
    """60 windows of 20 steps of the simulator's job (64 ranks), each group's compute scaled by
    its work; stragglers: rank 5 compute +12% (steps 200-700), rank 30 data +15% in 3 of every
    5 windows' steps, rank 50 (a pooled group) link +20% from step 300, the whole job 20%
    slower from step 900; then bad input: rank 7's row NaN (window 30), rank 27 absent
    (windows 31-37), a duplicate and two out-of-range rows (window 40), group 3 all NaN
    (window 45), a window of another world size (50), the step counter going back (52)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from straggler_sim import JobModel, Straggler, simulate

    groups = synthetic_groups()
    model = JobModel(world_size=64, seed=31, job_slowdown=(900, 1.2), stragglers=[
        Straggler(rank=5, cause="compute", slowdown=0.12, start_step=200, period_steps=10_000,
                  on_steps=500),
        Straggler(rank=30, cause="data", slowdown=0.15, start_step=100, period_steps=100,
                  on_steps=60),
        Straggler(rank=50, cause="link", slowdown=0.20, start_step=300)])
    factor = np.array([WORK[groups.group_of(r)] for r in range(64)])[:, None]
    records = []
    for index, sim in enumerate(simulate(model, steps=1200, window_steps=20)):
        window = sim.rank_window()
        columns = {
            "compute_seconds": (window.compute_seconds * factor)[:, 0],
            "data_seconds": window.data_seconds[:, 0].copy(),
            "collective_wait_seconds": window.collective_wait_seconds[:, 0].copy(),
            "transfer_seconds": window.transfer_seconds[:, 0].copy(),
            "step_seconds": np.median(sim.step_seconds, axis=1)}
        ranks = np.arange(64, dtype=np.int64)
        step, world = sim.step, 64
        keep = np.ones(64, dtype=bool)
        if index == 30:
            for values in columns.values():
                values[7] = np.nan
        if 31 <= index <= 37:
            keep[27] = False
        if index == 45:
            for values in columns.values():
                values[36:48] = np.nan
        if index == 50:
            world = 65
        if index == 52:
            step = records[-1].step - 40
        rows = np.flatnonzero(keep)
        if index == 40:
            rows = np.concatenate([rows, [3, 0, 1]])  # a duplicate of rank 3, two strays
            ranks = ranks.copy()
        out_ranks = ranks[rows]
        if index == 40:
            out_ranks = out_ranks.copy()
            out_ranks[-2:] = [-1, 64]
        records.append(WindowRecord(
            step=step, ranks=out_ranks, world_size=world,
            columns={name: values[rows] for name, values in columns.items()},
            nodes=[sim.nodes[r] for r in rows.tolist()],
            local_ranks=sim.local_ranks[rows]))
    return records


def save_records(records: list[WindowRecord], path: Path) -> None:
    """The records as JSON lines (NaN as null): step, world_size, ranks, nodes, local_ranks,
    columns."""
    with path.open("w") as out:
        for r in records:
            out.write(json.dumps({
                "step": r.step, "world_size": r.world_size, "ranks": r.ranks.tolist(),
                "nodes": list(r.nodes or []), "local_ranks": np.asarray(r.local_ranks).tolist(),
                "columns": {name: [None if v != v else float(v) for v in r.columns[name]]
                            for name in COLUMNS if name in r.columns}}) + "\n")


def load_records(path: Path) -> list[WindowRecord]:
    """What :func:`save_records` wrote."""
    records = []
    for line in path.read_text().splitlines():
        doc = json.loads(line)
        records.append(WindowRecord(
            step=doc["step"], world_size=doc["world_size"],
            ranks=np.array(doc["ranks"], dtype=np.int64), nodes=doc["nodes"],
            local_ranks=np.array(doc["local_ranks"], dtype=np.int64),
            columns={name: np.array([np.nan if v is None else v for v in values],
                                    dtype=np.float64)
                     for name, values in doc["columns"].items()}))
    return records


def demo_records(path: Path) -> list[WindowRecord]:
    """A ``laggard demo --windows`` file (rank 0's saved windows) as records."""
    return [WindowRecord.from_saved(json.loads(line)) for line in path.read_text().splitlines()]


def run_participant(records: list[WindowRecord], groups: PeerGroups | None,
                    world: int) -> list[dict[str, Any]]:
    """Each window through the monitor's straggler participant (rank 0): its findings
    (``to_dict``), scores and detector counters, as JSON-ready data."""
    from laggard.integrations.participants import MonitorContext, StragglerParticipant

    # the median detector alone: the recordings predate the blame detector (issue 33)
    participant = StragglerParticipant(None, peer_groups=groups, blame=False)
    participant.attach(MonitorContext(
        rank=0, world_size=world, node="n0", local_rank=0, window_steps=20,
        group=lambda: None, log_once=lambda *a: None, count_error=lambda where, exc: None))
    out = []
    for record in records:
        outcome = participant.on_window(record)
        if outcome is None:
            out.append({"step": record.step, "outcome": None})
            continue
        out.append({"step": record.step,
                    "findings": [f.to_dict() for f in outcome.findings],
                    "scores": {str(k): v for k, v in sorted(outcome.scores.items())},
                    "stats": dict(sorted(outcome.detector_stats.items()))})
    return out


#: name -> (windows file, peer groups, world size) of each recorded case.
def cases() -> dict[str, tuple[list[WindowRecord], PeerGroups | None, int]]:
    found: dict[str, tuple[list[WindowRecord], PeerGroups | None, int]] = {
        "synthetic": (load_records(FIXTURES / "synthetic_windows.jsonl"), synthetic_groups(),
                      64),
        "synthetic_all": (load_records(FIXTURES / "synthetic_windows.jsonl"), None, 64)}
    for world in (4, 8):
        path = FIXTURES / f"demo_pp{world}_windows.jsonl"
        half = world // 2
        found[f"demo_pp{world}"] = (demo_records(path), PeerGroups.from_lists(
            [list(range(half)), list(range(half, world))], world), world)
    return found


def main() -> None:
    save_records(synthetic_records(), FIXTURES / "synthetic_windows.jsonl")
    for name, (records, groups, world) in cases().items():
        outputs = run_participant(records, groups, world)
        with (FIXTURES / f"{name}_expected.jsonl").open("w") as out:
            for doc in outputs:
                out.write(json.dumps(doc) + "\n")
        raised = sum(1 for d in outputs for f in d.get("findings", []))
        print(f"{name}: {len(outputs)} windows, {raised} findings")


if __name__ == "__main__":
    main()
