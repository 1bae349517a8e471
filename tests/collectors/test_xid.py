"""XID collector: a real file tailed across appends, rotation and truncation; /dev/kmsg when root;
NVML events from the fake NVML merged with kernel-log lines; the real agent end to end."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from support import FIXTURES

from laggard.agent.context import FindingLog
from laggard.collectors.base import NoDataError
from laggard.collectors.xid import KernelLogSource, XidCollector
from laggard.nvml.fake import FakeNvml
from laggard.nvml.library import NvmlLibrary

LINE = "[ 12.5] NVRM: Xid (PCI:0000:18:00): 13, pid=7, name=python, Graphics SM Warp Exception\n"
SERIES = 'laggard_gpu_xid_errors_total{gpu="",pci_bus_id="0000:18:00",xid="13"}'



def append(path: Path, text: str) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(text)


def test_source_starts_at_the_end_holds_partial_lines_and_follows_rotation(tmp_path) -> None:
    log = tmp_path / "kern.log"
    log.write_text("old line, before the agent started\n")
    source = KernelLogSource(str(log))
    assert source.read_lines() == []
    append(log, "one\ntw")
    assert source.read_lines() == ["one"]
    append(log, "o\n")
    assert source.read_lines() == ["two"]
    log.rename(tmp_path / "kern.log.1")  # logrotate: rename, then a new file
    append(tmp_path / "kern.log.1", "three (late write to the old file)\n")
    log.write_text("four\n")
    assert source.read_lines() == ["three (late write to the old file)"]
    assert source.read_lines() == ["four"]
    log.write_text("")  # truncated in place (copytruncate)
    source.read_lines()
    append(log, "five\n")
    assert source.read_lines() == ["five"]
    log.unlink()
    assert source.read_lines() == []
    log.write_text("six\n")  # came back: read from its start
    assert source.read_lines() == ["six"]


def test_missing_file_waits_and_unreadable_source_is_no_data(tmp_path) -> None:
    source = KernelLogSource(str(tmp_path / "not-yet.log"))
    assert source.read_lines() == []
    (tmp_path / "not-yet.log").write_text("hello\n")
    assert source.read_lines() == ["hello"]
    collector = XidCollector(kernel_log=KernelLogSource(str(tmp_path)), library=None)  # a dir
    with pytest.raises(NoDataError):
        collector.collect()


def test_three_identical_lines_count_three_with_findings(tmp_path, expose, value) -> None:
    log = tmp_path / "kern.log"
    log.write_text("")
    findings = FindingLog()
    collector = XidCollector(kernel_log=KernelLogSource(str(log)), library=None,
                             findings=findings, node="node01")
    assert value(expose(collector), SERIES) is None
    append(log, LINE * 3)
    text = expose(collector)
    assert value(text, SERIES) == 3.0
    append(log, LINE)
    assert value(expose(collector), SERIES) == 4.0
    recent = findings.recent()
    assert len(recent) == 4
    assert recent[0]["evidence"]["action"] == "restart_app" and recent[0]["node"] == "node01"


def test_golden_exposition_of_corpus_logs(tmp_path, expose, golden, promtool) -> None:
    log = tmp_path / "kern.log"
    log.write_text("")
    collector = XidCollector(kernel_log=KernelLogSource(str(log)), library=None)
    collector.collect()
    for name in ("xid02_xid13_flood_then_xid43_dmesg_decode_iso.log",
                 "xid03_xid79_then_nvswitch_sxid20034_dmesg_uptime.log"):
        append(log, (FIXTURES / "xid" / name).read_text())
    append(log, "[ 12.3] NVRM: Xid (PCI:0000:b9:00): garbled\n")
    text = expose(collector)
    # xid03 has no wall-clock stamp: its Xid 79 gets the time it was read.
    text = "\n".join(line if "0000:91:00" not in line or "last_timestamp" not in line
                     else line.rsplit(" ", 1)[0] + " READ_TIME" for line in text.splitlines())
    golden("xid/corpus_xid02_xid03.prom", text + "\n")
    promtool(text.replace("READ_TIME", "1.7e+09") + "\n")


def test_nvml_event_and_kernel_line_of_one_xid_count_once(tmp_path, expose, value) -> None:
    fake = FakeNvml(2)  # step 20: Xid 13 on the last GPU (index 1, PCI 0000:28:00)
    log = tmp_path / "kern.log"
    log.write_text("")
    collector = XidCollector(kernel_log=KernelLogSource(str(log)), library=NvmlLibrary(fake))
    series = 'laggard_gpu_xid_errors_total{gpu="1",pci_bus_id="0000:28:00",xid="13"}'
    try:
        expose(collector)
        fake.advance(20)
        append(log, LINE.replace("0000:18:00", "0000:28:00"))
        deadline = time.monotonic() + 5
        text = expose(collector)
        while value(text, "laggard_xid_events_merged_total") != 1.0 and time.monotonic() < deadline:
            time.sleep(0.05)
            text = expose(collector)
        assert value(text, series) == 1.0
        assert value(text, "laggard_xid_events_merged_total") == 1.0
        append(log, LINE.replace("0000:18:00", "0000:28:00"))  # a second, real occurrence
        assert value(expose(collector), series) == 2.0
    finally:
        collector.stop()


def test_sxid_counted_per_fatal_link_line(tmp_path, expose, value) -> None:
    log = tmp_path / "kern.log"
    log.write_text("")
    findings = FindingLog()
    collector = XidCollector(kernel_log=KernelLogSource(str(log)), library=None,
                             findings=findings)
    collector.collect()
    append(log, (FIXTURES / "xid" / "xid03_xid79_then_nvswitch_sxid20034_dmesg_uptime.log")
           .read_text())
    text = expose(collector)
    assert value(text, 'laggard_gpu_sxid_errors_total{device="0000:05:00.0",sxid="20034"}') == 2
    assert value(text, 'laggard_gpu_sxid_errors_total{device="0000:06:00.0",sxid="20034"}') == 1
    sxid = [f for f in findings.recent() if f["kind"] == "sxid"]
    assert [(f["severity"], f["evidence"]["link"]) for f in sxid] == [
        ("critical", 48), ("critical", 63), ("critical", 37), ("critical", 62)]


@pytest.mark.skipif(os.geteuid() != 0 or not os.access("/dev/kmsg", os.W_OK),
                    reason="injecting a kernel-log record needs root and a writable /dev/kmsg")
def test_dev_kmsg_record_is_counted(expose, value) -> None:
    collector = XidCollector(kernel_log=KernelLogSource("/dev/kmsg"), library=None)
    collector.collect()  # opens at the end of the ring buffer
    record = "NVRM: Xid (PCI:0000:ee:00): 31, pid=1, name=laggard-test, MMU Fault (test record)"
    with open("/dev/kmsg", "w") as kmsg:
        kmsg.write(record + "\n")
    text = expose(collector)
    assert value(text, 'laggard_gpu_xid_errors_total{gpu="",pci_bus_id="0000:ee:00",xid="31"}'
                 ) == 1.0


def test_agent_counts_appended_lines_within_two_seconds(tmp_path, agent_factory, value) -> None:
    log = tmp_path / "syslog"
    log.write_text("Dec  2 11:38:27 node01 kernel: [  199.2] NVRM: unrelated line\n")
    agent = agent_factory("--collect-interval", "0.1", "--path.kmsg", str(log))
    deadline = time.monotonic() + 5.0  # the log is read from its end as of the first round
    while value(agent.scrape(), "laggard_kernel_log_lines_total") is None:
        assert time.monotonic() < deadline, "the xid collector never ran"
        time.sleep(0.05)
    assert value(agent.scrape(), SERIES) is None
    syslog_line = "Dec  2 11:38:47 node01 kernel: " + LINE
    for expected in (1.0, 4.0):
        append(log, syslog_line * int(expected if expected == 1.0 else 3))
        deadline = time.monotonic() + 2.0
        seen = None
        while time.monotonic() < deadline and seen != expected:
            seen = value(agent.scrape(), SERIES)
            time.sleep(0.05)
        assert seen == expected
