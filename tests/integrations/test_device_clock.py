"""The monitor's device clock against a fake torch.cuda with torch's names (no GPU here): pooled
events per phase boundary, read without blocking, one window late; DDP bucket-ready markers and
sampled collective events in CommTimer; FSDP2 stall markers; bad input falls back to the CPU
clock, counted and logged once."""

from __future__ import annotations

import logging
import math
import time

import numpy as np
import pytest
from fake_cuda import FakeCuda
from support import budget

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

from laggard.integrations import device_discovery  # noqa: E402
from laggard.integrations.comm_timing import CommTimer  # noqa: E402
from laggard.integrations.device_clock import DeviceClock  # noqa: E402
from laggard.integrations.monitor import TrainingMonitor  # noqa: E402
from laggard.integrations.phases import STALL_END, STALL_START, SYNC_END, step_times  # noqa: E402

K = 4


class CountingCuda(FakeCuda):
    """The fake, counting every call the code under test makes on it by name."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: dict[str, int] = {}

    def __getattribute__(self, name: str):  # noqa: ANN204
        if not name.startswith("_") and name not in ("calls", "now", "records", "queries"):
            calls = self.__dict__.get("calls")
            if calls is not None:
                calls[name] = calls.get(name, 0) + 1
        return object.__getattribute__(self, name)


@pytest.fixture
def one_rank_group():
    """A one-rank gloo group in this process, so the monitor gathers windows for real."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _device_monitor(fake, **kwargs) -> TrainingMonitor:
    # every window analysed before the next step: these tests read monitor.windows at once
    config = TrainingMonitor.Config(agent_address="", window_steps=K, phase_clock="device",
                                    analysis_thread=False, **kwargs.pop("config", {}))
    monitor = TrainingMonitor(config, device=fake, **kwargs)
    monitor._detect = True  # a one-rank job gathers nothing by default; these tests want to
    return monitor


def _step(monitor: TrainingMonitor, fake, forward: float, backward: float,
          run: float | None = None) -> None:
    with monitor.step():
        with monitor.phase("forward"):
            fake.launch(forward)  # device work: the launch returns at once
        with monitor.phase("backward"):
            fake.launch(backward)
    if run is not None:
        fake.run(run)


def test_phase_events_are_pooled_and_the_device_columns_arrive_one_window_late(one_rank_group):
    fake = FakeCuda()
    monitor = _device_monitor(fake)
    assert monitor.phase_clock == "device"
    clock = monitor.device_clock
    size = clock.pool.size
    made = fake.records
    for _ in range(3 * K):
        _step(monitor, fake, 0.030, 0.050, run=1.0)
    assert fake.records - made == 4 * 3 * K  # one event per phase boundary, nothing else
    assert clock.pool.free == size - 4  # the last step is read at the next step's end
    clock.harvest()
    assert clock.pool.free == size  # every event back in the pool: none made on the hot path
    first, second, third = monitor.windows
    assert math.isnan(first["compute_device_seconds"][0])  # nothing before the first window
    for record in (second, third):  # window w carries window w-1's device medians
        assert record["compute_device_seconds"][0] == pytest.approx(0.080)
        assert record["compute_seconds"][0] == pytest.approx(0.080)  # max(device, cpu)
        assert record["compute_cpu_seconds"][0] < 0.01  # the CPU only launched
        assert record["device_pending_count"][0] == 0
    assert clock.stats.steps_read == 3 * K and monitor.stats.internal_errors == 0
    monitor.close()


def test_events_pending_for_a_whole_window_never_block_the_loop(one_rank_group):
    """Every event stays pending (the device is a second behind per step): the loop's steps
    take no longer, only record/query were called (synchronize would raise), and the window's
    device columns are NaN and counted."""
    fake = CountingCuda()
    monitor = _device_monitor(fake)
    walls = []
    for _ in range(2 * K):
        start = time.perf_counter()
        _step(monitor, fake, 1.0, 1.0)  # never run: pending forever
        walls.append(time.perf_counter() - start)
    assert max(walls) < 0.05  # 2 s of device work per step enqueued, nothing waited for it
    record = monitor.windows[-1]
    assert math.isnan(record["compute_device_seconds"][0])
    assert math.isnan(record["collective_wait_device_seconds"][0])
    assert record["device_pending_count"][0] == K and monitor.stats.device_pending == K
    assert record["compute_seconds"][0] == pytest.approx(record["compute_cpu_seconds"][0])
    assert "synchronize" not in fake.calls
    assert set(fake.calls) <= {"Event", "current_stream", "launch"}  # events: record/query
    assert fake.queries > 0 and monitor.stats.internal_errors == 0
    # the device catches up later: window 0's steps are read and discarded as late, window
    # 1's (not gathered yet) in time
    fake.run(100.0)
    monitor.device_clock.harvest()
    assert monitor.device_clock.stats.steps_late == K
    assert monitor.device_clock.stats.steps_read == K
    monitor.close()


def test_a_user_switched_stream_falls_back_to_the_cpu_clock_counted_and_logged_once(
        one_rank_group, caplog):
    fake = FakeCuda()
    monitor = _device_monitor(fake)
    side = fake.Stream()
    with caplog.at_level(logging.WARNING, logger="laggard.integrations.monitor"):
        for _ in range(2 * K):
            with monitor.step():
                with monitor.phase("forward"):
                    fake.launch(0.030)
                with fake.stream(side):
                    with monitor.phase("backward"):
                        fake.launch(0.050, side)
            fake.run(1.0)
    stats = monitor.device_clock.stats
    assert stats.stream_switches == 2 * K and monitor.stats.device_fallbacks == 2 * K
    assert sum("stream other than" in r.getMessage() for r in caplog.records) == 1
    record = monitor.windows[-1]
    assert math.isnan(record["compute_device_seconds"][0])
    assert record["compute_seconds"][0] == pytest.approx(record["compute_cpu_seconds"][0])
    monitor.device_clock.harvest()
    assert monitor.device_clock.pool.free == monitor.device_clock.pool.size
    monitor.close()


def test_an_empty_pool_leaves_steps_untimed_counted_not_allocated():
    fake = FakeCuda()
    clock = DeviceClock(fake, window_steps=K, pool_events=4)
    cpu = step_times([("forward", 0.0, 0.001), ("backward", 0.001, 0.002)], step_seconds=0.002)
    for step in range(3):
        clock.begin_step()
        for name in ("forward", "backward"):
            clock.phase_mark("start", name)
            fake.launch(1.0)
            clock.phase_mark("end", name)
        clock.end_step(step, cpu)  # the device never runs: the first step holds all 4 events
    assert clock.stats.untimed_steps == 2 and clock.stats.events.exhausted == 8
    assert fake.records == 4


def test_ddp_bucket_ready_markers_give_the_exposed_wait_on_the_device(one_rank_group):
    fake = FakeCuda()
    timer = CommTimer(device_sample_every=1)
    monitor = _device_monitor(fake, comm_timer=timer)
    futures = []
    for _ in range(2 * K):
        with monitor.step():
            with monitor.phase("forward"):
                fake.launch(0.030)
            with monitor.phase("backward"):
                for _ in range(3):  # three buckets, each ready after 10 ms of backward
                    fake.launch(0.010)
                    fut = torch.futures.Future()
                    futures.append(fut)
                    timer.track(fut, 1024)
                fake.launch(0.020)  # the compute stream waits 20 ms for the last collective
                for fut in futures:
                    fut.set_result([torch.zeros(1)])
                futures.clear()
        fake.run(1.0)
    record = monitor.windows[-1]
    assert record["compute_device_seconds"][0] == pytest.approx(0.060)
    assert record["collective_wait_device_seconds"][0] == pytest.approx(0.020)
    assert record["collective_wait_seconds"][0] == pytest.approx(0.020)  # detector's wait
    # one ready event per step (re-recorded per bucket) + 4 phase events; sampled collectives
    # add two per bucket; each step's harvest reads the earlier steps' collectives
    step = timer.take_step()
    assert [c.bytes for c in step.device_collectives] == [1024] * 3
    # the fake has no NCCL stream: launch to the callback's event spans the later launches
    assert all(0.0 <= c.seconds < 0.1 for c in step.device_collectives)
    assert monitor.device_clock.stats.steps_read == 2 * K - 1  # the last: at the next step
    monitor.close()


def test_sampled_collectives_on_nccl_like_futures_are_timed_on_the_device():
    """An NCCL-like future: done at enqueue (so the CPU's launch-to-completion is a launch
    latency), its then() callback running with a current stream made to wait for the NCCL
    stream. The events recorded at launch and in the callback give the collective's 20 ms on
    the device, on the sampled steps only."""
    fake = FakeCuda()
    clock = DeviceClock(fake, window_steps=K)
    timer = CommTimer(device_sample_every=2)
    timer.attach_device_clock(clock)
    nccl = fake.Stream()
    cpu_seconds, device = [], []
    for _ in range(4):
        fake.launch(0.010)  # backward compute before the bucket is ready
        fut = torch.futures.Future()
        wrapped = timer.track(fut, 4096)
        ready = fake.Event(enable_timing=True)
        ready.record()
        nccl.wait_event(ready)  # NCCL's stream waits for the compute stream...
        fake.launch(0.020, nccl)  # ...and runs the all-reduce
        done = fake.Event(enable_timing=True)
        done.record(nccl)
        fake.current_stream().wait_event(done)  # the callback's current stream waits for it
        fut.set_result([torch.zeros(1)])  # done at enqueue
        assert wrapped.done()
        step = timer.take_step()
        cpu_seconds += [c.seconds for c in step.collectives]
        device += [c.seconds for c in step.device_collectives]
        fake.run(1.0)
    device += [c.seconds for c in timer.take_step().device_collectives]
    assert min(cpu_seconds) < 0.005  # the CPU saw the launch only (min: a loaded host)
    assert device == [pytest.approx(0.020), pytest.approx(0.020)]  # steps 0 and 2 sampled


def test_no_sync_steps_and_a_second_model_timer(one_rank_group):
    fake = FakeCuda()
    first, second = CommTimer(device_sample_every=0), CommTimer(device_sample_every=0)
    monitor = _device_monitor(fake, comm_timer=first)
    second.attach_device_clock(monitor.device_clock)
    for step in range(2 * K):
        with monitor.step():
            with monitor.phase("forward"):
                fake.launch(0.030)
            with monitor.phase("backward"):
                if step % 2 == 0:  # no_sync(): no hook fires, everything is compute
                    fake.launch(0.050)
                else:
                    fake.launch(0.020)
                    first.bucket_ready()
                    fake.launch(0.010)
                    second.bucket_ready()  # the later model's bucket is the last
                    fake.launch(0.020)
        fake.run(1.0)
    record = monitor.windows[-1]
    # medians of 0.08 (no_sync) and 0.06 (0.02 waited after the last bucket of either model)
    assert record["compute_device_seconds"][0] == pytest.approx(0.070)
    assert record["collective_wait_device_seconds"][0] == pytest.approx(0.010)
    monitor.close()


def test_ddp_buffer_broadcast_is_marked_as_a_wait_in_forward(one_rank_group):
    fake = FakeCuda()
    timer = CommTimer()
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    ddp.register_comm_hook(timer, __import__(
        "laggard.integrations.comm_timing", fromlist=["x"]).allreduce_timing_hook)
    monitor = _device_monitor(fake, comm_timer=timer)
    timer.watch_buffers(ddp)
    marks: list[str] = []
    original = monitor.device_clock.mark
    monitor.device_clock.mark = lambda kind, name="": (marks.append(kind), original(kind, name))[1]
    with monitor.step():
        with monitor.phase("forward"):
            loss = ddp(torch.randn(8, 4)).sum()
        with monitor.phase("backward"):
            loss.backward()
    assert SYNC_END in marks
    monitor.close()


def test_fsdp2_stall_markers_wrap_the_wait_points_and_come_out_at_close(one_rank_group):
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.fsdp._fully_shard import _fsdp_param_group as pg

    original = pg.FSDPParamGroup.post_backward
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2))
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    fake = FakeCuda()
    monitor = _device_monitor(fake)
    markers = monitor._fsdp_markers
    assert markers is not None and len(markers.installed) == 4 and not markers.missing
    kinds: list[tuple[str, str]] = []
    clock = monitor.device_clock
    mark = clock.mark
    clock.mark = lambda kind, name="": (kinds.append((kind, name)), mark(kind, name))[1]
    for _ in range(2 * K):
        with monitor.step():
            with monitor.phase("forward"):
                loss = model(torch.randn(4, 8)).sum()
            with monitor.phase("backward"):
                loss.backward()
        fake.run(1.0)
    assert (STALL_START, "post_backward") in kinds and (STALL_END, "post_backward") in kinds
    assert monitor.windows[-1]["collective_wait_device_seconds"][0] == 0.0  # the fake waits 0
    assert clock.stats.steps_read == 2 * K and monitor.stats.internal_errors == 0
    monitor.close()
    assert pg.FSDPParamGroup.post_backward is original


def test_refusals_fall_back_to_the_wall_clock_counted_and_logged_once(monkeypatch, caplog):
    config = TrainingMonitor.Config(agent_address="", detect=False, phase_clock="device")
    # no CUDA on this machine and no device module given
    with caplog.at_level(logging.WARNING, logger="laggard.integrations.monitor"):
        monitor = TrainingMonitor(config)
    assert monitor.phase_clock == "wall" and monitor.stats.device_fallbacks == 1
    assert "no CUDA device" in caplog.text
    # a model on several devices
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2, device="meta"))
    monitor = TrainingMonitor(config, device=FakeCuda(), model=model)
    assert monitor.phase_clock == "wall" and monitor.stats.device_fallbacks == 1
    # a backend neither NCCL nor gloo

    class OtherDist:
        def get_rank(self):
            return 0

        def get_world_size(self):
            return 1

        def get_backend(self, group=None):
            return "mpi"

    monkeypatch.setattr(device_discovery, "initialized_dist", lambda: OtherDist())
    monitor = TrainingMonitor(config, device=FakeCuda())
    assert monitor.phase_clock == "wall" and monitor.stats.device_fallbacks == 1
    # an Event that cannot be made (no driver)

    class NoDriver(FakeCuda):
        def Event(self, enable_timing=False):  # noqa: N802
            raise RuntimeError("CUDA driver initialization failed")

    monkeypatch.setattr(device_discovery, "initialized_dist", lambda: None)
    monitor = TrainingMonitor(config, device=NoDriver())
    assert monitor.phase_clock == "wall" and monitor.stats.device_fallbacks == 1
    with monitor.step():
        with monitor.phase("forward"):
            pass
    assert monitor.stats.internal_errors == 0


def test_auto_is_device_for_a_cuda_job_and_wall_otherwise():
    config = TrainingMonitor.Config(agent_address="", detect=False)
    assert config.phase_clock == "auto"
    assert TrainingMonitor(config).phase_clock == "wall"  # CPU job: torch.cuda not initialised
    cpu_model = torch.nn.Linear(2, 2)
    assert TrainingMonitor(config, model=cpu_model).phase_clock == "wall"
    assert TrainingMonitor(config, device=FakeCuda()).phase_clock == "device"
    assert TrainingMonitor(TrainingMonitor.Config(
        agent_address="", detect=False, phase_clock="thread_cpu"),
        device=FakeCuda()).phase_clock == "thread_cpu"
    with pytest.raises(ValueError, match="phase_clock"):
        TrainingMonitor.Config(phase_clock="gpu")


def test_the_device_clocks_median_is_over_read_steps_only():
    """A window with some steps read and some pending: the read ones give the device median,
    the pending ones keep their CPU times and are counted."""
    fake = FakeCuda()
    clock = DeviceClock(fake, window_steps=K)
    cpu = step_times([("forward", 0.0, 0.001)], step_seconds=0.001)
    for step in range(K):
        clock.begin_step()
        clock.phase_mark("start", "forward")
        fake.launch(0.010 * (step + 1))
        clock.phase_mark("end", "forward")
        clock.end_step(step, cpu)
        if step < 2:
            fake.run(0.010 * (step + 1))  # the device keeps up with the first two steps only
    assert np.isnan(clock.window_values(K - 1)["compute_device_seconds"])  # window 0: nothing
    values = clock.window_values(2 * K - 1)
    assert values["compute_device_seconds"] == pytest.approx(0.015)  # median of 0.01, 0.02
    assert values["device_pending_count"] == 2 and clock.stats.steps_pending == 2


def _run_job(tmp_path, clock: str) -> tuple[list[dict], list[dict]]:
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    here = Path(__file__).resolve().parent
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "3",
         str(here / "device_clock_worker.py"), str(tmp_path), clock],
        env=env, capture_output=True, text=True, timeout=budget(240))
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}-{clock}.json").read_text()) for r in range(3)]
    windows = [json.loads(line) for line in
               (tmp_path / f"windows-{clock}.jsonl").read_text().splitlines()]
    return ranks, windows


@pytest.mark.slow
def test_a_cpu_clock_misses_a_device_only_delay_that_the_device_clock_names(tmp_path):
    """A real 3-rank gloo DDP job on fake real-time devices: rank 2's forward enqueues 50 ms of
    device work its CPU never waits for, and every rank's collectives wait for it (as NCCL's
    stream order makes them on a GPU). The wall clock sees equal compute on every rank and
    names no one; the device clock names rank 2, cause compute, and rank 2 waits least on the
    device timeline (the arrived-last rule on device times)."""
    from laggard.detectors.window import WindowRecord

    wall_ranks, wall_windows = _run_job(tmp_path, "wall")
    def named(findings: list[dict]) -> set[tuple[int, str]]:
        # rank findings only: a whole-job slowdown (this machine's load) names no rank
        return {(f["rank"], f["kind"]) for f in findings
                if f["detector"] == "straggler" and f.get("rank") is not None}

    # The wall clock does not see rank 2's device-only delay. (On a loaded host, rank 0, which
    # also runs the window's analysis on its training thread, has been named once at load 12:
    # that is the host, not the injection, so only rank 2 is asserted here.)
    assert wall_ranks[0]["phase_clock"] == "wall"
    assert not {r for r, _ in named(wall_ranks[0]["findings"])} & {2}
    ranks, windows = _run_job(tmp_path, "device")
    delay = ranks[2]["delay"]
    assert all(r["phase_clock"] == "device" for r in ranks)
    assert all(r["stats"] == {"device_pending": 0, "device_fallbacks": 0, "internal_errors": 0}
               for r in ranks)
    assert named(ranks[0]["findings"]) == {(2, "compute")}
    for doc in windows[1:]:  # the first window has no device columns (one window late)
        record = WindowRecord.from_saved(doc)
        device, cpu = record["compute_seconds"], record["compute_cpu_seconds"]
        assert device[2] - np.median(device[:2]) > 0.8 * delay
        assert abs(cpu[2] - np.median(cpu[:2])) < 0.2 * delay  # the CPU clock misses it
        wait = record["collective_wait_device_seconds"]
        assert wait[2] < wait[:2].min() - 0.5 * delay  # the others waited for rank 2
    for doc in wall_windows[1:]:
        compute = WindowRecord.from_saved(doc)["compute_seconds"]
        assert abs(compute[2] - np.median(compute[:2])) < 0.2 * delay


def test_the_blame_sums_on_the_device_clock_are_the_device_waits_and_work():
    """A GPU's collective waits are on its stream: the blame sums of the late table are taken
    from its rows (one step waited 100 ms for a peer's stall, another step's own work 50 ms
    over), not from the CPU's launch times."""
    from laggard.detectors.window import DEVICE_CLOCK_COLUMNS
    from laggard.integrations.device_clock import DEVICE_BLAME_COLUMNS, _device_blame

    steps = 10
    slot = np.full((len(DEVICE_CLOCK_COLUMNS), steps), np.nan)
    row = {name: i for i, name in enumerate(DEVICE_CLOCK_COLUMNS)}
    slot[row["compute_seconds"]] = 0.020
    slot[row["data_seconds"]] = 0.001
    slot[row["collective_wait_seconds"]] = 0.005
    slot[row["collective_wait_seconds"], 3] = 0.105
    slot[row["compute_seconds"], 7] = 0.070
    values = _device_blame(slot)
    assert set(values) == set(DEVICE_BLAME_COLUMNS)
    assert values["wait_sum_seconds"] == pytest.approx(0.150)
    assert values["wait_spike_count"] == 1 and values["wait_spike_seconds"] == pytest.approx(0.1)
    assert values["work_spike_count"] == 1 and values["work_spike_seconds"] == pytest.approx(0.05)
