"""The heartbeat's sender on plain data: the tracer's per-group progress, the snapshot and its
datagram, the store thread's reads and reports against a fake store, and the monitor's phase
publication and datagrams on a real Unix datagram socket. The store key is tested in
test_heartbeat_key.py, rank 0's HangWatch in test_hang_watch.py, the log line in
test_hang_message.py; the real multi-process hangs in test_hang_jobs.py."""

from __future__ import annotations

import socket
import threading
import time
from types import SimpleNamespace

import pytest

pytest.importorskip("torch")

from heartbeat_data import hung_job, make_keys, make_snapshot  # noqa: E402
from support import budget, wait_for  # noqa: E402

from laggard.integrations.hang_watch import HangWatch  # noqa: E402
from laggard.integrations.heartbeat import (  # noqa: E402
    HeartbeatThreads,
    heartbeat_datagram,
    take_snapshot,
)
from laggard.integrations.heartbeat_key import (  # noqa: E402
    RankSnapshot,
    encode_key,
    encode_node_key,
)
from laggard.integrations.monitor import TrainingMonitor  # noqa: E402
from laggard.integrations.trace_records import GroupInfo  # noqa: E402
from laggard.integrations.tracer import CollectiveTracer  # noqa: E402
from laggard.wire import CLOSED_PHASE, GroupProgress, Heartbeat, decode_datagram  # noqa: E402

DP = GroupInfo(index=0, name="0", backend="gloo", ranks=(0, 1, 2, 3), desc="dp")
PP = GroupInfo(index=1, name="5", backend="gloo", ranks=(0, 1), desc="pp")


class FakeWork:
    """A Work whose future completes when the test says so."""

    def __init__(self) -> None:
        self.callbacks: list = []
        fut = SimpleNamespace(add_done_callback=self.callbacks.append)
        self.get_future = lambda: fut

    def finish(self) -> None:
        for cb in self.callbacks:
            cb(None)


def _tracer(*infos: GroupInfo) -> tuple[CollectiveTracer, list[object]]:
    tracer = CollectiveTracer(groups=[])
    tracer.groups = list(infos)
    pgs = []
    for info in infos:
        pg = object()
        tracer._by_id[id(pg)] = info
        pgs.append(pg)
    return tracer, pgs


def _progress(tracer: CollectiveTracer) -> dict[tuple[str, int | None], tuple[int, int, str]]:
    return {(p.group, p.peer): (p.issued, p.completed, p.op) for p in tracer.progress()}


# ------------------------------------------------------------------ the tracer's progress
def test_completed_counts_the_highest_prefix_in_issue_order():
    tracer, (dp,) = _tracer(DP)
    works = [FakeWork() for _ in range(3)]
    for w in works:
        tracer.track(w, "allreduce", dp, 64)
    works[1].finish()  # out of order: 2 done, 1 not yet
    assert _progress(tracer) == {("dp:0", None): (3, 0, "allreduce")}
    works[0].finish()
    assert _progress(tracer) == {("dp:0", None): (3, 2, "allreduce")}
    works[2].finish()
    [p] = tracer.progress()
    assert (p.issued, p.completed, p.ranks, p.desc) == (3, 3, (0, 1, 2, 3), "dp")
    assert p.completed_age_seconds <= p.issued_age_seconds


def test_p2p_is_counted_per_pair_never_in_the_groups_sequence():
    tracer, (dp, pp) = _tracer(DP, PP)
    for op in ("send", "recv", "send"):
        tracer.track(FakeWork(), op, pp, 8, peer=1)
    tracer.track(FakeWork(), "recv", pp, 8, peer=0)
    tracer.track(FakeWork(), "send", pp, 8)  # no peer: timed, not counted
    with tracer.timed("allgather", dp, 8):
        pass
    assert _progress(tracer) == {("pp:5", 1): (3, 0, "send"), ("pp:5", 0): (1, 0, "recv"),
                                 ("dp:0", None): (1, 1, "allgather")}


def test_the_ddp_hook_counts_at_launch_and_completes_at_its_future():
    tracer, (dp,) = _tracer(DP)
    handle = tracer.issue("allreduce", dp)
    assert _progress(tracer)[("dp:0", None)] == (1, 0, "allreduce")
    tracer.record("allreduce", dp, 0.0, 0.1, 64, issued=handle)
    assert _progress(tracer)[("dp:0", None)] == (1, 1, "allreduce")
    # a record() without a handle in a group counted at issue is not counted twice
    tracer.record("allreduce", dp, 0.0, 0.1, 64)
    assert _progress(tracer)[("dp:0", None)] == (1, 1, "allreduce")


def test_completion_only_sources_count_issued_and_completed_at_once():
    tracer, _ = _tracer(DP)
    for _ in range(2):
        tracer.record("allreduce", None, 0.0, 0.1, 64, index=0)  # flight recorder, NCCL hook
    assert _progress(tracer) == {("dp:0", None): (2, 2, "allreduce")}


def test_the_oldest_pending_collective_keeps_its_issue_time():
    tracer, (dp,) = _tracer(DP)
    works = [FakeWork() for _ in range(3)]
    for w in works:
        tracer.track(w, "allreduce", dp, 64)
    first = tracer._in_flight[next(iter(tracer._in_flight))][2]
    now = time.perf_counter() + 10.0  # ages measured to a moment after every issue
    [p] = tracer.progress(now)
    assert p.pending_age_seconds == now - first and p.issued_age_seconds < now - first
    works[0].finish()
    [p] = tracer.progress(now)
    assert p.issued_age_seconds <= p.pending_age_seconds < now - first
    works[1].finish()
    works[2].finish()
    [p] = tracer.progress(now)
    assert p.pending_age_seconds is None and tracer._progress.counters[(0, None)][1].times == {}


def test_a_call_that_raises_or_an_evicted_collective_is_not_left_pending():
    tracer, (dp,) = _tracer(DP)
    with pytest.raises(RuntimeError), tracer.timed("allgather", dp, 8):
        raise RuntimeError("gloo timeout")
    tracer.config.max_in_flight = 1
    tracer.begin("allreduce", dp, 8)
    tracer.begin("allreduce", dp, 8)  # evicts the first
    assert _progress(tracer)[("dp:0", None)] == (3, 2, "allreduce")


def test_progress_is_read_while_another_thread_holds_a_collective_open():
    tracer, (dp,) = _tracer(DP)
    work = FakeWork()
    tracer.track(work, "allreduce", dp, 8)
    seen = []
    reader = threading.Thread(target=lambda: seen.append(_progress(tracer)))
    reader.start()
    reader.join(10)
    assert seen == [{("dp:0", None): (1, 0, "allreduce")}]
    work.finish()


def test_group_keys_are_unique_and_short():
    assert DP.key == "dp:0" and DP.short_desc == "dp"
    assert GroupInfo(index=2, name="7", backend="gloo", ranks=(0,), desc="undefined").key == "pg7"
    long = GroupInfo(index=2, name="a" * 40, backend="gloo", ranks=(0,), desc="d" * 60)
    assert len(long.key) == 64 and long.key.endswith(":" + "a" * 40)


def test_the_heartbeat_datagram_decodes_with_the_wire_format():
    snap = make_snapshot(groups=(("dp:0", 10, 9, "allreduce"),))
    item = decode_datagram(heartbeat_datagram(snap, rank=2, world_size=4, run="r1", pid=42,
                                              node="n1"))
    assert isinstance(item, Heartbeat)
    assert (item.rank, item.world_size, item.step, item.pid, item.node, item.phase) == (
        2, 4, 7, 42, "n1", "data")
    assert item.groups[0].group == "dp:0" and item.groups[0].pending == 1


def test_the_datagram_is_byte_for_byte_the_one_the_agent_reads():
    """The bytes the heartbeat had before the heartbeat was split (issue 30): ages to the
    millisecond, the typical step to 6 decimals, the node cut to 64 characters."""
    groups = (GroupProgress("dp:0", 12, 11, "allreduce", 1.23456789, 0.0004999, None),
              GroupProgress("pp:5", 3, 3, "send", None, 2.0000001, 7))
    snap = RankSnapshot(step=42, phase="backward", phase_seconds=12.3456789,
                        step_seconds=0.123456789, quiet_seconds=0.98765432, groups=groups)
    assert heartbeat_datagram(snap, rank=3, world_size=8, run="r-1", pid=4242,
                              node="n" * 70) == (
        b'{"v":1,"type":"heartbeat","run":"r-1","rank":3,"world_size":8,"step":42,"pid":4242,'
        b'"node":"' + b"n" * 64 + b'","phase":"backward","phase_seconds":12.346,'
        b'"step_seconds":0.123457,"groups":[{"group":"dp:0","issued":12,"completed":11,'
        b'"op":"allreduce","issued_age_seconds":1.235,"completed_age_seconds":0.0},'
        b'{"group":"pp:5","issued":3,"completed":3,"op":"send","completed_age_seconds":2.0,'
        b'"peer":7}]}')


def test_a_snapshot_takes_the_tracers_progress_as_the_wires_groups():
    """The tracer's TracerProgress is the wire's GroupProgress with the group's members and
    its oldest pending age: the snapshot uses it as it is, ages measured to one moment."""
    tracer, (dp, pp) = _tracer(DP, PP)
    tracer.track(FakeWork(), "allreduce", dp, 64)
    tracer.track(FakeWork(), "send", pp, 8, peer=1)
    issued = max(c.issued_at for _, c in tracer._progress.counters.values())
    source = SimpleNamespace(where=("backward", issued - 5.0), step_index=3, tracer=tracer,
                             typical_step_seconds=lambda: 0.2)
    snap = take_snapshot(source, now=issued + 2.0)
    assert all(isinstance(g, GroupProgress) for g in snap.groups)
    assert [(g.group, g.peer, g.issued, g.completed) for g in snap.groups] == [
        ("dp:0", None, 1, 0), ("pp:5", 1, 1, 0)]
    assert snap.members == {"dp:0": (0, 1, 2, 3), "pp:5": (0, 1)}
    assert snap.phase_seconds == pytest.approx(7.0)
    assert snap.quiet_seconds == pytest.approx(2.0)  # the last issue, 2 s before now
    assert all(age is not None and age >= 1.999 for age in snap.pending_seconds)
    beat = decode_datagram(heartbeat_datagram(snap, rank=0, world_size=4, run="r", pid=1,
                                              node=None))
    assert [type(g) for g in beat.groups] == [GroupProgress, GroupProgress]
    assert beat.groups[0].issued_age_seconds == round(snap.groups[0].issued_age_seconds, 3)


# ------------------------------------------------------------------ the store thread's I/O
class FakeStore:
    """A dict with the Store methods the exchange uses; ``get`` of a missing key would block."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}
        self.down = False
        self.checks = 0

    def _up(self) -> None:
        if self.down:
            raise RuntimeError("Connection reset by peer")

    def set(self, key, value):
        self._up()
        self.data[key] = value

    def check(self, keys):
        self._up()
        self.checks += 1
        return all(k in self.data for k in keys)

    def multi_get(self, keys):
        self._up()
        assert all(k in self.data for k in keys), "multi_get of a missing key blocks"
        return [self.data[k] for k in keys]


def _source(phase="data", since=0.0, step=3):
    return SimpleNamespace(where=(phase, since), step_index=step, tracer=None,
                           typical_step_seconds=lambda: 0.2)


def test_rank_0_reads_keys_that_exist_and_checks_the_rest_by_halves():
    store = FakeStore()
    threads = HeartbeatThreads(_source(), rank=0, world_size=3, run="r1", store=store,
                               store_seconds=2.0, local_rank=0, local_world_size=1)
    for rank in (0, 2):  # one-rank nodes: each writes a node key of itself
        store.set(f"hb/n/{rank}", encode_node_key(
            {rank: encode_key(make_snapshot(), rank=rank, run="r1", pid=1, beat=1)},
            leader=rank, run="r1", beat=1))
    payloads = threads._read(store)
    assert payloads[1] is None and payloads[0] is not None and payloads[2] is not None
    assert threads.reader._known_nodes == {0, 2}
    store.set("hb/1", b"{}")  # rank 1's own key (no node key speaks for it)
    store.checks = 0
    assert threads._read(store)[1] == b"{}" and store.checks == 2  # only rank 1 rechecked
    assert threads.stats.own_keys_read == 1


def test_an_unreachable_store_is_counted_and_reports_nothing():
    store = FakeStore()
    store.down = True
    threads = HeartbeatThreads(_source(since=-1000.0), rank=0, world_size=3, run="r1",
                               store=store)
    snap = take_snapshot(threads.source)
    assert threads._write(store, snap) is False
    assert threads._watch(store, HangWatch(run="r1", world_size=3, interval=2.0), snap) is False
    assert threads.stats.store_errors == 2 and threads.stats.hangs_reported == 0


def test_the_store_thread_reports_through_on_hang_and_survives_a_raising_callback(caplog):
    store = FakeStore()
    got = []

    def on_hang(report):
        got.append(report)
        raise RuntimeError("user callback bug")

    threads = HeartbeatThreads(_source(since=-1000.0), rank=0, world_size=4, run="r1",
                               store=store, on_hang=on_hang)
    watch = HangWatch(run="r1", world_size=4, interval=2.0,
                      stats=threads.stats)
    for rank, payload in make_keys(hung_job(), beat=1).items():
        store.set(f"hb/{rank}", payload)  # ranks' own keys: no node key speaks for them
    with caplog.at_level("WARNING", logger="laggard.hang"):
        assert threads._watch(store, watch, take_snapshot(threads.source)) is True
    assert [r.ranks for r in got] == [(1,)] and threads.stats.callback_errors == 1
    assert threads.stats.hangs_reported == 1
    assert [r.message for r in caplog.records if r.name == "laggard.hang"] == [
        "laggard: " + got[0].message]


def test_closing_sends_a_goodbye_heartbeat_the_agent_lets_expire():
    """The last datagram says ``phase: closed`` (``laggard.wire.CLOSED_PHASE``): the agent then
    forgets the rank after its TTL instead of keeping it as stalled while the process lives."""
    sent: list[bytes] = []
    threads = HeartbeatThreads(_source(phase="optimizer"), rank=1, world_size=2, run="r1",
                               send=sent.append, heartbeat_seconds=0.05, store_seconds=0)
    threads.start()
    deadline = time.monotonic() + budget(10)
    while not sent and time.monotonic() < deadline:
        time.sleep(0.01)
    threads.close()
    phases = [decode_datagram(p).phase for p in sent]
    assert phases[0] == "optimizer" and phases[-1] == CLOSED_PHASE
    assert phases.count(CLOSED_PHASE) == 1 and not threads._threads


# ------------------------------------------------------------------ the monitor
def test_the_monitor_publishes_where_the_training_thread_is():
    monitor = TrainingMonitor(TrainingMonitor.Config(agent_address="", detect=False,
                                                     heartbeat_seconds=0))
    assert monitor.where[0] == "outside" and monitor.typical_step_seconds() is None
    seen = []
    with monitor.step():
        seen.append(monitor.where[0])
        with monitor.phase("data"):
            seen.append(monitor.where[0])
        seen.append(monitor.where[0])
    seen.append(monitor.where[0])
    assert seen == ["step", "data", "step", "outside"]
    assert monitor.typical_step_seconds() > 0
    monitor.close()


def test_heartbeats_arrive_on_a_unix_datagram_socket_with_the_rank_and_its_phase(tmp_path):
    path = str(tmp_path / "intake.sock")
    sink = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sink.bind(path)
    sink.settimeout(10)
    tracer, (dp,) = _tracer(DP)
    monitor = TrainingMonitor(TrainingMonitor.Config(
        agent_address=path, detect=False, heartbeat_seconds=0.05, node="node07", run="r-hb"),
        rank=2, world_size=4, tracer=tracer)
    try:
        with monitor.step():
            with monitor.phase("data"):
                tracer.issue("allreduce", dp)
                beats: list[Heartbeat] = []

                def two_beats() -> bool:
                    item = decode_datagram(sink.recv(65536))
                    if isinstance(item, Heartbeat):
                        beats.append(item)
                    return len(beats) >= 2

                assert wait_for(two_beats, timeout=20)
    finally:
        monitor.close()
        sink.close()
    beat = beats[-1]
    assert (beat.run, beat.rank, beat.world_size, beat.step, beat.node, beat.phase) == (
        "r-hb", 2, 4, 0, "node07", "data")
    assert beat.pid == __import__("os").getpid()
    assert [(g.group, g.issued, g.completed, g.op) for g in beat.groups] == [
        ("dp:0", 1, 0, "allreduce")]
    assert beats[-1].phase_seconds >= beats[0].phase_seconds
    assert monitor.stats.heartbeat.sent >= 2
