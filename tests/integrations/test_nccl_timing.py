"""Collectives on a device, timed by events (issue 27, item 3), against fakes with torch's names:
an NCCL future done at enqueue, FSDP2's comms inside their stream context, the completion
hook's refusals and deprecation warning, and flight-recorder dumps without start times."""

from __future__ import annotations

import json
import logging
import math
import time
import warnings
from types import SimpleNamespace

import pytest

pytest.importorskip("torch")

import fr_schema  # noqa: E402
from nccl_fakes import NcclWork, StreamCuda  # noqa: E402

from laggard.integrations.flight_recorder_source import FlightRecorderReader  # noqa: E402
from laggard.integrations.fsdp_trace import _timed_comm_classes  # noqa: E402
from laggard.integrations.nccl_completion import NcclCompletionHook  # noqa: E402
from laggard.integrations.trace_ops import wire_bytes  # noqa: E402
from laggard.integrations.trace_records import GroupInfo  # noqa: E402
from laggard.integrations.trace_sources import attach  # noqa: E402
from laggard.integrations.tracer import CollectiveTracer  # noqa: E402

NCCL = GroupInfo(index=0, name="0", backend="nccl", ranks=(0, 1, 2))
GLOO = GroupInfo(index=0, name="0", backend="gloo", ranks=(0, 1, 2))


class Group:
    """A process group object the tracer watches (``size()`` for the FSDP comms)."""

    def size(self) -> int:
        return 3


def _tracer(info: GroupInfo, cuda=None, **config) -> tuple[CollectiveTracer, Group]:
    tracer = CollectiveTracer(CollectiveTracer.Config(**config), groups=[], device=cuda)
    group = Group()
    tracer.groups = [info]
    tracer._by_id[id(group)] = info
    return tracer, group


# ------------------------------------------------------------------ async Work on NCCL
def test_an_nccl_future_done_at_enqueue_is_timed_by_events_not_by_the_cpu():
    cuda = StreamCuda()
    tracer, group = _tracer(NCCL, cuda)
    cuda.launch(0.100)  # compute already queued on the current stream before the collective
    work = NcclWork(cuda, 0.030)
    assert work.get_future().done()  # done at enqueue: a CPU clock would read ~0 s
    assert tracer.track(work, "allreduce", group, 4000) is work
    assert tracer.take_step().collectives == []  # events pending: nothing read, nothing blocked
    cuda.run(0.120)
    assert tracer.take_step().collectives == []  # the collective ends at 0.130 on the device
    cuda.run(0.020)
    step = tracer.take_step()
    # issue point (the stream reached it at 0.100) -> the collective's end (0.130)
    assert step.groups[0].by_op["allreduce"][1] == pytest.approx(0.030, abs=1e-9)
    assert step.groups[0].bytes == 4000 and step.exposed_seconds == 0
    stats = tracer.device_stats
    assert stats.recorded == 2 and stats.harvested == 1
    assert tracer.stats["errors"] == 0


def test_a_steps_device_collectives_are_handed_over_by_the_next_step_on_every_rank():
    # two ranks, one device behind the other at the step's end: the same collective still
    # lands in the same step's summary on both
    summaries: dict[str, list[float]] = {}
    for name, runs in (("ahead", [0.5, 0.5, 0.5]), ("behind", [0.001, 0.5, 0.5])):
        cuda = StreamCuda()
        tracer, group = _tracer(NCCL, cuda)
        summaries[name] = []
        for step, run in enumerate(runs):
            tracer.track(NcclWork(cuda, 0.010 * (step + 1)), "allreduce", group, 100)
            cuda.run(run)
            summaries[name].append(round(sum(g.seconds for g in
                                             tracer.take_step().groups.values()), 9))
    assert summaries["ahead"] == summaries["behind"] == [0.0, 0.010, 0.020]


def test_device_collectives_are_sampled_every_nth_per_group():
    cuda = StreamCuda()
    tracer, group = _tracer(NCCL, cuda, device_sample_every=3)
    for _ in range(7):
        tracer.track(NcclWork(cuda, 0.010), "allreduce", group, 100)
    cuda.run(1.0)
    tracer.take_step()  # the issue step
    step = tracer.take_step()
    assert step.groups[0].count == 3  # collectives 0, 3 and 6
    assert tracer.stats["unsampled"] == 4
    assert tracer.device_stats.recorded == 3 * 2  # two events per sampled collective only


def test_events_that_never_complete_are_dropped_and_counted_never_waited_for():
    cuda = StreamCuda()
    tracer, group = _tracer(NCCL, cuda, device_events=8)  # at most 2 pending
    t0 = time.perf_counter()
    for _ in range(10):
        tracer.track(NcclWork(cuda, 0.010), "allreduce", group, 100)
        assert tracer.take_step().collectives == []
    assert time.perf_counter() - t0 < 0.5  # synchronize() would have raised; nothing waits
    assert len(tracer._pending) <= 2
    stats = tracer.device_stats
    assert tracer.stats["device_unread"] == stats.expired >= 1 and stats.exhausted >= 1


def test_gloo_with_cpu_tensors_keeps_the_cpu_clock():
    cuda = StreamCuda()
    tracer, group = _tracer(GLOO, cuda)
    callbacks = []
    work = SimpleNamespace(get_future=lambda: SimpleNamespace(
        add_done_callback=callbacks.append))
    tracer.track(work, "allreduce", group, 8, tensor=SimpleNamespace(is_cuda=False))
    time.sleep(0.01)
    callbacks[0](None)  # gloo completes the future when the collective is done
    assert tracer.take_step().groups[0].seconds >= 0.009
    assert cuda.records == 0


def test_a_cuda_tensor_on_gloo_is_timed_on_the_device():
    cuda = StreamCuda()
    tracer, group = _tracer(GLOO, cuda)
    tracer.track(NcclWork(cuda, 0.004), "broadcast", group, 8, tensor=SimpleNamespace(
        is_cuda=True))
    cuda.run(1.0)
    tracer.take_step()
    assert tracer.take_step().groups[0].seconds == pytest.approx(0.004, abs=1e-9)


def test_a_work_without_a_then_is_counted_not_raised():
    cuda = StreamCuda()
    tracer, group = _tracer(NCCL, cuda)
    assert tracer.track(object(), "allreduce", group, 8) is not None
    assert tracer.stats["errors"] == 1
    assert tracer.device_stats.recorded == 1 and tracer._pending.pool.free == 512


def test_no_device_falls_back_to_the_cpu_clock_once_logged(caplog):
    class NoDevice:
        def Event(self, enable_timing=False):  # noqa: N802 - torch's name
            raise RuntimeError("no CUDA GPUs are available")

    tracer, group = _tracer(NCCL, NoDevice())
    callbacks = []
    work = SimpleNamespace(get_future=lambda: SimpleNamespace(
        add_done_callback=callbacks.append, then=callbacks.append))
    with caplog.at_level(logging.WARNING):
        tracer.track(work, "allreduce", group, 8)
        tracer.track(work, "allreduce", group, 8)
    assert tracer.stats["errors"] == 1 and tracer._device_off
    assert sum("timing events" in r.getMessage() for r in caplog.records) == 1


# ------------------------------------------------------------------ FSDP2's custom comms
class _AllGather:
    pass


class _ReduceScatter:
    pass


def _cuda_tensor(numel: int) -> SimpleNamespace:
    return SimpleNamespace(is_cuda=True, numel=lambda: numel, element_size=lambda: 2)


def test_fsdp2_comms_on_cuda_are_timed_on_the_stream_they_run_on():
    cuda = StreamCuda()
    tracer, group = _tracer(NCCL, cuda)
    timed_ag, timed_rs = _timed_comm_classes(_AllGather, _ReduceScatter)

    def all_gather(out, inp, pg, async_op=False):
        cuda.launch(0.020)  # on the current stream: FSDP2's all-gather stream
        return None

    def reduce_scatter(out, inp, pg, op, async_op=False):
        return NcclWork(cuda, 0.050) if async_op else cuda.launch(0.050)

    ag, rs = timed_ag(all_gather, tracer), timed_rs(reduce_scatter, tracer)
    cuda.launch(0.300)  # the compute stream is busy: not the all-gather's time
    ag_stream, rs_stream = cuda.Stream(), cuda.Stream()
    t0 = time.perf_counter()
    with cuda.stream(ag_stream):
        ag(None, _cuda_tensor(1000), group)
    with cuda.stream(rs_stream):
        rs(None, _cuda_tensor(3000), group, "sum")
        rs(None, _cuda_tensor(3000), group, "sum", async_op=True)
    assert time.perf_counter() - t0 < 0.05  # returned at enqueue
    cuda.run(0.2)
    assert tracer.take_step().collectives == []  # the issue step's: handed over by the next
    step = tracer.take_step()
    assert step.op_seconds("allgather") == pytest.approx(0.020, abs=1e-9)
    assert step.op_seconds("reduce_scatter") == pytest.approx(0.100, abs=1e-9)
    assert step.groups[0].bytes == (wire_bytes("allgather", 2000, 3)
                                    + 2 * wire_bytes("reduce_scatter", 6000, 3))
    assert step.exposed_seconds == 0  # enqueued: the training thread was not blocked


def test_fsdp2_comms_on_cpu_tensors_stay_on_the_cpu_clock():
    tracer, group = _tracer(GLOO, StreamCuda())
    timed_ag, _ = _timed_comm_classes(_AllGather, _ReduceScatter)
    ag = timed_ag(lambda out, inp, pg, async_op=False: time.sleep(0.01), tracer)
    ag(None, SimpleNamespace(is_cuda=False, numel=lambda: 10, element_size=lambda: 4), group)
    step = tracer.take_step()
    assert step.exposed_seconds >= 0.009 and step.op_seconds("allgather") >= 0.009


def test_a_raising_comm_returns_its_event_and_raises_through():
    cuda = StreamCuda()
    tracer, group = _tracer(NCCL, cuda)
    with pytest.raises(ValueError), tracer.timed("allgather", group, 8):
        raise ValueError("the comm's own error")
    assert tracer._pending.pool.free == 512 and len(tracer._pending) == 0


# ---------------------------------------------------------------- the completion hook
class HookGroup:
    def __init__(self, behaviour: str) -> None:
        self.behaviour = behaviour
        self.hooks: list = []

    def _register_on_completion_hook(self, hook) -> None:
        if self.behaviour == "raise":  # NCCL with TORCH_NCCL_ENABLE_TIMING unset
            raise RuntimeError("ProcessGroupNCCL OnCompletion hook requires recording start "
                               "and end events, which require setting TORCH_NCCL_ENABLE_TIMING")
        if self.behaviour == "deprecated":
            warnings.warn("_register_on_completion_hook is deprecated, use the flight "
                          "recorder", FutureWarning, stacklevel=2)
        self.hooks.append(hook)


@pytest.mark.parametrize("behaviour", ["raise", "deprecated"])
def test_completion_hook_refusal_or_deprecation_is_counted_and_logged_once(behaviour, caplog):
    tracer, _ = _tracer(NCCL)
    with caplog.at_level(logging.WARNING), warnings.catch_warnings():
        warnings.simplefilter("error")  # a warning escaping register() would raise here
        results = [NcclCompletionHook(tracer, NCCL).register(HookGroup(behaviour))
                   for _ in range(2)]
    if behaviour == "raise":
        assert results == [False, False] and tracer.stats["unknown_backend"] == 2
    else:
        assert results == [True, True] and tracer.stats["errors"] == 2
    assert len([r for r in caplog.records if "completion hook" in r.getMessage()]) == 1


def test_completion_hook_runs_on_its_own_thread_and_never_raises_into_it():
    import threading

    tracer, _ = _tracer(NCCL)
    hook = NcclCompletionHook(tracer, NCCL)
    thread = threading.Thread(target=hook, args=(SimpleNamespace(),), name="pt_nccl_runhook")
    thread.start()
    thread.join()
    assert tracer.stats["errors"] == 1


# ------------------------------------------------- flight recorder without NCCL timing
def _dump_without_timing() -> str:
    rank = fr_schema.Rank(0, {"0": ("default_pg", [0, 1, 2])})
    for _ in range(3):
        rank.collective("0", "all_reduce", sizes=((1000,),), dtype="Float")
    rank.collective("0", "_allgather_base", sizes=((500,),), dtype="Float")
    now = time.time_ns()
    for entry in rank.entries:  # the watchdog saw completion; nothing timed the start
        entry["time_discovered_completed_ns"] = now
    rank.entries[1]["time_discovered_started_ns"] = 0  # some builds write 0, not null
    return json.dumps(rank.dump())


def test_flight_recorder_entries_without_a_start_are_counted_and_sized_never_timed(caplog):
    tracer, _ = _tracer(NCCL)
    dump = _dump_without_timing()
    assert json.loads(dump)["entries"][0]["time_discovered_started_ns"] is None
    reader = FlightRecorderReader(tracer, dump=lambda: dump)
    with caplog.at_level(logging.WARNING):
        assert reader.poll() == 0
        assert reader.poll() == 0  # each entry once
    assert reader.untimed == 4
    assert reader.untimed_bytes == (3 * wire_bytes("allreduce", 4000, 3)
                                    + wire_bytes("allgather", 2000, 3))
    assert tracer.stats["untimed"] == 4
    assert tracer.take_step().collectives == []  # not 1.7e9 s each
    assert sum("no start time" in r.getMessage() for r in caplog.records) == 1


def test_flight_recorder_duration_ms_or_ordered_times_still_time_an_entry():
    tracer, _ = _tracer(NCCL)
    rank = fr_schema.Rank(0, {"0": ("default_pg", [0, 1, 2])})
    for _ in range(4):
        rank.collective("0", "all_reduce", sizes=((1000,),), dtype="Float")
    e = rank.entries
    e[0].update(time_discovered_started_ns=1_000_000_000,
                time_discovered_completed_ns=1_004_000_000)
    e[1].update(duration_ms=2.5)
    e[2].update(time_discovered_started_ns=2_000_000_000,
                time_discovered_completed_ns=1_000_000_000)  # out of order: untimed
    e[3].update(duration_ms=float("nan"))
    reader = FlightRecorderReader(tracer, dump=lambda: json.dumps(rank.dump()))
    assert reader.poll() == 2 and reader.untimed == 2
    step = tracer.take_step()
    assert step.groups[0].seconds == pytest.approx(0.0065, abs=1e-9)
    assert not any(math.isnan(c.seconds) for c in step.collectives)


def test_attach_says_the_flight_recorder_only_counts_without_nccl_timing():
    tracer, _ = _tracer(NCCL)
    lines = attach(tracer, env={"TORCH_FR_BUFFER_SIZE": "2000"}, groups=[object()])
    tracer._fr_reader.stop()
    assert "counts and sizes only" in lines[0]
