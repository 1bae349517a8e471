"""Kernel-log grammar on lines written here to the driver's printf formats (open-gpu-kernel-
modules: ``krcReportXid`` in ``kernel_rc.c``; ``NVSWITCH_PRINT_SXID``, ``NVSWITCH_REPORT_*`` and
``_nvswitch_dump_error_entry`` in ``src/common/nvswitch``), in the prefixes dmesg, the kernel's
``/dev/kmsg``, syslog and journald put before them. No line here is copied from a sample."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
from support import analyze_json

from laggard.detectors.finding import Severity
from laggard.detectors.xid_catalog import sxid_lookup
from laggard.parsers.kernel_log import (
    SXID_ORPHAN_LINES,
    KernelLogParser,
    SXidEvent,
    XidEvent,
    parse_kernel_log,
)

NOW = datetime(2026, 6, 1, tzinfo=timezone.utc).timestamp()
NINE = "Data {0x00000001, 0x00a0b0c0, 0x00000000, 0x00000000, 0x00000007, 0x00000000, " \
       "0x00000000, 0x00000000, 0x00000000}"
EIGHT = "Data {0x00000000, 0x00000000, 0x00000000, 0x00000003, 0x00000000, 0x00000000, " \
        "0x00000000, 0x00000000}"


def events(*lines: str) -> list[XidEvent | SXidEvent]:
    return list(parse_kernel_log(lines, now=NOW))


def sxids(*lines: str) -> list[SXidEvent]:
    return [e for e in events(*lines) if isinstance(e, SXidEvent)]


def sx(code: int, rest: str, switch: str = "nvidia-nvswitch2: ", pci: str = "0000:c7:00.0") -> str:
    return f"{switch}SXid (PCI:{pci}): {code:05d}, {rest}"


def test_data_only_sxid_in_dmesg_decode_iso_is_one_event_without_severity():
    line = "kern  :err   : 2026-03-04T10:11:12,250000+00:00 " + sx(12028, NINE)
    [event] = sxids(line)
    assert (event.sxid, event.pci_bus_id, event.severity, event.link) == (
        12028, "0000:c7:00.0", None, None)
    assert event.timestamp == datetime(2026, 3, 4, 10, 11, 12, 250000,
                                       tzinfo=timezone.utc).timestamp()
    assert event.device == "nvidia-nvswitch2"


def test_data_only_lines_two_words_blocks_are_one_event_and_repeats_are_two():
    # flags + data[0..7], then data[8..15]: one error-log entry; a new 9-word line is the next
    assert len(sxids(sx(12028, NINE), sx(12028, EIGHT))) == 1
    assert len(sxids(sx(12028, NINE), sx(12028, NINE))) == 2


def test_headline_then_its_dump_is_counted_once_whatever_the_severity_word():
    for word, expected in (("Fatal", "fatal"), ("Non-fatal", "nonfatal"),
                           ("Correctable", "correctable")):
        found = sxids(sx(20034, f"{word}, Link 07 LTSSM Fault Up (First)"),
                      sx(20034, "Severity 1 Engine instance 07 Sub-engine instance 00"),
                      sx(20034, NINE), sx(20034, EIGHT))
        assert [(e.severity, e.link) for e in found] == [(expected, 7)], word
        assert found[0].message == "LTSSM Fault Up (First)"


def test_pri_error_form_and_no_device_prefix():
    [event] = sxids(sx(12028, "Non-fatal, egress non-posted PRIV error, instance=2, chiplet=0",
                       switch=""))
    assert (event.severity, event.link, event.device) == ("nonfatal", None, None)
    assert "instance=2" in event.message


def test_dump_without_headline_takes_severity_from_the_severity_line():
    [event] = sxids(sx(11013, "Severity 0 Engine instance 31 Sub-engine instance 00"),
                    sx(11013, NINE))
    assert (event.severity, event.link) == ("nonfatal", 31)


def test_dump_lines_of_a_cut_headline_are_claimed_by_the_next_headline_of_that_code():
    found = sxids(sx(20034, "Severity 1 Engine instance 40 Sub-engine instance 00"),
                  sx(20034, "Fatal, Link 41 LTSSM Fault Up"))
    assert [e.link for e in found] == [41]


def test_interleaved_switches_keep_their_own_follow_ups():
    found = sxids(sx(20034, "Fatal, Link 03 LTSSM Fault Up", "nvidia-nvswitch0: ", "0000:05:00.0"),
                  sx(20034, "Fatal, Link 09 LTSSM Fault Up", "nvidia-nvswitch1: ", "0000:06:00.0"),
                  sx(20034, "Severity 1 Engine instance 03 Sub-engine instance 00",
                     "nvidia-nvswitch0: ", "0000:05:00.0"),
                  sx(20034, NINE, "nvidia-nvswitch1: ", "0000:06:00.0"))
    assert [(e.pci_bus_id, e.link) for e in found] == [("0000:05:00.0", 3), ("0000:06:00.0", 9)]


def test_orphan_is_reported_after_the_window_and_by_settle_for_a_live_source():
    parser = KernelLogParser(now=NOW)
    assert parser.feed(sx(12028, NINE)) == []
    out = []
    for i in range(SXID_ORPHAN_LINES + 8):
        out += parser.feed(f"[{i}.0] unrelated line")
    assert [e.sxid for e in out] == [12028]
    live = KernelLogParser(now=NOW)
    live.feed(sx(24001, NINE))
    assert live.settle() == []  # it may still be claimed within its batch
    assert [e.sxid for e in live.settle()] == [24001]


@pytest.mark.parametrize("prefix", [
    "[ 8123.456789] ",
    "<4>[ 8123.456789] ",
    "kern  :warn  : [ 8123.456789] ",
    "kern  :warn  : 2026-03-04T10:11:12,000001+00:00 ",
    "[Wed Mar  4 10:11:12 2026] ",
    "Mar  4 10:11:12 gpu-node-7 kernel: [ 8123.456789] ",
    "Mar 04 10:11:12.123456 gpu-node-7 kernel: ",
    "2026-03-04T10:11:12+0000 gpu-node-7 kernel: ",
    "2026-03-04T10:11:12.123456+00:00 gpu-node-7 kernel: ",
    "1772619072.123456 gpu-node-7 kernel: ",
    "4,9001,8123456789,-;",
    "    ",
    "\t",
])
def test_every_prefix_form_of_an_xid_line(prefix):
    line = (prefix + "NVRM: Xid (PCI:0000:4e:00): 94, pid=7171, name=python3, Ch 00000010, "
            "errorString CTX SWITCH TIMEOUT, Info 0x1c")
    [event] = events(line)
    assert (event.xid, event.pci_bus_id, event.pid, event.process) == (
        94, "0000:4e:00", 7171, "python3")


@pytest.mark.parametrize("header, xid, gi, ci", [
    ("NVRM: Xid (PCI:0000:4e:00 GPU-I:03 GPU-CI:01): 31", 31, 3, 1),
    ("NVRM: Xid (PCI:0000:4e:00 GPU-I:05): 31", 31, 5, None),
    ("NVRM: Xid (0000:4e:00): 31", 31, None, None),
])
def test_mig_and_legacy_headers(header, xid, gi, ci):
    [event] = events(f"[ 1.0] {header}, pid='<unknown>', name=<unknown>, MMU Fault: ENGINE GR")
    assert (event.xid, event.gpu_instance, event.compute_instance, event.pid) == (xid, gi, ci, None)


def test_a_line_wrapped_inside_its_header_is_joined():
    [event] = events("[ 9.5] NVRM: Xid (PCI:0000:4e", ":00): 48, pid=12, name=train, An "
                     "uncorrectable double bit error")
    assert (event.xid, event.pci_bus_id, event.pid) == (48, "0000:4e:00", 12)
    [sw] = sxids("[ 9.5] nvidia-nvswitch4: SXid (PCI:0000:e1:00.0): ",
                 "22012, Fatal, Link 33 Minion Link NA interrupt")
    assert (sw.sxid, sw.link, sw.severity) == (22012, 33, "fatal")


def test_sxid_severity_comes_from_the_line_else_from_the_catalog():
    assert sxid_lookup(12028).severity is Severity.CRITICAL      # fatal table, nothing printed
    assert sxid_lookup(20001).severity is Severity.WARNING       # non-fatal table
    assert sxid_lookup(23005, "nonfatal").severity is Severity.CRITICAL  # always fatal
    assert sxid_lookup(20034, "correctable").severity is Severity.INFO
    assert sxid_lookup(99999).catalog_class == "unknown"


def test_analyze_reports_a_data_only_sxid_with_the_catalog_severity(tmp_path):
    log = tmp_path / "dmesg-decode.log"
    log.write_text("\n".join([
        "kern  :info  : 2026-03-04T10:11:10,000000+00:00 nvidia-nvswitch: loaded",
        "kern  :err   : 2026-03-04T10:11:12,250000+00:00 " + sx(12028, NINE),
        "kern  :err   : 2026-03-04T10:11:12,250100+00:00 " + sx(12028, EIGHT),
        "kern  :err   : 2026-03-04T10:11:13,000000+00:00 " + sx(20001, NINE,
                                                                 pci="0000:c8:00.0"),
    ]) + "\n")
    rc, found = analyze_json(str(log))
    assert rc == 1
    by_code = {f["evidence"]["sxid"]: f for f in found if f["kind"] == "sxid"}
    assert by_code[12028]["severity"] == "critical"
    assert by_code[12028]["evidence"]["count"] == 1
    assert by_code[12028]["evidence"]["catalog_class"] == "fatal"
    assert by_code[20001]["severity"] == "warning"
    assert set(found[0]) == {"source", "kind", "severity", "subject", "evidence", "message",
                             "node"}


def test_analyze_joins_a_wrapped_xid_line(tmp_path):
    log = tmp_path / "wrapped.log"
    log.write_text("[ 9.5] NVRM: Xid (PCI:0000:4e\n:00): 79, pid=12, name=train, GPU has fallen "
                   "off the bus.\n")
    _, found = analyze_json(str(log))
    assert {(f["kind"], f["subject"]) for f in found} >= {("xid", "GPU 0000:4e:00"),
                                                         ("gpu_lost", "GPU 0000:4e:00")}
