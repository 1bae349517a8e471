"""Kind detection by content on every corpus sample, and on what is not a known kind."""

from __future__ import annotations

import gzip
import os

import pytest
from support import FIXTURES

from laggard.analyze.filetype import PROBE_BYTES, FileKindError, detect

DIR = FIXTURES / "analyze"

EXPECTED_KIND = {
    "dcgm01": "dcgm", "fr01": "flight_recorder", "fr02": "fr_trace_report",
    "ib01": "infiniband_listing", "nccl01": "nccl_log", "nccl02": "nccl_log",
    "nccl03": "nccl_log", "nccl10": "nccl_log", "nccl11": "nccl_log", "nccl14": "nccl_log",
    "nccltests01": "nccl_tests", "nccltests03": "nccl_tests", "net01": "proc_net_dev",
    "smi01": "nvidia_smi_q", "smi03": "nvidia_smi_q", "xid01": "kernel_log",
    "xid02": "kernel_log", "xid03": "kernel_log", "xid06": "kernel_log", "xid08": "kernel_log",
    "xid11": "kernel_log", "xid12": "kernel_log", "inspector01": "nccl_inspector",
    "inspector02": "nccl_inspector", "inspector03": "nccl_inspector",
    "inspector04": "nccl_inspector", "inspector05": "nccl_inspector",
    "inspector06": "nccl_inspector", "inspector07": "nccl_inspector_prom",
    "_dump": "flight_recorder",
}


def corpus_files():
    for root, _, files in os.walk(DIR):
        for name in sorted(files):
            yield os.path.join(root, name)


@pytest.mark.parametrize("path", list(corpus_files()), ids=os.path.basename)
def test_every_corpus_sample_is_recognised(path):
    key = os.path.basename(path).split("_")[0] or "_dump"
    assert detect(path) == EXPECTED_KIND[key]


def test_gzip_is_read_through(tmp_path):
    src = (DIR / "xid01_gsp_rpc_timeout_xid119_dmesg_ctime.log").read_bytes()
    path = tmp_path / "kern.log.gz"
    path.write_bytes(gzip.compress(src))
    assert detect(str(path)) == "kernel_log"


def test_marker_only_at_the_end_of_a_long_log(tmp_path):
    path = tmp_path / "train.out"
    with open(path, "w") as f:
        f.write("step 1 loss 2.0\n" * (3 * PROBE_BYTES // 16))
        f.write("[rank0]:[E626 06:24:44.9 ProcessGroupNCCL.cpp:616] [Rank 0] Watchdog caught "
                "collective operation timeout: WorkNCCL(SeqNum=8, OpType=ALLREDUCE, "
                "Timeout(ms)=600000) ran for 600020 milliseconds before timing out.\n")
    assert detect(str(path)) == "nccl_log"


def test_mixed_kernel_and_nccl_log(tmp_path):
    path = tmp_path / "node.log"
    path.write_text("[  219.4] NVRM: Xid (PCI:0000:07:00): 48, pid=1, name=x, DBE\n"
                    "node01:1:2 [0] NCCL INFO comm 0x1 rank 0 nranks 2 cudaDev 0 busId 7000 - "
                    "Init COMPLETE\n")
    assert detect(str(path)) == "mixed_log"


@pytest.mark.parametrize("content, reason", [
    (b"", "empty"),
    (bytes(range(256)) * 64, "binary"),
    (b"just some notes\nnothing to see\n", "no known marker"),
])
def test_unknown_content_is_refused_with_a_reason(tmp_path, content, reason):
    path = tmp_path / "x"
    path.write_bytes(content)
    with pytest.raises(FileKindError, match=reason):
        detect(str(path))


@pytest.mark.parametrize("line", [
    "torch.distributed.DistBackendError: [3] is setting up NCCL communicator and retrieving "
    "ncclUniqueId from [0] via c10d key-value store by key '0', but store->get('0') got error: "
    "Socket Timeout",
    "RuntimeError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:219, unhandled "
    "cuda error, NCCL version 2.14.3",
    "torch.distributed.DistStoreError: Timed out after 901 seconds waiting for clients. 1/2 "
    "clients joined.",
])
def test_python_side_nccl_failures_are_nccl_logs(tmp_path, line):
    path = tmp_path / "train.err"
    path.write_text("Traceback (most recent call last):\n" + line + "\n")
    assert detect(str(path)) == "nccl_log"
