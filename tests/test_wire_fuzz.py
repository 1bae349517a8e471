"""Property-based fuzzing of the datagram decoder and of what the intake builds from it.

The decoder is total: any bytes give a record or a :class:`RecordError`, never another
exception. Whatever it accepts can be exported: a registry holding a table fed those records
renders without error, with finite or exportable values only. Examples are bounded
(``LAGGARD_FUZZ_EXAMPLES``) so CI stays fast.
"""

from __future__ import annotations

import json
import math
import os

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import generate_latest
from support import registry_of

from laggard.agent.context import FindingLog
from laggard.agent.run_metrics import RunMetrics
from laggard.agent.run_table import RankTable
from laggard.wire import (
    MAX_JSON_DEPTH,
    MAX_WIRE_NUMBER,
    CollectiveTiming,
    RecordError,
    StepRecord,
    WindowReport,
    decode_datagram,
    json_depth,
    split_batch,
)

FUZZ_EXAMPLES = int(os.environ.get("LAGGARD_FUZZ_EXAMPLES", "60"))
FUZZ = settings(max_examples=FUZZ_EXAMPLES * 3, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

_NUMBER = st.one_of(
    st.integers(), st.floats(), st.integers(-(10 ** 400), 10 ** 400),
    st.sampled_from([0, -1, 2 ** 53, 2 ** 53 + 1, 2 ** 63, 2 ** 64, 10 ** 308, 1e308,
                     float("nan"), float("inf"), True]))
_LEAF = st.one_of(st.none(), st.booleans(), _NUMBER, st.text(max_size=70))
_VALUE = st.recursive(_LEAF, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=20)
_STEP_KEYS = ["v", "rank", "world_size", "step", "local_rank", "node", "phases",
              "collective_wait_seconds", "step_seconds", "collectives", "comm", "checksums",
              "type"]
_WINDOW_KEYS = ["v", "type", "step", "world_size", "scores", "findings", "comm",
                "detector_stats"]
_FINDING = st.fixed_dictionaries({}, optional={
    "detector": st.sampled_from(["straggler", "integrity", "x" * 64, "", 3]),
    "kind": st.sampled_from(["compute", "data", "job_slowdown", "nope"]),
    "severity": st.sampled_from(["warning", "critical", "loud"]),
    "rank": _NUMBER, "step": _NUMBER, "cleared": st.booleans(), "evidence": _VALUE})


@st.composite
def _document(draw) -> dict:
    """A dict shaped like a record, with every field drawn from good and hostile values."""
    window = draw(st.booleans())
    doc = {"v": 1, "type": "window"} if window else {"v": 1}
    base = {"rank": draw(st.integers(0, 7)), "world_size": 8, "step": draw(st.integers(0, 9))}
    doc.update(base if not window else {"step": base["step"], "world_size": 8})
    for key in draw(st.lists(st.sampled_from(_WINDOW_KEYS if window else _STEP_KEYS),
                             max_size=5)):
        if key == "phases" or key == "comm":
            doc[key] = draw(st.dictionaries(st.text(min_size=1, max_size=70), _NUMBER,
                                            max_size=4))
        elif key == "collectives":
            doc[key] = draw(st.lists(st.fixed_dictionaries(
                {"op": st.text(min_size=1, max_size=70), "seconds": _NUMBER},
                optional={"bytes": _NUMBER}), max_size=3))
        elif key == "scores":
            doc[key] = draw(st.dictionaries(st.sampled_from(["0", "1", "7", "8", "-1", "1e3"]),
                                            _NUMBER, max_size=4))
        elif key == "findings":
            doc[key] = draw(st.lists(_FINDING, max_size=3))
        elif key == "detector_stats":
            doc[key] = draw(st.dictionaries(st.text(min_size=1, max_size=8), _NUMBER,
                                            max_size=3))
        else:
            doc[key] = draw(_VALUE)
    return doc


def _encode(doc: dict) -> bytes:
    return json.dumps(doc).encode()  # NaN and Infinity as Python writes them


_PAYLOAD = st.one_of(
    st.binary(max_size=300),
    _document().map(_encode),
    _VALUE.map(lambda v: json.dumps(v).encode()),
    st.integers(1, 9000).map(lambda n: b"[" * n),
    st.integers(1, 3000).map(lambda n: b'{"v":1,"x":' * n),
)


def _decode(payload: bytes):
    try:
        return decode_datagram(payload)
    except RecordError as exc:
        assert exc.reason in {"oversized", "too_deep", "not_json", "version", "schema", "range",
                              "decoder_error"}
        assert exc.reason != "decoder_error", exc  # a hole in the validation, not a bad input
        return None


@FUZZ
@given(_PAYLOAD)
def test_the_decoder_returns_a_record_or_a_record_error(payload):
    item = _decode(payload)
    if isinstance(item, StepRecord):
        assert 0 <= item.rank < item.world_size
        numbers = [*item.phases.values(), *item.comm.values(),
                   *(c.seconds for c in item.collectives), *(c.bytes for c in item.collectives),
                   item.step, item.step_seconds or 0, item.collective_wait_seconds or 0]
        assert all(math.isfinite(x) and 0 <= x <= MAX_WIRE_NUMBER for x in numbers)
    elif isinstance(item, WindowReport):
        assert all(0 <= r < item.world_size for r in item.scores)
        assert all(f.get("rank") is None or 0 <= f["rank"] < item.world_size
                   for f in item.findings)


@FUZZ
@given(st.lists(_PAYLOAD, min_size=1, max_size=12))
def test_whatever_is_accepted_can_be_scraped(payloads):
    table = RankTable(max_ranks=4, findings=FindingLog(), default_node="n0", max_series=400)
    for payload in payloads:
        table.ingest(payload)
    assert table.accepted + sum(table.rejected.values()) == len(payloads)
    assert table.rejected["internal_error"] == 0
    text = generate_latest(registry_of(RunMetrics(table))).decode()
    assert "laggard_intake_datagrams_total" in text


@FUZZ
@given(st.lists(st.sampled_from(["[", "]", "{", "}", '"', "\\", "a", ",", ":"]), max_size=80))
def test_json_depth_never_understates_the_nesting(chars):
    payload = "".join(chars).encode()
    try:
        doc = json.loads(payload)
    except (ValueError, RecursionError):
        return
    def depth(value):
        if isinstance(value, list):
            return 1 + max(map(depth, value), default=0)
        if isinstance(value, dict):
            return 1 + max(map(depth, value.values()), default=0)
        return 0
    assert min(depth(doc), MAX_JSON_DEPTH + 1) <= json_depth(payload)


@FUZZ
@given(st.builds(
    StepRecord, rank=st.integers(0, 3), world_size=st.just(4), step=st.integers(0, 2 ** 53),
    phases=st.dictionaries(st.text(min_size=1, max_size=64), st.floats(0, 1e6), max_size=5),
    collectives=st.lists(st.builds(CollectiveTiming, st.text(min_size=1, max_size=64),
                                   st.floats(0, 1e3), st.integers(0, 2 ** 53)), max_size=4),
    checksums=st.lists(st.integers(-(2 ** 63), 2 ** 64 - 1), max_size=4)))
def test_every_valid_record_survives_the_round_trip(record):
    assert decode_datagram(record.encode()) == record


_BATCH_REASONS = {"oversized", "version", "schema", "range", "run_charset", "run_length"}


@FUZZ
@given(st.lists(_PAYLOAD, min_size=1, max_size=8), st.integers(-2, 70),
       st.sampled_from([1, 2, "1"]), st.binary(max_size=40))
def test_a_batch_splits_or_is_a_record_error(items, count, version, tail):
    # A batch header over arbitrary lines (a count that may lie, a version that may be wrong,
    # garbage after): split into its lines or refused with a label, never another exception.
    header = json.dumps({"v": version, "type": "batch", "run": "r", "rank": 0,
                         "count": count, "dropped": 0}).encode()
    payload = b"\n".join([header, *(i.replace(b"\n", b" ") for i in items)]) + tail
    try:
        split = split_batch(payload)
    except RecordError as exc:
        assert exc.reason in _BATCH_REASONS, exc
        return
    assert split is not None
    head, lines = split
    assert head.count == len(lines) == count and all(lines)
    table = RankTable(max_ranks=4, findings=FindingLog(), default_node="n0", max_series=400)
    for line in lines:
        table.ingest(line)
    assert table.accepted + sum(table.rejected.values()) == len(lines)
    assert table.rejected["internal_error"] == 0


@FUZZ
@given(_PAYLOAD)
def test_any_datagram_is_a_batch_none_or_a_record_error(payload):
    try:
        split = split_batch(payload)
    except RecordError as exc:
        assert exc.reason in _BATCH_REASONS, exc
        return
    assert split is None or split[0].count == len(split[1])
