"""The heartbeat's pieces on plain data: the tracer's per-group progress, the store keys, rank 0's
HangWatch with the hang rules of ``laggard.detectors.hang``, the log line, the store thread's
reads against a fake store, and the monitor's phase publication and datagrams on a real Unix
datagram socket. The real multi-process hangs are in test_hang_jobs.py."""

from __future__ import annotations

import socket
import threading
import time
from types import SimpleNamespace

import pytest

pytest.importorskip("torch")

from support import wait_for  # noqa: E402

from laggard.detectors.hang import HangCulprit, HangVerdict, RankState  # noqa: E402
from laggard.integrations.hang_message import hang_message  # noqa: E402
from laggard.integrations.hang_watch import HangWatch, HeartbeatStats  # noqa: E402
from laggard.integrations.heartbeat import (  # noqa: E402
    HeartbeatThreads,
    heartbeat_datagram,
    take_snapshot,
)
from laggard.integrations.heartbeat_key import (  # noqa: E402
    BadKey,
    RankSnapshot,
    decode_key,
    encode_key,
)
from laggard.integrations.monitor import TrainingMonitor  # noqa: E402
from laggard.integrations.tracer import CollectiveTracer, GroupInfo  # noqa: E402
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
    assert p.pending_age_seconds is None and tracer._progress[(0, None)][1].times == {}


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


# ------------------------------------------------------------------ snapshots and keys
def _snap(step=7, phase="data", phase_s=30.0, quiet=30.0,
          groups=(("dp:0", 10, 10, "allreduce"),)):
    return RankSnapshot(step=step, phase=phase, phase_seconds=phase_s, step_seconds=0.5,
                        quiet_seconds=quiet,
                        groups=tuple(GroupProgress(group=g, issued=i, completed=c, op=o)
                                     for g, i, c, o in groups),
                        members={"dp:0": (0, 1, 2, 3)})


def test_a_key_round_trips_with_its_members_in_runs():
    snap = _snap()
    payload = encode_key(snap, rank=2, run="r1", pid=42, beat=3)
    assert len(payload) < 200
    key = decode_key(payload, run="r1", rank=2)
    assert (key.pid, key.beat, key.closed, key.snapshot.step, key.snapshot.phase) == (
        42, 3, False, 7, "data")
    assert key.members == {"dp:0": (0, 1, 2, 3)}
    assert key.snapshot.groups[0].issued == 10


@pytest.mark.parametrize("payload, rank, why", [
    (encode_key(_snap(), rank=2, run="other", pid=1, beat=1), 2, "run"),
    (encode_key(_snap(), rank=3, run="r1", pid=1, beat=1), 2, "rank"),
    (b"\xff{not json", 2, "JSON"),
    (encode_key(_snap(), rank=2, run="r1", pid=1, beat=1).replace(b'"dp:0",10,10',
                                                                  b'"dp:0",10,11'), 2, "count"),
    (b"x" * 9000, 2, "bytes"),
])
def test_a_key_of_another_run_rank_or_shape_is_refused(payload, rank, why):
    with pytest.raises(BadKey):
        decode_key(payload, run="r1", rank=rank)


def test_the_heartbeat_datagram_decodes_with_the_wire_format():
    snap = _snap(groups=(("dp:0", 10, 9, "allreduce"),))
    item = decode_datagram(heartbeat_datagram(snap, rank=2, world_size=4, run="r1", pid=42,
                                              node="n1"))
    assert isinstance(item, Heartbeat)
    assert (item.rank, item.world_size, item.step, item.pid, item.node, item.phase) == (
        2, 4, 7, 42, "n1", "data")
    assert item.groups[0].group == "dp:0" and item.groups[0].pending == 1


# ------------------------------------------------------------------ rank 0's HangWatch
def _keys(states: dict[int, RankSnapshot], beat: int, run: str = "r1",
          closed: frozenset = frozenset()) -> dict[int, bytes | None]:
    return {r: encode_key(s, rank=r, run=run, pid=100 + r, beat=beat, closed=r in closed)
            for r, s in states.items()}


def _watch(world=4, interval=2.0) -> HangWatch:
    return HangWatch(run="r1", world_size=world, interval=interval,
                     stats=HeartbeatStats())


def _hung(missing=(1,), quiet=30.0) -> dict[int, RankSnapshot]:
    out = {}
    for r in range(4):
        if r in missing:
            out[r] = _snap(phase="data", phase_s=95.0, quiet=quiet,
                           groups=(("dp:0", 10, 10, "allreduce"),))
        else:
            out[r] = _snap(phase="backward", phase_s=40.0, quiet=quiet,
                           groups=(("dp:0", 11, 10, "allreduce"),))
    return out


def _observe(watch, now, payloads, quiet=30.0):
    return watch.observe(now, payloads, own_quiet=quiet, hang_after=10.0, own_step=7)


def test_one_rank_behind_is_reported_once_per_episode():
    watch = _watch()
    report = _observe(watch, 100.0, _keys(_hung(), beat=1))
    assert report is not None and report.ranks == (1,)
    assert report.message == ("hung since step 7 in allreduce #11 of group dp: rank 1 never "
                              "issued it (last in phase data for 95 s)")
    assert report.step == 7 and report.seconds_since_progress == 30.0
    assert _observe(watch, 102.0, _keys(_hung(), beat=2)) is None  # same episode
    watch.end_episode()
    assert _observe(watch, 300.0, _keys(_hung(), beat=3)) is not None


def test_a_skipped_collective_is_told_from_the_wait_it_caused_by_the_pending_ages():
    """Rank 2 skipped allreduce #5 of group a and waits in group b's #8, which the others never
    issue: a wait cycle, broken at the oldest wait (the others', in a)."""
    def snap(rank):
        if rank == 2:
            groups = (GroupProgress(group="a:1", issued=4, completed=4, op="allreduce"),
                      GroupProgress(group="b:2", issued=8, completed=7, op="allgather"))
            pending = (None, 29.0)
        else:
            groups = (GroupProgress(group="a:1", issued=5, completed=4, op="allreduce"),
                      GroupProgress(group="b:2", issued=7, completed=7, op="allgather"))
            pending = (30.0, None)
        return RankSnapshot(step=9, phase="backward" if rank == 2 else "metrics",
                            phase_seconds=29.0, step_seconds=0.1, quiet_seconds=29.0,
                            groups=groups, pending_seconds=pending, wall=1000.0)

    keys = {r: encode_key(snap(r), rank=r, run="r1", pid=100 + r, beat=1) for r in range(4)}
    report = _watch().observe(100.0, keys, own_quiet=29.0, hang_after=10.0, own_step=9,
                              wall=1001.0)
    assert report is not None and report.verdict.cycle
    assert [(c.rank, c.kind, c.group, c.seq) for c in report.verdict.culprits] == [
        (2, "missing", "a:1", 5)]
    assert report.states[0].groups[0].pending_seconds == 31.0  # aged by the 1 s since written


def test_a_level_job_is_slow_not_hung():
    watch = _watch()
    level = {r: _snap(phase="checkpoint", groups=(("dp:0", 11, 11, "allreduce"),))
             for r in range(4)}
    assert _observe(watch, 100.0, _keys(level, beat=1)) is None
    assert watch.stats.classifications == 1 and watch.stats.hangs_reported == 0


def test_nothing_is_read_as_hung_while_a_rank_still_moves_or_rank_0_has_not_waited():
    watch = _watch()
    moving = _hung()
    moving[2] = _snap(phase="backward", quiet=0.5, groups=(("dp:0", 11, 10, "allreduce"),))
    assert _observe(watch, 100.0, _keys(moving, beat=1)) is None
    assert watch.observe(100.0, _keys(_hung(), beat=1), own_quiet=5.0, hang_after=10.0,
                         own_step=7) is None
    assert watch.stats.classifications == 0


def test_a_rank_whose_key_stops_changing_is_silent_and_a_missing_key_too():
    watch = _watch()
    states = _hung(missing=())
    first = _keys(states, beat=1)
    assert _observe(watch, 100.0, first) is None  # level, everyone fresh
    later = _keys(states, beat=2)
    later[3] = first[3]  # rank 3 stopped writing at beat 1
    del later[2]  # rank 2's key vanished (never readable)
    assert _observe(watch, 100.0 + watch.silent_after + 1, later) is not None
    report = watch.observe(200.0, later, own_quiet=30.0, hang_after=10.0, own_step=7)
    assert report is None  # reported already
    assert watch.stats.silent_ranks == 2


def test_silence_is_only_judged_after_watching_long_enough():
    watch = _watch()
    keys = _keys(_hung(missing=()), beat=1)
    del keys[3]  # never wrote; rank 0 has just started watching
    assert _observe(watch, 100.0, keys) is None
    assert watch.stats.classifications == 0


def test_a_closed_rank_means_the_job_is_ending_not_hung():
    watch = _watch()
    assert _observe(watch, 100.0, _keys(_hung(), beat=1, closed=frozenset({3}))) is None


def test_sequence_numbers_going_back_are_counted_and_never_a_false_hang():
    watch = _watch()
    level = {r: _snap(groups=(("dp:0", 50, 50, "allreduce"),)) for r in range(4)}
    assert _observe(watch, 100.0, _keys(level, beat=1)) is None
    restarted = dict(level)
    restarted[1] = _snap(groups=(("dp:0", 3, 3, "allreduce"),))  # same pid, group re-made
    assert _observe(watch, 102.0, _keys(restarted, beat=2)) is None
    assert watch.stats.seq_backwards == 1


def test_keys_of_another_run_are_counted_and_read_as_absent():
    watch = _watch()
    keys = _keys(_hung(), beat=1)
    keys[2] = encode_key(_hung()[2], rank=2, run="other-run", pid=1, beat=1)
    assert _observe(watch, 100.0, keys) is None  # rank 2 has no usable key, not yet silent
    assert watch.stats.bad_keys == 1


def test_rules_that_raise_are_counted_and_report_nothing():
    def broken(ranks, **options):
        raise NotImplementedError("rules to come")

    watch = HangWatch(run="r1", world_size=4, interval=2.0, classify=broken)
    assert _observe(watch, 100.0, _keys(_hung(), beat=1)) is None
    assert watch.stats.classify_errors == 1


def test_the_message_names_every_group_and_kind():
    states = {12: RankState(rank=12, step=4812, phase="data", phase_seconds=95.2),
              14: RankState(rank=14, step=4812, phase="data", phase_seconds=94.0),
              3: RankState(rank=3, step=4813, phase="backward", phase_seconds=2.0),
              9: RankState(rank=9, silent_seconds=41.0)}
    verdict = HangVerdict(culprits=[
        HangCulprit(rank=3, kind="device", group="tp:4", desc="tp", seq=9, op="allgather"),
        HangCulprit(rank=9, kind="silent"),
        HangCulprit(rank=12, kind="missing", group="dp:3", desc="dp", seq=20537,
                    op="allreduce"),
        HangCulprit(rank=14, kind="missing", group="dp:3", desc="dp", seq=20537,
                    op="allreduce")])
    assert hang_message(verdict, states, own_step=1) == (
        "hung since step 4,812 in allgather #9 of group tp: rank 3 issued it and never "
        "completed it (stuck on the device) (last in phase backward for 2 s); rank 9 stopped "
        "reporting 41 s ago (holding the GIL, stuck in native code, or gone); in allreduce "
        "#20,537 of group dp: ranks 12 and 14 never issued it (last in phase data for 95 s)")



def test_a_silent_culprits_stale_key_gives_neither_the_step_nor_a_phase_age():
    """A rank that froze holding the GIL wrote its last key long before (here at step 0, before
    its store thread could run again): the job is hung in the step its peers report, and its
    phase is where it was last heard, with no age (seen from a new user's job: "hung since
    step 0 rank 1 ... (last in phase backward for 0 s)")."""
    states = {0: RankState(rank=0, step=30, phase="collective_wait", phase_seconds=12.0),
              1: RankState(rank=1, step=0, phase="backward", phase_seconds=0.0,
                           silent_seconds=8.0),
              2: RankState(rank=2, step=30, phase="collective_wait", phase_seconds=12.0)}
    verdict = HangVerdict(culprits=[HangCulprit(rank=1, kind="silent")])
    assert hang_message(verdict, states, own_step=30) == (
        "hung since step 30: rank 1 stopped reporting 8 s ago (holding the GIL, stuck in "
        "native code, or gone) (last heard at step 0, in phase backward)")

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


def test_rank_0_reads_keys_that_exist_and_checks_the_rest_one_by_one():
    store = FakeStore()
    threads = HeartbeatThreads(_source(), rank=0, world_size=3, run="r1", store=store,
                               store_seconds=2.0)
    for rank in (0, 2):
        store.set(f"hb/{rank}", encode_key(_snap(), rank=rank, run="r1", pid=1, beat=1))
    payloads = threads._read(store)
    assert payloads[1] is None and payloads[0] is not None and payloads[2] is not None
    assert threads._known == {0, 2}
    store.set("hb/1", b"{}")
    store.checks = 0
    assert threads._read(store)[1] == b"{}" and store.checks == 1  # only rank 1 rechecked


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
    for rank, payload in _keys(_hung(), beat=1).items():
        store.set(f"hb/{rank}", payload)
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
    deadline = time.monotonic() + 10
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
