"""Device timing events against a fake torch.cuda with torch's names (no GPU here): pooled,
read in order once completed, never blocking, bounded when the device never completes."""

import math

import pytest
from fake_cuda import FakeCuda

from laggard.integrations.device_events import EventPool, PendingIntervals


def test_an_interval_is_read_once_the_device_has_passed_its_end_never_before():
    cuda = FakeCuda()
    pool = EventPool(cuda, size=4)
    pending = PendingIntervals(pool)
    got: list[float] = []
    start = pool.record()
    cuda.launch(0.030)  # 30 ms of device work; the launch returned at once
    end = pool.record()
    pending.add(start, end, got.append)
    assert pending.harvest() == 0 and got == []  # the device has not run it yet
    cuda.run(0.020)
    assert pending.harvest() == 0
    cuda.run(0.015)
    assert pending.harvest() == 1 and got == [pytest.approx(0.030)]
    assert pool.free == 4 and pool.stats.harvested == 1


def test_intervals_are_read_in_stream_order_and_the_pool_never_allocates():
    cuda = FakeCuda()
    pool = EventPool(cuda, size=6)
    pending = PendingIntervals(pool)
    got: list[float] = []
    for seconds in (0.01, 0.02, 0.03):
        start = pool.record()
        cuda.launch(seconds)
        pending.add(start, pool.record(), got.append)
    assert pool.record() is None and pool.stats.exhausted == 1  # empty: counted, not made
    cuda.run(0.035)
    assert pending.harvest() == 2 and got == [pytest.approx(0.01), pytest.approx(0.02)]
    cuda.run(1.0)
    pending.harvest()
    assert got[2] == pytest.approx(0.03) and len(pending) == 0


def test_a_device_that_never_completes_costs_bounded_memory_and_nan():
    cuda = FakeCuda()
    pool = EventPool(cuda, size=64)
    pending = PendingIntervals(pool, max_pending=3)
    got: list[float] = []
    for _ in range(5):
        start = pool.record()
        cuda.launch(1.0)
        pending.add(start, pool.record(), got.append)
        assert pending.harvest() == 0
    assert len(pending) == 3 and pool.stats.expired == 2
    assert len(got) == 2 and all(math.isnan(v) for v in got)
    # an untimed interval (no event) is NaN at once
    pending.add(None, pool.record(), got.append)
    assert math.isnan(got[-1]) and cuda.queries > 0  # query() only: synchronize() would raise


def test_a_record_or_elapsed_time_that_raises_is_counted_not_raised():
    class Broken(FakeCuda):
        def Event(self, enable_timing: bool = False):  # noqa: N802
            event = super().Event(enable_timing=False)  # elapsed_time will refuse
            return event

    cuda = Broken()
    pool = EventPool(cuda, size=2)
    pending = PendingIntervals(pool)
    got: list[float] = []
    pending.add(pool.record(), pool.record(), got.append)
    cuda.run(1.0)
    assert pending.harvest() == 1 and math.isnan(got[0]) and pool.stats.errors == 1
    with pytest.raises(ValueError):
        EventPool(cuda, size=1)
