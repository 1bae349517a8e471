"""StepRecord / WindowReport wire format: round trips and every rejection reason."""

import json

import pytest

from laggard.wire import (
    MAX_DATAGRAM_BYTES,
    CollectiveTiming,
    RecordError,
    StepRecord,
    WindowReport,
    decode_datagram,
)


def test_step_record_round_trip_keeps_every_field():
    record = StepRecord(
        rank=3, world_size=4, step=17, local_rank=3, node="node01",
        phases={"data": 0.001, "forward": 0.01, "backward": 0.02},
        collective_wait_seconds=0.004, step_seconds=0.04,
        collectives=[CollectiveTiming("allreduce", 0.006, 1 << 20)],
        comm={"total_seconds": 0.006, "exposed_seconds": 0.002, "bytes": 1 << 20},
        checksums=[1, -2, 3],
    )
    assert decode_datagram(record.encode()) == record


def test_window_report_round_trip():
    report = WindowReport(step=40, world_size=8, scores={5: 7.5, 0: 0.1},
                          findings=[{"detector": "straggler", "kind": "compute",
                                     "severity": "warning", "rank": 5}],
                          detector_stats={"windows": 2, "missing_rank_reports": 3})
    assert decode_datagram(report.encode()) == report


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (b"\xff\xfe garbage", "not_json"),
        (b"[1, 2]", "not_json"),
        (b'{"v": 2, "rank": 0, "world_size": 1, "step": 0}', "version"),
        (b'{"v": 1, "rank": 4, "world_size": 4, "step": 0}', "range"),
        (b'{"v": 1, "rank": 0, "world_size": 1, "step": -1}', "range"),
        (b'{"v": 1, "rank": "0", "world_size": 1, "step": 0}', "schema"),
        (b'{"v": 1, "rank": 0, "world_size": 1, "step": 0, "phases": {"f": -1}}', "range"),
        (b'{"v": 1, "rank": 0, "world_size": 1, "step": 0, "phases": {"f": NaN}}', "range"),
        (b'{"v": 1, "rank": 0, "world_size": 1, "step": 0, "step_seconds": true}', "schema"),
        (b'{"v": 1, "type": "window", "step": 0, "world_size": 2, "scores": {"9": 1}}',
         "range"),
        (b'{"v": 1, "type": "window", "step": 0, "world_size": 2, "findings": [1]}', "schema"),
        (b'{"v": 1, "type": "window", "step": 0, "world_size": 2,'
         b' "detector_stats": {"windows": -1}}', "range"),
        (b"x" * (MAX_DATAGRAM_BYTES + 1), "oversized"),
        # One datagram of brackets once exhausted json's recursion and killed the intake.
        (b"[" * 5000, "too_deep"),
        (b'{"v": 1, "rank": 0, "world_size": 1, "step": 0, "x": ' + b"[" * 17 + b"]" * 17 + b"}",
         "too_deep"),
        # Integers beyond float range once made every later scrape fail with OverflowError.
        (b'{"v": 1, "rank": 0, "world_size": 1, "step": 0, "collectives": [{"op": "a", '
         b'"seconds": 0, "bytes": 1' + b"0" * 400 + b"}]}", "range"),
        (b'{"v": 1, "rank": 0, "world_size": 1, "step": 1' + b"0" * 30 + b"}", "range"),
        (b'{"v": 1, "rank": 0, "world_size": 1, "step": 0, "phases": {"f": 1' + b"0" * 400
         + b"}}", "range"),
        (b'{"v": 1, "rank": 0, "world_size": 1, "step": 0, "comm": {"bytes": 1e300}}', "range"),
        (b'{"v": 1, "rank": 0, "world_size": 1, "step": 0, "checksums": [1' + b"0" * 30 + b"]}",
         "range"),
        (b'{"v": 1, "rank": 0, "world_size": 1' + b"0" * 30 + b', "step": 0}', "range"),
        # A finding must name a rank of its own job.
        (b'{"v": 1, "type": "window", "step": 0, "world_size": 4, "findings": [{"detector": '
         b'"straggler", "kind": "compute", "severity": "warning", "rank": 999999999}]}', "range"),
        (b'{"v": 1, "type": "window", "step": 0, "world_size": 4, "scores": {"1e3": 1}}',
         "schema"),
        (b'{"v": 1, "type": "window", "step": 0, "world_size": 4, "scores": {"1": 1e999}}',
         "range"),
    ],
)
def test_bad_datagrams_are_rejected_with_a_reason(payload, reason):
    with pytest.raises(RecordError) as excinfo:
        decode_datagram(payload)
    assert excinfo.value.reason == reason


def test_unknown_keys_are_ignored_for_forward_compatibility():
    doc = {"v": 1, "rank": 0, "world_size": 1, "step": 2, "future_field": [1, 2]}
    assert decode_datagram(json.dumps(doc).encode()).step == 2


def test_heartbeat_round_trips_with_collective_groups_and_p2p_pairs() -> None:
    from laggard.wire import GroupProgress, Heartbeat

    beat = Heartbeat(rank=3, world_size=8, step=4812, run="train-42", pid=4242, node="n1",
                     phase="data", phase_seconds=95.2, step_seconds=0.41,
                     groups=[GroupProgress("dp", 20536, 20536, "allreduce", 95.1, 95.1),
                             GroupProgress("pp", 301, 300, "send", 0.2, 0.3, peer=7)])
    back = decode_datagram(beat.encode())
    assert back == beat
    assert back.groups[1].pending == 1 and back.groups[0].pending == 0


def test_group_progress_rounds_its_ages_to_the_millisecond_as_a_plain_entry() -> None:
    """What the sender does to the tracer's entries (a GroupProgress subclass with fields of
    its own): a plain GroupProgress, ages to 3 decimals, None left None."""
    from dataclasses import dataclass

    from laggard.wire import AGE_DECIMALS, GroupProgress, round_age

    @dataclass(frozen=True, slots=True, kw_only=True)
    class Local(GroupProgress):
        ranks: tuple[int, ...] = ()

    local = Local(group="dp:0", issued=5, completed=4, op="allreduce",
                  issued_age_seconds=1.23456, completed_age_seconds=None, peer=None, ranks=(0, 1))
    assert local.rounded() == GroupProgress("dp:0", 5, 4, "allreduce", 1.235, None, None)
    assert type(local.rounded()) is GroupProgress
    assert AGE_DECIMALS == 3 and round_age(None) is None and round_age(0.0004999) == 0.0


def test_a_group_key_names_its_group_by_its_description() -> None:
    from laggard.wire import group_desc

    assert [group_desc(k) for k in ("dp:3", "default_pg:0", "a:b:7", "pg5")] == [
        "dp", "default_pg", "a:b", "pg5"]


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (b'{"v":1,"type":"heartbeat","rank":0,"world_size":2,"step":1,'
         b'"groups":[{"group":"dp","issued":3,"completed":4}]}', "range"),  # completed > issued
        (b'{"v":1,"type":"heartbeat","rank":0,"world_size":2,"step":1,'
         b'"groups":[{"group":"pp","issued":3,"completed":3,"peer":2}]}', "range"),
        (b'{"v":1,"type":"heartbeat","rank":0,"world_size":2,"step":1,"pid":0}', "range"),
        (b'{"v":1,"type":"heartbeat","rank":0,"world_size":2,"step":1,"groups":{}}', "schema"),
        (b'{"v":1,"type":"heartbeat","rank":0,"world_size":2,"step":1,"phase_seconds":-1}',
         "range"),
        (b'{"v":1,"type":"beacon","rank":0,"world_size":2,"step":1}', "schema"),
    ],
)
def test_bad_heartbeats_are_rejected_with_a_reason(payload: bytes, reason: str) -> None:
    with pytest.raises(RecordError) as err:
        decode_datagram(payload)
    assert err.value.reason == reason
