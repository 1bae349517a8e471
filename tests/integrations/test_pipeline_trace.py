"""Pipeline send/recv timing: ``instrument_pipeline`` on a real 2-rank gloo pipeline
(``PipelineStage`` + ``Schedule1F1B``), and its bad-input paths without a job."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from types import SimpleNamespace

import pytest
from support import torchrun

torch = pytest.importorskip("torch")

from laggard.integrations import pipeline_trace  # noqa: E402
from laggard.integrations.phases import step_times  # noqa: E402
from laggard.integrations.trace_records import TraceStep  # noqa: E402
from laggard.integrations.tracer import CollectiveTracer  # noqa: E402

HERE = Path(__file__).parent
MICROBATCHES, DELAY = 4, 0.02  # pipeline_trace_worker.py's


@pytest.fixture(scope="module")
def pipeline_job(tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("pipeline")
    proc = torchrun(HERE / "pipeline_trace_worker.py", 2, str(out), timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


@pytest.mark.slow
def test_instrumenting_is_idempotent_undoable_and_leaves_the_loss_bitwise_unchanged(
        pipeline_job):
    for rank in pipeline_job:
        assert rank["installed"] and rank["again_installed"]
        assert rank["wrapped_once"]  # the second call did not wrap the wrapper
        assert rank["undone"] and rank["restored"]
        assert rank["traced"] == rank["baseline"]
        assert rank["monitor_errors"] == 0
        assert rank["stats"]["errors"] == 0 and rank["stats"]["p2p_unmapped"] == 0
    assert len(pipeline_job[1]["traced"]) == 6 * MICROBATCHES  # one loss per microbatch


@pytest.mark.slow
def test_every_send_and_receive_is_traced_per_peer(pipeline_job):
    for rank in pipeline_job:
        peer = 1 - rank["rank"]
        for step in rank["steps"][1:]:  # step 0 includes the stages' shape inference
            ops = step["ops"]
            # 1F1B: each microbatch's activation forward, its gradient back
            assert ops["send"][0] == MICROBATCHES and ops["recv"][0] == MICROBATCHES
            assert ops["send"][2] > 0 and ops["recv"][2] > 0
            assert step["p2p_seconds"] > 0
            # kept out of the collectives: nothing else ran in the pipeline group
            assert step["total"] == 0 and step["group_seconds"] == 0
        pairs = {(key, p): (issued, completed) for key, p, issued, completed, _ in
                 rank["progress"] if p is not None}
        assert len(pairs) == 1
        (_, p), (issued, completed) = next(iter(pairs.items()))
        assert p == peer and issued == completed == 6 * 2 * MICROBATCHES
        # gloo's P2P works have no future: completed when waited for
        assert rank["stats"]["futureless"] == 6 * 2 * MICROBATCHES


@pytest.mark.slow
def test_the_stage_waiting_for_its_slow_peer_records_the_exposed_wait(pipeline_job):
    stage0, stage1 = pipeline_job
    for step in stage1["steps"][1:]:
        # stage 1 waits for every activation of the sleeping stage 0
        assert step["p2p_wait"] >= 0.8 * MICROBATCHES * DELAY
        assert set(step["by_peer"]) == {"0"}
        assert step["by_peer"]["0"] == pytest.approx(step["p2p_wait"])
    waits = [s["p2p_wait"] for s in stage0["steps"][1:]]
    assert max(waits) < 0.8 * MICROBATCHES * DELAY  # stage 0 is the one waited for
    for window in stage1["windows"]:
        wait, compute, step = (window[n][1] for n in
                               ("p2p_wait_seconds", "compute_seconds", "step_seconds"))
        assert wait >= 0.8 * MICROBATCHES * DELAY
        # on the wall clock the wait comes off compute
        assert compute <= step - 0.8 * wait
        assert window["p2p_wait_seconds"][0] < wait


# ---------------------------------------------------------------------- without a job
class _Work:
    def __init__(self) -> None:
        self.waited = 0
        self.done = False

    def get_future(self):
        raise RuntimeError("Work::getFuture not implemented.")

    def wait(self) -> bool:
        self.waited += 1
        self.done = True
        return True

    def is_completed(self) -> bool:
        return self.done


def _tracer_with_group() -> tuple[CollectiveTracer, object]:
    """A tracer watching one fake group (no process group needed)."""
    from laggard.integrations.trace_records import GroupInfo

    tracer = CollectiveTracer(groups=[])
    group = object()
    info = GroupInfo(index=0, name="1", backend="gloo", ranks=(0, 1), desc="pp")
    tracer.groups.append(info)
    tracer._by_id[id(group)] = info
    tracer._keep.append(group)
    return tracer, group


def test_plain_isend_irecv_works_without_a_future_complete_when_waited_for():
    tracer, group = _tracer_with_group()
    send, recv = _Work(), _Work()
    tracer.track(send, "send", group, 64, peer=1)
    tracer.track(recv, "recv", group, 64, peer=1)
    assert tracer.wait(recv) is True and recv.waited == 1
    send.done = True  # completed without a wait: seen by take_step
    step = tracer.take_step()
    assert step.groups[0].by_op["send"][0] == 1 and step.groups[0].by_op["recv"][0] == 1
    assert step.groups[0].seconds == 0.0 and step.total_seconds == 0.0
    assert set(step.p2p_wait_by_peer) == {1} and step.p2p_wait_seconds >= 0
    assert tracer.stats["futureless"] == 2 and tracer.stats["errors"] == 0
    (pair,) = [p for p in tracer.progress() if p.peer == 1]
    assert (pair.issued, pair.completed) == (2, 2)


def test_a_wait_that_raises_passes_through_and_is_still_recorded():
    tracer, group = _tracer_with_group()
    work = _Work()
    work.wait = lambda: (_ for _ in ()).throw(RuntimeError("peer gone"))  # type: ignore
    tracer.track(work, "recv", group, 8, peer=1)
    with pytest.raises(RuntimeError, match="peer gone"):
        tracer.wait(work)
    assert 1 in tracer.take_step().p2p_wait_by_peer


def test_a_torch_without_the_schedules_functions_is_counted_and_logged_once(monkeypatch, caplog):
    from torch.distributed.pipelining import schedules

    monkeypatch.delattr(schedules, "_wait_batch_p2p")
    tracer = CollectiveTracer(groups=[])
    with caplog.at_level(logging.WARNING):
        first = pipeline_trace.instrument_pipeline(tracer)
        second = pipeline_trace.instrument_pipeline(tracer)
    assert not first and not second and not first.undo()
    assert tracer.stats["errors"] == 2
    assert sum("_wait_batch_p2p" in r.getMessage() for r in caplog.records) == 1


def test_a_batch_the_wrapper_cannot_read_is_issued_untraced_and_counted():
    tracer, group = _tracer_with_group()
    works = [_Work(), _Work()]
    odd = [SimpleNamespace(op=print, tensor=torch.zeros(2), group=group, peer=1)]
    assert pipeline_trace.track_p2p_ops(tracer, odd, works[:1]) == 0
    ops = [SimpleNamespace(op=torch.distributed.isend, tensor=torch.zeros(4), group=group,
                           peer=1)] * 3
    assert pipeline_trace.track_p2p_ops(tracer, ops, works) == 0  # 3 ops, 2 works
    assert tracer.stats["p2p_unmapped"] == 2 and tracer.in_flight == 0
    # a coalesced batch (one work): one recv of the summed bytes, the shared peer
    recv = SimpleNamespace(op=torch.distributed.irecv, tensor=torch.zeros(4), group=group,
                           peer=1)
    assert pipeline_trace.track_p2p_ops(tracer, [ops[0], recv], works[:1]) == 1
    tracer.wait(works[0])
    step = tracer.take_step()
    assert step.groups[0].by_op["recv"][2] == 32 and step.p2p_wait_by_peer.keys() == {1}


def test_instrument_and_undo_around_a_fake_schedule_call():
    from torch.distributed.pipelining import schedules

    tracer, group = _tracer_with_group()
    handle = pipeline_trace.instrument_pipeline(tracer)
    try:
        assert handle and schedules._batch_p2p._laggard_tracer is tracer
        other = CollectiveTracer(groups=[])
        replaced = pipeline_trace.instrument_pipeline(other)
        assert replaced and not handle  # the new tracer's wrappers replaced these
        assert schedules._batch_p2p.__wrapped__ is handle._wrappers[0].__wrapped__
        assert replaced.undo() and not handle.undo()
        assert not hasattr(schedules._batch_p2p, "_laggard_tracer")
    finally:
        replaced.undo()
        handle.undo()


def test_the_exposed_p2p_wait_comes_off_compute_on_the_wall_clock_only():
    step = TraceStep(p2p_wait_seconds=0.3)
    wall = step_times([("forward_backward", 0.0, 1.0)], step_seconds=1.2, collectives=step,
                      p2p_wait_seconds=step.p2p_wait_seconds)
    assert wall.compute_seconds == pytest.approx(0.7)
    assert wall.columns()["p2p_wait_seconds"] == pytest.approx(0.3)
    cpu = step_times([("forward_backward", 0.0, 0.6)], step_seconds=1.2, collectives=step,
                     p2p_wait_seconds=0.3, wall_clock=False)
    assert cpu.compute_seconds == pytest.approx(0.6)  # a thread's CPU clock stood still
    bad = step_times([], step_seconds=1.0, p2p_wait_seconds=float("nan"))
    assert bad.p2p_wait_seconds == 0.0 and bad.compute_seconds == 1.0
