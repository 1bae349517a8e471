"""The emulated asynchronous accelerator's semantics (``laggard.demo.emulated_device``): what a
CUDA stream and its timing events do, on threads, with a clock that other work cannot stretch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import pytest
from support import budget

from laggard.demo.emulated_device import EmulatedDevice, schedstat_available
from laggard.integrations.device_events import EventPool, PendingIntervals


def _spin(seconds: float) -> None:
    """Burn ``seconds`` of this thread's CPU time."""
    deadline = time.thread_time() + seconds
    x = 0
    while time.thread_time() < deadline:
        x += 1


@pytest.fixture
def device():
    dev = EmulatedDevice("test")
    yield dev
    dev.close()


def test_torch_names(device: EmulatedDevice) -> None:
    assert device.is_available() and device.device_count() == 1
    stream = device.current_stream()
    assert stream is device.default_stream()
    other = device.Stream()
    with device.stream(other):
        assert device.current_stream() is other
    assert device.current_stream() is stream
    event = device.Event(enable_timing=True)
    assert event.query()  # never recorded: complete, as CUDA
    device.synchronize()


def test_launch_returns_at_once_and_runs_in_order(device: EmulatedDevice) -> None:
    gate = threading.Event()
    order: list[int] = []
    started = time.perf_counter()
    first = device.launch(lambda: (gate.wait(budget(5)), order.append(1)))
    second = device.launch(order.append, 2)
    assert time.perf_counter() - started < 0.5  # launching never waits for the work
    assert not first.done() and not second.done()
    gate.set()
    second.result(timeout=budget(5))
    assert order == [1, 2]


def test_marker_completes_when_the_stream_reaches_it(device: EmulatedDevice) -> None:
    gate = threading.Event()
    start, end = device.Event(enable_timing=True), device.Event(enable_timing=True)
    start.record()
    device.launch(lambda: (gate.wait(budget(5)), _spin(0.05)))
    end.record()
    time.sleep(0.05)
    assert not end.query()  # behind the blocked work: pending, and query() did not block
    with pytest.raises(RuntimeError, match="completed"):
        start.elapsed_time(end)
    gate.set()
    end.synchronize()
    assert end.query()
    # the gate's wait is part of the work item (blocked time counts on the busy clock)
    assert start.elapsed_time(end) >= 40


def test_query_never_blocks(device: EmulatedDevice) -> None:
    gate = threading.Event()
    device.launch(gate.wait, 5)
    event = device.Event(enable_timing=True)
    event.record()
    started = time.perf_counter()
    for _ in range(1000):
        assert not event.query()
    assert time.perf_counter() - started < 0.5
    gate.set()
    event.synchronize()


def test_elapsed_time_refuses(device: EmulatedDevice) -> None:
    plain, timed = device.Event(), device.Event(enable_timing=True)
    with pytest.raises(RuntimeError, match="recorded"):
        timed.elapsed_time(device.Event(enable_timing=True))
    plain.record()
    timed.record()
    device.synchronize()
    with pytest.raises(RuntimeError, match="enable_timing"):
        plain.elapsed_time(timed)
    other = device.Stream()
    there = device.Event(enable_timing=True)
    there.record(other)
    other.synchronize()
    with pytest.raises(RuntimeError, match="different streams"):
        timed.elapsed_time(there)


def test_event_recorded_on_the_stream_thread_takes_its_time_there(device: EmulatedDevice) -> None:
    """As an event recorded inside a DDP hook: its time is where the hook ran, not the end of the
    launched work."""
    start = device.Event(enable_timing=True)
    inside = device.Event(enable_timing=True)
    end = device.Event(enable_timing=True)

    def work() -> None:
        _spin(0.04)
        inside.record()  # on the stream thread: the current stream, now
        assert inside.query()
        _spin(0.04)

    start.record()
    device.launch(work)
    end.record()
    end.synchronize()
    # 40 ms of CPU on each side of it are at least 40 ms of wall time (on a loaded host more,
    # so no upper bound): an event timed at the launch or at the work's end has ~0 on one side
    assert start.elapsed_time(inside) >= 0.95 * 40
    assert inside.elapsed_time(end) >= 0.95 * 40


def test_current_stream_on_the_stream_thread(device: EmulatedDevice) -> None:
    other = device.Stream()
    seen = other.launch(device.current_stream).result(timeout=budget(5))
    assert seen is other


def test_errors_surface_at_the_synchronisation(device: EmulatedDevice) -> None:
    failed = device.launch(lambda: 1 / 0)
    after = device.launch(lambda: 7)
    assert after.result(timeout=budget(5)) == 7  # the stream goes on
    with pytest.raises(ZeroDivisionError):
        failed.result()
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        device.synchronize()  # sticky, as a CUDA error


def test_item_waits_for_everything_launched_before_it(device: EmulatedDevice) -> None:
    torch = pytest.importorskip("torch")
    order: list[str] = []
    loss = device.launch(lambda: (order.append("forward"), torch.tensor(2.5))[1])
    device.launch(lambda: (_spin(0.02), order.append("backward")))
    device.launch(order.append, "optimizer")
    assert loss.item(timeout=budget(5)) == 2.5
    assert order == ["forward", "backward", "optimizer"]


def test_stream_wait_event(device: EmulatedDevice) -> None:
    side = device.Stream()
    gate = threading.Event()
    side.launch(gate.wait, 5)
    ready = side.record_event()
    main = device.current_stream()
    main.wait_event(ready)
    after = device.Event(enable_timing=True)
    after.record()
    time.sleep(0.05)
    assert not after.query()  # the main stream stalls behind the side stream's event
    gate.set()
    after.synchronize()
    assert ready.query()


HOG = "import time\nwhile True: time.thread_time()"


def test_clock_not_stretched_by_busy_sibling_processes() -> None:
    """Four processes spinning on this machine's cores (as other ranks do): wall time of a fixed
    amount of work stretches, the device clock does not."""
    hogs = [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(2 * os.cpu_count())]
    dev = EmulatedDevice("clock")
    try:
        time.sleep(0.2)
        device_ms, wall = _timed_spin(dev, 0.1)
    finally:
        for h in hogs:
            h.kill()
            h.wait()
        dev.close()
    assert device_ms == pytest.approx(100, rel=0.2)
    assert wall > 0.15  # the scheduler shared the cores: wall time stretched


@pytest.mark.parametrize("clock", ["busy", "thread_cpu"])
def test_clock_not_stretched_by_a_busy_sibling_stream(clock: str) -> None:
    """Other streams of the same process each in one long GIL-free op (a big matmul, as another
    device's kernel), on the cores this stream shares: neither clock stretches, while the wall
    time does. (A sibling that takes the GIL often is another matter: see the next test.)"""
    torch = pytest.importorskip("torch")
    dev = EmulatedDevice("clock", clock=clock)
    big = torch.randn(3072, 3072)
    siblings = [dev.Stream() for _ in range(3)]
    # One intra-op thread on every stream thread, as the demo's OMP_NUM_THREADS=1 gives: a
    # thread waiting for its OpenMP team is blocked, which the busy clock would count (OpenMP's
    # thread count is per thread: the test process's setting does not reach new threads).
    for stream in (dev.default_stream(), *siblings):
        stream.launch(torch.set_num_threads, 1).result(timeout=budget(10))
    try:
        for sibling in siblings:
            sibling.launch(torch.mm, big, big)  # ~1 s each on a core of its own here
            sibling.flush()  # launches are batched until a synchronisation
        time.sleep(0.05)
        device_ms, wall = _timed_spin(dev, 0.1, work=lambda: _mm_for(torch, 0.1))
        busy = not all(s.query() for s in siblings)
    finally:
        dev.close()
    if not busy:
        pytest.skip("the siblings finished before the measurement: nothing shared the cores")
    assert device_ms == pytest.approx(100, rel=0.3)
    assert wall > 0.15


def test_thread_cpu_clock_not_stretched_by_a_gil_holding_sibling() -> None:
    """A sibling thread that holds the GIL (pure Python) makes the stream thread *wait* for it:
    the busy clock counts that wait as it counts any block (a known limit: hence the launch
    batching, one Python-busy thread per rank in the demo), the thread_cpu clock does not."""
    dev = EmulatedDevice("clock", clock="thread_cpu")
    stop = threading.Event()

    def hog() -> None:
        while not stop.is_set():
            _spin(0.01)

    hogs = [threading.Thread(target=hog, daemon=True) for _ in range(4)]
    try:
        for h in hogs:
            h.start()
        device_ms, wall = _timed_spin(dev, 0.1)
    finally:
        stop.set()
        for h in hogs:
            h.join()
        dev.close()
    assert device_ms == pytest.approx(100, rel=0.2)
    assert wall > 0.15


def _mm_for(torch, seconds: float) -> None:  # type: ignore[no-untyped-def]
    a, out = torch.randn(96, 96), torch.empty(96, 96)
    deadline = time.thread_time() + seconds
    while time.thread_time() < deadline:
        torch.mm(a, a, out=out)


def _timed_spin(dev: EmulatedDevice, seconds: float, work=None) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    """(device ms, wall seconds) of ``seconds`` of CPU work launched on ``dev``."""
    start, end = dev.Event(enable_timing=True), dev.Event(enable_timing=True)
    start.record()
    wall = time.perf_counter()
    dev.launch(work or (lambda: _spin(seconds)))
    end.record()
    end.synchronize()
    return start.elapsed_time(end), time.perf_counter() - wall


@pytest.mark.skipif(not schedstat_available(), reason="no /proc/thread-self/schedstat")
def test_busy_clock_counts_blocked_waits_thread_cpu_does_not() -> None:
    """A stream blocked in a collective is a stalled device on the busy clock."""
    for clock, expected in (("busy", 100.0), ("thread_cpu", 0.0)):
        dev = EmulatedDevice("wait", clock=clock)
        try:
            start, end = dev.Event(enable_timing=True), dev.Event(enable_timing=True)
            start.record()
            dev.launch(time.sleep, 0.1)
            end.record()
            end.synchronize()
            assert start.elapsed_time(end) == pytest.approx(expected, abs=30), clock
        finally:
            dev.close()


def test_idle_time_is_not_device_time(device: EmulatedDevice) -> None:
    start, end = device.Event(enable_timing=True), device.Event(enable_timing=True)
    start.record()
    time.sleep(0.1)  # the loop is busy elsewhere: the device idles
    end.record()
    end.synchronize()
    assert start.elapsed_time(end) < 10


def test_event_pool_and_pending_intervals_on_the_device(device: EmulatedDevice) -> None:
    """What the monitor does: pooled events at phase boundaries, harvested without blocking."""
    pool = EventPool(device, size=8)
    pending = PendingIntervals(pool)
    seen: list[float] = []
    gate = threading.Event()
    start = pool.record(device.current_stream())
    device.launch(lambda: (gate.wait(budget(5)), _spin(0.03)))
    end = pool.record(device.current_stream())
    pending.add(start, end, seen.append)
    assert pending.harvest() == 0 and seen == []  # still pending: nothing read, nothing waited
    gate.set()
    device.synchronize()
    assert pending.harvest() == 1
    assert seen[0] == pytest.approx(0.03, abs=0.02)
    assert pool.free == 8


def test_rerecord_replaces_the_pending_marker(device: EmulatedDevice) -> None:
    gate = threading.Event()
    event = device.Event(enable_timing=True)
    device.launch(gate.wait, 5)
    event.record()
    event.record()  # re-recorded before the first marker ran: only the last counts
    gate.set()
    event.synchronize()
    assert event.query()


def test_closed_stream_refuses() -> None:
    dev = EmulatedDevice("closed")
    dev.launch(lambda: None).result(timeout=budget(5))
    dev.close()
    with pytest.raises(RuntimeError, match="closed"):
        dev.launch(lambda: None)


def test_unknown_clock() -> None:
    with pytest.raises(ValueError, match="clock"):
        EmulatedDevice(clock="wall")


@pytest.mark.slow
def test_demo_on_the_emulated_device(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A short real ``laggard demo --device emulated-async`` (3 gloo ranks, DDP): the CPU clock
    misses the slowed rank's extra backward work, which runs on its stream thread, and the
    device clock sees it."""
    pytest.importorskip("torch")

    report_path = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, "-m", "laggard.cli", "demo", "--device", "emulated-async",
         "--world-size", "3", "--steps", "60", "--window", "10", "--slow-rank", "1",
         "--slowdown", "1.5", "--report", str(report_path)],
        capture_output=True, text=True, timeout=budget(300), check=False,
        env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "compute on each clock" in proc.stdout
    report = json.loads(report_path.read_text())
    assert report["device"] == "emulated-async"
    cpu = report["clocks"]["cpu"][1]["excess"]
    # the loop only launched: the CPU clock sees no slowdown. One-sided: a rank whose loop waits
    # on its stream can read a little faster than the median on the CPU clock (-0.17 seen in CI)
    assert cpu is not None and cpu < 0.15
    assert report["phase_clock"] == "device"
    device = report["clocks"]["device"][1]["excess"]
    assert device is not None and device > 0.25  # 50% injected


def test_the_monitors_device_clock_on_the_emulated_device(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """What the demo relies on, in one process: phase events recorded from the loop are
    markers, so a device-only delay launched in the backward shows on the device clock and not
    on the CPU clock."""
    torch = pytest.importorskip("torch")
    import torch.distributed as dist

    from laggard.integrations.monitor import TrainingMonitor

    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    dev = EmulatedDevice("monitor")
    model = torch.nn.Linear(8, 8)
    monitor = TrainingMonitor(TrainingMonitor.Config(phase_clock="device", window_steps=4),
                              device=dev, model=model)
    try:
        for _ in range(8):
            with monitor.step():
                with monitor.phase("forward"):
                    loss = dev.launch(lambda: model(torch.ones(4, 8)).sum())
                with monitor.phase("backward"):
                    dev.launch(lambda loss=loss: (loss.result().backward(), _spin(0.01)))
                loss.item(timeout=budget(10))
        # one rank gathers nothing: read what the monitor would gather at step 8 (steps 4-7,
        # one window late)
        dev.synchronize()
        values = monitor.device_clock.window_values(8)
        assert values["compute_device_seconds"] >= 0.009
        assert values["compute_cpu_seconds"] < 0.005
        assert values["device_pending_count"] == 0
    finally:
        monitor.close()
        dev.close()
        dist.destroy_process_group()


def test_report_shows_both_clocks() -> None:
    """The demo report of an emulated run: each rank's compute on the CPU clock and on the
    device clock, device columns read one window late."""
    import argparse

    from laggard.demo.report import build_report, format_report

    args = argparse.Namespace(slow_rank=1, slowdown=1.25, slow_from=20, window=10,
                              compression="none")
    names = ["compute_seconds", "collective_wait_seconds", "compute_cpu_seconds",
             "compute_device_seconds"]

    def row(device: float, cpu: float = 3e-5) -> list[float]:
        return [device, 0.01, cpu, device]

    windows = [{"step": 9, "medians": [row(0.02)] * 3},
               {"step": 19, "medians": [row(0.02)] * 3},
               # describes steps 10-19 (one window late): not slowed yet
               {"step": 29, "medians": [row(0.02), row(0.02), row(0.02)]},
               {"step": 39, "medians": [row(0.02), row(0.025, 3.03e-5), row(0.02)]},
               {"step": 49, "medians": [row(0.02), row(0.025, 2.97e-5), row(0.02)]}]
    result = {"world_size": 3, "steps": 50, "loss": {"first": 5.0, "last": 2.0},
              "stat_names": names, "windows": windows, "findings": [],
              "device": "emulated-async", "phase_clock": "device", "device_clock": "busy"}
    report = build_report(result, args, "http://127.0.0.1:1/metrics")
    assert report["table_from_step"] == 30
    assert report["clocks"]["device"][1]["excess"] == pytest.approx(0.25)
    assert abs(report["clocks"]["cpu"][1]["excess"]) < 0.02
    text = format_report(report)
    assert "compute on each clock" in text and "+25.0%" in text
    cpu_only = build_report({**result, "phase_clock": "thread_cpu", "stat_names": names[:2],
                             "windows": [{**w, "medians": [r[:2] for r in w["medians"]]}
                                         for w in windows]}, args, "http://x/metrics")
    assert cpu_only["clocks"]["device"][1]["excess"] is None
    assert "no device clock" in format_report(cpu_only)
