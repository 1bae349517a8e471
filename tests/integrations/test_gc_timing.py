"""GcTimer on real collections (gc.collect() over real cyclic garbage), and the monitor's GC
phase: another thread's collection is never the training thread's."""

from __future__ import annotations

import gc
import socket
import threading

import pytest

from laggard.integrations.gc_timing import BETWEEN_PHASES, OUTSIDE, GcTimer
from laggard.wire import Heartbeat, StepRecord, decode_datagram


class _Cycle:
    def __init__(self) -> None:
        self.me = self


def _garbage(count: int = 5000) -> None:
    for _ in range(count):
        _Cycle()


@pytest.fixture
def no_automatic_gc():
    """Only the collections the test makes (gc.collect() runs the callbacks regardless)."""
    was = gc.isenabled()
    gc.disable()
    yield
    if was:
        gc.enable()


@pytest.fixture
def timer():
    where = {"phase": "forward"}
    timer = GcTimer(phase_of=lambda: where["phase"]).install()
    timer.where = where  # the test moves the training thread between phases
    yield timer
    timer.remove()


def test_each_collection_of_the_training_thread_is_timed_by_generation_and_phase(
        timer, no_automatic_gc):
    timer.begin_step()
    _garbage()
    assert gc.collect(0) >= 5000  # the cycles really were garbage
    timer.where["phase"] = "backward"
    _garbage()
    gc.collect(1)
    step = timer.take_step()
    assert step.collections == (1, 1, 0) and step.generation == 1
    assert set(step.wall_by_phase) == set(step.cpu_by_phase) == {"forward", "backward"}
    assert step.wall_seconds == pytest.approx(sum(step.wall_by_phase.values()))
    assert step.wall_seconds > 0 and step.cpu_seconds > 0
    assert timer.stats.collections[:2] == [1, 1] and timer.stats.errors == 0
    # the next step starts empty
    assert timer.take_step().collections == (0, 0, 0)


def test_a_collection_on_another_thread_is_not_the_steps(timer, no_automatic_gc):
    timer.begin_step()
    worker = threading.Thread(target=lambda: (_garbage(), gc.collect(2)))
    worker.start()
    worker.join()
    step = timer.take_step()
    assert step.collections == (0, 0, 0) and step.wall_seconds == 0 and step.generation == -1
    assert timer.stats.other_thread_collections == 1
    assert timer.stats.other_thread_seconds > 0


def test_collections_between_steps_are_counted_apart(timer, no_automatic_gc):
    timer.where["phase"] = OUTSIDE
    gc.collect(0)
    assert timer.take_step().collections == (0, 0, 0)
    assert timer.stats.outside_step_collections == 1


def test_without_a_phase_source_every_collection_is_between_phases(no_automatic_gc):
    timer = GcTimer().install()
    try:
        timer.begin_step()
        gc.collect(0)
        assert set(timer.take_step().wall_by_phase) == {BETWEEN_PHASES}
    finally:
        timer.remove()


def test_the_callback_never_raises_and_is_removed_once(no_automatic_gc):
    def broken() -> str:
        raise RuntimeError("phase lookup failed")

    timer = GcTimer(phase_of=broken).install().install()
    assert gc.callbacks.count(timer._callback) == 1
    timer.begin_step()
    gc.collect(0)  # no "Exception ignored in gc callback": counted instead
    assert timer.stats.errors == 1
    timer.remove()
    timer.remove()
    assert timer._callback not in gc.callbacks and not timer.installed


# -------------------------------------------------------------------------- in the monitor
torch = pytest.importorskip("torch")

from laggard.detectors.window import summarize_window  # noqa: E402
from laggard.integrations.monitor import TrainingMonitor  # noqa: E402


def _step_record(sock: socket.socket) -> StepRecord:
    while True:
        item = decode_datagram(sock.recv(65536))
        if not isinstance(item, Heartbeat):
            return item


def _monitor(receiver, **config) -> TrainingMonitor:
    return TrainingMonitor(TrainingMonitor.Config(
        agent_address=f"127.0.0.1:{receiver.getsockname()[1]}", detect=False,
        heartbeat_seconds=0, hang_store_seconds=0, **config), rank=1, world_size=4)


@pytest.mark.parametrize("clock", ["wall", "thread_cpu"])
def test_a_collection_in_forward_leaves_forward_for_the_gc_phase(receiver, no_automatic_gc,
                                                                clock):
    monitor = _monitor(receiver, phase_clock=clock)
    with monitor.step():
        with monitor.phase("forward"):
            _garbage(20000)
            gc.collect(1)
        with monitor.phase("backward"):
            pass
    record = _step_record(receiver)
    monitor.close()
    assert record.phases["gc"] > 0 and record.phases["forward"] >= 0
    assert monitor.stats.gc.collections[1] == 1
    # the step's window columns: the pause and the generation
    window = summarize_window(monitor._table.values[:, :1])
    assert window["gc_seconds"] == pytest.approx(record.phases["gc"])
    assert window["gc_generation"] == 1
    assert window["compute_seconds"] == pytest.approx(
        record.phases["forward"] + record.phases["backward"] + record.phases["gc"])
    assert all(getattr(cb, "__self__", None) is not monitor._gc for cb in gc.callbacks)


def test_another_threads_collection_is_never_taken_out_of_a_phase(receiver, no_automatic_gc):
    monitor = _monitor(receiver, phase_clock="wall")
    with monitor.step():
        with monitor.phase("forward"):
            worker = threading.Thread(target=lambda: (_garbage(20000), gc.collect(2)))
            worker.start()
            worker.join()  # the training thread waits: its forward, not its GC
    record = _step_record(receiver)
    monitor.close()
    assert "gc" not in record.phases
    assert monitor.stats.gc.other_thread_collections == 1
    assert monitor.stats.gc.collections == [0, 0, 0]


def test_gc_timing_off_leaves_gc_callbacks_alone(receiver):
    before = list(gc.callbacks)
    monitor = _monitor(receiver, gc_timing=False)
    assert gc.callbacks == before and monitor.stats.gc is None
    with monitor.step():
        with monitor.phase("forward"):
            gc.collect(0)
    assert "gc" not in _step_record(receiver).phases
    monitor.close()


def test_a_monitor_dropped_without_close_leaves_gc_callbacks(receiver):
    before = len(gc.callbacks)
    monitor = _monitor(receiver)
    assert len(gc.callbacks) == before + 1
    monitor._agent.sock.close()
    del monitor
    gc.collect()
    assert len(gc.callbacks) == before
