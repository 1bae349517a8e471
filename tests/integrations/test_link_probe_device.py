"""The link probe over the job's data path (issue 27, item 4): on NCCL a CUDA tensor over the
default group, timed by events and read one window late, against a fake ``torch.distributed``
and a fake ``torch.cuda``; the choice of path. The gloo path runs on real gloo in
tests/integrations/test_tracer.py (``test_link_probe_round_trip_is_measured_on_every_rank``)."""

from __future__ import annotations

import logging
import math
import time

import pytest

torch = pytest.importorskip("torch")

from nccl_fakes import P2pDist, StreamCuda  # noqa: E402

from laggard.integrations.link_probe import (  # noqa: E402
    PROBE_COLUMN,
    REPEATS,
    LinkProbe,
    LinkProbeParticipant,
    ProbePath,
    probe_path,
)
from laggard.integrations.participants import MonitorContext  # noqa: E402


def test_on_a_device_the_round_trip_is_the_events_not_the_launch_and_a_window_late():
    cuda = StreamCuda()
    dist = P2pDist(cuda, round_trips=[0.004, 0.003, 0.009, 0.008, 0.1, 0.1],
                    cpu_seconds=0.005)
    probe = LinkProbe(None, 0, 3, 1024, device=cuda, dist=dist)
    t0 = time.perf_counter()
    assert math.isnan(probe.run())  # window 1: enqueued, nothing read yet, nothing waited for
    assert time.perf_counter() - t0 < 0.5
    cuda.run(1.0)
    # window 2 reports window 1's fastest round trip; the 5 ms CPU launches are not in it
    assert probe.run() == pytest.approx(0.003, abs=1e-9)
    cuda.run(1.0)
    assert probe.run() == pytest.approx(0.008, abs=1e-9)
    # rank 0 of 3: sends in round 0 to rank 1, receives in round 2 from rank 2
    assert ("isend", 1, 0x1A66) in dist.calls and ("recv", 2, 0x1A66 + 2) in dist.calls
    assert probe.pending_stats.harvested == 2 * REPEATS and len(probe._pending) == REPEATS


def test_a_probe_never_completing_is_nan_and_bounded():
    cuda = StreamCuda()
    dist = P2pDist(cuda, round_trips=[0.001] * 200)
    probe = LinkProbe(None, 0, 3, 1024, device=cuda, dist=dist, pool_size=8)
    assert math.isnan(probe.run())
    cuda.run(1.0)
    assert probe.run() == pytest.approx(0.001, abs=1e-9)
    for _ in range(20):  # the device stops: every window NaN (never the stale value), bounded
        assert math.isnan(probe.run())
    assert len(probe._pending) <= 3
    assert probe.pending_stats.expired + probe.pending_stats.exhausted > 0


def test_the_cpu_clock_path_is_unchanged_without_a_device():
    cuda = StreamCuda()
    dist = P2pDist(cuda, round_trips=[0.0] * 4, cpu_seconds=0.002)
    probe = LinkProbe(None, 0, 3, 1024, dist=dist)
    assert probe.run() >= 0.002 * 2  # isend + recv of the ack, on the CPU
    assert cuda.records == 0


def _context(group=None) -> MonitorContext:
    return MonitorContext(rank=0, world_size=3, node="n0", local_rank=0, window_steps=5,
                          group=lambda: group, log_once=lambda *a: None,
                          count_error=lambda *a: None)


def test_the_participant_reports_the_device_probe_one_window_late():
    cuda = StreamCuda()
    dist = P2pDist(cuda, round_trips=[0.006, 0.005, 0.002, 0.004])
    part = LinkProbeParticipant(1024, path=ProbePath(None, "nccl", cuda), dist=dist)
    part.attach(_context(group="gloo-gather-group"))
    assert math.isnan(part.contribute(5)[PROBE_COLUMN.name])
    cuda.run(1.0)
    assert part.contribute(10)[PROBE_COLUMN.name] == pytest.approx(0.005, abs=1e-9)
    assert part._probe.group is None  # the default (NCCL) group, not the gather group


def test_nccl_jobs_probe_over_the_default_group_on_cuda(monkeypatch):
    import torch.distributed as dist

    monkeypatch.setattr(dist, "get_backend", lambda group=None: "nccl")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    path = probe_path("gather")
    assert path.group is None and path.backend == "nccl" and path.device is torch.cuda
    assert path.tensor_device == torch.device("cuda", 3)


def test_gloo_and_other_backends_probe_over_the_gather_group(monkeypatch, caplog):
    import torch.distributed as dist

    logged: list[str] = []

    def log_once(key, msg, *args):
        logged.append(msg % args)

    assert probe_path("gather") == ProbePath("gather", "gloo")  # no default group here
    monkeypatch.setattr(dist, "get_backend", lambda group=None: "gloo")
    assert probe_path("gather", log_once) == ProbePath("gather", "gloo") and not logged
    monkeypatch.setattr(dist, "get_backend", lambda group=None: "mpi")
    assert probe_path("gather", log_once).group == "gather"
    monkeypatch.setattr(dist, "get_backend", lambda group=None: "nccl")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert probe_path("gather", log_once).device is None
    assert len(logged) == 2 and "neither NCCL nor gloo" in logged[0]


def test_a_failing_probe_turns_itself_off_and_never_raises(caplog):
    class Broken(P2pDist):
        def isend(self, *a, **k):
            raise RuntimeError("peer gone")

    cuda = StreamCuda()
    part = LinkProbeParticipant(1024, path=ProbePath(None, "nccl", cuda),
                                dist=Broken(cuda, []))
    ctx = _context()
    logged = []
    ctx.log_once = lambda key, msg, *a: logged.append(key)
    part.attach(ctx)
    with caplog.at_level(logging.WARNING):
        assert math.isnan(part.contribute(5)[PROBE_COLUMN.name])
    assert part.nbytes == 0 and logged == ["probe"] and part.contribute(10) == {}
