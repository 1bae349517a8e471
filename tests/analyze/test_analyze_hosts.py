"""``laggard analyze`` on aggregated logs (issue 25): findings keyed by the host the input
names, the HOST and SOURCE columns, an NCCL culprit's location in the table, and exit codes that
do not depend on whether a file was named or found in a directory.

Fixtures (``tests/fixtures/analyze_hosts``, written here in the real formats): a two-host
rsyslog file (RFC 3164 lines, one RFC 3339 line), the same events as ``pdsh -w
gpu-node-[07,12] dmesg`` prints them (``dmesg -T`` stamps on one host, uptime on the other), and
a 4-rank job's NCCL logs where rank 2 (on node-b) never reported its timeout."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
from support import FIXTURES, REPO, analyze_json, budget

HOSTS = FIXTURES / "analyze_hosts"
SYSLOG = HOSTS / "two_hosts_syslog.log"
PDSH = HOSTS / "pdsh_dmesg.log"
NCCL = HOSTS / "nccl_rank2_silent"
XID119 = FIXTURES / "analyze" / "xid01_gsp_rpc_timeout_xid119_dmesg_ctime.log"


def analyze(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "laggard.cli", "analyze", *args],
                          capture_output=True, text=True, timeout=budget(120), cwd=REPO)


def keyed(items: list[dict]) -> dict[tuple[str, str | None, str], dict]:
    return {(f["kind"], f["node"], f["evidence"].get("pci_bus_id")): f for f in items}


@pytest.mark.parametrize("path", [SYSLOG, PDSH], ids=["syslog", "pdsh"])
def test_the_same_bus_id_on_two_hosts_is_two_gpus(path):
    rc, items = analyze_json(str(path))
    assert rc == 1
    found = keyed(items)
    for host, uuid in (("gpu-node-07", "GPU-00000000-0000-0000-0000-000000000007"),
                       ("gpu-node-12", "GPU-00000000-0000-0000-0000-000000000012")):
        xid = found[("xid", host, "0000:3b:00")]
        assert xid["subject"] == f"{host} GPU 0000:3b:00"
        assert (xid["evidence"]["xid"], xid["evidence"]["count"]) == (79, 1)
        assert xid["evidence"]["host"] == host and xid["evidence"]["uuid"] == uuid
        assert f"on {host} GPU 0000:3b:00" in xid["message"]
        assert found[("gpu_lost", host, "0000:3b:00")]["evidence"]["host"] == host
    # the multi-line "fallen off the bus" of gpu-node-12, interleaved with gpu-node-07's lines
    assert found[("xid", "gpu-node-12", "0000:86:00")]["evidence"]["xid"] == 79
    assert found[("xid", "gpu-node-07", "0000:5e:00")]["evidence"]["process"] == "pt_main_thread"
    (sxid,) = [f for f in items if f["kind"] == "sxid"]
    assert sxid["node"] == ("gpu-node-12" if path == SYSLOG else "gpu-node-07")
    assert sxid["subject"] == f"{sxid['node']} NVSwitch 0000:06:00.0"
    assert all(f["node"] and f["subject"].startswith(f["node"] + " ") for f in items)


def test_rm_init_failures_and_dmesg_ctime_stamps_keep_their_host():
    _, items = analyze_json(str(SYSLOG))
    lost = keyed(items)[("gpu_lost", "gpu-node-07", "0000:5e:00")]
    assert lost["evidence"]["rm_init_adapter_failures"] == 1
    _, items = analyze_json(str(PDSH))
    xid13 = keyed(items)[("xid", "gpu-node-07", "0000:5e:00")]
    assert xid13["evidence"]["first"] is not None  # the dmesg -T stamp after the pdsh prefix
    assert keyed(items)[("xid", "gpu-node-12", "0000:3b:00")]["evidence"][
        "first_uptime_seconds"] == 319.470997


def test_the_table_has_a_host_column_and_names_hosts_in_the_culprits():
    result = analyze(str(SYSLOG))
    assert result.returncode == 1, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["SEVERITY", "KIND", "HOST", "SUBJECT", "MESSAGE"]  # one file
    rows = [line.split() for line in lines[1:] if line.startswith("critical  xid")]
    assert [r[2] for r in rows[:2]] == ["gpu-node-07", "gpu-node-12"]
    culprits = lines[lines.index("Culprits:") + 1:]
    assert "  gpu-node-07 GPU 0000:3b:00: xid (two_hosts_syslog.log)" in culprits
    assert "  gpu-node-12 GPU 0000:3b:00: xid (two_hosts_syslog.log)" in culprits


def test_a_log_naming_no_host_has_no_host_column():
    result = analyze(str(XID119))
    assert result.stdout.splitlines()[0].split() == ["SEVERITY", "KIND", "SUBJECT", "MESSAGE"]


def test_an_nccl_culprit_is_located_in_the_table_and_in_json():
    rc, items = analyze_json(str(NCCL))
    assert rc == 1
    (timeout,) = [f for f in items if f["kind"] == "collective_timeout"]
    assert timeout["subject"] == "rank 2" and timeout["node"] == "node-b"
    assert timeout["evidence"]["culprit_locations"] == {"2": "node-b GPU 0000:3b:00 (cudaDev 0)"}
    assert timeout["evidence"]["locations"]["0"] == "node-a GPU 0000:1b:00 (cudaDev 0)"
    result = analyze(str(NCCL))
    assert "rank 2 on node-b GPU 0000:3b:00 (cudaDev 0)" in result.stdout.split("Culprits:")[1]
    row = next(line for line in result.stdout.splitlines()
               if line.startswith("critical  collective_timeout"))
    assert row.split()[2] == "node-b"


def test_a_directory_run_has_a_source_column_relative_to_the_directory():
    result = analyze(str(HOSTS))
    assert result.returncode == 1, result.stderr
    lines = result.stdout.splitlines()
    header = lines[0].split()
    assert header == ["SEVERITY", "KIND", "HOST", "SUBJECT", "SOURCE", "MESSAGE"]
    column = lines[0].index("SOURCE")
    sources = {line[column:].split()[0] for line in lines[1:lines.index("")]}
    assert {"two_hosts_syslog.log", "pdsh_dmesg.log"} <= sources
    assert any(s.startswith("nccl_rank2_silent/rank0.log") for s in sources)
    rc, items = analyze_json(str(HOSTS))
    assert {os.path.basename(f["source"]) for f in items if f["kind"] == "xid"} == {
        "two_hosts_syslog.log", "pdsh_dmesg.log"}
    assert all(f["source"].startswith(str(HOSTS)) for f in items)  # --json keeps the full path


def test_two_files_named_get_a_source_column_too():
    result = analyze(str(SYSLOG), str(XID119))
    assert "SOURCE" in result.stdout.splitlines()[0].split()


def test_exit_codes_are_the_same_for_a_file_named_and_found_in_a_directory(tmp_path):
    """docs/analyze.md: 0 nothing found, 1 findings, 2 an input could not be read (unknown or
    binary file...), the other files still analysed and printed."""
    alone = tmp_path / "alone"
    alone.mkdir()
    bad = {"core.bin": os.urandom(4096), "empty.log": b"",
           "notes.txt": b"the job died around 3 am\n"}
    for name, data in bad.items():
        (alone / name).write_bytes(data)
        named = analyze(str(alone / name))
        assert named.returncode == 2, (name, named.stderr)
        in_dir = tmp_path / f"dir_{name}"
        in_dir.mkdir()
        (in_dir / name).write_bytes(data)
        shutil.copy(SYSLOG, in_dir / SYSLOG.name)
        found = analyze(str(in_dir))
        assert found.returncode == 2, (name, found.stderr)
        error = f"laggard analyze: error: {in_dir / name}: unknown kind: "
        assert named.stderr.replace(str(alone), str(in_dir)).strip() == \
            [line for line in found.stderr.splitlines() if line.startswith(error)][0]
        assert "gpu-node-07 GPU 0000:3b:00" in found.stdout  # the good file still counts
        assert "Traceback" not in named.stderr + found.stderr
    clean = tmp_path / "clean"
    clean.mkdir()
    (clean / "kern.log").write_text("Dec  2 11:38:47 gpu-node-07 kernel: NVRM: loading NVIDIA "
                                    "UNIX x86_64 Kernel Module  570.158.01\n")
    assert analyze(str(clean)).returncode == 0
    assert analyze(str(clean / "kern.log")).returncode == 0
    (clean / ".hidden.bin").write_bytes(os.urandom(64))  # hidden files are not inputs
    assert analyze(str(clean)).returncode == 0
