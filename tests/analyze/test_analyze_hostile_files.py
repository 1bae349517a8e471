"""``laggard analyze`` on hostile files, as a real process: every per-file failure is one line
on stderr and exit status 2, never a traceback, and the other files are still analysed."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

from support import FIXTURES, REPO, budget

XID79 = FIXTURES / "analyze" / "xid03_xid79_then_nvswitch_sxid20034_dmesg_uptime.log"
HOSTILE = {
    # 6 KB of nesting once exhausted json's recursion while telling the file's kind.
    "nested.json": b'{"coll_perf": ' + b"[" * 6000 + b"]" * 6000 + b"}\n",
    "nested_dump.json": b'{"pg_config": {}, "entries": ' + b"[" * 6000 + b"]" * 6000 + b"}",
    "_dump_7": b"\x80\x04" + b"\xff" * 64,
    "infinite_dump.json": b'{"pg_config": {}, "pg_status": {"0": {"last_enqueued_collective":'
                          b' Infinity}}, "entries": [{"time_created_ns": Infinity}]}',
    "smi.csv": b"index, name, clocks_event_reasons.active\n0,\r a, 0x1\n",
}


def _run(*paths: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "laggard.cli", "analyze", "--json", *paths],
                          capture_output=True, text=True, timeout=budget(120), cwd=REPO)


def test_a_hostile_file_beside_a_real_xid_costs_only_itself(tmp_path):
    for name, data in HOSTILE.items():
        (tmp_path / name).write_bytes(data)
    shutil.copy(XID79, tmp_path / XID79.name)
    result = _run(str(tmp_path))
    assert "Traceback" not in result.stderr
    assert any(f["kind"] == "gpu_lost" and "91:00" in f["subject"]
               for f in json.loads(result.stdout))
    for name in HOSTILE:
        single = _run(str(tmp_path / name))
        assert "Traceback" not in single.stderr, name
        assert single.returncode in (0, 1, 2), (name, single.stderr)
        if single.returncode == 2:
            assert f"laggard analyze: error: {tmp_path / name}:" in single.stderr


def test_each_unreadable_file_is_named_and_the_status_is_2(tmp_path):
    (tmp_path / "nested.json").write_bytes(HOSTILE["nested.json"])
    shutil.copy(XID79, tmp_path / XID79.name)
    result = _run(str(tmp_path / "nested.json"), str(tmp_path / XID79.name))
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and "nested.json" in errors[0]
    assert any(f["kind"] == "xid" for f in json.loads(result.stdout))
