"""XID collector: a real file tailed across appends, rotation and truncation, its history read at
start; /dev/kmsg (history and new records) when root; NVML events from the fake NVML merged with
kernel-log lines; a lost GPU the fake NVML does not list; the real agent end to end."""

from __future__ import annotations

import json
import logging
import os
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest
from support import FIXTURES, budget, scrape, stop_agent

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


def test_source_reads_the_history_holds_partial_lines_and_follows_rotation(tmp_path) -> None:
    log = tmp_path / "kern.log"
    log.write_text("old line, before the agent started\n")
    source = KernelLogSource(str(log))
    assert source.read_lines() == ["old line, before the agent started"]
    assert source.caught_up
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
    (recent,) = findings.recent()  # one finding, raised four times
    assert recent["count"] == 4 and findings.counts() == {("xid", "xid", "warning"): 4}
    assert recent["evidence"]["action"] == "restart_app" and recent["node"] == "node01"


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
    # xid03 has no wall-clock stamp: its Xid 79 gets the time it was read. The log was empty at
    # the first read: the counts run from that time.
    text = "\n".join(line.rsplit(" ", 1)[0] + " READ_TIME"
                     if ("0000:91:00" in line and "last_timestamp" in line)
                     or line.startswith("laggard_kernel_log_history_start") else line
                     for line in text.splitlines())
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
        deadline = time.monotonic() + budget(5)
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


def iso(epoch: float) -> str:
    """``epoch`` as a journald short-iso stamp (``2026-12-01T21:42:55+0000``)."""
    return time.strftime("%Y-%m-%dT%H:%M:%S+0000", time.gmtime(epoch))


def fallen_off(pci: str, epoch: float) -> str:
    return (f"{iso(epoch)} node01 kernel: NVRM: Xid (PCI:{pci}): 79, pid='<unknown>', "
            "name=<unknown>, GPU has fallen off the bus.\n")


def test_history_at_start_counts_an_old_xid_79_and_marks_the_unlisted_gpu_lost(
        tmp_path, expose, value, caplog) -> None:
    """A file already holding an Xid 79 of this boot, for a GPU the fake NVML does not list
    (it lists 0000:18:00 and 0000:28:00): counted at the first read, with its own time, the GPU
    marked lost by its PCI bus id; an Xid 79 stamped before this boot is counted, not lost."""
    boot = time.time() - 3600.0
    happened = int(boot) + 1800  # half an hour before the agent starts
    log = tmp_path / "syslog"
    log.write_text(f"{iso(boot - 86400)} node01 kernel: Linux version 6.1 (an older boot)\n"
                   + fallen_off("0000:4c:00", boot - 86400)
                   + fallen_off("0000:3b:00", happened)
                   + fallen_off("0000:18:00", happened)  # a GPU NVML lists: nvml's to mark
                   + f"{iso(happened)} node01 kernel: {LINE.split('] ', 1)[1]}".replace(
                       "0000:18:00", "0000:28:00"))
    fake = FakeNvml(2)
    findings = FindingLog()
    collector = XidCollector(kernel_log=KernelLogSource(str(log)), library=NvmlLibrary(fake),
                             findings=findings, node="node01", boot_time=boot)
    try:
        with caplog.at_level(logging.INFO):
            text = expose(collector)
    finally:
        collector.stop()
    lost = 'laggard_gpu_lost{gpu="",pci_bus_id="0000:3b:00"}'
    # Only the unlisted GPU of this boot: not the older boot's, not the one NVML lists.
    assert [ln for ln in text.splitlines() if ln.startswith("laggard_gpu_lost{")] == [
        lost + " 1.0"]
    assert value(text, 'laggard_gpu_xid_errors_total{gpu="",pci_bus_id="0000:3b:00",xid="79"}'
                 ) == 1.0
    assert value(text, 'laggard_gpu_xid_errors_total{gpu="",pci_bus_id="0000:4c:00",xid="79"}'
                 ) == 1.0
    assert value(text, 'laggard_gpu_xid_errors_total{gpu="1",pci_bus_id="0000:28:00",xid="13"}'
                 ) == 1.0
    assert value(text, 'laggard_gpu_xid_last_timestamp_seconds{gpu="",pci_bus_id="0000:3b:00",'
                       'xid="79"}') == happened
    assert value(text, "laggard_kernel_log_history_start_timestamp_seconds") == int(boot) - 86400
    assert value(text, "laggard_kernel_log_lines_total") == 5.0
    gone = {(f["gpu"], f["evidence"]["pci_bus_id"]): f for f in findings.recent()
            if f["kind"] == "gpu_lost"}
    assert set(gone) == {(None, "0000:3b:00"), (0, "0000:18:00")}
    assert gone[(None, "0000:3b:00")]["severity"] == "critical"
    assert gone[(None, "0000:3b:00")]["first_seen"] == rfc3339(happened)
    history = [r.getMessage() for r in caplog.records if "counted from" in r.getMessage()]
    assert history == [f"kernel log {log}: Xids counted from its oldest line, at "
                       f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(int(boot) - 86400))}"
                       ": 5 lines before the agent started, with 4 Xids and 0 SXids; each "
                       "start of the agent counts this history afresh"]


def test_a_long_history_is_read_over_rounds_and_said_once_read(tmp_path, monkeypatch,
                                                              caplog) -> None:
    monkeypatch.setattr("laggard.collectors.xid.MAX_READ_BYTES", 4096)
    log = tmp_path / "kern.log"
    log.write_text(LINE * 100)  # ~8.6 KiB: three rounds of 4 KiB
    collector = XidCollector(kernel_log=KernelLogSource(str(log)), library=None)

    def said() -> list[str]:
        return [r.getMessage() for r in caplog.records if "counted from" in r.getMessage()]

    with caplog.at_level(logging.INFO):
        for _ in range(2):
            collector.collect()
            assert said() == []
        collector.collect()
        append(log, LINE)
        collector.collect()
    (line,) = said()
    assert "at an unknown time (no line carries one): 100 lines" in line  # dmesg uptime stamps
    assert collector.parser.lines == 101


KMSG_SERIES = 'laggard_gpu_xid_errors_total{gpu="",pci_bus_id="0000:ed:00",xid="31"}'


@pytest.mark.skipif(os.geteuid() != 0 or not os.access("/dev/kmsg", os.W_OK),
                    reason="injecting a kernel-log record needs root and a writable /dev/kmsg")
def test_dev_kmsg_history_and_new_records_are_counted(expose, value) -> None:
    """A real record written to /dev/kmsg: counted live by a collector already reading, and by
    a fresh one from the ring buffer's history, with the record's own time."""
    live = XidCollector(kernel_log=KernelLogSource("/dev/kmsg"), library=None)
    text = expose(live)  # the whole ring buffer (earlier runs of this test left records in it)
    before = value(text, KMSG_SERIES) or 0.0
    start = value(text, "laggard_kernel_log_history_start_timestamp_seconds")
    assert start is not None and start <= time.time()
    record = "NVRM: Xid (PCI:0000:ed:00): 31, pid=1, name=laggard-test, MMU Fault (test record)"
    written = time.time()
    with open("/dev/kmsg", "w") as kmsg:
        kmsg.write(record + "\n")
    assert value(expose(live), KMSG_SERIES) == before + 1
    fresh = XidCollector(kernel_log=KernelLogSource("/dev/kmsg"), library=None)
    text = expose(fresh)
    assert value(text, KMSG_SERIES) == before + 1
    stamp = value(text, 'laggard_gpu_xid_last_timestamp_seconds{gpu="",pci_bus_id="0000:ed:00",'
                        'xid="31"}')
    assert stamp is not None and abs(stamp - written) < 5.0  # boot time + the record's uptime


def rfc3339(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def test_agent_reports_an_xid_79_of_the_history_logs_it_once_with_times(tmp_path, agent_factory,
                                                                         value) -> None:
    happened = int(time.time()) - 600
    log = tmp_path / "syslog"
    log.write_text(fallen_off("0000:3b:00", happened) * 3)
    agent = agent_factory("--collector.interval", "0.1", "--path.kmsg", str(log),
                          "--collector.nvml.fake-gpus", "2",
                          "--collector.nvml.fake-gpus-scenario", "steady",
                          "--node.name", "gpu-node-07")
    lost = 'laggard_gpu_lost{gpu="",pci_bus_id="0000:3b:00"}'
    deadline = time.monotonic() + budget(10.0)
    while value(text := agent.scrape(), lost) is None:
        assert time.monotonic() < deadline, "the Xid 79 of the history was never exported"
        time.sleep(0.1)
    assert value(text, 'laggard_gpu_xid_errors_total{gpu="",pci_bus_id="0000:3b:00",xid="79"}'
                 ) == 3.0
    assert value(text, "laggard_kernel_log_history_start_timestamp_seconds") == happened
    assert value(text, 'laggard_findings_total{detector="xid",kind="gpu_lost",'
                       'severity="critical"}') == 1.0
    findings = json.loads(scrape(f"http://127.0.0.1:{agent.port}/findings"))
    xid = [f for f in findings if f["kind"] == "xid"]
    assert [(f["count"], f["first_seen"], f["last_seen"]) for f in xid] == [
        (3, rfc3339(happened), rfc3339(happened))]
    status, out = stop_agent(agent)
    assert status == 0
    raised = [line for line in out.splitlines() if "laggard.findings: raised" in line]
    assert len(raised) == 2, out  # the Xid and the lost GPU, each once for three lines
    assert any(" ERROR laggard.findings: raised critical xid/gpu_lost node=gpu-node-07 "
               "pci_bus_id=0000:3b:00: GPU 0000:3b:00 fell off the bus (Xid 79)" in line
               for line in raised), out
    assert all(line.endswith(f"(at {rfc3339(happened)})") for line in raised), out
    assert "Xids counted from its oldest line" in out


def test_agent_counts_appended_lines_within_two_seconds(tmp_path, agent_factory, value) -> None:
    log = tmp_path / "syslog"
    log.write_text("Dec  2 11:38:27 node01 kernel: [  199.2] NVRM: unrelated line\n")
    agent = agent_factory("--collector.interval", "0.1", "--path.kmsg", str(log))
    deadline = time.monotonic() + budget(5.0)  # the log is read from its end as of the first round
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


@pytest.mark.skipif(os.geteuid() != 0 or not os.access("/dev/kmsg", os.W_OK),
                    reason="injecting a kernel-log record needs root and a writable /dev/kmsg")
def test_a_kmsg_record_wakes_the_collector_at_once(expose, value) -> None:
    """The kernel log on its events: a record written to /dev/kmsg ends the collector's wait
    for data, and a round then counts it (the sampler runs that round at once, whatever the
    interval: tests/agent/test_sampler.py)."""
    collector = XidCollector(kernel_log=KernelLogSource("/dev/kmsg"), library=None)
    before = value(expose(collector), KMSG_SERIES) or 0.0  # the history, and the device opened
    for _ in range(100):  # other processes' records: read them first (bounded)
        if not collector.wait_for_data(0.05):
            break
        expose(collector)
    with open("/dev/kmsg", "w") as kmsg:
        kmsg.write("NVRM: Xid (PCI:0000:ed:00): 31, pid=1, name=laggard-test, MMU Fault "
                   "(wait test)\n")
    assert collector.wait_for_data(budget(5.0))
    assert value(expose(collector), KMSG_SERIES) == before + 1


def test_a_queued_nvml_event_ends_the_wait_and_a_file_log_waits_its_time(tmp_path) -> None:
    log = tmp_path / "syslog"
    log.write_text("")
    collector = XidCollector(kernel_log=KernelLogSource(str(log)), library=None)
    list(collector.collect())
    start = time.monotonic()
    assert not collector.wait_for_data(0.2)  # a file: nothing to wait on but the time
    assert time.monotonic() - start >= 0.2
    collector._events.put((0, 13, time.time()))
    assert collector.wait_for_data(5.0)
