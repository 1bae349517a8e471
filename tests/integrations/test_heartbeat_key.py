"""The hang store key (laggard.integrations.heartbeat_key): a rank's snapshot round-trips with
its members in runs, and rank 0 refuses another run's or rank's key and anything garbled."""

from __future__ import annotations

import pytest
from heartbeat_data import make_snapshot

from laggard.integrations.heartbeat_key import (
    MAX_KEY_BYTES,
    MAX_NODE_RANKS,
    BadKey,
    RankSnapshot,
    decode_key,
    decode_node_key,
    encode_key,
    encode_node_key,
)
from laggard.wire import GroupProgress


def test_a_key_round_trips_with_its_members_in_runs():
    snap = make_snapshot()
    payload = encode_key(snap, rank=2, run="r1", pid=42, beat=3)
    assert len(payload) < 200
    key = decode_key(payload, run="r1", rank=2)
    assert (key.pid, key.beat, key.closed, key.snapshot.step, key.snapshot.phase) == (
        42, 3, False, 7, "data")
    assert key.members == {"dp:0": (0, 1, 2, 3)}
    assert key.snapshot.groups[0].issued == 10


@pytest.mark.parametrize("payload, rank, why", [
    (encode_key(make_snapshot(), rank=2, run="other", pid=1, beat=1), 2, "run"),
    (encode_key(make_snapshot(), rank=3, run="r1", pid=1, beat=1), 2, "rank"),
    (b"\xff{not json", 2, "JSON"),
    (encode_key(make_snapshot(), rank=2, run="r1", pid=1, beat=1).replace(b'"dp:0",10,10',
                                                                  b'"dp:0",10,11'), 2, "count"),
    (b"x" * 9000, 2, "bytes"),
])
def test_a_key_of_another_run_rank_or_shape_is_refused(payload, rank, why):
    with pytest.raises(BadKey):
        decode_key(payload, run="r1", rank=rank)


#: A snapshot with ages of more decimals than the key keeps, and members in two runs.
ODD = dict(step=42, phase="backward", phase_seconds=12.3456789, step_seconds=0.123456789,
           quiet_seconds=0.98765432,
           groups=(GroupProgress("dp:0", 12, 11, "allreduce", 1.23456789, 0.0004999, None),
                   GroupProgress("pp:5", 3, 3, "send", None, 2.0000001, 7)),
           members={"dp:0": (0, 2, 4, 6, 9)}, pending_seconds=(3.14159265, None),
           wall=1764662400.1234567)


def test_the_key_format_is_byte_for_byte_the_one_rank_0_reads():
    """The bytes the key had before the heartbeat was split (issue 30): ages and the wall time
    to the millisecond, members as ``[start, count, stride]`` runs, none for a P2P pair."""
    payload = encode_key(RankSnapshot(**ODD), rank=3, run="r-1", pid=4242, beat=9, closed=True)
    assert payload == (
        b'{"v":1,"r":"r-1","k":3,"p":4242,"b":9,"c":1,"w":1764662400.123,"s":42,'
        b'"ph":"backward","pa":12.346,"q":0.988,"t":0.123,"g":[["dp:0",12,11,"allreduce",null,'
        b'[[0,4,2],[9,1,1]],3.142],["pp:5",3,3,"send",7,null,null]]}')
    key = decode_key(payload, run="r-1", rank=3)
    assert key.closed and key.members == {"dp:0": (0, 2, 4, 6, 9)}
    assert key.snapshot.pending_seconds == (3.142, None)


def test_members_needing_more_runs_than_a_key_lists_are_left_out():
    scattered = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37)  # 6 runs; a key lists 4
    snap = RankSnapshot(**{**ODD, "members": {"dp:0": scattered}})
    key = decode_key(encode_key(snap, rank=0, run="r", pid=1, beat=1), run="r", rank=0)
    assert key.members == {}
    assert len(encode_key(snap, rank=0, run="r", pid=1, beat=1)) < MAX_KEY_BYTES


# ------------------------------------------------------------------ the node key
def _node(keys=(2, 3), leader=2, run="r1", beat=5) -> bytes:
    return encode_node_key({r: encode_key(make_snapshot(), rank=r, run=run, pid=1, beat=r)
                            for r in keys}, leader=leader, run=run, beat=beat)


def test_a_node_key_carries_its_ranks_keys_unchanged():
    own = {r: encode_key(make_snapshot(step=r), rank=r, run="r1", pid=9, beat=r) for r in (5, 4)}
    node = decode_node_key(encode_node_key(own, leader=4, run="r1", beat=7), run="r1", leader=4)
    assert (node.leader, node.beat) == (4, 7) and node.keys == own
    assert decode_key(node.keys[5], run="r1", rank=5).snapshot.step == 5


@pytest.mark.parametrize("payload, leader", [
    (_node(run="other"), 2),  # another run's
    (_node(), 3),  # another leader's, under this one's name
    (_node().rsplit(b"\n", 1)[0], 2),  # a line short of its rank list
    (_node().replace(b'"v":1', b'"v":2', 1), 2),  # another version
    (_node().replace(b'"k":[2,3]', b'"k":[2,2]'), 2),  # a rank twice
    (b"\xff\n{}", 2),
])
def test_a_node_key_of_another_run_leader_or_shape_is_refused(payload, leader):
    with pytest.raises(BadKey):
        decode_node_key(payload, run="r1", leader=leader)


def test_a_node_key_refuses_more_ranks_than_a_node_holds():
    with pytest.raises(ValueError, match="ranks"):
        encode_node_key({r: b"{}" for r in range(MAX_NODE_RANKS + 1)}, leader=0, run="r",
                        beat=1)
