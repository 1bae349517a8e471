"""The batch datagram (``laggard_pkg/wire.py``): a header line and one record a line, split by
the intake; a malformed batch is refused with a label like any datagram."""

from __future__ import annotations

import json

import pytest

from laggard.wire import (
    MAX_BATCH_ITEMS,
    MAX_DATAGRAM_BYTES,
    RecordError,
    StepRecord,
    decode_datagram,
    encode_batch,
    split_batch,
)


def _steps(n: int) -> list[bytes]:
    return [StepRecord(rank=2, world_size=4, step=i, run="r1", phases={"forward": 0.01},
                       node="n\nx").encode() for i in range(n)]


def test_a_batch_round_trips_record_by_record() -> None:
    items = _steps(5)
    payload = encode_batch(items, run="r1", rank=2, dropped=7)
    header, lines = split_batch(payload)
    assert (header.run, header.rank, header.count, header.dropped) == ("r1", 2, 5, 7)
    assert lines == items  # a newline inside a string is escaped: it never splits a record
    assert [decode_datagram(line).step for line in lines] == [0, 1, 2, 3, 4]


def test_other_datagrams_are_not_batches() -> None:
    assert split_batch(_steps(1)[0]) is None
    assert split_batch(b'{"v": 1,\n "rank": 0, "world_size": 1, "step": 3}') is None
    assert split_batch(b"garbage\nmore") is None
    # a batch is an unknown type to the single-datagram decoder (so never nested)
    with pytest.raises(RecordError) as info:
        decode_datagram(b'{"v":1,"type":"batch","run":"r","rank":0,"count":1,"dropped":0}')
    assert info.value.reason == "schema"


def _header(**fields: object) -> bytes:
    doc = {"v": 1, "type": "batch", "run": "r", "rank": 0, "count": 2, "dropped": 0}
    doc.update(fields)
    return json.dumps(doc).encode()


@pytest.mark.parametrize("header, lines, reason", [
    (_header(count=3), _steps(2), "schema"),          # the count lies
    (_header(count=0), [b"{}"], "range"),
    (_header(v=2), _steps(2), "version"),
    (_header(rank=-1), _steps(2), "range"),
    (_header(dropped="x"), _steps(2), "schema"),
    (_header(run="a b"), _steps(2), "run_charset"),
    (_header(count=2), [_steps(1)[0], b""], "schema"),  # an empty record
    (_header(count=2), [b"{}", b" " * MAX_DATAGRAM_BYTES], "oversized"),
])
def test_a_malformed_batch_is_refused_with_a_label(header: bytes, lines: list[bytes],
                                                   reason: str) -> None:
    with pytest.raises(RecordError) as info:
        split_batch(b"\n".join([header, *lines]))
    assert info.value.reason == reason


def test_too_many_records_is_a_schema_error_within_the_size() -> None:
    tiny = [b"{}"] * (MAX_BATCH_ITEMS + 1)
    with pytest.raises(RecordError) as info:
        split_batch(b"\n".join([_header(count=len(tiny)), *tiny]))
    assert info.value.reason == "range"
    assert len(b"\n".join(tiny)) < MAX_DATAGRAM_BYTES


def test_the_encoder_refuses_what_the_decoder_would() -> None:
    for items in ([], [b"a\nb"], [b"{}"] * (MAX_BATCH_ITEMS + 1)):
        with pytest.raises(ValueError):
            encode_batch(items, run="r", rank=0, dropped=0)


def test_decode_items_expands_a_batch_and_passes_any_other_datagram():
    from laggard.wire import Heartbeat, decode_items, encode_batch

    records = [StepRecord(rank=1, world_size=4, step=s, run="r1").encode() for s in (5, 6)]
    batch = encode_batch(records, run="r1", rank=1, dropped=0)
    assert [item.step for item in decode_items(batch)] == [5, 6]
    beat = Heartbeat(rank=1, world_size=4, run="r1", pid=7, step=6).encode()
    assert isinstance(decode_items(beat)[0], Heartbeat)
