"""Kernel-log parser on the real logs of the corpus (answers from corpus/EXPECTED.md) and on the
line formats of the driver source that the corpus does not cover."""

from __future__ import annotations

import time
from collections import Counter
from datetime import datetime, timezone

import pytest
from support import FIXTURES

from laggard.parsers.kernel_log import (
    KernelLogParser,
    SXidEvent,
    XidEvent,
    parse_kernel_log,
)

XID_DIR = FIXTURES / "xid"
#: Reference time for year-less syslog stamps: 2026-06-01 UTC.
NOW = datetime(2026, 6, 1, tzinfo=timezone.utc).timestamp()


def events_of(name: str) -> list[XidEvent | SXidEvent]:
    with open(XID_DIR / name, encoding="utf-8") as f:
        return list(parse_kernel_log(f, now=NOW))


def xids(events: list[XidEvent | SXidEvent]) -> list[XidEvent]:
    return [e for e in events if isinstance(e, XidEvent)]


def local(y: int, mo: int, d: int, h: int, mi: int, s: int) -> float:
    return time.mktime((y, mo, d, h, mi, s, 0, 0, -1))


def test_xid01_five_gsp_timeouts_and_no_rpc_history_rows() -> None:
    events = events_of("xid01_gsp_rpc_timeout_xid119_dmesg_ctime.log")
    assert [(e.xid, e.pci_bus_id) for e in xids(events)] == [(119, "0000:9b:00")] * 5
    assert len(events) == 5  # the RPC history rows (NVRM:     -1    103 ...) are not Xids
    assert Counter((e.pid, e.process) for e in xids(events)) == {
        (2024380, "nvidia-smi"): 3, (1263500, "cache_mgr_main"): 1, (1240590, "gpud"): 1}
    assert events[0].timestamp == local(2025, 2, 23, 16, 24, 18)
    assert events[-1].timestamp == local(2025, 2, 23, 16, 30, 13)
    functions = [e.message.split("Expected function ")[1].split(" (")[0] for e in xids(events)]
    assert functions == ["103", "10", "10", "76", "76"]


def test_xid02_sixteen_xid13_then_xid43_iso_decode() -> None:
    events = xids(events_of("xid02_xid13_flood_then_xid43_dmesg_decode_iso.log"))
    assert [e.xid for e in events] == [13] * 16 + [43]
    assert {e.pci_bus_id for e in events} == {"0000:38:00"}
    assert all(e.pid is None and e.process is None for e in events[:16])
    last = events[-1]
    assert (last.pid, last.process, last.message) == (2924364, "pt_main_thread", "Ch 00000008")
    expected = datetime(2025, 1, 21, 4, 41, 44, 287197, tzinfo=timezone.utc).timestamp()
    assert last.timestamp == pytest.approx(expected, abs=1e-6)
    assert events[0].message.startswith("Graphics SM Global Exception on (GPC 8, TPC 5, SM 1)")


def test_xid03_one_xid79_and_four_sxid_events_once_per_fatal_link_line() -> None:
    events = events_of("xid03_xid79_then_nvswitch_sxid20034_dmesg_uptime.log")
    gpu = xids(events)
    assert [(e.xid, e.pci_bus_id, e.pid) for e in gpu] == [(79, "0000:91:00", None)]
    assert gpu[0].uptime_seconds == pytest.approx(6781741.548779)
    switch = [e for e in events if isinstance(e, SXidEvent)]
    assert [(e.sxid, e.pci_bus_id, e.link, e.severity) for e in switch] == [
        (20034, "0000:06:00.0", 48, "fatal"),
        (20034, "0000:05:00.0", 63, "fatal"),
        (20034, "0000:07:00.0", 37, "fatal"),
        (20034, "0000:05:00.0", 62, "fatal"),
    ]
    assert switch[0].device == "nvidia-nvswitch1"
    assert switch[0].uptime_seconds - gpu[0].uptime_seconds == pytest.approx(11.85, abs=0.01)


def test_xid06_three_xid13_then_xid109_peermem_line_ignored() -> None:
    events = events_of("xid06_xid13_then_xid109_dmesg_ctime_unknown_pid.log")
    assert [(e.xid, e.pci_bus_id) for e in xids(events)] == [(13, "0000:cb:00")] * 3 + [
        (109, "0000:cb:00")]
    assert len(events) == 4
    assert events[0].timestamp == local(2024, 8, 30, 11, 43, 9)
    last = xids(events)[-1]
    assert (last.pid, last.process) == (1797828, "pt_main_thread")
    assert "CTX SWITCH TIMEOUT" in last.message and last.timestamp == local(2024, 8, 30, 11, 43, 14)


def test_xid08_legacy_format_without_pid() -> None:
    events = xids(events_of("xid08_legacy_driver_xid32_xid31_no_pid.log"))
    assert [(e.xid, e.pci_bus_id) for e in events] == [(32, "0000:01:00")] * 2 + [
        (31, "0000:01:00")]
    assert [e.uptime_seconds for e in events] == pytest.approx([24128.828315, 24128.828608,
                                                                24128.834365])
    assert all(e.pid is None and e.timestamp is None for e in events)
    assert events[2].message == "Ch 00000003, engmask 00000101, intr 10000000"


def test_xid11_multiline_fallen_off_the_bus_is_xid79() -> None:
    events = xids(events_of("xid11_fallen_off_bus_multiline_without_xid_dmesg.log"))
    assert [(e.xid, e.pci_bus_id) for e in events] == [(79, "0000:b3:00")]
    assert events[0].uptime_seconds == pytest.approx(1843.308145)
    assert "10de:26b5" in events[0].message and events[0].raw.count("\n") == 2


def test_xid12_syslog_prefix_year_less() -> None:
    events = xids(events_of("xid12_xid48_dbe_xid64_syslog_with_uptime.log"))
    assert [(e.xid, e.pci_bus_id) for e in events] == [(48, "0000:07:00"), (64, "0000:07:00")]
    assert "physAddr 0x7fffa8860 partition 7, subpartition 1" in events[0].message
    # No year in syslog: the latest Dec 2 not after the reference time (2026-06-01) is 2025.
    assert events[0].timestamp == local(2025, 12, 2, 11, 38, 47)
    assert events[0].uptime_seconds == pytest.approx(219.470994)


def test_kmsg_record_with_embedded_newlines_and_sequence_prefix() -> None:
    parser = KernelLogParser()
    record = ("3,4242,1843308145,-;NVRM: The NVIDIA GPU 0001:B3:00.0\\x0aNVRM: (PCI ID: 10de:26b5)"
              " installed in this system has\\x0aNVRM: fallen off the bus and is not responding"
              " to commands.")
    (event,) = parser.feed(record)
    assert (event.xid, event.pci_bus_id, event.uptime_seconds) == (79, "0001:b3:00", 1843.308145)
    assert event.raw == record
    assert parser.feed(" SUBSYSTEM=pci") == []  # kmsg dictionary line


@pytest.mark.parametrize(("line", "expected"), [
    # MIG attribution, NVLink5 fatal token, pid/name
    ("4,1,2000000,-;NVRM: Xid (PCI:0018:01:00 GPU-I:02 GPU-CI:01): 149, pid=12, name=python3, "
     "NETIR_LINK_EVT Fatal Link 00 (0x016415c6)",
     dict(xid=149, pci_bus_id="0018:01:00", gpu_instance=2, compute_instance=1, pid=12,
          process="python3", fatal_token="Fatal", uptime_seconds=2.0)),
    # no process context (newer drivers), lower-case nonfatal token
    ("[ 5.5] NVRM: Xid (PCI:0000:B9:00): 145, RLW, nonfatal, cross-contain=0, Link 3 (0x4)",
     dict(xid=145, pci_bus_id="0000:b9:00", pid=None, fatal_token="Nonfatal",
          message="RLW, nonfatal, cross-contain=0, Link 3 (0x4)")),
    # derivative Xid with the "caused by previous Xid" suffix, journald short-precise
    ("Dec 02 11:38:47.250000 node01 kernel: NVRM: Xid (PCI:0000:b9:00): 45, pid=7, "
     "name=pt_main_thread, Ch 00000010 caused by previous Xid 145",
     dict(xid=45, caused_by=145, message="Ch 00000010", pid=7, fatal_token=None,
          timestamp=local(2025, 12, 2, 11, 38, 47) + 0.25)),
    # pre-"PCI:" driver, journald short-iso with a +0000 zone
    ("2025-01-21T04:41:44+0000 node01 kernel: NVRM: Xid (0000:03:00): 14, Channel 00000001",
     dict(xid=14, pci_bus_id="0000:03:00", message="Channel 00000001",
          timestamp=datetime(2025, 1, 21, 4, 41, 44, tzinfo=timezone.utc).timestamp())),
    # empty pid and name (seen in GSP timeouts from kernel threads), dmesg -r priority prefix
    ("<4>[  219.4] NVRM: Xid (PCI:0000:9b:00): 119, pid=, name=, Timeout after 6s",
     dict(xid=119, pid=None, process=None, message="Timeout after 6s", uptime_seconds=219.4)),
])
def test_driver_format_variants(line: str, expected: dict[str, object]) -> None:
    (event,) = KernelLogParser(now=NOW).feed(line)
    for field, value in expected.items():
        assert getattr(event, field) == value, field


def test_malformed_and_truncated_lines_are_counted_and_skipped() -> None:
    parser = KernelLogParser()
    lines = [
        "[ 12.3] NVRM: Xid (PCI:0000:b9:00): garbled",
        "[ 12.3] NVRM: Xid (PCI:0000:b9",
        "kernel: nvidia-nvswitch3: SXid (PCI:0000:c1:00.0): garbled, Fatal",
        "[ 12.4] NVRM: GPU4 RPC history (CPU -> GSP):",  # lookalike, not an Xid line
        "[ 12.4] NVRM:     -1    103  GSP_RM_ALLOC   0x0000000000002080 0x0000000000000004",
        "\x00\xff garbage \ufffd",
        "",
        "[ 12.5] NVRM: Xid (PCI:0000:b9:00): 13, pid=1, name=a, fine",
    ]
    events = [e for line in lines for e in parser.feed(line)]
    assert [e.xid for e in xids(events)] == [13]
    assert (parser.lines, parser.skipped) == (8, 3)


def test_unfinished_fallen_off_bus_message_is_not_an_event() -> None:
    lines = ["[ 1.0] NVRM: The NVIDIA GPU 0000:b3:00.0",
             "[ 1.1] NVRM: loading NVIDIA UNIX Open Kernel Module",
             "[ 1.2] NVRM: Xid (PCI:0000:b3:00): 31, pid=1, name=a, MMU fault"]
    assert [(e.xid, e.uptime_seconds) for e in parse_kernel_log(lines)] == [(31, 1.2)]


@pytest.mark.parametrize(("line", "expected"), [
    # journalctl -o short-unix
    ("1737434504.283302 node01 kernel: NVRM: Xid (PCI:0000:38:00): 43, pid=5, name=p, Ch 08",
     dict(xid=43, timestamp=1737434504.283302, uptime_seconds=None)),
    # journalctl -o short-monotonic
    ("[ 6781741.548779] node01 kernel: NVRM: Xid (PCI:0000:91:00): 79, pid='<unknown>', "
     "name=<unknown>, GPU has fallen off the bus.",
     dict(xid=79, uptime_seconds=6781741.548779, timestamp=None)),
    # dmesg --time-format reltime and delta: the message is still read
    ("[Feb23 16:24] NVRM: Xid (PCI:0000:9b:00): 119, pid=1, name=a, Timeout",
     dict(xid=119, timestamp=None, uptime_seconds=None)),
    ("[  +0.000010] NVRM: Xid (PCI:0000:9b:00): 120, pid=1, name=a, GSP error",
     dict(xid=120, timestamp=None)),
])
def test_journal_and_dmesg_time_formats(line: str, expected: dict[str, object]) -> None:
    (event,) = KernelLogParser(now=NOW).feed(line)
    for field, value in expected.items():
        assert getattr(event, field) == value, field


def test_fabric_manager_bracketed_iso_nonfatal_sxid() -> None:
    (event,) = KernelLogParser().feed(
        "[2026-07-15T04:18:55.513286+00:00] nvidia-nvswitch0: SXid (PCI:0000:59:00.0): 12028, "
        "Non-fatal, Link 32 egress non-posted PRIV error (First)")
    assert isinstance(event, SXidEvent)
    assert (event.sxid, event.pci_bus_id, event.link, event.severity) == (
        12028, "0000:59:00.0", 32, "nonfatal")
    assert event.timestamp == pytest.approx(
        datetime(2026, 7, 15, 4, 18, 55, 513286, tzinfo=timezone.utc).timestamp())


def test_fallen_off_bus_with_a_prefix_on_every_line() -> None:
    # journald short-monotonic and rsyslog repeat the prefix on each line of one printk
    lines = ["[ 1843.308145] node01 kernel: NVRM: The NVIDIA GPU 0000:b3:00.0",
             "[ 1843.308145] node01 kernel: NVRM: (PCI ID: 10de:26b5) installed in this system has",
             "[ 1843.308145] node01 kernel: NVRM: fallen off the bus and is not responding to "
             "commands."]
    events = list(parse_kernel_log(lines))
    assert [(e.xid, e.pci_bus_id) for e in events] == [(79, "0000:b3:00")]

