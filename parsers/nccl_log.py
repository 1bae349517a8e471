"""Pure parser for what NCCL and PyTorch's ProcessGroupNCCL print about collectives.

Feed it the lines of a job's stdout/stderr, one at a time; it keeps no more than a few pending
lines, so a log of any size streams through in bounded memory.

Messages recognised (printf formats from PyTorch ``torch/csrc/distributed/c10d/
ProcessGroupNCCL.cpp`` and ``TraceUtils.h``, NCCL ``src/debug.cc`` and ``src/transport/net_ib.cc``):

* watchdog timeout, every version::

      [Rank R] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=S, OpType=OP,
      NumelIn=N, NumelOut=N, Timeout(ms)=T) ran for E milliseconds before timing out.

  ``WorkNCCL(...)`` has been printed as ``(OpType, TensorShape, Timeout)``, ``(SeqNum, OpType,
  [TensorShape,] Timeout)`` and ``(SeqNum, OpType, NumelIn, NumelOut, Timeout)``; its fields are
  read as ``key=value`` pairs, so any of them may be absent.
* the process group's progress, printed beside a timeout or error (``logPrefix()`` is ``[Rank R]``,
  ``[PG P Rank R]``, ``[PG P (desc) Rank R]`` or ``[PG ID P PG GUID G(desc) Rank R]``)::

      Exception (either an error or timeout) detected by watchdog at work: S, last enqueued NCCL
      work: E, last completed NCCL work: C.
      Timeout at NCCL work: S, last enqueued NCCL work: E, last completed NCCL work: C.
      failure detected by watchdog at work sequence id: S PG status: last enqueued work: E,
      last completed work: C
      Received a dump signal due to a collective timeout from rank X ... Last enqueued NCCL
      work: E, last completed NCCL work: C.

* bring-up: ``[R] is setting up NCCL communicator and retrieving ncclUniqueId from [0] ...
  got error: ...`` and the TCPStore's ``J/W clients joined``; ``NCCL error in: file:line,
  <reason>, NCCL version X`` raised into Python.
* the heartbeat monitor: ``ProcessGroupNCCL's watchdog got stuck for N seconds`` and
  ``Heartbeat monitor timed out!``.
* ``TORCH_DISTRIBUTED_DEBUG=DETAIL``'s fingerprint check: ``Detected mismatch between
  collectives on ranks. Rank A is running collective: ..., but Rank B is running collective: ...``
* ``TORCH_NCCL_DESYNC_DEBUG``'s report: ``ranks [..] are the lagging ranks that caused this
  timeout`` and ``[..] joined but didn't finish collective #S``.
* NCCL debug lines ``host:pid:tid [dev] [file:line] NCCL INFO|WARN msg``: ``Init COMPLETE`` (old
  ``comm 0x.. rank R nranks N cudaDev D busId B`` and new ``ncclCommInitRank comm .. nvmlDev ..
  commId 0x..`` forms), ``Init timings: rank R nranks N total T (part t, ...)``, every ``WARN``
  (``NET/IB`` completion errors decoded: peer, ``ibv_wc_status``, vendor error, direction), and
  the ``file:line -> N`` lines that propagate an ``ncclResult_t`` after a WARN.

Launcher prefixes (``[rank0]:``, Ray's ``(RayWorkerWrapper pid=.., ip=..)``, ``srun -l``'s
``3:``, timestamps) are skipped because messages are searched for, not anchored. A message cut by
a terminal wrap is rejoined with the next lines (up to :data:`MAX_JOINED_LINES`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "BringUpFailure",
    "CollectiveMismatch",
    "DesyncReport",
    "InitComplete",
    "InitTimings",
    "NcclError",
    "NcclLogParser",
    "NcclWarning",
    "ProgressStatus",
    "WatchdogStuck",
    "WatchdogTimeout",
    "parse_nccl_log",
    "NCCL_RESULTS",
    "IBV_WC_STATUS",
]

#: Most physical lines joined to rebuild one message cut by a terminal wrap.
MAX_JOINED_LINES = 4
#: Longest line kept whole; longer lines (a binary blob in the log) are cut.
MAX_LINE_CHARS = 16384

#: ``ncclResult_t`` (NCCL ``src/nccl.h.in``).
NCCL_RESULTS = {
    0: "ncclSuccess", 1: "ncclUnhandledCudaError", 2: "ncclSystemError",
    3: "ncclInternalError", 4: "ncclInvalidArgument", 5: "ncclInvalidUsage",
    6: "ncclRemoteError", 7: "ncclInProgress",
}
#: ``enum ibv_wc_status`` (rdma-core ``libibverbs/verbs.h``; meanings in ``ibv_poll_cq(3)``).
IBV_WC_STATUS = {
    0: "IBV_WC_SUCCESS", 1: "IBV_WC_LOC_LEN_ERR", 2: "IBV_WC_LOC_QP_OP_ERR",
    3: "IBV_WC_LOC_EEC_OP_ERR", 4: "IBV_WC_LOC_PROT_ERR", 5: "IBV_WC_WR_FLUSH_ERR",
    6: "IBV_WC_MW_BIND_ERR", 7: "IBV_WC_BAD_RESP_ERR", 8: "IBV_WC_LOC_ACCESS_ERR",
    9: "IBV_WC_REM_INV_REQ_ERR", 10: "IBV_WC_REM_ACCESS_ERR", 11: "IBV_WC_REM_OP_ERR",
    12: "IBV_WC_RETRY_EXC_ERR", 13: "IBV_WC_RNR_RETRY_EXC_ERR", 14: "IBV_WC_LOC_RDD_VIOL_ERR",
    15: "IBV_WC_REM_INV_RD_REQ_ERR", 16: "IBV_WC_REM_ABORT_ERR", 17: "IBV_WC_INV_EECN_ERR",
    18: "IBV_WC_INV_EEC_STATE_ERR", 19: "IBV_WC_FATAL_ERR", 20: "IBV_WC_RESP_TIMEOUT_ERR",
    21: "IBV_WC_GENERAL_ERR",
}


@dataclass(frozen=True, slots=True)
class WatchdogTimeout:
    """One rank's ``Watchdog caught collective operation timeout``.

    Attributes:
        rank: rank in its process group as the message prints it (``[Rank R]``), else the
            launcher's ``[rankN]:`` prefix, else None.
        launcher_rank: N of a ``[rankN]:`` prefix (torchrun's global rank), else None.
        seq: ``SeqNum``, the process group's collective sequence number; None in old formats.
        op: ``OpType`` (``ALLREDUCE``, ``_REDUCE_SCATTER_BASE``...).
        numel_in: ``NumelIn`` (elements), when printed.
        numel_out: ``NumelOut`` (elements), when printed.
        tensor_shape: ``TensorShape`` as printed (``[1024, 8]``), when printed.
        timeout_ms: ``Timeout(ms)``.
        elapsed_ms: milliseconds the collective had run when the watchdog fired.
        timestamp: the glog stamp (``1206 18:44:12.715298746``, month-day, no year) if any.
        raw: the (rejoined) line.
        pg: the process group's id from a ``[PG P ...]`` / ``[PG ID P ...]`` prefix, else None
            (``[Rank R]`` alone names no group).
        pg_desc: the group's description when the prefix prints one (``default_pg``).
    """

    rank: int | None
    launcher_rank: int | None
    seq: int | None
    op: str | None
    numel_in: int | None
    numel_out: int | None
    tensor_shape: str | None
    timeout_ms: int | None
    elapsed_ms: int | None
    timestamp: str | None
    raw: str
    pg: str | None = None
    pg_desc: str | None = None


@dataclass(frozen=True, slots=True)
class ProgressStatus:
    """A process group's progress as its watchdog printed it.

    Attributes:
        rank: rank in the process group (from the log prefix), else the launcher rank.
        pg: process group id (``PG 1``, ``PG ID 0``), None when the prefix has none.
        pg_desc: the group's description (``default_pg``) when printed.
        work_seq: sequence number of the failed work, when the message names one.
        last_enqueued: last collective sequence number enqueued by this rank.
        last_completed: last one completed (-1: none yet).
        reason: ``"exception"``, ``"timeout"``, ``"error"``, ``"failure"``, ``"dump_signal"`` or
            ``"periodic"``: which message it came from.
        raw: the line.
    """

    rank: int | None
    pg: str | None
    pg_desc: str | None
    work_seq: int | None
    last_enqueued: int
    last_completed: int
    reason: str
    raw: str


@dataclass(frozen=True, slots=True)
class WatchdogStuck:
    """The watchdog itself stopped making progress (heartbeat monitor).

    ``ProcessGroupNCCL's watchdog got stuck for N seconds without making progress`` or
    ``Heartbeat monitor timed out!``: a CUDA or NCCL call blocked the watchdog thread, most often
    behind a GPU fault or a GIL deadlock; the process is then killed.

    Attributes:
        rank: from the log prefix or launcher prefix; ``seconds``: N when printed.
    """

    rank: int | None
    seconds: int | None
    raw: str


@dataclass(frozen=True, slots=True)
class BringUpFailure:
    """A rank that could not build its NCCL communicator or join the job.

    ``[R] is setting up NCCL communicator and retrieving ncclUniqueId from [0] via c10d
    key-value store by key '0', but store->get('0') got error: ...`` (PyTorch
    ``ProcessGroupNCCL::broadcastUniqueNCCLID``), or the TCPStore's ``Timed out after N seconds
    waiting for clients. J/W clients joined.``

    Attributes:
        rank: the rank waiting (None for the store's message).
        root: the rank it waited for (the one that creates the unique id).
        error: the store error as printed.
        joined / expected: clients joined and expected, from the store's message.
    """

    rank: int | None
    root: int | None
    error: str | None
    joined: int | None
    expected: int | None
    raw: str


@dataclass(frozen=True, slots=True)
class NcclError:
    """``NCCL error in: file:line, <ncclGetErrorString>, NCCL version X`` raised into Python.

    Attributes:
        rank: from the launcher prefix; ``where``: file:line; ``what``: NCCL's error string;
        ``result``: the ``ncclResult_t`` name when printed (``ncclRemoteError``...);
        ``nccl_version``.
    """

    rank: int | None
    where: str
    what: str
    result: str | None
    nccl_version: str | None
    raw: str


@dataclass(frozen=True, slots=True)
class CollectiveMismatch:
    """``Detected mismatch between collectives on ranks`` (``TORCH_DISTRIBUTED_DEBUG=DETAIL``).

    Attributes:
        rank: the rank that detected it.
        other_rank: the rank found running something else.
        this: its collective fingerprint as printed.
        other: the other rank's fingerprint as printed.
        raw: the line.
    """

    rank: int
    other_rank: int
    this: str
    other: str
    raw: str


@dataclass(frozen=True, slots=True)
class DesyncReport:
    """Ranks named by ``TORCH_NCCL_DESYNC_DEBUG``'s report.

    Attributes:
        never_joined: ranks that "never joined any collectives".
        joined_not_finished: ranks that joined collective ``seq`` but did not finish it.
        finished_not_joined_next: ranks that finished ``seq`` but did not join ``seq + 1``.
        seq: the collective number the report is about (counted from 1), if given.
        raw: the line.
    """

    never_joined: tuple[int, ...] = ()
    joined_not_finished: tuple[int, ...] = ()
    finished_not_joined_next: tuple[int, ...] = ()
    seq: int | None = None
    raw: str = ""


@dataclass(frozen=True, slots=True)
class InitComplete:
    """One rank's ``Init COMPLETE`` NCCL line.

    Attributes:
        host, pid, tid: from the NCCL line prefix.
        rank: rank in the communicator; ``nranks``: its size.
        cuda_dev: CUDA device ordinal; ``nvml_dev``: NVML index (new format only).
        bus_id: PCI bus id as NCCL prints it (``e7000`` = bus 0xe7, device 0).
        comm: communicator pointer; ``comm_id``: the communicator hash (new format only).
    """

    host: str
    pid: int
    tid: int
    rank: int
    nranks: int
    cuda_dev: int | None
    nvml_dev: int | None
    bus_id: str | None
    comm: str | None
    comm_id: str | None


@dataclass(frozen=True, slots=True)
class InitTimings:
    """``Init timings: rank R nranks N total T (kernels t, bootstrap t, ...)`` (seconds)."""

    host: str
    pid: int
    rank: int
    nranks: int
    total_seconds: float
    parts: dict[str, float]


@dataclass(slots=True)
class NcclWarning:
    """An ``NCCL WARN`` line, with an InfiniBand completion error decoded when it is one.

    Attributes:
        host, pid, tid, device: from the NCCL line prefix (``device`` is the CUDA ordinal).
        source: ``file.c:line`` that printed it, when printed.
        message: the text after ``NCCL WARN``.
        result: the ``ncclResult_t`` code the same thread propagated next (``-> 6``), if seen.
        peer, peer_port: remote address of an IB completion error.
        wc_status: ``ibv_wc_status`` code; ``vendor_err``: the HCA vendor syndrome.
        opcode: work-completion opcode; ``direction``: ``Recv``/``Send``... when printed.
        hca: the local HCA name (``mlx5_0``) when printed.
        raw: the line.
    """

    host: str
    pid: int
    tid: int
    device: int | None
    source: str | None
    message: str
    raw: str
    result: int | None = None
    peer: str | None = None
    peer_port: int | None = None
    wc_status: int | None = None
    vendor_err: int | None = None
    opcode: int | None = None
    direction: str | None = None
    hca: str | None = None


NcclLogEvent = (WatchdogTimeout | ProgressStatus | WatchdogStuck | BringUpFailure | NcclError
                | CollectiveMismatch | DesyncReport | InitComplete | InitTimings | NcclWarning)

_INT = r"-?\d+"
_LAUNCHER_RANK = re.compile(r"\[rank(\d+)\]:?")
_GLOG = re.compile(r"\[[EWIF](\d{3,4} \d\d:\d\d:\d\d\.\d+)")
# logPrefix(): "[Rank 3] ", "[PG 1 Rank 0] ", "[PG 0 (default_pg) Rank 1] ",
# "[PG ID 0 PG GUID 0(default_pg) Rank 1] ", "[PG ID 2 PG GUID 3 Rank 3] "
_LOG_PREFIX = re.compile(
    r"\[(?:PG (?:ID )?(?P<pg>\w+)(?: PG GUID (?P<guid>[^\s(\]]+))?\s*(?:\((?P<desc>[^)]*)\))?\s+)?"
    r"Rank (?P<rank>\d+)\]"
)
_WATCHDOG = re.compile(
    r"Watchdog caught collective operation timeout:?\s*WorkNCCL\((?P<fields>[^)]*\)?[^)]*)\)"
    r"\s*ran for (?P<elapsed>\d+) milliseconds"
)
_WORK_FIELD = re.compile(r"(\w+(?:\(ms\))?)=(\[[^\]]*\]|[^,]+)")
_PROGRESS = re.compile(
    r"(?P<what>detected by watchdog at work|Timeout at NCCL work|NCCL error is detected by "
    r"watchdog at work|failure detected by watchdog at work sequence id|Received a dump signal|"
    r"NCCL Work update periodically)"
    r"(?::\s*(?P<seq>" + _INT + r"))?.*?last enqueued (?:NCCL )?work:\s*(?P<enq>" + _INT + r")"
    r",\s*last completed (?:NCCL )?work:\s*(?P<comp>" + _INT + ")",
    re.IGNORECASE,
)
_PROGRESS_REASON = {
    "detected by watchdog at work": "exception", "timeout at nccl work": "timeout",
    "nccl error is detected by watchdog at work": "error",
    "failure detected by watchdog at work sequence id": "failure",
    "received a dump signal": "dump_signal", "nccl work update periodically": "periodic",
}
_UNIQUE_ID = re.compile(
    r"\[(?P<rank>\d+)\] is setting up NCCL communicator and retrieving ncclUniqueId from "
    r"\[(?P<root>\d+)\](?:.*?got error: (?P<err>.*?)\s*$)?")
_STORE_JOIN = re.compile(r"waiting for clients\. (?P<joined>\d+)/(?P<expected>\d+) clients joined")
_NCCL_ERROR = re.compile(
    r"NCCL error in: (?P<where>[^,]+), (?P<what>.*?)(?:, NCCL version (?P<ver>[\w.+-]+))?"
    r"(?:\s+(?P<result>nccl[A-Z]\w+Error))?(?::|\s*$)")
_STUCK = re.compile(r"watchdog got stuck for (\d+) seconds|Heartbeat monitor timed out")
_MISMATCH = re.compile(
    r"Detected mismatch between collectives on ranks\. Rank (?P<a>\d+) is running collective: "
    r"(?P<this>.*?), but Rank (?P<b>\d+) is running collective: (?P<other>.*?)\.?\s*$"
)
_NEVER_JOINED = re.compile(r"ranks \[(?P<ranks>[\d, ]*)\] are the lagging ranks")
_JOINED = re.compile(r"\[(?P<ranks>[\d, ]*)\] joined but didn't finish collective #(?P<seq>\d+)")
_FINISHED = re.compile(
    r"\[(?P<ranks>[\d, ]*)\] finished collective #(?P<seq>\d+), but didn't join"
)
# NCCL's debug prefix (src/debug.cc): "%s:%d:%d [%d] " then for WARN "%s:%d " (file:line).
_NCCL_LINE = re.compile(
    r"(?P<host>[\w.\-]+):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>\d+)\] "
    r"(?:(?P<src>[\w./\-]+:\d+) )?NCCL (?P<level>WARN|INFO|ABORT) (?P<msg>.*)$"
)
_INIT_OLD = re.compile(
    r"comm (?P<comm>0x[0-9a-f]+) rank (?P<rank>\d+) nranks (?P<nranks>\d+) cudaDev (?P<cuda>\d+)"
    r"(?: nvmlDev (?P<nvml>\d+))? busId (?P<bus>[0-9a-f]+)(?: commId (?P<cid>0x[0-9a-f]+))?"
    r".*Init COMPLETE"
)
_INIT_TIMINGS = re.compile(
    r"Init timings(?: - \w+)?: rank (?P<rank>\d+) nranks (?P<nranks>\d+) total (?P<total>[\d.]+)"
    r"(?: \((?P<parts>[^)]*)\))?"
)
_PROPAGATE = re.compile(r"(?:[\w./\-]+:\d+ )?-> (?P<code>\d+)")
# NET/IB completion error, three generations (net_ib.cc):
#  "with error %d, opcode %d, len %d, vendor err %d"
#  "with status=%d opcode=%d len=%d vendor err %d (%s)"
#  "with status=%s(%d) opcode=%s(%d) vendor_err=%u"
_IB_COMPLETION = re.compile(
    r"Got completion from peer (?P<peer>\S+?)(?:<(?P<port>\d+)>)? with "
    r"(?:error |status=)(?:\w+\()?(?P<status>\d+)\)?,?\s+opcode[= ](?:\w+\()?(?P<opcode>\d+)\)?,?"
    r"(?:\s+len[= ]\d+,?)?\s+vendor[ _]err[ =](?P<vendor>\d+)(?: \((?P<dir>[^)]*)\))?"
)
_HCA = re.compile(r"\bhca (\S+)")
# A line that starts a message we know but may have been cut by a terminal wrap.
_STARTS = ("Watchdog caught collective operation timeout", "Detected mismatch between collectives")


def _ranks(text: str) -> tuple[int, ...]:
    return tuple(int(t) for t in text.replace(" ", "").split(",") if t.isdigit())


class NcclLogParser:
    """Streaming parser; see the module docstring for the messages it reads.

    Attributes:
        lines: physical lines fed so far.
        events: number of events returned so far.
    """

    def __init__(self) -> None:
        self.lines = 0
        self.events = 0
        self._pending: list[str] = []
        # (host, pid, tid) -> the last WARN of that thread still waiting for its "-> N" line
        self._open_warnings: dict[tuple[str, int, int], NcclWarning] = {}

    def feed(self, line: str) -> list[NcclLogEvent]:
        """Parse one physical line; return the events it completes (often none)."""
        self.lines += 1
        line = line.rstrip("\r\n")[:MAX_LINE_CHARS]
        if self._pending:
            joined = self._pending[-1] + line.lstrip()
            event = self._parse(joined)
            if event is not None:
                self._pending.clear()
                return self._emit([event])
            if len(self._pending) < MAX_JOINED_LINES - 1 and not any(s in line for s in _STARTS):
                self._pending.append(joined)
                return []
            self._pending.clear()
        event = self._parse(line)
        if event is None:
            if any(s in line for s in _STARTS):
                self._pending.append(line.rstrip() + " ")
            return []
        return self._emit([event])

    def flush(self) -> list[NcclLogEvent]:
        """End of input: drop any message left incomplete."""
        self._pending.clear()
        self._open_warnings.clear()
        return []

    def _emit(self, events: list[NcclLogEvent]) -> list[NcclLogEvent]:
        self.events += len(events)
        return events

    def _parse(self, line: str) -> NcclLogEvent | None:
        if "NCCL" in line:
            m = _NCCL_LINE.search(line)
            if m:
                return self._nccl_line(m, line)
        if "WorkNCCL" in line:
            m = _WATCHDOG.search(line)
            if m:
                return _watchdog(m, line)
        if "ast enqueued" in line:
            m = _PROGRESS.search(line)
            if m:
                return _progress(m, line)
        if "ncclUniqueId" in line or "clients joined" in line:
            event = _bring_up(line)
            if event is not None:
                return event
        if "NCCL error in:" in line and (m := _NCCL_ERROR.search(line)):
            launcher = _LAUNCHER_RANK.search(line, 0, m.start())
            return NcclError(int(launcher.group(1)) if launcher else None, m["where"].strip(),
                             m["what"].strip(), m["result"], m["ver"], line)
        if "stuck for" in line or "Heartbeat monitor timed out" in line:
            m = _STUCK.search(line)
            if m:
                prefix = _LOG_PREFIX.search(line, 0, m.start())
                rank, _ = _rank_of(line[: m.start()], prefix)
                return WatchdogStuck(rank, _int_or_none(m.group(1)), line)
        if "mismatch between collectives" in line:
            m = _MISMATCH.search(line)
            if m:
                return CollectiveMismatch(int(m["a"]), int(m["b"]), m["this"], m["other"], line)
        if "lagging" in line or "collective #" in line:
            return _desync(line)
        return None

    def _nccl_line(self, m: re.Match[str], line: str) -> NcclLogEvent | None:
        host, pid, tid = m["host"], int(m["pid"]), int(m["tid"])
        msg = m["msg"]
        if m["level"] == "WARN":
            warning = NcclWarning(host, pid, tid, int(m["dev"]), m["src"], msg.strip(), line)
            ib = _IB_COMPLETION.search(msg)
            if ib:
                warning.peer, warning.wc_status = ib["peer"], int(ib["status"])
                warning.peer_port = int(ib["port"]) if ib["port"] else None
                warning.opcode, warning.vendor_err = int(ib["opcode"]), int(ib["vendor"])
                warning.direction = ib["dir"]
                hca = _HCA.search(msg)
                warning.hca = hca.group(1) if hca else None
            self._open_warnings[(host, pid, tid)] = warning
            return warning
        if "Init COMPLETE" in msg:
            init = _INIT_OLD.search(msg)
            if init:
                return InitComplete(
                    host, pid, tid, int(init["rank"]), int(init["nranks"]), int(init["cuda"]),
                    int(init["nvml"]) if init["nvml"] else None, init["bus"], init["comm"],
                    init["cid"])
        if "Init timings" in msg:
            t = _INIT_TIMINGS.search(msg)
            if t:
                parts = {}
                for part in (t["parts"] or "").split(","):
                    name, _, value = part.strip().rpartition(" ")
                    try:
                        parts[name] = float(value)
                    except ValueError:
                        continue
                return InitTimings(host, pid, int(t["rank"]), int(t["nranks"]),
                                   float(t["total"]), parts)
        if "-> " in msg:
            p = _PROPAGATE.search(msg)
            open_warning = self._open_warnings.pop((host, pid, tid), None)
            if p and open_warning is not None:
                # The WARN object was already returned; the caller sees the code on it.
                open_warning.result = int(p["code"])
        return None


def _rank_of(line: str, prefix: re.Match[str] | None) -> tuple[int | None, int | None]:
    launcher = _LAUNCHER_RANK.search(line)
    launcher_rank = int(launcher.group(1)) if launcher else None
    if prefix is not None:
        return int(prefix["rank"]), launcher_rank
    return launcher_rank, launcher_rank


def _int_or_none(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def _watchdog(m: re.Match[str], line: str) -> WatchdogTimeout:
    fields = {k: v.strip() for k, v in _WORK_FIELD.findall(m["fields"])}
    prefix = _LOG_PREFIX.search(line, 0, m.start())
    rank, launcher_rank = _rank_of(line[: m.start()], prefix)
    glog = _GLOG.search(line, 0, m.start())
    return WatchdogTimeout(
        rank=rank, launcher_rank=launcher_rank, seq=_int_or_none(fields.get("SeqNum")),
        op=fields.get("OpType"), numel_in=_int_or_none(fields.get("NumelIn")),
        numel_out=_int_or_none(fields.get("NumelOut")), tensor_shape=fields.get("TensorShape"),
        timeout_ms=_int_or_none(fields.get("Timeout(ms)")), elapsed_ms=int(m["elapsed"]),
        timestamp=glog.group(1) if glog else None, raw=line,
        pg=prefix["pg"] if prefix is not None else None,
        pg_desc=prefix["desc"] if prefix is not None else None,
    )


def _progress(m: re.Match[str], line: str) -> ProgressStatus:
    prefix = _LOG_PREFIX.search(line, 0, m.start())
    rank, _ = _rank_of(line[: m.start()], prefix)
    pg = desc = None
    if prefix is not None:
        pg, desc = prefix["pg"], prefix["desc"]
    return ProgressStatus(
        rank=rank, pg=pg, pg_desc=desc, work_seq=_int_or_none(m["seq"]),
        last_enqueued=int(m["enq"]), last_completed=int(m["comp"]),
        reason=_PROGRESS_REASON[m["what"].lower()], raw=line,
    )


def _bring_up(line: str) -> BringUpFailure | None:
    m = _UNIQUE_ID.search(line)
    if m:
        return BringUpFailure(int(m["rank"]), int(m["root"]), m["err"], None, None, line)
    m = _STORE_JOIN.search(line)
    if m:
        return BringUpFailure(None, None, None, int(m["joined"]), int(m["expected"]), line)
    return None


def _desync(line: str) -> DesyncReport | None:
    m = _NEVER_JOINED.search(line)
    if m:
        return DesyncReport(never_joined=_ranks(m["ranks"]), raw=line)
    m = _JOINED.search(line)
    if m:
        return DesyncReport(joined_not_finished=_ranks(m["ranks"]), seq=int(m["seq"]), raw=line)
    m = _FINISHED.search(line)
    if m:
        return DesyncReport(finished_not_joined_next=_ranks(m["ranks"]), seq=int(m["seq"]),
                            raw=line)
    return None


#: Most events of one type kept in an :class:`NcclLog`; a flood beyond it is counted only.
MAX_EVENTS_PER_TYPE = 20_000


@dataclass(slots=True)
class NcclLog:
    """Everything parsed from one log, by type (at most :data:`MAX_EVENTS_PER_TYPE` each).

    Attributes:
        dropped: events not kept because their type's list was full.
    """

    timeouts: list[WatchdogTimeout] = field(default_factory=list)
    progress: list[ProgressStatus] = field(default_factory=list)
    stuck: list[WatchdogStuck] = field(default_factory=list)
    bring_up: list[BringUpFailure] = field(default_factory=list)
    errors: list[NcclError] = field(default_factory=list)
    mismatches: list[CollectiveMismatch] = field(default_factory=list)
    desync: list[DesyncReport] = field(default_factory=list)
    inits: list[InitComplete] = field(default_factory=list)
    init_timings: list[InitTimings] = field(default_factory=list)
    warnings: list[NcclWarning] = field(default_factory=list)
    lines: int = 0
    dropped: int = 0

    def add(self, event: NcclLogEvent) -> None:
        """File one parser event under its type."""
        buckets: dict[type, list[Any]] = {
            WatchdogTimeout: self.timeouts, ProgressStatus: self.progress,
            WatchdogStuck: self.stuck, BringUpFailure: self.bring_up, NcclError: self.errors,
            CollectiveMismatch: self.mismatches,
            DesyncReport: self.desync, InitComplete: self.inits,
            InitTimings: self.init_timings, NcclWarning: self.warnings,
        }
        bucket = buckets[type(event)]
        if len(bucket) < MAX_EVENTS_PER_TYPE:
            bucket.append(event)
        else:
            self.dropped += 1


def parse_nccl_log(lines: Iterable[str]) -> NcclLog:
    """Parse a whole log (any iterable of lines, e.g. an open file) into an :class:`NcclLog`.

    Memory is bounded by :data:`MAX_EVENTS_PER_TYPE` events per type, whatever the log's size.
    """
    parser = NcclLogParser()
    out = NcclLog()
    for line in lines:
        for event in parser.feed(line):
            out.add(event)
    parser.flush()
    out.lines = parser.lines
    return out
