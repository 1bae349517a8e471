"""CollectiveTracer and its sources: a real 3-rank gloo job (FSDP2, DDP, async Work, bad input),
and the NCCL sources against fakes with the same names as torch's (no GPU in this suite)."""

from __future__ import annotations

import datetime
import json
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from support import budget

pytest.importorskip("torch")

from laggard.integrations.flight_recorder_source import FlightRecorderReader  # noqa: E402
from laggard.integrations.trace_ops import wire_bytes  # noqa: E402
from laggard.integrations.trace_records import GroupInfo, union_seconds  # noqa: E402
from laggard.integrations.trace_sources import attach  # noqa: E402
from laggard.integrations.tracer import CollectiveTracer  # noqa: E402

HERE = Path(__file__).parent


@pytest.fixture(scope="module")
def gloo_job(tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("tracer")
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "3",
         str(HERE / "tracer_worker.py"), str(out)],
        capture_output=True, text=True, timeout=budget(240),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(3)]


def test_fsdp2_tracing_leaves_the_loss_bitwise_unchanged(gloo_job):
    for rank in gloo_job:
        assert rank["traced"] == rank["baseline"]
        assert rank["monitor_errors"] == 0


def test_fsdp2_all_gather_and_reduce_scatter_are_timed_with_wire_bytes(gloo_job):
    params = 32 * 64 + 64 + 64 * 64 + 64 + 64 * 4 + 4
    for rank in gloo_job:
        ops = rank["last_step"]["ops"]
        assert set(ops) == {"allgather", "reduce_scatter"}
        # every rank sends (W-1)/W of the fp32 parameters per all-gather (shards padded to W)
        assert ops["allgather"][1] >= 2 * params * 4 // 3
        assert ops["reduce_scatter"][1] >= 2 * params * 4 // 3 // 3
        # FSDP2 on gloo calls synchronously: all of it is exposed
        assert rank["last_step"]["exposed"] == pytest.approx(rank["last_step"]["total"])


def test_the_delayed_rank_arrived_last_in_every_step_of_the_world_group(gloo_job):
    groups = {label: (ranks, last, steps) for label, ranks, last, steps in
              gloo_job[0]["group_waits"]}
    ranks, last, steps = groups["world"]
    assert steps == 4 and last == [0, 0, 4]
    # no collective ran on the pair group: no step says who was waited for
    assert groups["ranks 0,1"] == ([0, 1], [0, 0], 0)


def test_ddp_hook_and_async_work_feed_the_same_tracer(gloo_job):
    for rank in gloo_job:
        assert rank["ddp_ops"]["allreduce"] > 0
        assert rank["async_ops"] == {"allreduce": 8000}


def test_bad_groups_are_counted_never_raised(gloo_job):
    assert gloo_job[0]["groups_watched"] == [[0, 1, 2], [0, 1]]
    assert gloo_job[2]["groups_watched"] == [[0, 1, 2]]
    for rank in gloo_job:
        assert rank["stats"]["unknown_group"] == 1  # the group created after the tracer
    assert gloo_job[2]["outsider_stats"]["not_member"] == 1
    assert gloo_job[0]["outsider_stats"]["not_member"] == 0


def test_link_probe_round_trip_is_measured_on_every_rank(gloo_job):
    for rank in gloo_job:
        assert 0 < rank["probe"] < 1.0


# ------------------------------------------------------------------- without processes
def _tracer(*infos: GroupInfo, **config) -> CollectiveTracer:
    tracer = CollectiveTracer(CollectiveTracer.Config(**config), groups=[])
    tracer.groups = list(infos)
    return tracer


WORLD = GroupInfo(index=0, name="0", backend="nccl", ranks=(0, 1, 2))


def test_a_collective_that_never_completes_is_dropped_and_counted():
    tracer = _tracer(WORLD, max_in_flight=2, stall_seconds=0.01)
    tracer._by_id[id(None)] = WORLD  # no torch.distributed: stand in for the default group
    pg = object()
    tracer._by_id[id(pg)] = WORLD
    tokens = [tracer.begin("allreduce", pg, 8) for _ in range(3)]
    assert tracer.in_flight == 2 and tracer.stats["never_completed"] == 1
    time.sleep(0.02)
    tracer.take_step()
    assert tracer.in_flight == 0 and tracer.stats["never_completed"] == 3
    tracer.end(tokens[-1])  # late completion of a dropped collective: ignored
    assert tracer.take_step().collectives == []


def test_completed_collectives_are_bounded_between_steps():
    tracer = _tracer(WORLD, max_completed=3)
    for i in range(5):
        tracer.record("allreduce", None, float(i), i + 0.5, 10, index=0)
    step = tracer.take_step()
    assert tracer.stats["dropped"] == 2 and step.groups[0].count == 3 and step.bytes == 30


def test_union_counts_overlaps_once():
    assert union_seconds([(0, 2), (1, 3), (5, 6)]) == pytest.approx(4)
    assert union_seconds([]) == 0


def test_wire_bytes_follow_the_ring_algorithms():
    assert wire_bytes("allreduce", 3000, 3) == 4000
    assert wire_bytes("allgather", 1000, 4) == 3000
    assert wire_bytes("reduce_scatter", 4000, 4) == 3000


class FakeProcessGroup:
    """Stands in for an NCCL ``ProcessGroup``: records the hook it is given."""

    def __init__(self, refuse: bool = False) -> None:
        self.hooks: list = []
        self.refuse = refuse

    def _register_on_completion_hook(self, hook) -> None:
        if self.refuse:
            raise RuntimeError("ProcessGroup::setCompletionHook only implemented for NCCL")
        self.hooks.append(hook)


def _work_info(op: str, active_ms: float, started_s: float, finished_s: float):
    # same attribute names and types as torch._C._distributed_c10d.WorkInfo
    epoch = datetime.datetime(2026, 1, 1)
    return SimpleNamespace(op_type=f"OpType.{op}", seq=1,
                           time_started=epoch + datetime.timedelta(seconds=started_s),
                           time_finished=epoch + datetime.timedelta(seconds=finished_s),
                           active_duration=datetime.timedelta(milliseconds=active_ms))


def test_nccl_completion_hook_records_active_duration_else_finish_minus_start():
    tracer = _tracer(WORLD)
    pg = FakeProcessGroup()
    lines = attach(tracer, env={"TORCH_NCCL_ENABLE_TIMING": "1"}, groups=[pg])
    assert "completion hook" in lines[0] and len(pg.hooks) == 1
    pg.hooks[0](_work_info("ALLREDUCE", 12.0, 0, 1))
    pg.hooks[0](_work_info("_ALLGATHER_BASE", 0.0, 0, 0.25))
    pg.hooks[0](SimpleNamespace())  # malformed: counted, not raised into the watchdog
    step = tracer.take_step()
    assert step.groups[0].by_op["allreduce"][1] == pytest.approx(0.012, abs=1e-6)
    assert step.groups[0].by_op["allgather"][1] == pytest.approx(0.25, abs=1e-6)
    assert tracer.stats["errors"] == 1


def test_without_timing_opt_in_nccl_falls_back_to_the_flight_recorder_or_says_so():
    tracer = _tracer(WORLD)
    assert "Python-side" in attach(tracer, env={}, groups=[FakeProcessGroup()])[0]
    refused = _tracer(WORLD)
    lines = attach(refused, env={"TORCH_NCCL_ENABLE_TIMING": "1"},
                   groups=[FakeProcessGroup(refuse=True)])
    assert refused.stats["unknown_backend"] == 1 and "Python-side" in lines[0]


def _fr(entries: list[dict]) -> str:
    return json.dumps({"version": "2.10", "entries": entries})


def _entry(rid: int, state: str, name: str = "nccl:all_reduce", group: str = "0",
           created_ns: int | None = None, **extra) -> dict:
    return {"record_id": rid, "state": state, "profiling_name": name,
            "process_group": [group, "default_pg"], "input_sizes": [[1000]],
            "input_dtypes": ["Float"],
            "time_created_ns": created_ns if created_ns is not None else time.time_ns(),
            "time_discovered_started_ns": 1_000_000_000,
            "time_discovered_completed_ns": 1_020_000_000, **extra}


def test_flight_recorder_reader_hands_over_each_completed_entry_once():
    tracer = _tracer(WORLD)
    dumps = [_fr([_entry(0, "completed"), _entry(1, "started")]),
             _fr([_entry(0, "completed"), _entry(1, "completed", duration_ms=5.0),
                  _entry(2, "completed", group="9")])]
    reader = FlightRecorderReader(tracer, dump=lambda: dumps.pop(0))
    assert reader.poll() == 1
    assert reader.poll() == 1  # entry 1 now; entry 0 not again; group 9 is not watched
    step = tracer.take_step()
    assert step.groups[0].count == 2
    assert step.groups[0].seconds == pytest.approx(0.020 + 0.005, abs=1e-6)
    assert step.bytes == 2 * wire_bytes("allreduce", 4000, 3)
    assert tracer.stats["unknown_group"] == 1


def test_flight_recorder_reader_gives_up_on_a_stalled_entry_and_survives_garbage():
    tracer = _tracer(WORLD, stall_seconds=1.0)
    old = time.time_ns() - 5_000_000_000
    dumps = [_fr([_entry(0, "scheduled", created_ns=old), _entry(1, "completed")]), "not json"]
    reader = FlightRecorderReader(tracer, dump=lambda: dumps.pop(0))
    assert reader.poll() == 1 and tracer.stats["never_completed"] == 1
    assert reader.poll() == 0 and tracer.stats["errors"] == 1


def test_flight_recorder_reader_runs_on_its_own_thread():
    tracer = _tracer(WORLD)
    reader = FlightRecorderReader(tracer, interval_s=0.01,
                                  dump=lambda: _fr([_entry(0, "completed")])).start()
    deadline = time.monotonic() + budget(5)
    while reader.seen == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    reader.stop()
    assert tracer.take_step().groups[0].count == 1


def test_gloo_entries_never_complete_so_the_reader_only_counts_them():
    tracer = _tracer(GroupInfo(index=0, name="0", backend="gloo", ranks=(0, 1)))
    reader = FlightRecorderReader(tracer, dump=lambda: _fr(
        [_entry(0, "scheduled", name="gloo:all_reduce"),
         _entry(1, "scheduled", name="gloo:all_reduce")]))
    assert reader.poll() == 0 and reader.seen == 2
    assert tracer.take_step().collectives == []
