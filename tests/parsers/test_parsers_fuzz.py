"""Property-based fuzzing of every parser ``laggard analyze`` uses, and of the flight-recorder
loader: whatever the input, a parser returns or raises the error it documents, never anything
else. Inputs are mutations of the real fixture files (lines shuffled, cut, spliced with huge
numbers, NaN, deep brackets, control bytes) plus plain random text; examples are bounded so CI
stays fast (``FUZZ_EXAMPLES``)."""

from __future__ import annotations

import gzip
import json
import os
import pickle
import tempfile

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import FIXTURES

from laggard.analyze import filetype
from laggard.analyze.cli import analyze_paths
from laggard.parsers.exposition import dcgm_gpus, parse_exposition
from laggard.parsers.flight_recorder import (
    DumpError,
    load_dump,
    parse_dump,
    parse_fr_trace_report,
)
from laggard.parsers.infiniband_listing import parse_ib_listing, parse_ibstat, parse_perfquery
from laggard.parsers.kernel_log import KernelLogParser, parse_kernel_log
from laggard.parsers.nccl_inspector import parse_inspector_lines
from laggard.parsers.nccl_log import parse_nccl_log
from laggard.parsers.nccl_tests import parse_nccl_tests
from laggard.parsers.nvidia_smi import parse_nvidia_smi_csv, parse_nvidia_smi_q
from laggard.parsers.proc_net_dev import parse_proc_net_dev
from laggard.parsers.proc_net_udp import parse_udp_drops

FUZZ_EXAMPLES = int(os.environ.get("LAGGARD_FUZZ_EXAMPLES", "60"))
FUZZ = settings(max_examples=FUZZ_EXAMPLES, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

_TEXT_FIXTURES = sorted(
    p for p in (FIXTURES / "analyze").rglob("*")
    if p.is_file() and not p.read_bytes()[:2].startswith(b"\x80"))
_FIXTURE_LINES = sorted({line for p in _TEXT_FIXTURES
                         for line in p.read_text(errors="replace").splitlines()[:300]})
_PICKLED_DUMP = (FIXTURES / "analyze" / "fr_nvrx_gpu_error_2nd" / "_dump_0").read_bytes()

# What breaks parsers: numbers past float or int-string range, NaN, deep nesting, odd bytes.
_NASTY = st.sampled_from([
    "9" * 5000, "1e999", "-1e999", "NaN", "Infinity", "-0", "0x7fffffffffffffff",
    "[" * 3000, "{" * 3000, '{"a":' * 2000, "\x00", "\ufffd", "\u202e", "\r", "\t" * 50,
    "Xid", "NVRM: Xid (PCI:0000:3b:00): 79,", "NCCL WARN", "[Rank 0] Watchdog", "|", ":", "=",
])


@st.composite
def _mutated_line(draw) -> str:
    line = draw(st.sampled_from(_FIXTURE_LINES))
    op = draw(st.integers(0, 4))
    if op == 0:
        return line
    at = draw(st.integers(0, len(line)))
    if op == 1:
        return line[:at]
    if op == 2:
        return line[:at] + draw(_NASTY) + line[at:]
    if op == 3:
        return "".join(draw(_NASTY) if c.isdigit() and draw(st.booleans()) else c
                       for c in line[:200])
    return draw(st.text(max_size=80))


_LINES = st.lists(st.one_of(_mutated_line(), st.text(max_size=200)), max_size=40)


@FUZZ
@given(_LINES)
def test_line_parsers_return_whatever_the_lines(lines):
    parse_kernel_log(lines)
    parser = KernelLogParser()
    for line in lines:
        parser.feed(line)
    parser.flush()
    parse_nccl_log(lines)
    parse_nccl_tests(lines)
    parse_nvidia_smi_q(lines)
    try:
        parse_nvidia_smi_csv(lines)
    except ValueError:
        pass  # documented: the first row is not a --query-gpu header
    parse_ib_listing(lines)
    parse_ibstat(lines)
    parse_perfquery(lines)
    dcgm_gpus(parse_exposition(lines))
    parse_inspector_lines(lines)
    parse_fr_trace_report(lines)
    parse_proc_net_dev("\n".join(lines))
    parse_udp_drops(lines)


_JSON_LEAF = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=20),
                       st.sampled_from([10 ** 400, -(10 ** 400), float("nan"), float("inf")]))
_JSON = st.recursive(_JSON_LEAF, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=12), inner, max_size=4)),
    max_leaves=30)
_ENTRY_KEYS = ["process_group", "pg_id", "profiling_name", "collective_seq_id", "p2p_seq_id",
               "is_p2p", "input_sizes", "output_sizes", "input_dtypes", "output_dtypes", "state",
               "time_created_ns", "timeout_ms", "record_id"]


@st.composite
def _dump_doc(draw):
    entries = draw(st.lists(st.dictionaries(st.sampled_from(_ENTRY_KEYS), _JSON, max_size=8),
                            max_size=4))
    return {"version": draw(_JSON), "entries": entries,
            "pg_config": draw(st.dictionaries(st.text(max_size=4), st.dictionaries(
                st.sampled_from(["desc", "ranks"]), _JSON), max_size=3)),
            "pg_status": draw(st.dictionaries(st.text(max_size=4), st.dictionaries(
                st.sampled_from(["last_enqueued_collective", "last_started_collective",
                                 "last_completed_collective"]), _JSON), max_size=3))}


@FUZZ
@given(st.one_of(_dump_doc(), _JSON))
def test_parse_dump_takes_any_loaded_structure(raw):
    try:
        parse_dump(raw)
    except DumpError:
        pass


def _load_bytes(data: bytes, name: str = "_dump_3"):
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, name)
        with open(path, "wb") as f:
            f.write(data)
        try:
            return load_dump(path)
        except DumpError:
            return None


@st.composite
def _mutated_pickle(draw) -> bytes:
    data = bytearray(_PICKLED_DUMP)
    for _ in range(draw(st.integers(1, 8))):
        at = draw(st.integers(0, len(data) - 1))
        op = draw(st.integers(0, 2))
        if op == 0:
            data[at] = draw(st.integers(0, 255))
        elif op == 1:
            del data[at:at + draw(st.integers(1, 64))]
        else:
            data[at:at] = draw(st.binary(max_size=16))
    return bytes(data)


@FUZZ
@given(st.one_of(
    _mutated_pickle(),
    _dump_doc().map(lambda d: json.dumps(d).encode()),
    st.binary(max_size=512),
    st.just(b'{"pg_config": {}, "entries": ' + b"[" * 5000 + b"]" * 5000 + b"}"),
    st.just(b"(" * 3000 + b")" * 3000),
))
def test_the_flight_recorder_loader_raises_only_dump_error(data):
    _load_bytes(data)


def test_a_restricted_pickle_refuses_code_whatever_it_is_wrapped_in():
    class Evil:
        def __reduce__(self):
            return (os.system, ("echo pwned",))

    assert _load_bytes(pickle.dumps({"entries": [Evil()]}, protocol=4)) is None


@FUZZ
@given(st.one_of(
    st.lists(_mutated_line(), max_size=30).map(lambda ls: "\n".join(ls).encode()),
    st.binary(max_size=400),
    _mutated_pickle(),
    st.lists(_mutated_line(), max_size=30).map(
        lambda ls: gzip.compress("\n".join(ls).encode())[:-5]),  # a truncated .gz
    st.just(b"[" * 6000 + b"]" * 6000),
    st.just(b'{"coll_perf": ' + b"[" * 6000 + b"]" * 6000 + b"}\n"),
), st.sampled_from((None, *filetype.KINDS)))
def test_analyze_reports_every_file_without_raising(data, kind):
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("fuzzed.log", "_dump_1"):
            with open(os.path.join(tmp, name), "wb") as f:
                f.write(data)
        try:
            filetype.detect(os.path.join(tmp, "fuzzed.log"))
        except filetype.FileKindError:
            pass
        findings, inputs = analyze_paths([tmp], kind)
        assert all(isinstance(e, str) for e in inputs.errors)
