"""XID collector (``xid``): every Xid counted, from NVML events and from the kernel log.

dcgm-exporter exports the *last* Xid as a gauge, so a repeated Xid is invisible; here every event
increments ``laggard_gpu_xid_errors_total{gpu,pci_bus_id,xid}``, and
``laggard_gpu_xid_last_timestamp_seconds`` says when it was last seen.

Two sources, merged:

* **NVML events**: an event set with ``nvmlEventTypeXidCriticalError`` registered on every GPU,
  waited on with ``nvmlEventSetWait_v2`` (500 ms timeout) in a background thread;
* **the kernel log**: ``/dev/kmsg`` (records ``prio,seq,usec,flags;message``) or a syslog or
  journal file named by ``--path.kmsg``, read from its end at start without blocking; a rotated,
  truncated or vanished file is reopened. Lines go through
  :class:`~laggard.parsers.kernel_log.KernelLogParser`.

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
import stat
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from laggard.collectors.base import NoDataError
from laggard.collectors.tailer import FileTailer
from laggard.detectors.xid_catalog import sxid_finding, xid_finding
from laggard.nvml.library import NvmlLibrary, shared_library
from laggard.parsers.kernel_log import KernelLogParser, SXidEvent, XidEvent

log = logging.getLogger(__name__)

#: Most bytes read from a kernel-log file in one round, and the longest partial line kept.
MAX_READ_BYTES = 4 << 20
MAX_PARTIAL_LINE = 64 << 10
#: Most distinct (GPU, Xid) and (switch, SXid) series kept; further ones are counted as dropped.
MAX_SERIES = 1024
#: NVML events waiting for the next round; more are dropped and counted.
MAX_QUEUED_EVENTS = 10_000


class KernelLogSource:
    """Non-blocking reader of new kernel-log lines.

    ``/dev/kmsg`` (a character device) is read record by record from the end of the ring buffer;
    any other path is read as a text file from its end at the first read, then followed across
    rotation (new inode), truncation (shorter than our offset) and disappearance (retried each
    round; a file that appears later is read from its start).

    Args:
        path: ``/dev/kmsg`` or a file.

    Attributes:
        lost_records: kmsg records overwritten before we read them (``EPIPE``).
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.lost_records = 0
        self._fd: int | None = None  # /dev/kmsg
        self._file: FileTailer | None = None  # any other path

    def read_lines(self) -> list[str]:
        """Lines added since the last call (complete lines only).

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
        except OSError:
            return []  # permissions changed under us: retried next round
        return [line.decode("utf-8", errors="replace") for line in lines]

    def close(self) -> None:
        """Close the file descriptor, if open."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
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
        os.lseek(self._fd, 0, os.SEEK_END)  # after the newest record

    def _tailer(self) -> FileTailer:
        tailer = FileTailer(self.path, start_at_end=True, max_read_bytes=MAX_READ_BYTES,
                            max_line_bytes=MAX_PARTIAL_LINE)
        try:
            tailer.read_lines()  # opens it now: a file without permission fails at the start
        except OSError as exc:
            raise NoDataError(f"cannot read kernel log {self.path}: {exc}") from None
        return tailer

    def _read_kmsg(self) -> list[str]:
        assert self._fd is not None
        lines: list[str] = []
        while len(lines) < 100_000:
            try:
                record = os.read(self._fd, 8192)  # one record per read (dev-kmsg ABI)
            except BlockingIOError:
                break
            except BrokenPipeError:  # records overwritten before we read them; go on
                self.lost_records += 1
                continue
            if not record:
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


class XidCollector:
    """Counts Xids and SXids from NVML events and the kernel log.

    Args:
        kernel_log: the kernel-log reader, or None to use NVML events only.
        library: the NVML wrapper for events and for PCI -> GPU index mapping, or None.
        findings: ``FindingLog``-like sink (``add``) for one finding per Xid, or None.
        node: node name put on findings.
        merge_window: see :class:`XidCounter`.
    """

    name = "xid"

    def __init__(self, *, kernel_log: KernelLogSource | None, library: NvmlLibrary | None,
                 findings: Any = None, node: str | None = None,
                 merge_window: float = 10.0) -> None:
        self.kernel_log = kernel_log
        self.library = library
        self.findings = findings
        self.node = node
        self.parser = KernelLogParser()
        self.counter = XidCounter(merge_window)
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
            for line in lines:
                for event in self.parser.feed(line):
                    self._on_kernel_event(event)
            for event in self.parser.settle():  # SXid dump lines no headline claimed
                self._on_kernel_event(event)
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

    def _on_kernel_event(self, event: XidEvent | SXidEvent) -> None:
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
                    node=self.node))
            return
        gpu = self._pci_to_gpu.get(event.pci_bus_id)
        if self.counter.is_new(event.pci_bus_id, event.xid, "kernel_log"):
            wall = event.timestamp if event.timestamp is not None else time.time()
            self._count(gpu, event.pci_bus_id, event.xid, wall, event.message,
                        event.fatal_token, "kernel_log")

    def _count(self, gpu: int | None, pci: str, xid: int, wall: float, message: str,
               fatal_token: str | None, source: str) -> None:
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
                                          source=source))

    def _families(self) -> list[Metric]:
        labels = ["gpu", "pci_bus_id", "xid"]
        total = CounterMetricFamily("laggard_gpu_xid_errors",
                                    "Xid events reported by the NVIDIA driver, repeats included",
                                    labels=labels)
        last = GaugeMetricFamily("laggard_gpu_xid_last_timestamp_seconds",
                                 "when this Xid was last reported (Unix time)", labels=labels)
        for key, (count, wall) in sorted(self._xids.items()):
            total.add_metric(list(key), count)
            last.add_metric(list(key), wall)
        sxid = CounterMetricFamily("laggard_gpu_sxid_errors",
                                   "NVSwitch SXid events (device = switch PCI address)",
                                   labels=["device", "sxid"])
        for (device, code), count in sorted(self._sxids.items()):
            sxid.add_metric([device, code], count)
        lines = CounterMetricFamily("laggard_kernel_log_lines",
                                    "kernel-log lines read by the XID collector")
        lines.add_metric([], self.parser.lines)
        skipped = CounterMetricFamily("laggard_kernel_log_malformed_lines",
                                      "Xid-looking kernel-log lines that could not be parsed")
        skipped.add_metric([], self.parser.skipped)
        merged = CounterMetricFamily("laggard_xid_events_merged",
                                     "Xid events seen by both NVML and the kernel log, "
                                     "counted once")
        merged.add_metric([], self.counter.merged)
        dropped = CounterMetricFamily("laggard_xid_events_dropped",
                                      "Xid events not counted: series or queue limit reached")
        dropped.add_metric([], self._dropped_series + self._dropped_events)
        return [total, last, sxid, lines, skipped, merged, dropped]

    def stop(self) -> None:
        """Stop the NVML event thread and close the kernel log."""
        self._stop.set()
        if self.kernel_log is not None:
            self.kernel_log.close()


def from_config(config: Any, context: Any) -> XidCollector:
    """Registry factory: kernel log at ``config.kmsg_path`` plus NVML events (real or fake)."""
    return XidCollector(kernel_log=KernelLogSource(config.kmsg_path) if config.kmsg_path else None,
                        library=shared_library(config.fake_gpus, _scenario(config)),
                        findings=context.findings, node=context.node)


def _scenario(config: Any) -> str:
    return getattr(config, "fake_gpus_scenario", "default")
