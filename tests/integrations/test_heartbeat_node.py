"""The node exchange of hang keys (laggard.integrations.heartbeat_node, hang_read): a node's
leader writes one key for its ranks to a real TCPStore over real abstract Unix sockets; a
member whose leader stops acking writes its own key, and rank 0's read keeps the newer one."""

from __future__ import annotations

import datetime
import itertools
import json
import threading
import time
from types import SimpleNamespace

import pytest
from heartbeat_data import make_snapshot
from support import wait_for

torch_dist = pytest.importorskip("torch.distributed")

from laggard.integrations.hang_read import RoundReader, find_existing  # noqa: E402
from laggard.integrations.hang_watch import HeartbeatStats  # noqa: E402
from laggard.integrations.heartbeat import HeartbeatThreads  # noqa: E402
from laggard.integrations.heartbeat_key import decode_node_key, encode_key  # noqa: E402
from laggard.integrations.heartbeat_node import (  # noqa: E402
    ACK,
    NodeCollector,
    NodeLayout,
    NodeLink,
)

RUN = "node-test"


def test_the_layout_follows_torchruns_local_ranks_and_else_one_rank_a_node():
    lay = NodeLayout.from_env(13, 16, environ={"LOCAL_RANK": "5", "LOCAL_WORLD_SIZE": "8"})
    assert (lay.leader, lay.is_leader, list(lay.members), lay.nodes) == (8, False,
                                                                         list(range(8, 16)), 2)
    assert list(lay.leaders()) == [0, 8]
    for env in ({}, {"LOCAL_RANK": "5"}, {"LOCAL_RANK": "9", "LOCAL_WORLD_SIZE": "8"},
                {"LOCAL_RANK": "x", "LOCAL_WORLD_SIZE": "8"}):
        alone = NodeLayout.from_env(13, 16, environ=env)
        assert (alone.leader, alone.size, alone.nodes) == (13, 1, 16)


def test_the_leader_keeps_each_members_newest_key_and_refuses_strangers():
    collector = NodeCollector(RUN, range(4, 8))
    old = encode_key(make_snapshot(step=1), rank=5, run=RUN, pid=1, beat=1)
    new = encode_key(make_snapshot(step=2), rank=5, run=RUN, pid=1, beat=2)
    stranger = encode_key(make_snapshot(), rank=9, run=RUN, pid=1, beat=1)
    other_run = encode_key(make_snapshot(), rank=6, run="other", pid=1, beat=1)
    assert collector.take([new, stranger, other_run, b"\xff", old]) == {5}
    assert collector.keys() == {5: new} and collector.bad == 3


class _Store:
    """A dict counting ``check`` calls (``check``: all of the keys exist)."""

    def __init__(self, keys):
        self.keys, self.checks = set(keys), 0

    def check(self, names):
        self.checks += 1
        return all(n in self.keys for n in names)


def test_existence_checks_halve_a_batch_with_gaps_and_stop_at_their_allowance():
    names = [f"k{i}" for i in range(1000)]
    there = [n for n in names if n not in ("k3", "k900")]
    store = _Store(there)
    found, left = find_existing(store, names, 1000)
    assert sorted(found) == sorted(there) and left == 1000 - store.checks
    assert store.checks < 60  # vs 1,000 one by one
    assert find_existing(_Store(names), names, 1) == (names[:512], 0)


# ------------------------------------------------------------------ real store, real sockets
class _Rank:
    """A training thread stand-in that moves (its phase restarts every call)."""

    def __init__(self, step: int) -> None:
        self.step_index = step
        self.tracer = None

    @property
    def where(self):
        return ("forward", time.perf_counter())

    def typical_step_seconds(self):
        return 0.1


@pytest.fixture
def server():
    store = torch_dist.TCPStore("127.0.0.1", 0, 1, True,
                                timeout=datetime.timedelta(seconds=30))
    yield store


def _beat(payload: bytes | None) -> int:
    return -1 if payload is None else json.loads(payload)["b"]


def test_two_nodes_write_two_keys_and_a_stopped_leaders_member_writes_its_own(server):
    job = f"test-{time.time_ns()}"
    ranks = [HeartbeatThreads(_Rank(r), rank=r, world_size=4, run=RUN, store=server,
                              store_seconds=0.1, hang_seconds=3600.0, local_rank=r % 2,
                              local_world_size=2, link_job=job) for r in range(4)]
    store = torch_dist.PrefixStore(f"laggard/{RUN}/", server)
    reader = RoundReader(run=RUN, layout=ranks[0].layout, interval=ranks[0].interval,
                         stats=HeartbeatStats())
    stopped = threading.Event()
    release = threading.Event()
    collect = ranks[2]._collect

    def stopped_leader(link, collector):  # rank 2's store thread stops, as in a SIGSTOP
        if stopped.is_set():
            release.wait()
        return collect(link, collector)

    ranks[2]._collect = stopped_leader
    for r in ranks:
        r.start()
    try:
        assert wait_for(lambda: all(p is not None for p in reader.read(store, 0.0).values()),
                        10)
        node = decode_node_key(store.get("hb/n/2"), run=RUN, leader=2)
        assert set(node.keys) == {2, 3}
        assert not store.check(["hb/1"]) and not store.check(["hb/3"])
        assert ranks[1].stats.store_writes == 0 and ranks[1].stats.keys_to_leader > 0
        assert ranks[0].stats.store_writes > 0 and ranks[2].stats.store_writes > 0

        stopped.set()
        time.sleep(0.3)  # the leader's last write, if one was under way, is in
        frozen = decode_node_key(store.get("hb/n/2"), run=RUN, leader=2)
        assert wait_for(lambda: ranks[3].stats.leader_lost == 1, 10)
        assert wait_for(lambda: store.check(["hb/3"]), 5)
        t0 = time.perf_counter()
        reader.read(store, t0)  # node 2's key seen unchanged from here
        later = t0 + reader.stale_after + 0.1
        assert wait_for(lambda: _beat(reader.read(store, later)[3]) > _beat(frozen.keys[3]), 5)
        payloads = reader.read(store, later)
        assert payloads[2] == frozen.keys[2]  # the stopped leader: its last key, silent
        assert ranks[1].stats.leader_lost == 0  # node 0's leader answers
        assert reader.stats.own_keys_read > 0
    finally:
        release.set()
        for r in ranks:
            r.close()


def test_a_member_reads_its_leaders_ack_off_a_real_socket():
    job = f"test-{time.time_ns()}"
    leader, member = NodeLink(job, 0), NodeLink(job, 1)
    try:
        key = encode_key(make_snapshot(), rank=1, run=RUN, pid=1, beat=1)
        assert member.send(0, key)
        pending: list[bytes] = []
        assert wait_for(lambda: bool(pending.extend(leader.drain()) or pending), 5)
        assert pending == [key]
        threads = HeartbeatThreads(SimpleNamespace(), rank=0, world_size=2, run=RUN,
                                   local_rank=0, local_world_size=2, link_job=job)
        collector = NodeCollector(RUN, range(0, 2))
        collector.take(pending)
        assert leader.send(1, ACK)
        assert wait_for(lambda: ACK in member.drain(), 5)
        assert threads.layout.is_leader and collector.keys() == {1: key}
    finally:
        leader.close()
        member.close()


def test_a_round_of_2048_ranks_in_256_node_keys_names_the_one_rank_behind(server):
    """256 leaders' keys on a real TCPStore (8 ranks each, in a TP group of its node and a DP
    group of 256): rank 0 reads them in batches and names rank 5 alone, the 2,047 ranks waiting
    on it victims."""
    from laggard.integrations.hang_watch import HangWatch
    from laggard.integrations.heartbeat_key import RankSnapshot, encode_node_key
    from laggard.wire import GroupProgress

    nodes, world = 256, 2048

    def key(rank: int) -> bytes:
        node, local = divmod(rank, 8)
        tp, dp = f"tp:{node}", f"dp:{local}"
        behind = rank == 5
        snap = RankSnapshot(
            step=9, phase="data" if behind else "backward", phase_seconds=60.0,
            step_seconds=1.0, quiet_seconds=60.0,
            groups=(GroupProgress(group=tp, issued=4, completed=4, op="allgather"),
                    GroupProgress(group=dp, issued=10 if behind else 11, completed=10,
                                  op="allreduce")),
            members={tp: tuple(range(node * 8, node * 8 + 8)), dp: tuple(range(local, world, 8))},
            pending_seconds=(None, None if behind else 60.0), wall=time.time())
        return encode_key(snap, rank=rank, run=RUN, pid=1, beat=1)

    store = torch_dist.PrefixStore(f"laggard/{RUN}/", server)
    for node in range(nodes):
        leader = node * 8
        store.set(f"hb/n/{leader}", encode_node_key(
            {r: key(r) for r in range(leader, leader + 8)}, leader=leader, run=RUN, beat=1))
    stats = HeartbeatStats()
    layout = NodeLayout.of(0, world, 0, 8)
    payloads = RoundReader(run=RUN, layout=layout, interval=2.0, stats=stats).read(store, 0.0)
    assert sum(p is not None for p in payloads.values()) == world and stats.own_keys_read == 0
    watch = HangWatch(run=RUN, world_size=world, interval=2.0, stats=stats, device=False)
    report = watch.observe(0.0, payloads, own_quiet=60.0, hang_after=10.0, own_step=9)
    assert report is not None and report.ranks == (5,), report
    assert [c.kind for c in report.verdict.culprits] == ["missing"]
    assert stats.bad_keys == 0


class _TimedStore:
    """Records when each key was set (``time.perf_counter``)."""

    def __init__(self) -> None:
        self.sets: list[tuple[str, float]] = []

    def set(self, key, value):
        self.sets.append((key, time.perf_counter()))


def test_a_member_whose_leader_never_answered_writes_at_the_per_rank_interval():
    """No leader socket at all (as with ranks in separate network namespaces): the member falls
    back to its own key, paced by the job's per-rank budget, not the node interval."""
    job = f"test-{time.time_ns()}"
    store = _TimedStore()
    member = HeartbeatThreads(_Rank(1), rank=1, world_size=4, run=RUN, store_seconds=0.05,
                              writes_per_second=10.0, local_rank=1, local_world_size=2,
                              link_job=job)
    assert (member.interval, member.rank_interval) == (0.2, 0.4)
    link = NodeLink(job, 1)
    thread = threading.Thread(target=member._follow, args=(store, link), daemon=True)
    thread.start()
    try:
        assert wait_for(lambda: len(store.sets) >= 3, 20)
        times = [t for key, t in store.sets if key == "hb/1"]  # before the goodbye
    finally:
        member._stop.set()
        thread.join(10)
        link.close()
    assert len(times) >= 3 and member.stats.leader_lost == 1
    assert store.sets[-1][0] == "hb/1" and len(store.sets) > len(times)  # the goodbye
    assert min(b - a for a, b in itertools.pairwise(times)) >= 0.4 - 0.01
