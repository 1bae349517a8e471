"""The run id and the device identity on the wire: round trips, old senders, bad ids."""

import json

import pytest
from support import registry_of

from laggard.agent.context import FindingLog
from laggard.agent.run_metrics import RunMetrics
from laggard.agent.run_table import RankTable
from laggard.wire import (
    MAX_RUN_LEN,
    RecordError,
    StepRecord,
    WindowReport,
    check_run,
    decode_datagram,
    sanitise_run,
)


def test_run_and_device_identity_round_trip():
    record = StepRecord(rank=1, world_size=2, step=3, run="slurm-12.0",
                        uuid="GPU-5d1c0000-1111-2222-3333-444455556666",
                        pci_bus_id="00000000:9B:00.0")
    assert decode_datagram(record.encode()) == record
    report = WindowReport(step=3, world_size=2, run="slurm-12.0", scores={1: 0.2})
    assert decode_datagram(report.encode()) == report


def test_an_old_sender_without_run_is_run_empty_and_encodes_as_before():
    old = b'{"v":1,"rank":0,"world_size":1,"step":0}'
    assert decode_datagram(old).run == ""
    assert StepRecord(rank=0, world_size=1, step=0).encode() == old
    assert decode_datagram(b'{"v":1,"type":"window","step":0,"world_size":1}').run == ""


def _with(run):
    return json.dumps({"v": 1, "rank": 0, "world_size": 1, "step": 0, "run": run}).encode()


@pytest.mark.parametrize(("run", "reason"), [
    ("a" * (MAX_RUN_LEN + 1), "run_length"),
    ("a" * 7000, "run_length"),
    ("ok\x00", "run_charset"),
    ("ok\nLaggardAgentDown", "run_charset"),
    ('a"b', "run_charset"),
    ("with space", "run_charset"),
    ("é", "run_charset"),
    (12, "run_charset"),
    (None, "run_charset"),
    (["a"], "run_charset"),
])
def test_a_bad_run_id_is_refused_by_reason(run, reason):
    with pytest.raises(RecordError) as info:
        decode_datagram(_with(run))
    assert info.value.reason == reason
    window = json.dumps({"v": 1, "type": "window", "step": 0, "world_size": 1, "run": run})
    with pytest.raises(RecordError) as info:
        decode_datagram(window.encode())
    assert info.value.reason == reason


def test_bad_run_ids_are_counted_and_never_touch_another_runs_data():
    table = RankTable(rank_histograms=True, max_ranks=8, findings=FindingLog(), default_node="n0")
    table.ingest(StepRecord(rank=0, world_size=1, step=0, run="good").encode())
    table.ingest(_with("x" * 10_000))  # 10 kB: over the datagram limit
    table.ingest(_with("x" * 7_000))
    table.ingest(_with("bad\x07bell"))
    table.ingest(StepRecord(rank=0, world_size=1, step=1, run="good").encode())
    r = registry_of(RunMetrics(table))
    rejected = {reason: r.get_sample_value("laggard_intake_rejected_total", {"reason": reason})
                for reason in ("oversized", "run_length", "run_charset")}
    assert rejected == {"oversized": 1, "run_length": 1, "run_charset": 1}
    assert r.get_sample_value("laggard_steps_total", {"run": "good", "rank": "0"}) == 2
    assert r.get_sample_value("laggard_intake_runs") == 1


@pytest.mark.parametrize("key", ["uuid", "pci_bus_id"])
@pytest.mark.parametrize("value", ["", "x" * 97, "a\nb", 5, "é"])
def test_a_bad_device_identity_is_refused(key, value):
    doc = {"v": 1, "rank": 0, "world_size": 1, "step": 0, key: value}
    with pytest.raises(RecordError) as info:
        decode_datagram(json.dumps(doc).encode())
    assert info.value.reason == "schema"


def test_sanitise_run_always_gives_what_check_run_accepts():
    for text in ["", "ok", "a b\tc", "\x00" * 100, "é" * 70, "x" * 1000, "\ud800"]:
        run = sanitise_run(text)
        assert check_run(run) == run
        assert len(run) <= MAX_RUN_LEN
    assert sanitise_run("ok-1.2") == "ok-1.2"
