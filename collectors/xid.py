"""XID collector (``xid``): every Xid counted, from NVML events and from the kernel log.

dcgm-exporter exports the *last* Xid as a gauge, so a repeated Xid is invisible; here every event
increments ``laggard_gpu_xid_errors_total{gpu,pci_bus_id,xid}``, and
``laggard_gpu_xid_last_timestamp_seconds`` says when it was last seen.

Two sources, merged:

* **NVML events**: an event set with ``nvmlEventTypeXidCriticalError`` registered on every GPU,
  waited on with ``nvmlEventSetWait_v2`` (500 ms timeout) in a background thread;
* **the kernel log**: ``/dev/kmsg`` (records ``prio,seq,usec,flags;message``) or a syslog or
  journal file named by ``--path.kmsg``, read without blocking; a rotated, truncated or vanished
  file is reopened. Lines go through :class:`~laggard.parsers.kernel_log.KernelLogParser`.

**On its events.** The agent runs a round as soon as ``/dev/kmsg`` holds a new record or an
NVML event is queued (:meth:`XidCollector.wait_for_data`, at most ten rounds a second), and
otherwise every ``--collector.xid.interval`` (a syslog file, which has nothing to wait on, is
read at that interval).

**History.** At start the kernel log is read from its beginning: every record ``/dev/kmsg``
still buffers (the kernel's ring buffer, oldest first), or the whole file. So an agent started
after a GPU fell off the bus counts that Xid and marks the GPU lost. The counters of each agent
process start from that history: a restarted agent counts the same history again from zero
(Prometheus' ``rate()`` and ``increase()`` take the drop as a counter reset), and
``laggard_kernel_log_history_start_timestamp_seconds`` says from when the counts run (the
oldest record's time; the agent logs it too, once the history is read). Records the ring buffer
dropped before the agent started are not counted by anyone: ``dmesg`` cannot show them either.

**Lost GPUs.** An Xid 79 ("GPU has fallen off the bus", NVIDIA's Xid catalog; also the driver's
"... has fallen off the bus" message without a number) of the current boot marks that GPU lost:
one ``gpu_lost`` finding (as ``laggard analyze`` reports the same line) and, while NVML does not
list that PCI bus id, ``laggard_gpu_lost{gpu="",pci_bus_id}`` 1 (a GPU NVML lists is the nvml
collector's ``laggard_gpu_lost{gpu}``). An Xid for a GPU NVML does not list keeps its
``pci_bus_id`` label with ``gpu=""``. Lines stamped before this boot (a syslog file's older
days) are counted, but mark nothing lost: a reboot brings a GPU back.

An Xid that both sources report (same GPU, same code, within ``merge_window`` seconds) is counted
once: each event of one source cancels at most one of the other, so three identical lines still
count three. NVSwitch SXids (kernel log only) go to ``laggard_gpu_sxid_errors_total{device,sxid}``
(``device`` = the switch's PCI address). Each Xid becomes a finding with the catalog's action,
each SXid one with the severity :func:`laggard.detectors.xid_catalog.sxid_lookup` gives (the
driver's word for the event, else the Fabric Manager guide's class); SXid dump lines printed
without a headline are reported after each batch of lines (``KernelLogParser.settle``).
"""

from __future__ import annotations

import logging
import os
import queue
import select
import stat
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from laggard.collectors.base import AgentSettings, CollectorSpec, Flag, NoDataError
from laggard.collectors.nvml import library as nvml_library
from laggard.collectors.tailer import FileTailer
from laggard.detectors.finding import Finding, Severity
from laggard.detectors.xid_catalog import sxid_finding, xid_finding
from laggard.nvml.library import NvmlLibrary
from laggard.parsers.kernel_log import FALLEN_OFF_BUS_XID, KernelLogParser, SXidEvent, XidEvent

log = logging.getLogger(__name__)

#: Most bytes read from a kernel-log file in one round, and the longest partial line kept.
MAX_READ_BYTES = 4 << 20
MAX_PARTIAL_LINE = 64 << 10
#: Most distinct (GPU, Xid) and (switch, SXid) series kept; further ones are counted as dropped.
MAX_SERIES = 1024
#: NVML events waiting for the next round; more are dropped and counted.
MAX_QUEUED_EVENTS = 10_000

#: The collector's flag: where the kernel log is read. A path, as node_exporter's collector-owned
#: ``--path.udev.data``; empty: NVML events only.
KERNEL_LOG = Flag("path.kmsg", "/dev/kmsg", metavar="PATH",
                  help="kernel log to read XIDs from: /dev/kmsg, or a syslog or journal file "
                       "(default %(default)s; empty: NVML events only)")


#: kmsg records read in one round at most; a longer ring buffer is read over several rounds.
MAX_RECORDS_PER_ROUND = 100_000
#: Seconds of slack on the boot time when telling this boot's lines from older ones (syslog
#: stamps have whole seconds; the boot time is computed from two clocks).
BOOT_SLACK_SECONDS = 60.0


def boot_wall_time() -> float:
    """Unix time at which this machine booted (seconds), from ``CLOCK_BOOTTIME``."""
    return time.time() - time.clock_gettime(time.CLOCK_BOOTTIME)


class KernelLogSource:
    """Non-blocking reader of the kernel log: its history first, then new lines.

    ``/dev/kmsg`` (a character device) is read record by record, one ``read()`` per record, from
    the oldest record still in the ring buffer: that is where a fresh ``open()`` starts (kernel
    ``Documentation/ABI/testing/dev-kmsg``; ``SEEK_END`` would skip the history, and
    ``SEEK_DATA`` would skip what ``dmesg --clear`` cleared, which must not hide a lost GPU).
    A record overwritten before it was read gives ``EPIPE``: counted, and reading goes on.

    Any other path is read as a text file from its start, then followed across rotation (new
    inode), truncation (shorter than our offset) and disappearance (retried each round; a file
    that appears later is read from its start).

    Args:
        path: ``/dev/kmsg`` or a file.

    Attributes:
        lost_records: kmsg records overwritten before we read them (``EPIPE``).
        caught_up: True once a read has reached the end of what the log held: the history is
            read (a long one takes several rounds: :data:`MAX_RECORDS_PER_ROUND`,
            :data:`MAX_READ_BYTES`).
        boot_time: for ``/dev/kmsg``, the Unix time its uptime stamps count from
            (``CLOCK_MONOTONIC``'s zero: printk's clock does not count suspend either; the
            kernel's clock may drift from it by a little); None for a file.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.lost_records = 0
        self.caught_up = False
        self.boot_time: float | None = None
        self._fd: int | None = None  # /dev/kmsg
        self._poller: Any = None  # select.poll on it, made at the first wait
        self._file: FileTailer | None = None  # any other path
        self._file_read = False  # a first read that fails is NoDataError, later ones retried

    @property
    def is_kmsg(self) -> bool:
        """True when the path is the kernel's record device (after the first read)."""
        return self._fd is not None

    def read_lines(self) -> list[str]:
        """Lines added since the last call (complete lines only); the history at the first.

        Raises:
            NoDataError: the path cannot be opened at the first read (no permission), or it is
                neither a character device nor a regular file.
        """
        if self._fd is None and self._file is None:
            self._open()
        if self._fd is not None:
            return self._read_kmsg()
        assert self._file is not None
        try:
            lines = self._file.read_lines()
        except OSError as exc:
            if not self._file_read:
                raise NoDataError(f"cannot read kernel log {self.path}: {exc}") from None
            return []  # permissions changed under us: retried next round
        self._file_read = True
        self.caught_up = self.caught_up or self._file.at_end
        return [line.decode("utf-8", errors="replace") for line in lines]

    def wait_readable(self, timeout: float) -> bool:
        """Block up to ``timeout`` seconds until ``/dev/kmsg`` holds a record not read yet
        (``poll``: the dev-kmsg ABI wakes a reader with POLLIN on a new record, POLLERR|POLLPRI
        when records were overwritten, which a read reports). False at once for a file, or
        before the first read opened the device: neither has readiness to wait on."""
        if self._fd is None:
            return False
        if self._poller is None:
            self._poller = select.poll()
            self._poller.register(self._fd, select.POLLIN | select.POLLPRI)
        return bool(self._poller.poll(max(timeout, 0.0) * 1000))

    def close(self) -> None:
        """Close the file descriptor, if open."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
            self._poller = None
        if self._file is not None:
            self._file.close()

    def _open(self) -> None:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            # The tailer waits for it, and reads a file that appears later from its start.
            log.info("kernel log %s does not exist yet; waiting for it", self.path)
            self._file = self._tailer()
            return
        except OSError as exc:
            raise NoDataError(f"cannot read kernel log {self.path}: {exc}") from None
        if stat.S_ISREG(st.st_mode):
            self._file = self._tailer()
            return
        if not stat.S_ISCHR(st.st_mode):
            raise NoDataError(f"kernel log {self.path} is neither /dev/kmsg nor a file")
        try:
            self._fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as exc:
            raise NoDataError(f"cannot read kernel log {self.path}: {exc}") from None
        self.boot_time = time.time() - time.monotonic()

    def _tailer(self) -> FileTailer:
        # The first read_lines() opens it (a file without permission fails at the start) and
        # gives the first MAX_READ_BYTES of its history.
        return FileTailer(self.path, start_at_end=False, max_read_bytes=MAX_READ_BYTES,
                          max_line_bytes=MAX_PARTIAL_LINE)

    def _read_kmsg(self) -> list[str]:
        assert self._fd is not None
        lines: list[str] = []
        while len(lines) < MAX_RECORDS_PER_ROUND:
            try:
                record = os.read(self._fd, 8192)  # one record per read (dev-kmsg ABI)
            except BlockingIOError:
                self.caught_up = True
                break
            except BrokenPipeError:  # records overwritten before we read them; go on
                self.lost_records += 1
                continue
            if not record:
                self.caught_up = True
                break
            lines.append(record.decode("utf-8", errors="replace").rstrip("\n"))
        return lines


@dataclass(slots=True)
class _Pending:
    key: tuple[str, int]
    source: str
    received: float


class XidCounter:
    """Counts Xid events per (GPU, Xid), merging the two sources' reports of one event.

    Args:
        merge_window: seconds within which an NVML event and a kernel-log line of the same GPU
            and code are taken as one event.
        clock: monotonic clock.
    """

    def __init__(self, merge_window: float = 10.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.merge_window = merge_window
        self._clock = clock
        self._unmatched: deque[_Pending] = deque(maxlen=4096)
        self.merged = 0

    def is_new(self, pci_bus_id: str, xid: int, source: str) -> bool:
        """Record one report; False when it matches an unmatched report of the other source."""
        now = self._clock()
        key = (pci_bus_id, xid)
        while self._unmatched and now - self._unmatched[0].received > self.merge_window:
            self._unmatched.popleft()
        for pending in self._unmatched:
            if pending.key == key and pending.source != source:
                self._unmatched.remove(pending)
                self.merged += 1
                return False
        self._unmatched.append(_Pending(key, source, now))
        return True


@dataclass(slots=True)
class _History:
    """What the kernel log held when it was first read."""

    done: bool = False
    start: float | None = None  # Unix time of its oldest line with a time
    lines: int = 0
    xids: int = 0
    sxids: int = 0


class XidCollector:
    """Counts Xids and SXids from NVML events and the kernel log (its history included).

    Args:
        kernel_log: the kernel-log reader, or None to use NVML events only.
        library: the NVML wrapper for events and for PCI -> GPU index mapping, or None.
        findings: ``FindingLog``-like sink (``add(finding, at=unix_seconds)``) for one finding
            per Xid and one ``gpu_lost`` per GPU that fell off the bus, or None.
        node: node name put on findings.
        merge_window: see :class:`XidCounter`.
        boot_time: Unix time of this boot, to tell an older boot's lines (history of a syslog
            file) from this one's; None: from ``CLOCK_BOOTTIME``.
    """

    name = "xid"

    def __init__(self, *, kernel_log: KernelLogSource | None, library: NvmlLibrary | None,
                 findings: Any = None, node: str | None = None,
                 merge_window: float = 10.0, boot_time: float | None = None) -> None:
        self.kernel_log = kernel_log
        self.library = library
        self.findings = findings
        self.node = node
        self.parser = KernelLogParser()  # replaced by one with kmsg's boot time at the first read
        self.counter = XidCounter(merge_window)
        self._started = time.time()
        self._boot_time = boot_wall_time() if boot_time is None else boot_time
        self._history = _History()
        self._lost: set[str] = set()  # PCI bus ids of the GPUs an Xid 79 of this boot named
        self._xids: dict[tuple[str, str, str], list[float]] = {}  # (gpu, pci, xid) -> [n, ts]
        self._sxids: dict[tuple[str, str], int] = {}
        self._dropped_series = 0
        self._events: queue.Queue[tuple[int, int, float]] = queue.Queue(MAX_QUEUED_EVENTS)
        self._dropped_events = 0
        self._watcher: threading.Thread | None = None
        self._stop = threading.Event()
        self._pci_to_gpu: dict[str, int] = {}
        self._gpu_to_pci: dict[int, str] = {}
        self._kernel_log_ok = kernel_log is not None

    # -- sources --------------------------------------------------------------------------------

    def _nvml_up(self) -> bool:
        if self.library is None:
            return False
        try:
            self.library.start()
        except NoDataError:
            return False
        if not self._pci_to_gpu:
            self._pci_to_gpu = self.library.pci_bus_ids()
            self._gpu_to_pci = {gpu: pci for pci, gpu in self._pci_to_gpu.items()}
        if self._watcher is None:
            self._watcher = threading.Thread(target=self._watch_nvml, name="laggard-xid-nvml",
                                             daemon=True)
            self._watcher.start()
        return True

    def _watch_nvml(self) -> None:
        lib = self.library
        assert lib is not None
        nvml = lib.module
        xid_type = nvml.nvmlEventTypeXidCriticalError
        try:
            event_set = nvml.nvmlEventSetCreate()
            for index in range(lib.start()):
                supported = lib.call(index, "nvmlDeviceGetSupportedEventTypes")
                if supported is not None and supported & xid_type:
                    lib.call(index, "nvmlDeviceRegisterEvents", xid_type, event_set)
        except Exception as exc:  # noqa: BLE001 - no events: the kernel log still works
            log.warning("NVML XID events unavailable: %s", exc)
            return
        while not self._stop.is_set():
            try:
                data = nvml.nvmlEventSetWait_v2(event_set, 500)
            except nvml.NVMLError as exc:
                if exc.value == nvml.NVML_ERROR_TIMEOUT:
                    continue
                # A lost GPU or a re-initialised library: this event set is dead. Wait a little
                # (no spinning), then let the next round register a fresh one.
                log.warning("NVML event wait failed (%s); re-registering", exc)
                self._stop.wait(5.0)
                self._free(nvml, event_set)
                self._watcher = None
                return
            if data.eventType & xid_type:
                index = self._index_of(nvml, data.device)
                try:
                    self._events.put_nowait((index, int(data.eventData), time.time()))
                except queue.Full:
                    self._dropped_events += 1

    @staticmethod
    def _free(nvml: Any, event_set: Any) -> None:
        try:
            nvml.nvmlEventSetFree(event_set)
        except Exception:  # noqa: BLE001 - freeing a dead set must not raise
            pass

    @staticmethod
    def _index_of(nvml: Any, device: Any) -> int:
        try:
            return int(nvml.nvmlDeviceGetIndex(device))
        except Exception:  # noqa: BLE001 - unmapped device
            return -1

    def wait_for_data(self, timeout: float) -> bool:
        """Block up to ``timeout`` seconds until a round has news: an NVML event queued or a
        ``/dev/kmsg`` record not read yet. The agent's sampler calls it between rounds, so an
        Xid is counted when it happens (the kernel log on its events), and the collector's
        interval is only the longest time between rounds. A syslog file has no readiness to
        wait on: it is read every interval, as before.

        Returns:
            True when a round now would read something new.
        """
        deadline = time.monotonic() + timeout
        kmsg = self.kernel_log if self._kernel_log_ok else None
        while True:
            if not self._events.empty():
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            # short slices while NVML events may come in beside the kernel log
            step = min(left, 0.1) if self._watcher is not None else left
            if kmsg is not None and kmsg.is_kmsg:
                if kmsg.wait_readable(step):
                    return True
            else:
                time.sleep(step)

    # -- collection -----------------------------------------------------------------------------

    def collect(self) -> Iterable[Metric]:
        """Read both sources and return the counts.

        Raises:
            NoDataError: neither the kernel log nor NVML events can be read here.
        """
        nvml_ok = self._nvml_up()
        if self.kernel_log is not None and self._kernel_log_ok:
            try:
                lines = self.kernel_log.read_lines()
            except NoDataError as exc:
                log.info("%s", exc)
                self._kernel_log_ok = False
                lines = []
            self._read_history_or_lines(self.kernel_log, lines)
        if not nvml_ok and not self._kernel_log_ok:
            raise NoDataError("no NVML and no readable kernel log")
        while True:
            try:
                index, xid, wall = self._events.get_nowait()
            except queue.Empty:
                break
            pci = self._gpu_to_pci.get(index, "")
            if self.counter.is_new(pci or f"gpu{index}", xid, "nvml"):
                self._count(index if index >= 0 else None, pci, xid, wall, "", None, "nvml")
        return self._families()

    def _read_history_or_lines(self, source: KernelLogSource, lines: list[str]) -> None:
        history = self._history
        if not history.done and source.is_kmsg and self.parser.lines == 0:
            self.parser = KernelLogParser(boot_time=source.boot_time)
        for line in lines:
            events = self.parser.feed(line)
            if not history.done:
                history.lines += 1
                if history.start is None:
                    history.start = self.parser.last_timestamp
            for event in events:
                self._on_kernel_event(event)
        for event in self.parser.settle():  # SXid dump lines no headline claimed
            self._on_kernel_event(event)
        if not history.done and source.caught_up:
            self._end_history(source)

    def _end_history(self, source: KernelLogSource) -> None:
        """The history is read: say once from when the counts run."""
        history = self._history
        history.done = True
        what = "record" if source.is_kmsg else "line"
        if history.lines == 0:
            history.start = self._started  # an empty log: the counts run from the agent's start
            since = f"the agent's start, at {_utc(self._started)} (the log was empty)"
        elif history.start is None:
            since = f"its oldest {what}, at an unknown time (no {what} carries one)"
        else:
            since = f"its oldest {what}, at {_utc(history.start)}"
        lost = (f"; {source.lost_records} records were overwritten before they were read"
                if source.lost_records else "")
        log.info("kernel log %s: Xids counted from %s: %s before the agent started, with %s "
                 "and %s%s; each start of the agent counts this history afresh", source.path,
                 since, _count_of(history.lines, what), _count_of(history.xids, "Xid"),
                 _count_of(history.sxids, "SXid"), lost)

    def _on_kernel_event(self, event: XidEvent | SXidEvent) -> None:
        if not self._history.done:
            self._history.sxids += isinstance(event, SXidEvent)
            self._history.xids += isinstance(event, XidEvent)
        if isinstance(event, SXidEvent):
            key = (event.pci_bus_id, str(event.sxid))
            if key in self._sxids or len(self._sxids) < MAX_SERIES:
                self._sxids[key] = self._sxids.get(key, 0) + 1
            else:
                self._dropped_series += 1
            if self.findings is not None:
                self.findings.add(sxid_finding(
                    sxid=event.sxid, pci_bus_id=event.pci_bus_id, link=event.link,
                    printed=event.severity, message=event.message, device=event.device,
                    node=self.node), at=event.timestamp)
            return
        gpu = self._pci_to_gpu.get(event.pci_bus_id)
        # A line older than the merge window (the history) cannot be the kernel's copy of an
        # NVML event this agent received: it must not cancel a fresh one.
        old = (event.timestamp is not None
               and event.timestamp < self._started - self.counter.merge_window)
        if old or self.counter.is_new(event.pci_bus_id, event.xid, "kernel_log"):
            wall = event.timestamp if event.timestamp is not None else time.time()
            self._count(gpu, event.pci_bus_id, event.xid, wall, event.message,
                        event.fatal_token, "kernel_log")

    def _count(self, gpu: int | None, pci: str, xid: int, wall: float, message: str,
               fatal_token: str | None, source: str) -> None:
        if xid == FALLEN_OFF_BUS_XID and pci and wall >= self._boot_time - BOOT_SLACK_SECONDS:
            self._mark_lost(gpu, pci, wall, source)
        key = ("" if gpu is None else str(gpu), pci, str(xid))
        entry = self._xids.get(key)
        if entry is None:
            if len(self._xids) >= MAX_SERIES:
                self._dropped_series += 1
                return
            entry = self._xids[key] = [0, 0.0]
        entry[0] += 1
        entry[1] = max(entry[1], wall)
        if self.findings is not None:
            self.findings.add(xid_finding(xid=xid, pci_bus_id=pci, gpu=gpu, message=message,
                                          fatal_token=fatal_token, node=self.node,
                                          source=source), at=wall)

    def _mark_lost(self, gpu: int | None, pci: str, wall: float, source: str) -> None:
        """An Xid 79 of this boot: the GPU at ``pci`` is lost (one finding per GPU)."""
        if pci in self._lost:
            return
        if len(self._lost) >= MAX_SERIES:
            self._dropped_series += 1
            return
        self._lost.add(pci)
        if self.findings is None:
            return
        where = f"GPU {gpu} ({pci})" if gpu is not None else f"GPU {pci}"
        listed = "" if gpu is not None else " (NVML does not list it)"
        self.findings.add(Finding(
            detector="xid", kind="gpu_lost", severity=Severity.CRITICAL, node=self.node, gpu=gpu,
            message=f"{where} fell off the bus (Xid 79){listed}: it is unusable until the node "
                    f"is rebooted or the GPU reset; drain the node and check the PCIe link, "
                    f"power and the GPU",
            evidence={"pci_bus_id": pci, "xid": FALLEN_OFF_BUS_XID, "source": source,
                      "listed_by_nvml": gpu is not None},
        ), at=wall)

    def _families(self) -> list[Metric]:
        labels = ["gpu", "pci_bus_id", "xid"]
        total = CounterMetricFamily(
            "laggard_gpu_xid_errors", "Xid events reported by the NVIDIA driver (NVML events and "
            "the kernel log, its history at the agent's start included), repeats included.",
            labels=labels)
        last = GaugeMetricFamily("laggard_gpu_xid_last_timestamp_seconds",
                                 "When this Xid was last reported, in seconds since the "
                                 "Unix epoch (a kernel-log line's own time).", labels=labels)
        for key, (count, wall) in sorted(self._xids.items()):
            total.add_metric(list(key), count)
            last.add_metric(list(key), wall)
        sxid = CounterMetricFamily("laggard_gpu_sxid_errors",
                                   "NVSwitch SXid events (device = the switch's PCI address).",
                                   labels=["device", "sxid"])
        for (device, code), count in sorted(self._sxids.items()):
            sxid.add_metric([device, code], count)
        lines = CounterMetricFamily("laggard_kernel_log_lines",
                                    "Kernel-log lines read by the XID collector, its history at "
                                    "the agent's start included.")
        lines.add_metric([], self.parser.lines)
        skipped = CounterMetricFamily("laggard_kernel_log_malformed_lines",
                                      "Xid-looking kernel-log lines that could not be parsed.")
        skipped.add_metric([], self.parser.skipped)
        merged = CounterMetricFamily("laggard_xid_events_merged",
                                     "Xid events seen by both NVML and the kernel log, "
                                     "counted once.")
        merged.add_metric([], self.counter.merged)
        dropped = CounterMetricFamily("laggard_xid_events_dropped",
                                      "Xid events not counted: the series or queue limit was "
                                      "reached.")
        dropped.add_metric([], self._dropped_series + self._dropped_events)
        history = GaugeMetricFamily(
            "laggard_kernel_log_history_start_timestamp_seconds",
            "Time of the oldest kernel-log record read at the agent's start (its start, for an "
            "empty log), in seconds since the Unix epoch: the Xid counters count from there.",
            labels=[])
        if self._history.start is not None:
            history.add_metric([], self._history.start)
        families: list[Metric] = [total, last, sxid, lines, skipped, merged, dropped, history]
        unlisted = sorted(pci for pci in self._lost if pci not in self._pci_to_gpu)
        if unlisted:
            # Beside the nvml collector's laggard_gpu_lost{gpu}: a GPU NVML does not list has
            # no index, only the bus id the kernel printed.
            lost = GaugeMetricFamily(
                "laggard_gpu_lost", "1 when NVML reports the GPU lost, or when the kernel log says "
                "it fell off the bus (Xid 79) and NVML lists no GPU at pci_bus_id; 0 otherwise.",
                labels=["gpu", "pci_bus_id"])
            for pci in unlisted:
                lost.add_metric(["", pci], 1)
            families.append(lost)
        return families

    def stop(self) -> None:
        """Stop the NVML event thread and close the kernel log."""
        self._stop.set()
        if self.kernel_log is not None:
            self.kernel_log.close()


def _count_of(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _utc(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


def from_config(settings: AgentSettings, context: Any) -> XidCollector:
    """Registry factory: the kernel log at ``--path.kmsg`` plus the NVML events of the nvml
    collector's library (real or fake: ``--collector.nvml.fake-gpus``)."""
    path = settings.flag(KERNEL_LOG)
    return XidCollector(kernel_log=KernelLogSource(path) if path else None,
                        library=nvml_library(settings), findings=context.findings,
                        node=context.node)


COLLECTOR = CollectorSpec(
    name="xid", build=from_config, default=True, flags=(KERNEL_LOG,),
    help="every GPU Xid and NVSwitch SXid, from NVML events and the kernel log")
