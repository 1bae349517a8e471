"""The host a kernel-log line names, in every standard place an aggregated log puts one: the
syslog HOSTNAME field (RFC 3164, RFC 3339 file stamps, RFC 5424 headers), journalctl's short
formats, and the ``host: `` prefix of pdsh and clush before any dmesg stamp. Lines written here to
those formats (rsyslog templates, RFC 5424 section 6, ``pdsh``'s line prefix)."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from laggard.parsers.kernel_log import PARKED_MESSAGE_LINES, KernelLogParser, parse_kernel_log

NOW = datetime(2026, 12, 3, tzinfo=timezone.utc).timestamp()
XID = "NVRM: Xid (PCI:0000:3b:00): 79, pid=<unknown>, name=<unknown>, GPU has fallen off the bus."
SXID = "nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 20034, Fatal, Link 48 LTSSM Fault Up"


@pytest.mark.parametrize("prefix", [
    "Dec  2 11:38:47 gpu-node-07 kernel: [  219.470994] ",           # RFC 3164 (rsyslog)
    "Dec 02 11:38:47 gpu-node-07 kernel: ",                          # journalctl short
    "Dec 02 11:38:47.123456 gpu-node-07 kernel: ",                   # short-precise
    "2026-12-02T11:38:47+0000 gpu-node-07 kernel: ",                 # short-iso
    "2026-12-02T11:38:47.123456+00:00 gpu-node-07 kernel: ",         # RSYSLOG_FileFormat
    "[  219.470994] gpu-node-07 kernel: ",                           # short-monotonic
    "<4>1 2026-12-02T11:38:47.123456+00:00 gpu-node-07 kernel - - - ",            # RFC 5424
    '<4>1 2026-12-02T11:38:47Z gpu-node-07 kernel - - [origin x="y\\]"] [ 1.5] ',  # with SD
    "gpu-node-07: [12345.678901] ",                                  # pdsh dmesg
    "gpu-node-07: [Wed Dec  2 11:38:47 2026] ",                      # pdsh dmesg -T
    "gpu-node-07: 2026-12-02T11:38:47,283302+00:00 ",                # pdsh dmesg --time-format iso
    "gpu-node-07: kern  :warn  : [12345.678901] ",                   # pdsh dmesg --decode
    "gpu-node-07: 4,1234,12345678901,-;",                            # pdsh cat /dev/kmsg
    "gpu-node-07: ",                                                 # pdsh dmesg -t
    "gpu-node-07: Dec  2 11:38:47 gpu-node-07 kernel: ",             # pdsh of a syslog file
])
def test_every_standard_host_field_is_read(prefix):
    for message in (XID, SXID):
        (event,) = parse_kernel_log([prefix + message], now=NOW)
        assert event.host == "gpu-node-07", (prefix, event)


def test_the_message_and_stamps_are_read_after_the_host():
    (e,) = parse_kernel_log(["<4>1 2026-12-02T11:38:47.5Z gpu-node-07 kernel - - - [ 9.25] " + XID])
    assert (e.xid, e.pci_bus_id, e.uptime_seconds) == (79, "0000:3b:00", 9.25)
    assert e.timestamp == datetime(2026, 12, 2, 11, 38, 47, 500000, timezone.utc).timestamp()
    (e,) = parse_kernel_log(["gpu-node-07: [12345.678901] " + XID])
    assert (e.uptime_seconds, e.message) == (12345.678901, "GPU has fallen off the bus.")


@pytest.mark.parametrize("line", [
    XID, SXID, "[12345.678901] " + XID, "[12345.678901] " + SXID,
    "kern  :warn  : [12345.678901] " + XID, "4,1234,12345678901,-;" + XID,
    "kernel: " + XID, "[Wed Dec  2 11:38:47 2026] " + XID,
    "<4>1 2026-12-02T11:38:47Z - kernel - - - " + XID,  # RFC 5424's nil HOSTNAME
    "3: [12345.678901] " + XID,  # srun --label's task id
])
def test_a_kernel_tag_is_never_taken_for_a_host(line):
    (event,) = parse_kernel_log([line], now=NOW)
    assert event.host is None, line


def test_interleaved_hosts_keep_their_own_multi_line_messages():
    lines = [f"Dec  2 11:38:4{i} {host} kernel: {text}" for i, (host, text) in enumerate([
        ("gpu-node-07", "NVRM: The NVIDIA GPU 0000:b3:00.0"),
        ("gpu-node-12", "NVRM: The NVIDIA GPU 0000:86:00.0"),
        ("gpu-node-07", "NVRM: (PCI ID: 10de:26b5) installed in this system has"),
        ("gpu-node-12", "NVRM: (PCI ID: 10de:2330) installed in this system has"),
        ("gpu-node-12", "NVRM: fallen off the bus and is not responding to commands."),
        ("gpu-node-07", "NVRM: fallen off the bus and is not responding to commands."),
    ])]
    found = [(e.host, e.pci_bus_id, e.xid) for e in parse_kernel_log(lines, now=NOW)]
    assert found == [("gpu-node-12", "0000:86:00", 79), ("gpu-node-07", "0000:b3:00", 79)]
    pdsh = ["gpu-node-12: [  322.400001] NVRM: The NVIDIA GPU 0000:86:00.0",
            "gpu-node-07: [  100.000001] eth0: link up",
            "gpu-node-12:                NVRM: (PCI ID: 10de:2330) installed in this system has",
            "gpu-node-12:                NVRM: fallen off the bus and is not responding to "
            "commands."]
    (e,) = parse_kernel_log(pdsh)
    assert (e.host, e.pci_bus_id, e.uptime_seconds) == ("gpu-node-12", "0000:86:00", 322.400001)


def test_a_message_another_host_never_finishes_is_given_up():
    parser = KernelLogParser(now=NOW)
    parser.feed("Dec  2 11:38:40 gpu-node-07 kernel: NVRM: The NVIDIA GPU 0000:b3:00.0")
    for i in range(PARKED_MESSAGE_LINES + 16):
        parser.feed(f"Dec  2 11:38:41 gpu-node-12 kernel: eth0: line {i}")
    assert not parser.waiting  # the rest of a large log is not kept on the slow path
    assert parser.feed("Dec  2 11:38:47 gpu-node-07 kernel: NVRM: fallen off the bus and is "
                       "not responding to commands.") == []


def test_the_parser_says_the_host_of_the_last_line():
    parser = KernelLogParser(now=NOW)
    parser.feed("Dec  2 11:38:47 gpu-node-07 kernel: NVRM: GPU 0000:5e:00.0: RmInitAdapter "
                "failed! (0x24:0x72:1568)")
    assert parser.host == "gpu-node-07"
    parser.feed("[ 1.0] NVRM: nothing")
    assert parser.host is None


@pytest.mark.parametrize("line", [
    "gpu-node-07:", "gpu-node-07: ", ": [1.0] " + XID, "a" * 300 + ": [1.0] " + XID,
    "<4>1 2026-12-02T11:38:47Z", "<4>1 2026-12-02T11:38:47Z gpu-node-07 kernel - - [unclosed",
    "gpu-node-07: gpu-node-12: gpu-node-13: [1.0] NVRM: Xid (PCI:0000:3", "\x00: [" * 50,
])
def test_odd_prefixes_are_skipped_not_raised(line):
    parser = KernelLogParser(now=NOW)
    parser.feed(line)
    parser.flush()


def test_an_sxid_dump_line_follows_only_its_own_hosts_headline():
    head = "nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 20034, Fatal, Link 48 LTSSM Fault Up"
    data = ("nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 20034, Data {0x00000001, 0x00a0b0c0, "
            "0x00000000, 0x00000000, 0x00000007, 0x00000000, 0x00000000, 0x00000000, "
            "0x00000000}")
    lines = ["gpu-node-07: [ 1.0] " + head, "gpu-node-12: [ 2.0] " + data,
             "gpu-node-07: [ 1.0] " + data]
    found = sorted((e.host, e.sxid, e.severity) for e in parse_kernel_log(lines))
    # gpu-node-07's Data line is its headline's follow-up; gpu-node-12's has no headline
    assert found == [("gpu-node-07", 20034, "fatal"), ("gpu-node-12", 20034, None)]
