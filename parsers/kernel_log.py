"""Pure parser for NVIDIA Xid and NVSwitch SXid lines in kernel-log text.

(Longer than the house limit on purpose: one state machine reads the prefixes, continuation
lines, wrapped headers and SXid follow-ups, and they share its state.)

No I/O here: the XID collector (:mod:`laggard.collectors.xid`) and ``laggard analyze`` feed it
lines from ``/dev/kmsg``, ``dmesg`` output, syslog files or journald output.

Line prefixes understood (one physical line at a time; the prefix is removed, the kernel message
is kept):

* ``/dev/kmsg`` records, ``prio,seq,usec,flags[,...];message`` (kernel
  ``Documentation/ABI/testing/dev-kmsg``): ``usec`` is the monotonic uptime in microseconds;
  ``\\xNN`` escapes are decoded and an embedded newline splits the record into lines. Dictionary
  lines (`` KEY=value``) are ignored.
* ``dmesg``: ``[ 123.456789] msg``, ``dmesg -r`` (``<4>[ 123.4] msg``), ``dmesg --decode``
  (``kern  :warn  : msg``), ``dmesg --ctime`` (``[Sun Feb 23 16:24:18 2025] msg``, local time) and
  ``dmesg --time-format iso`` (``2025-01-21T04:41:44,283302+00:00 msg``).
* syslog and ``journalctl``: ``Dec  2 11:38:47 host kernel: [ 219.4] msg`` (RFC 3164, no year),
  ``Dec 02 11:38:47.123456 host kernel: msg`` (short-precise), ISO-stamped
  ``2025-01-21T04:41:44+0000 host kernel: msg`` (short-iso, rsyslog's RFC 3339 file format),
  ``[ 219.470994] host kernel: msg`` (short-monotonic), and RFC 5424 records
  ``<4>1 2025-01-21T04:41:44.283302+00:00 host kernel - - - msg`` (header fields of RFC 5424
  section 6: VERSION TIMESTAMP HOSTNAME APP-NAME PROCID MSGID STRUCTURED-DATA).
* ``pdsh`` / ``clush`` output: ``host: `` before any of the above (``gpu-node-07: [12345.6]
  NVRM: Xid ...``, ``gpu-node-07: [Sun Feb 23 16:24:18 2025] ...`` of ``dmesg -T``). A word
  before ``: `` is read as such a host only when a stamp, a kernel tag (``NVRM:``,
  ``nvidia-nvswitchN:``, ``kernel:``) or an indented continuation follows it, and never when it
  is itself one of those tags, so ``NVRM: Xid ...`` of ``dmesg -t`` keeps no host; a number
  (``srun --label``'s task id, ``3: ...``) is not a host either.

Hosts: every event carries ``host``, the host name the line names (the pdsh/clush prefix first,
else the syslog/journal HOSTNAME field), or None for plain ``dmesg`` and ``/dev/kmsg``, which
name none. Continuation lines inherit the host of the line they continue.
* continuation lines: indented lines without a stamp (the second and third line of the
  "fallen off the bus" message) inherit the stamps of the line before.

Messages recognised, with the printf formats of NVIDIA's open-gpu-kernel-modules
(``src/nvidia/src/kernel/gpu/rc/kernel_rc.c``, ``krcReportXid``; ``src/common/nvswitch``,
``NVSWITCH_PRINT_SXID``; ``kernel-open/nvidia/nv.c``, ``nv_start_device``)::

    NVRM: Xid (PCI:%04x:%02x:%02x[ GPU-I:%02u[ GPU-CI:%02u]]): %d, pid=%s, name=%s, %s
                                                   [ caused by previous Xid %d]
    NVRM: Xid (PCI:%04x:%02x:%02x): %d, %s                      (no process context, newer drivers)
    NVRM: Xid (%04x:%02x:%02x): %d, %s                           (older drivers, no "PCI:")
    [nvidia-nvswitch%d: ]SXid (PCI:%04x:%02x:%02x.%x): %05d, Fatal|Non-fatal|Correctable, Link %02d
    [nvidia-nvswitch%d: ]SXid (PCI:...): %05d, Fatal|Non-fatal, %s, instance=%d, chiplet=%d
    [nvidia-nvswitch%d: ]SXid (PCI:...): %05d, Severity %d Engine instance %02d Sub-engine ...
    [nvidia-nvswitch%d: ]SXid (PCI:...): %05d, Data {0x%08x, 0x%08x, ...}
    NVRM: The NVIDIA GPU %04x:%02x:%02x.%x
    NVRM: (PCI ID: %04x:%04x) installed in this system has
    NVRM: fallen off the bus and is not responding to commands.   (no Xid number: reported as 79)

``pid`` is ``'<unknown>'`` (quotes included) when the channel has no owner, and may be empty.
NVLink5 Xids (144-150) carry a ``Fatal``/``Nonfatal`` token in their message.

An SXid event is printed as a headline (``Fatal|Non-fatal|Correctable, Link N ...``) followed by
the error-log dump (``Severity S Engine instance ...`` and ``Data {...}`` lines, from
``_nvswitch_dump_error_entry``): those follow-ups are not counted again. A dump line whose
headline is not there (the driver logged data only, or the excerpt lost it) is an event of its
own: ``Severity 1`` is fatal, ``Severity 0`` non-fatal, a ``Data`` line alone carries no
severity (``laggard.detectors.xid_catalog.sxid_lookup`` then decides from the code). Such a line
is held until :data:`SXID_ORPHAN_LINES` more lines pass, :meth:`KernelLogParser.flush` or
:meth:`KernelLogParser.settle`; a headline of the same switch and code arriving first claims it
(it was the tail of a cut headline).

Indented copies of whole lines are read as lines. An Xid or SXid line cut inside its header (a
terminal or syslog wrap) is joined with the next line.

Timestamps: ``timestamp`` is epoch seconds where the line carries a wall-clock time. ``--ctime``
stamps are read in this machine's local time zone (as ``dmesg`` printed them). Syslog stamps
have no year: the parser takes the year that puts the stamp at most one day after the parser's
reference time ``now`` (default: the wall clock as the line is parsed), so a December line read in
January lands in the previous year. Uptime-only sources give ``timestamp=None`` unless
``boot_time`` is passed.
"""

from __future__ import annotations

import calendar
import functools
import re
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime

__all__ = [
    "KernelLogParser",
    "SXidEvent",
    "XidEvent",
    "parse_kernel_log",
]

#: Xid number given to the "has fallen off the bus" message, which prints none (NVIDIA XID
#: catalog: Xid 79, "GPU has fallen off the bus").
FALLEN_OFF_BUS_XID = 79

#: NVLink5 Xids whose message carries a Fatal/Nonfatal token (NVIDIA XID catalog, 144-150).
_NVLINK5_XIDS = range(144, 151)


@dataclass(frozen=True, slots=True)
class XidEvent:
    """One Xid reported by the NVIDIA driver.

    Attributes:
        xid: the Xid number.
        pci_bus_id: ``"dddd:bb:dd"`` lower case (domain at least 4 hex digits), as the driver
            prints it: no function number.
        timestamp: epoch seconds, or None when the line has only an uptime stamp (see module doc).
        uptime_seconds: seconds since boot when the line carries it, else None.
        pid: process id of the channel owner, None when unknown or absent.
        process: process name, None when ``<unknown>`` or absent.
        message: the driver's text after the ``pid``/``name`` fields, without the
            "caused by previous Xid" suffix.
        raw: the input line(s) the event came from (newline-joined for multi-line messages).
        fatal_token: ``"Fatal"`` or ``"Nonfatal"`` for NVLink5 Xids that print one, else None.
        caused_by: N of a "caused by previous Xid N" suffix, else None.
        gpu_instance: MIG GPU instance id (``GPU-I:``), else None.
        compute_instance: MIG compute instance id (``GPU-CI:``), else None.
        host: the host the line names (pdsh/clush prefix, syslog/journal HOSTNAME), else None;
            two hosts' GPUs of the same bus id are two GPUs.
    """

    xid: int
    pci_bus_id: str
    timestamp: float | None
    uptime_seconds: float | None
    pid: int | None
    process: str | None
    message: str
    raw: str
    fatal_token: str | None = None
    caused_by: int | None = None
    gpu_instance: int | None = None
    compute_instance: int | None = None
    host: str | None = None


@dataclass(frozen=True, slots=True)
class SXidEvent:
    """One NVSwitch error (an SXid is not an Xid: its own numbering, its own metric).

    Attributes:
        sxid: the SXid number.
        pci_bus_id: the switch's ``"dddd:bb:dd.f"`` lower case, as the driver prints it.
        link: NVLink port number, when the line names one.
        severity: ``"fatal"`` or ``"nonfatal"``, None when the line gives neither.
        timestamp: epoch seconds or None (see :class:`XidEvent`).
        uptime_seconds: seconds since boot or None.
        message: the text after the severity/link fields.
        raw: the input line.
        device: the switch device name (``"nvidia-nvswitch1"``).
        host: the host the line names, else None (see :class:`XidEvent`).
    """

    sxid: int
    pci_bus_id: str
    link: int | None
    severity: str | None
    timestamp: float | None
    uptime_seconds: float | None
    message: str
    raw: str
    device: str | None = None
    host: str | None = None


KernelEvent = XidEvent | SXidEvent

# ---- line prefixes -----------------------------------------------------------------------

_KMSG = re.compile(r"^(\d+),(\d+),(\d+),[^;]*;(.*)$")
_KMSG_ESCAPE = re.compile(r"\\x([0-9a-fA-F]{2})")
_DECODE = re.compile(r"^[a-z]+\s*:[a-z]+\s*:\s?")  # dmesg --decode: "kern  :warn  : "
_PRIORITY = re.compile(r"^<\d+>")
_UPTIME = re.compile(r"^\[\s*(\d+\.\d+)\]\s?")
_CTIME = re.compile(
    r"^\[(?:[A-Z][a-z]{2} )?([A-Z][a-z]{2}) +(\d{1,2}) (\d\d):(\d\d):(\d\d) (\d{4})\]\s?"
)
_ISO = re.compile(
    r"^\[?(\d{4})-(\d\d)-(\d\d)[T ](\d\d):(\d\d):(\d\d)(?:[.,](\d+))?(Z|[+-]\d\d:?\d\d)?\]?\s+"
)
# journalctl -o short-unix
_EPOCH = re.compile(r"^(\d{9,11}\.\d+)\s+")
# Any other bracketed stamp (dmesg --time-format reltime "[Feb23 16:24]", delta "[  +0.000010]",
# a bracketed ISO stamp of fabric-manager logs is matched by _ISO first).
_OTHER_BRACKET = re.compile(r"^\[[^\]]{1,40}\]\s?")
_BSD = re.compile(r"^([A-Z][a-z]{2}) +(\d{1,2}) (\d\d):(\d\d):(\d\d)(?:\.(\d+))?\s+")
# "host tag[pid]: " after a syslog/journal time stamp; the host cannot end in ":" so that a
# kernel message ("NVRM: Xid ...") is never mistaken for one.
_HOST_TAG = re.compile(r"^(?P<host>[^\s:\[]+) [\w.@/-]+(?:\[\d+\])?: ")
# RFC 5424 (section 6): "<PRI>1 TIMESTAMP HOSTNAME APP-NAME PROCID MSGID STRUCTURED-DATA MSG",
# each header field "-" when nil; the TIMESTAMP is read by _ISO.
_RFC5424_VERSION = re.compile(r"^1 (?=\d{4}-\d\d-\d\dT)")
_RFC5424_HEADER = re.compile(
    r"^(?P<host>\S{1,255}) \S{1,48} \S{1,128} \S{1,32} (?:-|(?:\[(?:[^\]\\]|\\.)*\])+)(?: |$)")
# "host: " of pdsh and clush (one line per output line of each host). The lookahead is what
# tells a host from a kernel tag: a stamp, a kernel tag or an indented continuation follows.
_KERNEL_TAGS = frozenset({"NVRM", "kernel", "nvidia", "nvidia-modeset", "nvidia-peermem",
                          "nvidia-uvm", "nvidia-drm"})
_PDSH = re.compile(
    r"^(?P<host>[A-Za-z0-9][\w.-]{0,252}): (?=\s|\[|<\d|\d+,\d+,\d+,|\d{4}-\d\d-\d\d"
    r"|\d{9,11}\.\d|[A-Z][a-z]{2} +\d{1,2} \d\d:|[a-z]+\s*:[a-z]+\s*:"
    r"|(?:NVRM|kernel|nvidia-nvswitch\d*): |S?Xid )")
_MONTHS = {m: i for i, m in enumerate(
    ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"), 1)}

# ---- messages ----------------------------------------------------------------------------

_HEX = "[0-9a-fA-F]"
_XID = re.compile(
    rf"NVRM: Xid \((?:PCI:)?(?P<dom>{_HEX}{{4,8}}):(?P<bus>{_HEX}{{2}}):(?P<dev>{_HEX}{{2}})"
    r"(?:\.[0-9a-fA-F])?(?: GPU-I:(?P<gi>\d+))?(?: GPU-CI:(?P<ci>\d+))?\): (?P<xid>\d+)"
    r"(?:,\s*(?P<rest>.*))?$"
)
_XID_LOOKALIKE = re.compile(r"\bS?Xid\b")
_PID_NAME = re.compile(
    r"^pid=(?P<pid>'?<unknown>'?|\d*),\s*name=(?P<name>[^,]*)(?:,\s?(?P<msg>.*))?$"
)
_CAUSED_BY = re.compile(r"\s*caused by previous Xid (\d+)\s*$")
_FATAL_TOKEN = re.compile(r"(?<![\w-])(Fatal|Non-?fatal)(?![\w-])", re.IGNORECASE)
_SXID = re.compile(
    r"(?:(?P<device>nvidia-nvswitch\d*): )?SXid \(PCI:(?P<pci>[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:"
    r"[0-9a-fA-F]{2}(?:\.[0-9a-fA-F])?)\): (?P<sxid>\d+)(?:,\s*(?P<rest>.*))?$"
)
# The headline of one event (``NVSWITCH_REPORT_FATAL`` / ``_NONFATAL`` / ``_CORRECTABLE``:
# "%s, Link %02d %s%s"; ``NVSWITCH_REPORT_PRI_ERROR_*``: "%s, %s, instance=%d, chiplet=%d").
_SXID_SEVERITY = re.compile(
    r"^(?P<sev>Fatal|Non-?fatal|Correctable)(?:,\s*Link (?P<link>\d+))?,?\s*(?P<msg>.*)$",
    re.IGNORECASE)
# The error-log dump that follows (``_nvswitch_dump_error_entry``): "Severity %d Engine instance
# %02d Sub-engine instance %02d" (severity 1 = NVSWITCH_ERROR_SEVERITY_FATAL, 0 = NONFATAL) and
# one or two "Data {0x%08x, ...}" lines (9 words: flags + data[0..7]; then data[8..15] when any
# is set). Printed after a headline they are its follow-ups; printed alone they are the event.
_SXID_ENTRY = re.compile(r"^Severity (?P<sev>\d+) Engine instance (?P<engine>\d+)")
_SXID_DATA = re.compile(r"^Data \{(?P<words>[^}]*)\}?")
# An Xid/SXid line cut inside its header ("NVRM: Xid (PCI:0000:3", "SXid (PCI:0000:05:00.0): ").
_CUT_HEADER = re.compile(r"S?Xid \((?:PCI:)?[0-9a-fA-F:.]*$|S?Xid \([^)]*\):\s*\d*,?\s*$")
#: Input lines an SXid dump line without its headline waits for one before it is its own event.
SXID_ORPHAN_LINES = 64
_FALLEN_START = re.compile(rf"NVRM: The NVIDIA GPU ({_HEX}{{4,8}}):({_HEX}{{2}}):({_HEX}{{2}})")
_FALLEN_END = "fallen off the bus"
_FALLEN_NEXT = ("NVRM: (PCI ID", "NVRM: installed", "NVRM: fallen")
#: Lines a pending "fallen off the bus" message may span before it is given up.
_FALLEN_MAX_LINES = 4
#: Input lines (of any host) a host's unfinished multi-line message waits for its next line in
#: an aggregated log before it is given up (it keeps every line on the slow path meanwhile).
PARKED_MESSAGE_LINES = 256


@dataclass(slots=True)
class _Stamp:
    """When and where a line was logged: epoch and uptime seconds, and the host it names."""

    timestamp: float | None
    uptime: float | None
    host: str | None = None


def _pci(dom: str, bus: str, dev: str) -> str:
    return f"{int(dom, 16):04x}:{bus.lower()}:{dev.lower()}"


@functools.lru_cache(maxsize=4096)
def _local_epoch(year: int, month: int, day: int, hh: int, mm: int, ss: int) -> float | None:
    # Cached: a burst of Xid lines repeats the same second, and mktime is most of the cost of a
    # year-less syslog line.
    try:
        return time.mktime((year, month, day, hh, mm, ss, 0, 0, -1))
    except (OverflowError, ValueError):
        return None


class KernelLogParser:
    """Stateful kernel-log parser: feed physical lines, get Xid and SXid events.

    State is kept for continuation lines and for the multi-line "fallen off the bus" message;
    call :meth:`flush` at the end of input.

    Args:
        now: reference epoch time for year-less syslog stamps (default: the wall clock when
            each line is parsed).
        boot_time: epoch time of boot; when given, uptime-only lines get a ``timestamp`` too.

    Attributes:
        lines: physical lines fed.
        skipped: lines that name an Xid or SXid but could not be parsed (truncated, garbled).
        host: the host the last line fed names (its pdsh/clush prefix or syslog HOSTNAME; a
            continuation line's is the line it continues), else None: for callers that read
            more of a line than the events (``laggard analyze``'s RmInitAdapter lines).
    """

    def __init__(self, *, now: float | None = None, boot_time: float | None = None) -> None:
        self.lines = 0
        self.skipped = 0
        self.host: str | None = None
        self._now = now  # None: the wall clock at each line (a long-running agent)
        self._boot_time = boot_time
        self._last = _Stamp(None, None)
        self._pending: list[str] = []  # raw lines of an unfinished "fallen off the bus" message
        self._pending_text: list[str] = []
        self._pending_pci = ""
        self._pending_stamp = _Stamp(None, None)
        # The host whose unfinished message the four fields above hold, and the other hosts'
        # (an aggregated log interleaves hosts' lines: one host's line must not end or extend
        # another host's message).
        self._pending_host: str | None = None
        self._parked: dict[str | None, tuple[list[str], list[str], str, _Stamp, int]] = {}
        self._wrapped: tuple[str, _Stamp, str] | None = None  # an Xid line cut in its header
        # switch pci -> (sxid, what its last SXid line was: head / entry / data9 / data)
        # (host, switch pci) -> ...: two hosts' switches of one bus id are two switches
        self._sxid_last: dict[tuple[str | None, str], tuple[int, str]] = {}
        # (switch pci, sxid) -> dump lines with no headline: (line number, batch, event)
        self._orphans: dict[tuple[str | None, str, int], list[tuple[int, int, SXidEvent]]] = {}
        self._generation = 0

    # -- public ----------------------------------------------------------------------------

    def feed(self, line: str) -> list[KernelEvent]:
        """Parse one physical line.

        Args:
            line: one line of input, with or without its trailing newline.

        Returns:
            Events completed by this line (usually zero or one).
        """
        self.lines += 1
        self.host = None
        events = self._feed(line.rstrip("\r\n"))
        if self._orphans and self.lines % 8 == 0:
            events += self._expire(self.lines - SXID_ORPHAN_LINES)
        if self._parked and self.lines % 8 == 0:  # messages other hosts never finished
            for host in [h for h, p in self._parked.items()
                         if self.lines - p[4] > PARKED_MESSAGE_LINES]:
                del self._parked[host]
        return events

    def _feed(self, line: str) -> list[KernelEvent]:
        host: str | None = None
        # A number is srun --label's task id, not a host.
        if (pdsh := _PDSH.match(line)) and pdsh["host"] not in _KERNEL_TAGS \
                and not pdsh["host"].startswith("nvidia-nvswitch") and not pdsh["host"].isdigit():
            host = pdsh["host"]
            line = line[pdsh.end():]
        kmsg = _KMSG.match(line)
        if kmsg:
            uptime = int(kmsg.group(3)) / 1e6
            stamp = self._last = _Stamp(self._from_uptime(uptime), uptime, host)
            text = _KMSG_ESCAPE.sub(lambda m: chr(int(m.group(1), 16)), kmsg.group(4))
            self.host = host
            events: list[KernelEvent] = []
            for i, part in enumerate(text.split("\n")):
                events += self._message(part, stamp, raw=line, continuation=i > 0)
            return events
        if line[:1] in (" ", "\t"):
            if self._pending or self._parked or self._wrapped is not None:
                last = self._last if host is None else _Stamp(self._last.timestamp,
                                                              self._last.uptime, host)
                self.host = last.host
                return self._message(line.strip(), last, raw=line, continuation=True)
            if "Xid" not in line:
                return []  # an indented line outside a multi-line message: kmsg dictionary etc.
            line = line.strip()  # an indented copy of a whole line (a report, a quoted log)
        stamp, message = self._strip_prefix(line, host)
        self.host = stamp.host
        return self._message(message, stamp, raw=line, continuation=False)

    @property
    def last_timestamp(self) -> float | None:
        """Epoch seconds of the last line fed, when it carried a wall-clock time (or an uptime
        and ``boot_time`` was given); None otherwise. Continuation lines keep the time of the
        line they continue."""
        return self._last.timestamp

    @property
    def waiting(self) -> bool:
        """True while a message is split across lines (a wrapped header, an unfinished "fallen
        off the bus"): the next line must be fed even if it names no Xid."""
        return self._wrapped is not None or bool(self._pending) or bool(self._parked)

    def flush(self) -> list[KernelEvent]:
        """End of input: give up any unfinished multi-line message.

        Returns:
            SXid dump lines still waiting for a headline, each as its own event (an unfinished
            "fallen off the bus" message is incomplete and is not reported).
        """
        self._drop_pending()
        self._parked.clear()
        if self._wrapped is not None:
            self.skipped += 1
            self._wrapped = None
        return self._expire(None)

    def settle(self) -> list[KernelEvent]:
        """For a live source read in batches: report the SXid dump lines that waited a whole
        batch for a headline (call once per batch, after feeding it).

        Returns:
            Those events.
        """
        events = self._expire(None, generation=self._generation)
        self._generation += 1
        return events

    def _expire(self, before_line: int | None, generation: int | None = None) \
            -> list[KernelEvent]:
        out: list[KernelEvent] = []
        for key in list(self._orphans):
            keep = []
            for line_no, gen, event in self._orphans[key]:
                old = (before_line is None or line_no <= before_line) and (
                    generation is None or gen < generation)
                if old:
                    out.append(event)
                else:
                    keep.append((line_no, gen, event))
            if keep:
                self._orphans[key] = keep
            else:
                del self._orphans[key]
        return out

    # -- prefixes ----------------------------------------------------------------------------

    def _from_uptime(self, uptime: float) -> float | None:
        return None if self._boot_time is None else self._boot_time + uptime

    def _strip_prefix(self, line: str, host: str | None = None) -> tuple[_Stamp, str]:
        """Remove the stamps and the syslog/journal header of one line.

        Args:
            line: the physical line (a pdsh/clush prefix already removed).
            host: the host of that prefix, if any; it wins over a HOSTNAME field.

        Returns:
            The line's stamp (with its host) and the kernel message.
        """
        text = _DECODE.sub("", line, count=1)
        text = _PRIORITY.sub("", text, count=1)
        timestamp: float | None = None
        uptime: float | None = None
        rfc5424 = False
        if v := _RFC5424_VERSION.match(text):
            text, rfc5424 = text[v.end():], True
        if m := _UPTIME.match(text):
            uptime = float(m.group(1))
        elif m := _CTIME.match(text):
            month = _MONTHS.get(m.group(1), 0)
            if month:
                timestamp = _local_epoch(int(m.group(6)), month, int(m.group(2)),
                                         int(m.group(3)), int(m.group(4)), int(m.group(5)))
        elif m := _ISO.match(text):
            timestamp = _iso_epoch(m)
        elif m := _BSD.match(text):
            timestamp = self._bsd_epoch(m)
        elif m := _EPOCH.match(text):
            timestamp = float(m.group(1))
        else:
            m = _OTHER_BRACKET.match(text)  # dmesg reltime/delta: no usable time
        if m:
            text = text[m.end():]
        if rfc5424 and (header := _RFC5424_HEADER.match(text)):
            text = text[header.end():]
            if host is None and header["host"] != "-":
                host = header["host"]
        elif tag := _HOST_TAG.match(text):  # "host kernel: " of syslog and journald
            text = text[tag.end():]
            if host is None:
                host = tag["host"]
            if m := _UPTIME.match(text):  # "host kernel: [ 219.47] msg"
                uptime = float(m.group(1))
                text = text[m.end():]
        if text.startswith("kernel: "):
            text = text[len("kernel: "):]
        if timestamp is None and uptime is not None:
            timestamp = self._from_uptime(uptime)
        if rfc5424 and (m := _UPTIME.match(text)):  # "kernel - - - [ 219.47] msg"
            uptime = float(m.group(1))
            text = text[m.end():]
        stamp = _Stamp(timestamp, uptime, host)
        self._last = stamp
        return stamp, text

    def _bsd_epoch(self, m: re.Match[str]) -> float | None:
        month = _MONTHS.get(m.group(1))
        if month is None:
            return None
        now = time.time() if self._now is None else self._now
        year = time.localtime(now).tm_year
        fraction = float("0." + m.group(6)) if m.group(6) else 0.0
        for candidate in (year, year - 1):  # at most a day in the future, else last year
            epoch = _local_epoch(candidate, month, int(m.group(2)), int(m.group(3)),
                                 int(m.group(4)), int(m.group(5)))
            if epoch is not None and epoch <= now + 86400:
                return epoch + fraction
        return None

    # -- messages ----------------------------------------------------------------------------

    def _message(self, text: str, stamp: _Stamp, *, raw: str,
                 continuation: bool) -> list[KernelEvent]:
        if stamp.host != self._pending_host:
            self._switch_host(stamp.host)
        if self._pending:
            # The rest of a "fallen off the bus" message: continuation lines, or the same text
            # with its own prefix (syslog daemons repeat the prefix on every printk line).
            if continuation or text.startswith(_FALLEN_NEXT):
                if raw != self._pending[-1]:  # a kmsg record holds every line of the message
                    self._pending.append(raw)
                self._pending_text.append(text)
                if _FALLEN_END in text:
                    return [self._finish_fallen()]
                if len(self._pending_text) >= _FALLEN_MAX_LINES:
                    self._drop_pending()
                return []
            self._drop_pending()  # another message started: that was not the one we waited for
        if self._wrapped is not None:
            event = self._unwrap(text)
            if event is not None:
                return [event]
        if continuation:
            return []
        if "Xid" in text:
            event = self._xid_or_sxid(text, stamp, raw)
            return [] if event is None else [event]
        if m := _FALLEN_START.search(text):
            self._pending = [raw]
            self._pending_text = [text]
            self._pending_pci = _pci(m.group(1), m.group(2), m.group(3))
            self._pending_stamp = stamp
            if _FALLEN_END in text:  # the whole message on one line (journald export)
                return [self._finish_fallen()]
        return []

    def _switch_host(self, host: str | None) -> None:
        """Park the current host's unfinished message and take up ``host``'s (bounded: past
        1024 hosts with one open, the oldest is given up)."""
        if self._pending:
            if len(self._parked) >= 1024:
                del self._parked[next(iter(self._parked))]
            self._parked[self._pending_host] = (self._pending, self._pending_text,
                                                self._pending_pci, self._pending_stamp,
                                                self.lines)
        parked = self._parked.pop(host, None)
        if parked is not None and self.lines - parked[4] <= PARKED_MESSAGE_LINES:
            self._pending, self._pending_text, self._pending_pci, self._pending_stamp, _ = parked
        else:
            self._pending, self._pending_text, self._pending_pci = [], [], ""
            self._pending_stamp = _Stamp(None, None)
        self._pending_host = host

    def _drop_pending(self) -> None:
        self._pending = []
        self._pending_text = []

    def _finish_fallen(self) -> XidEvent:
        text = " ".join(t.removeprefix("NVRM:").strip() for t in self._pending_text)
        event = XidEvent(
            xid=FALLEN_OFF_BUS_XID, pci_bus_id=self._pending_pci,
            timestamp=self._pending_stamp.timestamp, uptime_seconds=self._pending_stamp.uptime,
            pid=None, process=None, message=text, raw="\n".join(self._pending),
            host=self._pending_stamp.host,
        )
        self._pending = []
        self._pending_text = []
        return event

    def _xid_or_sxid(self, text: str, stamp: _Stamp, raw: str) -> KernelEvent | None:
        if m := _XID.search(text):
            return _xid_event(m, stamp, raw)
        if m := _SXID.search(text):
            return self._sxid_line(m, stamp, raw)
        if _XID_LOOKALIKE.search(text) and ("NVRM" in text or "nvswitch" in text):
            if _CUT_HEADER.search(text):
                self._wrapped = (text, stamp, raw)  # a terminal or syslog wrap: join the next
            else:
                self.skipped += 1  # names an Xid but does not follow the driver's format
        return None

    def _unwrap(self, text: str) -> KernelEvent | None:
        assert self._wrapped is not None
        head, stamp, raw = self._wrapped
        self._wrapped = None
        for joined in (head + text, head + " " + text):
            if (m := _XID.search(joined)) or (m := _SXID.search(joined)):
                self._wrapped = None
                if m.re is _XID:
                    return _xid_event(m, stamp, raw + "\n" + text)
                return self._sxid_line(m, stamp, raw + "\n" + text)
        self.skipped += 1
        return None

    def _sxid_line(self, m: re.Match[str], stamp: _Stamp, raw: str) -> SXidEvent | None:
        """One SXid line: a headline is an event; a dump line (``Severity``/``Data``) is the
        follow-up of the headline or dump line before it on the same switch and code, or else
        an event of its own, held until no headline claims it (see :data:`SXID_ORPHAN_LINES`).
        """
        rest = m.group("rest") or ""
        pci, sxid = _switch_pci(m.group("pci")), int(m.group("sxid"))
        entry = _SXID_ENTRY.match(rest)
        data = None if entry else _SXID_DATA.match(rest)
        if entry is None and data is None:
            # Dump lines of this code still waiting belong to a headline cut from the excerpt.
            self._orphans.pop((stamp.host, pci, sxid), None)
            self._sxid_last[(stamp.host, pci)] = (sxid, "head")
            return _sxid_event(m, rest, stamp, raw)
        words = len(data["words"].split(",")) if data else 0
        last = self._sxid_last.get((stamp.host, pci))
        follows = last is not None and last[0] == sxid and (
            (entry is not None and last[1] == "head")
            or (data is not None and last[1] in ("head", "entry"))
            or (data is not None and last[1] == "data9" and words == 8))
        self._sxid_last[(stamp.host, pci)] = (sxid, "entry" if entry else "data9" if words == 9
                                              else "data")
        if follows:
            return None
        printed = None if entry is None else "fatal" if entry["sev"] == "1" else "nonfatal"
        event = SXidEvent(
            sxid=sxid, pci_bus_id=pci, link=int(entry["engine"]) if entry else None,
            severity=printed, timestamp=stamp.timestamp, uptime_seconds=stamp.uptime,
            message=rest.strip(), raw=raw, device=m.group("device"), host=stamp.host)
        if len(self._orphans) < 1024:
            self._orphans.setdefault((stamp.host, pci, sxid), []).append(
                (self.lines, self._generation, event))
        return None


def _iso_epoch(m: re.Match[str]) -> float | None:
    year, month, day, hh, mm, ss = (int(m.group(i)) for i in range(1, 7))
    fraction = float("0." + m.group(7)) if m.group(7) else 0.0
    zone = m.group(8)
    if zone is None:
        epoch = _local_epoch(year, month, day, hh, mm, ss)
        return None if epoch is None else epoch + fraction
    try:
        base = calendar.timegm(datetime(year, month, day, hh, mm, ss).timetuple())
    except ValueError:
        return None
    if zone != "Z":
        sign = -1 if zone[0] == "+" else 1  # local = UTC + offset, so UTC = local - offset
        digits = zone[1:].replace(":", "")
        base += sign * (int(digits[:2]) * 3600 + int(digits[2:]) * 60)
    return base + fraction


def _xid_event(m: re.Match[str], stamp: _Stamp, raw: str) -> XidEvent:
    rest = m.group("rest") or ""
    pid: int | None = None
    process: str | None = None
    if pn := _PID_NAME.match(rest):
        pid_text, name = pn.group("pid"), pn.group("name").strip()
        pid = int(pid_text) if pid_text.isdigit() else None
        process = name if name and name != "<unknown>" else None
        rest = pn.group("msg") or ""
    caused_by: int | None = None
    if cb := _CAUSED_BY.search(rest):
        caused_by = int(cb.group(1))
        rest = rest[:cb.start()]
    xid = int(m.group("xid"))
    fatal_token: str | None = None
    if xid in _NVLINK5_XIDS and (ft := _FATAL_TOKEN.search(rest)):
        fatal_token = "Fatal" if ft.group(1).lower() == "fatal" else "Nonfatal"
    return XidEvent(
        xid=xid, pci_bus_id=_pci(m.group("dom"), m.group("bus"), m.group("dev")),
        timestamp=stamp.timestamp, uptime_seconds=stamp.uptime, pid=pid, process=process,
        message=rest.strip(), raw=raw, fatal_token=fatal_token, caused_by=caused_by,
        gpu_instance=int(m.group("gi")) if m.group("gi") else None,
        compute_instance=int(m.group("ci")) if m.group("ci") else None,
        host=stamp.host,
    )


def _switch_pci(text: str) -> str:
    dom, _, tail = text.lower().partition(":")
    return f"{int(dom, 16):04x}:{tail}"


def _sxid_event(m: re.Match[str], rest: str, stamp: _Stamp, raw: str) -> SXidEvent:
    severity: str | None = None
    link: int | None = None
    message = rest
    if sev := _SXID_SEVERITY.match(rest):
        word = sev.group("sev").lower()
        severity = word if word in ("fatal", "correctable") else "nonfatal"
        link = int(sev.group("link")) if sev.group("link") else None
        message = sev.group("msg")
    return SXidEvent(
        sxid=int(m.group("sxid")), pci_bus_id=_switch_pci(m.group("pci")), link=link,
        severity=severity, timestamp=stamp.timestamp, uptime_seconds=stamp.uptime,
        message=message.strip(), raw=raw, device=m.group("device"), host=stamp.host,
    )


def parse_kernel_log(lines: Iterable[str], *, now: float | None = None,
                     boot_time: float | None = None) -> Iterator[KernelEvent]:
    """Parse kernel-log lines and yield every Xid and SXid event, in input order.

    Args:
        lines: physical lines in any of the formats listed in the module doc.
        now: reference time for year-less syslog stamps (see :class:`KernelLogParser`).
        boot_time: epoch time of boot, to turn uptime stamps into timestamps.

    Yields:
        :class:`XidEvent` and :class:`SXidEvent` objects.
    """
    parser = KernelLogParser(now=now, boot_time=boot_time)
    for line in lines:
        yield from parser.feed(line)
    yield from parser.flush()
