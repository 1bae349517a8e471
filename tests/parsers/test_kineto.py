"""The streaming Kineto (Chrome trace-event JSON) reader: events and the other top-level fields
at any chunk size, ``distributedInfo`` before or after the events, strings holding brackets,
truncated and foreign documents. The per-step breakdown and the straggler rule are tested in
tests/analyze/test_kineto.py."""

from __future__ import annotations

import io
import json

import pytest
from kineto_events import document, x

import laggard.parsers.kineto as kineto_parser
from laggard.parsers.kineto import KinetoReader, TraceError


def test_reader_streams_events_and_keeps_the_other_fields_at_any_chunk_size(monkeypatch):
    events = [x(f"aten::op{i}", i * 10.5, 3.25, extra=[1, {"a": "}]"}]) for i in range(50)]
    text = json.dumps(document(events, baseTimeNanoseconds=1_790_000_000_000_000_000),
                      indent=1)
    for chunk in (3, 17, 1 << 20):
        monkeypatch.setattr(kineto_parser, "CHUNK_CHARS", chunk)
        reader = KinetoReader(io.StringIO(text))
        assert list(reader.events()) == events
        assert reader.meta["baseTimeNanoseconds"] == 1_790_000_000_000_000_000  # not cut
        assert reader.meta["distributedInfo"]["rank"] == 0


@pytest.mark.parametrize("text, message", [
    ('{"schemaVersion": 1, "traceEvents": [{"ph": "X", "name": "a", "ts": 1', "ends"),
    ('{"schemaVersion": 1}', "no 'traceEvents'"),
    ('["not", "a", "trace"]', "expected '{'"),
])
def test_reader_rejects_truncated_and_foreign_documents(text, message):
    with pytest.raises(TraceError, match=message):
        list(KinetoReader(io.StringIO(text)).events())


def test_distributed_info_after_the_events_and_empty_or_non_object_events(monkeypatch):
    monkeypatch.setattr(kineto_parser, "CHUNK_CHARS", 7)
    events = [x("ProfilerStep#3", 0, 100, cat="user_annotation", note='a "]}" string')]
    doc = document(events, rank=5, world=8)
    text = json.dumps({"traceEvents": [{}, 5, *events], "distributedInfo":
                       doc["distributedInfo"]})
    reader = KinetoReader(io.StringIO(text))
    assert list(reader.events()) == events  # {} and 5 are not events
    assert reader.events_read == 1
    assert reader.meta["distributedInfo"]["world_size"] == 8


@pytest.mark.parametrize("chunk", [5, 64, 1 << 20])
def test_a_trace_cut_at_any_point_is_a_trace_error_after_the_whole_events(monkeypatch, chunk):
    monkeypatch.setattr(kineto_parser, "CHUNK_CHARS", chunk)
    events = [x(f"aten::mm{i}", i * 100, 50) for i in range(4)]
    text = json.dumps(document(events))
    for end in range(len(text) // 3, len(text) - 1, 37):
        reader = KinetoReader(io.StringIO(text[:end]))
        seen = []
        with pytest.raises(TraceError):
            seen.extend(reader.events())
        assert seen == events[:len(seen)]  # what came out before the cut was whole
