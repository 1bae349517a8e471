"""NCCL / ProcessGroupNCCL log parser on the corpus logs (answers from corpus/EXPECTED.md) and on
the message formats of PyTorch's and NCCL's source that the corpus does not cover."""

from __future__ import annotations

from support import FIXTURES, parse_file

from laggard.parsers.nccl_log import (
    CollectiveMismatch,
    DesyncReport,
    NcclLogParser,
    WatchdogTimeout,
    parse_nccl_log,
)

DIR = FIXTURES / "analyze"


def log_of(name: str):
    return parse_file(parse_nccl_log, DIR / name)


def test_nccl01_pt25_format_reduce_scatter_timeouts_and_progress():
    log = log_of("nccl01_watchdog_timeout_reduce_scatter_base_pt25_format.log")
    assert [(t.rank, t.elapsed_ms) for t in log.timeouts] == [(0, 600061), (4, 600099),
                                                              (3, 600089)]
    t = log.timeouts[0]
    assert (t.seq, t.op, t.numel_in, t.numel_out, t.timeout_ms) == (
        7753, "_REDUCE_SCATTER_BASE", 544997376, 68124672, 600000)
    assert t.numel_in // t.numel_out == 8  # world size 8
    assert t.launcher_rank == 0 and t.timestamp == "1206 18:44:12.715298746"
    assert [(p.rank, p.pg, p.work_seq, p.last_enqueued, p.last_completed) for p in log.progress] \
        == [(0, "1", 7753, 7755, 7752), (4, "1", 7753, 7755, 7752)]


def test_nccl02_pg_guid_prefix():
    log = log_of("nccl02_watchdog_timeout_allreduce_pg_guid_format.log")
    assert [(t.rank, t.seq, t.op, t.numel_in, t.elapsed_ms) for t in log.timeouts] == [
        (1, 808, "ALLREDUCE", 9801523, 600020), (0, 808, "ALLREDUCE", 9801523, 600030),
        (2, 808, "ALLREDUCE", 9801523, 600061)]
    p = log.progress[0]
    assert (p.pg, p.pg_desc, p.last_enqueued, p.last_completed) == ("0", "default_pg", 811, 807)


def test_nccl03_legacy_format_without_numel():
    log = log_of("nccl03_watchdog_timeout_legacy_format_no_numel_30min.log")
    assert {t.rank: t.elapsed_ms for t in log.timeouts} == {
        1: 1802212, 3: 1802211, 2: 1802212, 6: 1802210, 7: 1802220}
    assert {(t.seq, t.op, t.timeout_ms, t.numel_in) for t in log.timeouts} == {
        (469508, "ALLREDUCE", 1800000, None)}


def test_nccl10_old_init_complete_lines():
    log = log_of("nccl10_info_init_complete_legacy_2nodes_16ranks.log")
    assert len(log.inits) == 8
    assert {i.nranks for i in log.inits} == {16}
    by_host: dict[str, list[int]] = {}
    for i in log.inits:
        by_host.setdefault(f"{i.host}:{i.pid}", []).append(i.rank)
    assert by_host == {"node02:193027": [15, 14, 12, 8, 9], "node01:58077": [2, 5, 4]}
    r15 = next(i for i in log.inits if i.rank == 15)
    assert (r15.bus_id, r15.cuda_dev, r15.comm_id) == ("e7000", 7, None)


def test_nccl11_new_init_complete_and_init_timings():
    log = log_of("nccl11_info_ncclCommInitRank_complete_with_init_timings.log")
    assert [i.rank for i in log.inits] == [6, 4, 0, 1, 5]
    assert {i.comm_id for i in log.inits} == {"0x49bbd7790311d5eb"}
    assert {i.nranks for i in log.inits} == {16}
    assert [(t.rank, t.total_seconds) for t in log.init_timings] == [(2, 1.08), (6, 1.08),
                                                                     (0, 1.08)]
    assert log.init_timings[0].parts["bootstrap"] == 0.22
    assert log.init_timings[0].parts["topo"] == 0.28


def test_nccl14_ib_completion_errors_with_propagated_result():
    log = log_of("nccl14_warn_ib_completion_status12_vendor129_ib_plugin.log")
    assert len(log.warnings) == 3
    assert {(w.host, w.device, w.peer, w.wc_status, w.vendor_err, w.direction, w.result)
            for w in log.warnings} == {("node01", 4, "192.0.2.10", 12, 129, "Recv", 6)}
    assert [w.peer_port for w in log.warnings] == [54862, 54862, 49892]
    assert log.warnings[0].source == "ib_plugin.c:1615"


def test_every_workncll_variant_and_log_prefix():
    lines = [
        # PyTorch 1.x: no SeqNum, TensorShape
        "[E ProcessGroupNCCL.cpp:566] [Rank 2] Watchdog caught collective operation timeout: "
        "WorkNCCL(OpType=BROADCAST, TensorShape=[1024, 8], Timeout(ms)=1800000) ran for 1800514 "
        "milliseconds before timing out.",
        # Ray worker prefix, PG with description, glog stamp with 3-digit month-day
        "(RayWorkerWrapper pid=270291, ip=10.0.0.1) [rank3]:[E219 08:58:32.606233339 "
        "ProcessGroupNCCL.cpp:616] [Rank 3] Watchdog caught collective operation timeout: "
        "WorkNCCL(SeqNum=31, OpType=ALLREDUCE, NumelIn=117440512, NumelOut=117440512, "
        "Timeout(ms)=600000) ran for 600031 milliseconds before timing out.",
        "[rank1]:[E1003 18:37:01.833621509 ProcessGroupNCCL.cpp:1709] [PG 0 (default_pg) Rank 1] "
        "Timeout at NCCL work: 6463, last enqueued NCCL work: 6463, last completed NCCL work: "
        "6462.",
        "[rank1]:[E1218 20:27:21.484903450 ProcessGroupNCCL.cpp:2168] [PG ID 1 PG GUID 1 Rank 1]"
        "  failure detected by watchdog at work sequence id: 1 PG status: last enqueued work: "
        "547, last completed work: -1",
        "[rank4]:[E703 15:37:17.178360488 ProcessGroupNCCL.cpp:1987] [PG ID 0 PG GUID 0(default_pg)"
        " Rank 4] Received a dump signal due to a collective timeout from  rank 7 and we will try "
        "our best to dump the debug info. Last enqueued NCCL work: 56118, last completed NCCL "
        "work: 56118.This is most likely caused by incorrect usages of collectives",
    ]
    parser = NcclLogParser()
    events = [e for line in lines for e in parser.feed(line)]
    old, ray = events[0], events[1]
    assert isinstance(old, WatchdogTimeout)
    assert (old.rank, old.seq, old.op, old.tensor_shape, old.elapsed_ms) == (
        2, None, "BROADCAST", "[1024, 8]", 1800514)
    assert (ray.rank, ray.seq, ray.elapsed_ms, ray.timestamp) == (
        3, 31, 600031, "219 08:58:32.606233339")
    timeout, failure, dump = events[2:]
    assert (timeout.reason, timeout.pg, timeout.pg_desc, timeout.work_seq) == (
        "timeout", "0", "default_pg", 6463)
    assert (failure.reason, failure.rank, failure.pg, failure.last_enqueued,
            failure.last_completed) == ("failure", 1, "1", 547, -1)
    assert (dump.reason, dump.rank, dump.last_enqueued) == ("dump_signal", 4, 56118)


def test_message_cut_by_a_terminal_wrap_is_rejoined():
    lines = [
        "[rank3] Watchdog caught collective operation timeout:",
        "WorkNCCL(SeqNum=64214, OpType=ALLGATHER, NumelIn=1, NumelOut=32,",
        " Timeout(ms)=600000) ran for 600100 milliseconds before timing out.",
        "unrelated line",
    ]
    parser = NcclLogParser()
    events = [e for line in lines for e in parser.feed(line)]
    assert len(events) == 1
    t = events[0]
    assert (t.rank, t.seq, t.op, t.numel_in, t.numel_out, t.elapsed_ms) == (
        3, 64214, "ALLGATHER", 1, 32, 600100)


def test_a_half_line_does_not_swallow_the_next_message():
    # Two ranks writing to one stream: the first message is cut and never completed.
    lines = [
        "[rank0]:[E626 06:24:44.903 ProcessGroupNCCL.cpp:616] [Rank 0] Watchdog caught collective",
        "[rank1]:[E626 06:24:44.903 ProcessGroupNCCL.cpp:616] [Rank 1] Watchdog caught collective "
        "operation timeout: WorkNCCL(SeqNum=808, OpType=ALLREDUCE, NumelIn=9, NumelOut=9, "
        "Timeout(ms)=600000) ran for 600020 milliseconds before timing out.",
    ]
    parser = NcclLogParser()
    events = [e for line in lines for e in parser.feed(line)]
    assert [(e.rank, e.seq) for e in events] == [(1, 808)]


def test_fingerprint_mismatch_and_desync_report():
    lines = [
        "RuntimeError: Detected mismatch between collectives on ranks. Rank 0 is running "
        "collective: CollectiveFingerPrint(SequenceNumber=4, OpType=ALLREDUCE, TensorShape=[4]), "
        "but Rank 1 is running collective: CollectiveFingerPrint(SequenceNumber=4, "
        "OpType=BROADCAST, TensorShape=[4]).",
        "\t - To our best knowledge, ranks [47] are the lagging ranks that caused this timeout. "
        "They never joined any collectives",
        "\t   - [3, 5] joined but didn't finish collective #41207 (count from 1)",
    ]
    parser = NcclLogParser()
    events = [e for line in lines for e in parser.feed(line)]
    mismatch, never, joined = events
    assert isinstance(mismatch, CollectiveMismatch)
    assert (mismatch.rank, mismatch.other_rank) == (0, 1)
    assert "BROADCAST" in mismatch.other and "ALLREDUCE" in mismatch.this
    assert isinstance(never, DesyncReport) and never.never_joined == (47,)
    assert joined.joined_not_finished == (3, 5) and joined.seq == 41207


def test_older_ib_completion_format_and_hca_name():
    parser = NcclLogParser()
    old = parser.feed("gpu7:123:456 [2] NCCL WARN NET/IB : Got completion from peer "
                      "10.1.2.3<45678> with error 12, opcode 0, len 0, vendor err 129")[0]
    new = parser.feed("gpu7:123:456 [2] net_ib.cc:2210 NCCL WARN NET/IB: Got completion from "
                      "peer 10.1.2.4<1234> with status=IBV_WC_RETRY_EXC_ERR(12) "
                      "opcode=IBV_WC_RECV(128) vendor_err=129 localGid ::1 remoteGids ::2 "
                      "hca mlx5_3")[0]
    assert (old.peer, old.peer_port, old.wc_status, old.vendor_err) == ("10.1.2.3", 45678, 12,
                                                                        129)
    assert (new.peer, new.wc_status, new.opcode, new.vendor_err, new.hca) == (
        "10.1.2.4", 12, 128, 129, "mlx5_3")


def test_binary_junk_and_huge_lines_are_ignored():
    parser = NcclLogParser()
    assert parser.feed("\x00\xff" * 50_000) == []
    assert parser.feed("WorkNCCL(" * 10_000) == []
    assert parser.lines == 2


def test_heartbeat_monitor_stuck_watchdog():
    parser = NcclLogParser()
    (a,) = parser.feed(
        "[rank0]:[E1120 10:00:00.1 ProcessGroupNCCL.cpp:1536] [PG ID 0 PG GUID 0(default_pg) "
        "Rank 0] ProcessGroupNCCL's watchdog got stuck for 480 seconds without making progress "
        "in monitoring enqueued collectives.")
    (b,) = parser.feed("[rank5]:[E ProcessGroupNCCL.cpp:1316] [PG 0 Rank 5] Heartbeat monitor "
                       "timed out! Process will be terminated after dumping debug info.")
    assert (a.rank, a.seconds) == (0, 480) and (b.rank, b.seconds) == (5, None)


def test_bring_up_and_nccl_error_lines():
    parser = NcclLogParser()
    (b,) = parser.feed("[5] is setting up NCCL communicator and retrieving ncclUniqueId from [0] "
                       "via c10d key-value store by key '0', but store->get('0') got error: wait "
                       "timeout after 300000ms")
    assert (b.rank, b.root, b.error) == (5, 0, "wait timeout after 300000ms")
    (store,) = parser.feed("torch.distributed.DistStoreError: Timed out after 901 seconds "
                           "waiting for clients. 1/2 clients joined.")
    assert (store.joined, store.expected) == (1, 2)
    (e,) = parser.feed("RuntimeError: NCCL error in: ../torch/csrc/distributed/c10d/"
                       "NCCLUtils.hpp:219, unhandled cuda error, NCCL version 2.14.3")
    assert (e.where, e.what, e.nccl_version) == (
        "../torch/csrc/distributed/c10d/NCCLUtils.hpp:219", "unhandled cuda error", "2.14.3")


def test_indented_and_wrapped_timeout_lines_are_read():
    # PyTorch's format (ProcessGroupNCCL.cpp, operator<<(WorkNCCL)) under a PG GUID prefix.
    line = ("[rank2]:[E1201 09:14:12.000001000 ProcessGroupNCCL.cpp:632] [PG ID 0 PG GUID "
            "0(default_pg) Rank 2] Watchdog caught collective operation timeout: WorkNCCL("
            "SeqNum=301, OpType=_ALLGATHER_BASE, NumelIn=8, NumelOut=8, Timeout(ms)=600000) ran "
            "for 600017 milliseconds before timing out.")
    cut = line.index("NumelOut")
    log = parse_nccl_log(["    " + line, line[:cut], line[cut:]])
    assert [(t.rank, t.seq, t.op, t.pg, t.pg_desc) for t in log.timeouts] == [
        (2, 301, "_ALLGATHER_BASE", "0", "default_pg")] * 2
