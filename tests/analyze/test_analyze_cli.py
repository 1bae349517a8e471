"""``laggard analyze`` run as a real process on every corpus sample (answers from
corpus/EXPECTED.md), on a directory of mixed files, and on bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from support import FIXTURES, REPO, analyze_json, budget

DIR = FIXTURES / "analyze"


def analyze(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "laggard.cli", "analyze", *args],
                          capture_output=True, text=True, timeout=timeout, cwd=REPO)


def findings(*paths: str) -> tuple[int, list[dict]]:
    """The CLI's entry point in this process (the samples are many; a process each would cost a
    second apiece on a busy machine); the subprocess tests below cover the real binary."""
    return analyze_json(*paths)


def one(name: str) -> tuple[int, list[dict]]:
    matches = sorted(p for p in DIR.iterdir() if p.name.startswith(name))
    assert len(matches) == 1, matches
    return findings(str(matches[0]))


def by_kind(items: list[dict], kind: str) -> list[dict]:
    return [f for f in items if f["kind"] == kind]


def test_json_findings_have_the_documented_fields():
    rc, items = one("xid01")
    assert rc == 1
    # the keys of every release so far, and "node" (issue 25: keys are only ever added)
    assert all(set(f) == {"source", "kind", "severity", "subject", "evidence", "message", "node"}
               for f in items)
    assert all(f["node"] is None for f in items)  # plain dmesg names no host


def test_xid01_gsp_timeouts_grouped_with_processes():
    _, items = one("xid01")
    (f,) = by_kind(items, "xid")
    ev = f["evidence"]
    assert (ev["xid"], ev["pci_bus_id"], ev["count"]) == (119, "0000:9b:00", 5)
    assert f["severity"] == "critical" and ev["action"] == "reset_gpu"
    assert [(p["pid"], p["process"], p["count"]) for p in ev["processes"]] == [
        (2024380, "nvidia-smi", 3), (1263500, "cache_mgr_main", 1), (1240590, "gpud", 1)]
    assert (ev["pid"], ev["process"]) == (2024380, "nvidia-smi")
    assert any("103 (GSP_RM_ALLOC)" in m for m in ev["messages"])
    assert ev["uuid"] == "GPU-00000000-0000-0000-0000-000000000001"


def test_xid02_flood_of_13_then_43_application_fault():
    _, items = one("xid02")
    xids = {f["evidence"]["xid"]: f for f in by_kind(items, "xid")}
    assert xids[13]["evidence"]["count"] == 16 and xids[13]["evidence"]["pci_bus_id"] == \
        "0000:38:00"
    assert "pid" not in xids[13]["evidence"]  # pid '<unknown>'
    x43 = xids[43]["evidence"]
    assert (x43["count"], x43["pid"], x43["process"]) == (1, 2924364, "pt_main_thread")
    assert xids[43]["severity"] == "info"  # an application fault, not hardware
    assert by_kind(items, "gpu_lost") == []


def test_xid03_fallen_off_bus_then_nvswitch_sxids():
    _, items = one("xid03")
    (x79,) = by_kind(items, "xid")
    assert (x79["evidence"]["xid"], x79["evidence"]["pci_bus_id"]) == (79, "0000:91:00")
    assert x79["evidence"]["first_uptime_seconds"] == pytest.approx(6781741.548779)
    assert x79["severity"] == "critical"
    assert [f["subject"] for f in by_kind(items, "gpu_lost")] == ["GPU 0000:91:00"]
    sxids = {f["evidence"]["pci_bus_id"]: f["evidence"] for f in by_kind(items, "sxid")}
    assert {pci: (ev["sxid"], ev["links"]) for pci, ev in sxids.items()} == {
        "0000:06:00.0": (20034, [48]), "0000:05:00.0": (20034, [62, 63]),
        "0000:07:00.0": (20034, [37])}
    assert sum(ev["count"] for ev in sxids.values()) == 4  # once per "Fatal, Link N" line


def test_xid06_xid13_then_109_and_no_peermem_xid():
    _, items = one("xid06")
    xids = {f["evidence"]["xid"]: f["evidence"] for f in by_kind(items, "xid")}
    assert set(xids) == {13, 109}
    assert xids[13]["count"] == 3 and xids[13]["pci_bus_id"] == "0000:cb:00"
    assert (xids[109]["pid"], xids[109]["process"]) == (1797828, "pt_main_thread")


def test_xid08_legacy_driver_without_pid():
    _, items = one("xid08")
    xids = {f["evidence"]["xid"]: f["evidence"] for f in by_kind(items, "xid")}
    assert (xids[32]["count"], xids[31]["count"]) == (2, 1)
    assert {ev["pci_bus_id"] for ev in xids.values()} == {"0000:01:00"}
    assert xids[32]["first_uptime_seconds"] == pytest.approx(24128.828315)
    assert xids[31]["last_uptime_seconds"] == pytest.approx(24128.834365)


def test_xid11_fallen_off_bus_without_xid_number_counts_as_79():
    _, items = one("xid11")
    (x,) = by_kind(items, "xid")
    assert (x["evidence"]["xid"], x["evidence"]["pci_bus_id"]) == (79, "0000:b3:00")
    (lost,) = by_kind(items, "gpu_lost")
    assert lost["severity"] == "critical"


def test_xid12_dbe_and_page_retirement_and_a_gpu_that_fails_init():
    _, items = one("xid12")
    xids = {f["evidence"]["xid"]: f for f in by_kind(items, "xid")}
    assert set(xids) == {48, 64}
    assert {f["evidence"]["pci_bus_id"] for f in xids.values()} == {"0000:07:00"}
    assert {f["severity"] for f in xids.values()} == {"critical"}
    (lost,) = by_kind(items, "gpu_lost")
    assert lost["evidence"]["pci_bus_id"] == "0000:0a:00"
    assert lost["evidence"]["rm_init_adapter_failures"] == 3
    assert lost["evidence"]["codes"] == ["0x24:0x72:1568"]


def test_nccl01_every_shown_rank_is_stuck_so_the_culprit_did_not_report():
    rc, items = one("nccl01")
    assert rc == 1
    (f,) = items
    ev = f["evidence"]
    assert f["kind"] == "collective_timeout"
    assert (ev["op"], ev["seq"], ev["timeout_ms"], ev["pg"]) == (
        "_REDUCE_SCATTER_BASE", 7753, 600000, "1")
    assert ev["elapsed_ms"] == {"0": 600061, "3": 600089, "4": 600099}
    assert (ev["numel_in"], ev["numel_out"], ev["world_size"]) == (544997376, 68124672, 8)
    assert ev["last_enqueued"] == {"0": 7755, "4": 7755}
    assert ev["last_completed"] == {"0": 7752, "4": 7752}
    assert ev["behind"] == [] and ev["not_reporting"] == [1, 2, 5, 6, 7]
    assert f["subject"] == "ranks 1, 2, 5, 6, 7" and "not among them" in f["message"]


def test_nccl02_pg_guid_format():
    _, (f,) = one("nccl02")
    ev = f["evidence"]
    assert (ev["op"], ev["seq"], ev["numel_in"], ev["timeout_ms"]) == (
        "ALLREDUCE", 808, 9801523, 600000)
    assert ev["elapsed_ms"] == {"0": 600030, "1": 600020, "2": 600061}
    assert set(ev["last_enqueued"].values()) == {811}
    assert set(ev["last_completed"].values()) == {807}


def test_nccl03_legacy_30_minute_timeout():
    _, (f,) = one("nccl03")
    ev = f["evidence"]
    assert (ev["seq"], ev["op"], ev["timeout_ms"]) == (469508, "ALLREDUCE", 1800000)
    assert ev["elapsed_ms"] == {"1": 1802212, "2": 1802212, "3": 1802211, "6": 1802210,
                                "7": 1802220}
    assert ev["not_reporting"] == [0, 4, 5]


@pytest.mark.parametrize("name", ["nccl10", "nccl11", "smi03", "dcgm01", "fr01"])
def test_healthy_samples_give_no_findings_and_exit_0(name):
    rc, items = one(name)
    assert (rc, items) == (0, [])


def test_nccl14_ib_completion_errors():
    _, (f,) = one("nccl14")
    ev = f["evidence"]
    assert f["kind"] == "nccl_network_error" and f["severity"] == "critical"
    assert (ev["host"], ev["device"], ev["peer"], ev["count"]) == ("node01", 4, "192.0.2.10", 3)
    assert (ev["wc_status"], ev["wc_status_name"], ev["vendor_err"], ev["direction"]) == (
        12, "IBV_WC_RETRY_EXC_ERR", 129, "Recv")
    assert ev["peer_ports"] == [49892, 54862] and ev["nccl_result"] == [6]


def test_nccl_tests_busbw():
    _, (f,) = one("nccltests01")
    ev = f["evidence"]
    assert (ev["ranks"], ev["peak_busbw_gbps"], ev["busbw_1gib_gbps"], ev["avg_busbw_gbps"]) == (
        16, 338.82, 297.86, 70.742)
    _, (f,) = one("nccltests03")
    assert (f["evidence"]["ranks"], f["evidence"]["peak_busbw_gbps"]) == (32, 29.47)


def test_smi01_clock_events():
    _, (f,) = one("smi01")
    assert f["kind"] == "clock_event" and f["subject"] == "GPU 0000:75:00"
    assert sorted(f["evidence"]["reasons"]) == ["hw_power_brake", "sw_power_cap", "sw_thermal"]


def test_fr02_torchfrtrace_names_rank_1():
    _, (f,) = one("fr02")
    assert f["kind"] == "collective_timeout" and f["evidence"]["missing_ranks"] == [1]
    assert f["evidence"]["collective"] == 5 and f["subject"] == "rank 1"


def test_flight_recorder_directory_names_ranks_9_and_14():
    rc, items = findings(str(DIR / "fr_nvrx_gpu_error_2nd"))
    assert rc == 1
    first = items[0]
    ev = first["evidence"]
    assert first["severity"] == "critical" and first["subject"] == "ranks 9, 14"
    assert (ev["pg"], ev["seq"], ev["op"], ev["input_sizes"], ev["input_dtypes"]) == (
        "72", 44791, "all_to_all", [[2048, 5120]], ["BFloat16"])
    assert ev["missing_ranks"] == [9, 14] and ev["likely_stragglers"] == [9, 14]
    assert ev["last_enqueued"]["9"] == 44790 and ev["last_completed"]["9"] == 44787
    assert ev["last_enqueued"]["8"] == 44796 and ev["last_completed"]["8"] == 44790
    assert sorted(ev["lagging_pgs"]) == sorted(
        ["72", "37", "38", "64", "69", "70", "90"])


def test_inspector_and_network_samples():
    _, items = findings(str(DIR / "inspector"))
    assert {f["kind"] for f in items} == {"busbw"}
    real = [f for f in items if f["evidence"].get("comm") == "0xad56c683b0c4ef"]
    assert real[0]["evidence"]["ranks"] == [1] and real[0]["evidence"]["busbw_gbps_median"] == \
        0.55585
    prom = [f for f in items if f["evidence"].get("message_size") == "4-5GB"]
    assert prom[0]["evidence"]["busbw_gbps"] == 678.263
    _, items = one("ib01")
    assert [f["subject"] for f in items if f["severity"] == "warning"] == ["mlx5_1 port 1"]
    _, (f,) = one("net01")
    assert (f["subject"], f["evidence"]["receive_drop"]) == ("br0", 17015)
    assert "2018" in f["evidence"]["taken_at"]


def test_a_directory_of_mixed_files_names_the_culprits():
    result = analyze(str(DIR))
    assert result.returncode == 1, result.stderr
    out = result.stdout
    culprits = out[out.index("Culprits:"):]
    for subject in ("GPU 0000:9b:00", "ranks 9, 14", "GPU 0000:91:00",
                    "node01 GPU 4 <-> 192.0.2.10", "GPU 0000:75:00", "ranks 1, 2, 5, 6, 7"):
        assert subject in culprits
    # the hang rules' kind beside a flight-recorder culprit: 9 and 14 are stuck on the device
    assert "ranks 9, 14: collective_timeout [device]" in culprits
    assert "Traceback" not in result.stderr


def test_watchdog_logs_of_different_ranks_are_compared_across_files(tmp_path):
    line = ("[rank{r}]:[E626 06:24:44.9 ProcessGroupNCCL.cpp:616] [Rank {r}] Watchdog caught "
            "collective operation timeout: WorkNCCL(SeqNum=9, OpType=ALLREDUCE, NumelIn=4, "
            "NumelOut=4, Timeout(ms)=600000) ran for 6000{r}0 milliseconds before timing out.\n"
            "[rank{r}]:[E626 06:24:44.9 ProcessGroupNCCL.cpp:1785] [PG ID 0 PG GUID 0(default_pg) "
            "Rank {r}] Exception (either an error or timeout) detected by watchdog at work: 9, "
            "last enqueued NCCL work: {e}, last completed NCCL work: 8.\n")
    for rank, enq in ((0, 12), (1, 9), (2, 12)):
        (tmp_path / f"rank{rank}.log").write_text(line.format(r=rank, e=enq))
    _, (f,) = findings(str(tmp_path))
    ev = f["evidence"]
    assert ev["ranks"] == [0, 1, 2] and ev["behind"] == [1] and ev["ahead"] == [0, 2]
    assert f["subject"] == "rank 1" and "stragglers" in f["message"]


def test_first_collective_hang_is_a_bring_up_failure(tmp_path):
    (tmp_path / "out.log").write_text(
        "[rank0]:[E1218 20:27:21.4 ProcessGroupNCCL.cpp:629] [Rank 0] Watchdog caught collective "
        "operation timeout: WorkNCCL(SeqNum=1, OpType=BROADCAST, NumelIn=131072000, "
        "NumelOut=131072000, Timeout(ms)=600000) ran for 600081 milliseconds before timing out.\n")
    _, (f,) = findings(str(tmp_path))
    assert f["evidence"]["bring_up"] is True and f["subject"] == "bring-up failure"


def test_ops_that_differ_at_one_sequence_number_are_a_desync_not_a_straggler(tmp_path):
    text = "".join(
        f"[rank{r}]:[E1 1:1:1.1 ProcessGroupNCCL.cpp:1] [Rank {r}] Watchdog caught collective "
        f"operation timeout: WorkNCCL(SeqNum=40, OpType={op}, NumelIn={n}, NumelOut={n}, "
        f"Timeout(ms)=600000) ran for 600001 milliseconds before timing out.\n"
        for r, op, n in ((0, "ALLREDUCE", 10), (1, "ALLREDUCE", 10), (2, "ALLREDUCE", 12)))
    (tmp_path / "job.log").write_text(text)
    _, items = findings(str(tmp_path))
    (mismatch,) = items  # reported as a desync only, no straggler named
    assert mismatch["kind"] == "collective_mismatch"
    assert sorted(s["ranks"] for s in mismatch["evidence"]["signatures"]) == [[0, 1], [2]]


def test_bad_inputs_are_answered_with_messages_not_tracebacks(tmp_path):
    truncated = tmp_path / "trace_0"
    data = (DIR / "fr_nvrx_gpu_error_2nd" / "_dump_0").read_bytes()
    truncated.write_bytes(data[:1000])
    garbage = tmp_path / "garbage.bin"
    garbage.write_bytes(os.urandom(4096))
    notes = tmp_path / "notes.txt"
    notes.write_text("the job died around 3 am\n")
    for path, text in ((truncated, "truncated"), (garbage, "binary"),
                       (notes, "unknown kind"), (tmp_path / "absent.log", "no such file")):
        result = analyze(str(path))
        assert result.returncode == 2, (path, result.stdout, result.stderr)
        assert text in result.stderr and "Traceback" not in result.stderr
    # inside a directory the same files are the same errors (status 2, one line each), and the
    # good file beside them is still analysed and printed
    (tmp_path / "xid.log").write_bytes((DIR / "xid01_gsp_rpc_timeout_xid119_dmesg_ctime.log")
                                       .read_bytes())
    truncated.unlink()
    result = analyze(str(tmp_path))
    assert result.returncode == 2, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith(
        "laggard analyze: error: ")]
    assert len(errors) == 2 and any("garbage.bin: unknown kind: binary" in e for e in errors)
    assert any("notes.txt: unknown kind" in e for e in errors)
    assert "Xid 119" in result.stdout
    result = subprocess.run([sys.executable, "-m", "laggard.cli", "analyze", "--bogus"],
                            capture_output=True, text=True, timeout=budget(60))
    assert result.returncode == 2 and "Traceback" not in result.stderr


def test_a_large_log_streams_in_bounded_memory(tmp_path):
    path = tmp_path / "kern.log"
    block = ("Dec  2 11:38:47 node01 kernel: [  219.470994] eth0: link up, 100Gbps, full duplex\n"
             "Dec  2 11:38:47 node01 systemd[1]: Started Session 42 of user root.\n" * 49
             + "Dec  2 11:38:48 node01 kernel: [  220.1] NVRM: Xid (PCI:0000:07:00): 48, "
               "pid='<unknown>', name=<unknown>, An uncorrectable double bit error\n")
    chunk = block * 200
    with open(path, "w") as f:
        while f.tell() < 200 * 1024 * 1024:
            f.write(chunk)
    size_mib = path.stat().st_size / 2**20
    # The child reports its own peak RSS from VmHWM, which belongs to its address space alone:
    # getrusage's ru_maxrss survives fork and exec, so it would report pytest's own size.
    code = ("import re, sys\n"
            "from laggard.cli import main\n"
            "rc = main(['analyze', '--json', sys.argv[1]])\n"
            "status = open('/proc/self/status').read()\n"
            "print(re.search(r'VmHWM:\\s+(\\d+) kB', status).group(1), file=sys.stderr)\n"
            "sys.exit(rc)\n")
    result = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True,
                            text=True, timeout=budget(600))
    assert result.returncode == 1, result.stderr
    (f,) = json.loads(result.stdout)
    assert f["evidence"]["xid"] == 48 and f["evidence"]["count"] > 20_000
    peak_mib = int(result.stderr.strip().splitlines()[-1]) / 1024
    assert peak_mib < min(150, size_mib / 2), (peak_mib, size_mib)


def test_init_lines_of_another_file_place_the_culprit_rank_on_its_host_and_gpu(tmp_path):
    (tmp_path / "init.log").write_bytes(
        (DIR / "nccl10_info_init_complete_legacy_2nodes_16ranks.log").read_bytes())
    (tmp_path / "rank3.log").write_text(
        "[rank3]:[E1 1:1:1.1 ProcessGroupNCCL.cpp:1] [Rank 3] Watchdog caught collective "
        "operation timeout: WorkNCCL(SeqNum=12, OpType=ALLREDUCE, NumelIn=8, NumelOut=8, "
        "Timeout(ms)=600000) ran for 600001 milliseconds before timing out.\n")
    _, (f,) = findings(str(tmp_path))
    assert f["evidence"]["locations"]["15"] == "node02 GPU 0000:e7:00 (cudaDev 7)"
    assert f["evidence"]["locations"]["2"] == "node01 GPU 0000:64:00 (cudaDev 2)"


def test_ranks_that_only_received_the_dump_signal_still_show_who_is_behind(tmp_path):
    prefix = ("[rank{r}]:[E703 15:37:17.1 ProcessGroupNCCL.cpp:1987] "
              "[PG ID 0 PG GUID 0(default_pg) Rank {r}] ")
    lines = [
        prefix.format(r=0) + "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=100, "
        "OpType=ALLREDUCE, NumelIn=4, NumelOut=4, Timeout(ms)=600000) ran for 600010 "
        "milliseconds before timing out.",
        prefix.format(r=0) + "Exception (either an error or timeout) detected by watchdog at "
        "work: 100, last enqueued NCCL work: 102, last completed NCCL work: 99.",
    ] + [
        prefix.format(r=r) + "Received a dump signal due to a collective timeout from  rank 0 "
        f"and we will try our best to dump the debug info. Last enqueued NCCL work: {e}, last "
        "completed NCCL work: 99.This is most likely caused by incorrect usages of collectives"
        for r, e in ((1, 102), (2, 102), (3, 99))
    ]
    (tmp_path / "job.log").write_text("\n".join(lines) + "\n")
    _, (f,) = findings(str(tmp_path))
    ev = f["evidence"]
    assert ev["progress_only_ranks"] == [1, 2, 3] and ev["behind"] == [3]
    assert f["subject"] == "rank 3" and ev["not_reporting"] == []


def test_a_log_with_both_kernel_and_nccl_lines_runs_both_parsers(tmp_path):
    xid = (DIR / "xid12_xid48_dbe_xid64_syslog_with_uptime.log").read_text()
    nccl = (DIR / "nccl14_warn_ib_completion_status12_vendor129_ib_plugin.log").read_text()
    (tmp_path / "node01-all.log").write_text(xid + nccl)
    _, items = findings(str(tmp_path / "node01-all.log"))
    assert {f["kind"] for f in items} == {"xid", "gpu_lost", "nccl_network_error"}


def test_a_directory_of_several_jobs_does_not_lend_one_jobs_world_to_another():
    # the corpus holds 16-rank Init COMPLETE lines and three unrelated jobs' timeouts
    _, items = findings(str(DIR))
    timeouts = {f["evidence"].get("seq"): f["evidence"] for f in items
                if f["kind"] == "collective_timeout" and "not_reporting" in f["evidence"]}
    assert timeouts[469508]["not_reporting"] == [0, 4, 5]
    assert timeouts[808]["not_reporting"] == [] and "locations" not in timeouts[808]
    assert timeouts[7753]["world_size"] == 8


def test_bring_up_failures_point_at_the_root_rank_and_nccl_errors_at_the_network(tmp_path):
    (tmp_path / "job.log").write_text("\n".join([
        "[rank3]: torch.distributed.DistBackendError: [3] is setting up NCCL communicator and "
        "retrieving ncclUniqueId from [0] via c10d key-value store by key '0', but "
        "store->get('0') got error: Socket Timeout",
        "[rank5]: torch.distributed.DistBackendError: [5] is setting up NCCL communicator and "
        "retrieving ncclUniqueId from [0] via c10d key-value store by key '0', but "
        "store->get('0') got error: Socket Timeout",
        "torch.distributed.DistStoreError: Timed out after 901 seconds waiting for clients. 1/2 "
        "clients joined.",
        "[rank2]: torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/"
        "c10d/ProcessGroupNCCL.cpp:1970, remote process exited or there was a network error, "
        "NCCL version 2.19.3",
    ]) + "\n")
    _, items = findings(str(tmp_path))
    subjects = {f["subject"]: f for f in items}
    root = subjects["rank 0"]["evidence"]
    assert root["bring_up"] and root["waiting_ranks"] == [3, 5] and root["errors"] == [
        "Socket Timeout"]
    assert subjects["bring-up failure"]["evidence"]["joined"] == 1
    net = subjects["rank 2"]
    assert net["kind"] == "nccl_network_error" and net["evidence"]["nccl_version"] == ["2.19.3"]


def test_a_named_file_with_nothing_to_report_says_what_it_was_read_as(tmp_path):
    result = analyze(str(DIR / "nccl10_info_init_complete_legacy_2nodes_16ranks.log"))
    assert result.returncode == 0
    assert "read as nccl_log; nothing to report" in result.stderr
    missing = analyze(str(tmp_path / "absent.log"))
    assert missing.returncode == 2
    assert "No findings in the inputs that could be read." in missing.stdout


def test_a_log_whose_finding_comes_from_the_cross_rank_stage_is_not_called_empty():
    path = DIR / "nccl14_warn_ib_completion_status12_vendor129_ib_plugin.log"
    out = analyze(str(path))
    assert out.returncode == 1
    assert "nccl_network_error" in out.stdout
    assert "nothing to report" not in out.stdout + out.stderr
    assert "Culprits:" in out.stdout


def test_warnings_are_the_culprits_when_nothing_is_critical(tmp_path):
    from laggard.analyze.cli import _table
    from laggard.detectors.finding import Finding, Severity

    warning = Finding(detector="analyze", kind="straggler", severity=Severity.WARNING,
                      message="rank 2 is the one the others wait for", subject="rank 2",
                      source="trace_rank2.json")
    info = Finding(detector="analyze", kind="busbw", severity=Severity.INFO, message="fine",
                   subject="nccl-tests", source="t.txt")
    text = _table([warning, info])
    assert "Culprits:\n  rank 2: straggler (trace_rank2.json)" in text
    assert "nccl-tests:" not in text.split("Culprits:")[1]
