"""AgentContext: what the daemon shares with the collectors it builds, and the FindingLog in it.

Every finding raised on this node goes through one :class:`FindingLog`: the collectors' (xid,
nvml's ``gpu_lost``, throttle, flight_recorder) and the job's, from WindowReports (the intake's
``add``). It counts them for ``laggard_findings_total``, keeps the recent ones for ``/findings``
and logs each one **once when raised and once when cleared**, never a flood.

A job's findings are a level: rank 0 re-sends those that still hold with every window
(:meth:`FindingLog.hold`: nothing counted or logged again; an agent that never saw the raise,
restarted mid-run, takes it up), and the job's end ends them (:meth:`FindingLog.end_run`: kept on
``/findings`` with ``ended_at``).
"""

from __future__ import annotations

import datetime
import json
import logging
import math
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from laggard.detectors.finding import Finding

#: Findings kept in memory for ``/findings``; older ones drop off (counters keep counting).
MAX_RECENT_FINDINGS = 256
#: Seconds after which a finding that was neither cleared nor raised again stops being active:
#: raised again after that, it is logged again. Xids, throttles and lost GPUs are never cleared
#: by their detectors; without this an Xid 13 at 09:00 would hide the same Xid at 15:00.
QUIET_SECONDS = 600.0
#: Most finding lines logged a minute; past it lines are counted, not logged (said once).
MAX_LOG_LINES_PER_MINUTE = 60
#: Longest message (and label value) put in a log line, in characters.
MAX_LOGGED_CHARS = 400
#: A finding that happened longer ago than this (seconds; a kernel log's history) says when.
_HISTORY_NOTE_SECONDS = 60.0

_YEAR_3000 = 32_503_680_000.0  # Unix seconds

#: Log level of a raised finding, by severity; a cleared one is logged at INFO.
LOG_LEVELS = {"info": logging.INFO, "warning": logging.WARNING, "critical": logging.ERROR}
_RANK = {"info": 0, "warning": 1, "critical": 2}

#: What a finding is about, beyond its detector and kind: finding fields, then evidence keys.
_SUBJECT_FIELDS = ("run", "node", "rank", "gpu", "subject")
_SUBJECT_EVIDENCE = ("pci_bus_id", "xid", "sxid", "link", "pg")
#: Fields named in a log line (``name=value``), in this order.
_WHERE_FIELDS = ("run", "node", "rank", "local_rank", "gpu", "subject", "sender_pid",
                 "sender_uid")

log = logging.getLogger("laggard.findings")


def rfc3339(epoch: float) -> str:
    """``epoch`` (Unix seconds) as RFC 3339, UTC, milliseconds: ``2026-12-01T21:42:55.120Z``."""
    moment = datetime.datetime.fromtimestamp(epoch, datetime.timezone.utc)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def finding_key(doc: dict[str, Any]) -> tuple[str, ...]:
    """What a finding is about, so a repeat is recognised: detector, kind and subject.

    The subject is the finding's run, node, rank, GPU and ``subject`` fields and its evidence's
    ``pci_bus_id``, ``xid``, ``sxid``, ``link`` and ``pg`` (Xid 13 and Xid 79 of one GPU are two
    findings, so are one SXid on two links of a switch, and a rank behind in two process
    groups). A cleared finding has the key of the one it clears (:meth:`Finding.clear` keeps
    these fields).

    Args:
        doc: a finding's ``to_dict()`` form (from the wire: any JSON values).

    Returns:
        A tuple of strings (each at most :data:`MAX_LOGGED_CHARS`).
    """
    evidence = doc.get("evidence")
    if not isinstance(evidence, dict):
        evidence = {}
    parts = [doc.get("detector"), doc.get("kind")]
    parts += [doc.get(name) for name in _SUBJECT_FIELDS]
    parts += [evidence.get(name) for name in _SUBJECT_EVIDENCE]
    return tuple(_text(part) for part in parts)


def _text(value: Any) -> str:
    if value is None:
        return ""
    if not isinstance(value, (str, int, float, bool)):
        value = json.dumps(value, sort_keys=True, default=str)
    return str(value)[:MAX_LOGGED_CHARS]


def _clean(value: Any) -> str:
    """``value`` for one log line: control characters escaped (a message from the wire must not
    forge a second line), cut at :data:`MAX_LOGGED_CHARS`."""
    text = _text(value)
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)[:MAX_LOGGED_CHARS]


def _where(doc: dict[str, Any]) -> str:
    """``detector/kind name=value ...``: what a person needs to find the thing at fault."""
    out = [f"{_clean(doc.get('detector'))}/{_clean(doc.get('kind'))}"]
    evidence = doc.get("evidence")
    if not isinstance(evidence, dict):
        evidence = {}
    pairs = [(name, doc.get(name)) for name in _WHERE_FIELDS]
    pairs.append(("pci_bus_id", evidence.get("pci_bus_id")))
    for name, value in pairs:
        if value is None or value == "":
            continue
        text = _clean(value)
        out.append(f'{name}="{text}"' if (" " in text or "=" in text) else f"{name}={text}")
    return " ".join(out)


@dataclass(slots=True)
class _Episode:
    """One finding from its first raise to its clear (or to its last repeat)."""

    key: tuple[str, ...]
    doc: dict[str, Any]  # the latest raise of the worst severity, or the clear once cleared
    first_seen: float  # Unix seconds
    last_seen: float
    count: int  # raises, repeats included (0: cleared here, raised before the agent started)
    severity: str  # the worst severity logged
    last_raised: float  # monotonic seconds, for QUIET_SECONDS
    raised_message: str | None = None
    cleared_at: float | None = None
    job: str | None = None  # the run whose WindowReports sent it; None: this node's own
    ended_at: float | None = None  # Unix seconds its job ended while it held

    @property
    def holds(self) -> bool:
        """Neither cleared nor ended."""
        return self.cleared_at is None and self.ended_at is None


@dataclass(slots=True)
class _LogBudget:
    """At most ``per_minute`` lines a minute (monotonic), the rest counted."""

    per_minute: int
    window_start: float = -math.inf
    lines: int = 0
    suppressed: int = 0

    def admit(self, now: float, lines: list[tuple[int, str]]) -> list[tuple[int, str]]:
        out: list[tuple[int, str]] = []
        for line in lines:
            if now - self.window_start >= 60.0:
                if self.suppressed:
                    out.append((logging.WARNING, f"{self.suppressed} finding lines were not "
                                "logged in the last minute; /findings has the findings"))
                self.window_start, self.lines, self.suppressed = now, 0, 0
            if self.lines < self.per_minute:
                self.lines += 1
                out.append(line)
                continue
            if not self.suppressed:
                out.append((logging.WARNING, f"more than {self.per_minute} finding lines this "
                            "minute: the rest are counted, not logged, until it ends "
                            "(laggard_findings_total and /findings have them all)"))
            self.suppressed += 1
        return out


class FindingLog:
    """Thread-safe, bounded record and log of the findings raised on this node.

    * counts every raised finding by ``(detector, kind, severity)`` for
      ``laggard_findings_total``, repeats included;
    * logs a finding once when raised, at its severity's level (info -> INFO, warning ->
      WARNING, critical -> ERROR, anything else from the wire -> WARNING), and once when cleared
      (INFO), in one line: ``raised critical xid/gpu_lost node=n07 pci_bus_id=0000:3b:00:
      <message>``. A finding raised again while active (same :func:`finding_key`, not cleared,
      raised again within ``quiet_seconds``) is counted, not logged, unless its severity rose.
      At most ``max_log_lines_per_minute`` lines a minute; past that the rest are counted and
      the log says so;
    * keeps the last ``maxlen`` episodes (a finding from its raise to its clear) for
      ``/findings``: :meth:`recent`.

    Lines are logged after the lock is released: a blocked log handler (a full pipe) delays
    only the thread that raised the finding.

    Args:
        maxlen: episodes kept for :meth:`recent`.
        quiet_seconds: see :data:`QUIET_SECONDS`.
        max_log_lines_per_minute: see :data:`MAX_LOG_LINES_PER_MINUTE`.
        clock: monotonic clock (tests pass a fake one).
        wall_clock: Unix-time clock, for ``first_seen`` / ``last_seen``.
    """

    def __init__(self, maxlen: int = MAX_RECENT_FINDINGS, *,
                 quiet_seconds: float = QUIET_SECONDS,
                 max_log_lines_per_minute: int = MAX_LOG_LINES_PER_MINUTE,
                 clock: Callable[[], float] = time.monotonic,
                 wall_clock: Callable[[], float] = time.time) -> None:
        self._lock = threading.Lock()
        self._maxlen = maxlen
        self._quiet = quiet_seconds
        self._clock = clock
        self._wall = wall_clock
        self._episodes: OrderedDict[int, _Episode] = OrderedDict()  # least recently touched first
        self._latest: dict[tuple[str, ...], int] = {}  # key -> its latest episode
        self._next_id = 0
        self._counts: Counter[tuple[str, str, str]] = Counter()
        self._budget = _LogBudget(max_log_lines_per_minute)

    def add(self, finding: Finding | dict[str, Any], *, at: float | None = None,
            job: str | None = None) -> None:
        """Record one finding (a :class:`Finding` or its ``to_dict()`` form).

        Args:
            finding: raised, or cleared (``cleared`` true).
            at: when it happened, Unix seconds (a kernel-log line's own time); None: now.
            job: the run whose WindowReport carried it (``""`` for a sender that names none),
                so that :meth:`end_run` ends it; None for the node's own findings.
        """
        doc = finding.to_dict() if isinstance(finding, Finding) else dict(finding)
        severity = str(doc.get("severity"))
        key = finding_key(doc)
        now, wall = self._clock(), self._wall()
        if at is None or not 0.0 <= at < _YEAR_3000:  # NaN too: a time RFC 3339 can write
            at = wall
        with self._lock:
            if doc.get("cleared"):
                lines = self._clear(key, doc, at, now)
            else:
                self._counts[(str(doc.get("detector")), str(doc.get("kind")), severity)] += 1
                lines = self._raise(key, doc, severity, at, now, wall, job)
            lines = self._budget.admit(now, lines)
        for level, line in lines:
            log.log(level, "%s", line)

    def hold(self, doc: dict[str, Any], *, job: str) -> None:
        """A job's finding that still holds, re-sent with a window (``WindowReport.active``).

        Idempotent: while its episode holds, only its ``last_seen`` moves (nothing counted in
        ``laggard_findings_total``, nothing logged). An agent that has no episode holding for it
        (restarted mid-run, or the raise's datagram was lost) starts one, ``count`` 0 like a
        clear of a finding raised before the agent started, and logs it once at its severity's
        level ("holds ...").

        Args:
            doc: the raised finding's ``to_dict()`` form (``cleared`` is ignored).
            job: the run whose WindowReport carried it.
        """
        doc = {k: v for k, v in doc.items() if k != "cleared"}
        key = finding_key(doc)
        now, wall = self._clock(), self._wall()
        severity = str(doc.get("severity"))
        with self._lock:
            episode = self._episodes.get(self._latest.get(key, -1))
            if episode is not None and episode.holds:
                episode.last_seen = max(episode.last_seen, wall)
                episode.last_raised = now  # held: it does not go quiet
                self._touch(key)
                return
            self._start(key, _Episode(key, doc, wall, wall, 0, severity, now,
                                      raised_message=_text(doc.get("message")), job=job))
            lines = self._budget.admit(now, [(
                LOG_LEVELS.get(severity, logging.WARNING),
                f"holds {_clean(severity)} {_where(doc)}: {_clean(doc.get('message'))} "
                f"(raised at step {_clean(doc.get('step'))}, not seen raised by this agent)")])
        for level, line in lines:
            log.log(level, "%s", line)

    def end_run(self, job: str, *, reason: str = "the job ended") -> int:
        """End the findings of run ``job`` that still hold: kept for ``/findings`` with
        ``ended_at`` (now), logged once each (INFO), no longer active.

        Args:
            job: the run (as given to :meth:`add` / :meth:`hold`).
            reason: the words logged for why (``the job ended``, ``no report for the TTL``).

        Returns:
            How many findings ended.
        """
        now, wall = self._clock(), self._wall()
        lines: list[tuple[int, str]] = []
        with self._lock:
            for episode in self._episodes.values():
                if episode.job != job or not episode.holds:
                    continue
                episode.ended_at = wall
                lines.append((logging.INFO, f"ended {_where(episode.doc)}: {reason} while it "
                                            f"held (raised {rfc3339(episode.first_seen)})"))
            ended = len(lines)
            lines = self._budget.admit(now, lines) if lines else []
        for level, line in lines:
            log.log(level, "%s", line)
        return ended

    def _raise(self, key: tuple[str, ...], doc: dict[str, Any], severity: str, at: float,
               now: float, wall: float, job: str | None) -> list[tuple[int, str]]:
        episode = self._episodes.get(self._latest.get(key, -1))
        level = LOG_LEVELS.get(severity, logging.WARNING)
        when = f" (at {rfc3339(at)})" if wall - at > _HISTORY_NOTE_SECONDS else ""
        if (episode is not None and episode.holds
                and now - episode.last_raised < self._quiet):
            if _RANK.get(severity, 1) >= _RANK.get(episode.severity, 1):
                # the latest raise, unless it is milder than an earlier one
                episode.doc, episode.raised_message = doc, _text(doc.get("message"))
            episode.count += 1
            episode.first_seen = min(episode.first_seen, at)
            episode.last_seen = max(episode.last_seen, at)
            episode.last_raised = now
            self._touch(key)
            if _RANK.get(severity, 1) <= _RANK.get(episode.severity, 1):
                return []
            was, episode.severity = episode.severity, severity
            return [(level, f"raised {_clean(severity)} (was {_clean(was)}) "
                            f"{_where(doc)}: {_clean(doc.get('message'))}{when}")]
        self._start(key, _Episode(key, doc, at, at, 1, severity, now,
                                  raised_message=_text(doc.get("message")), job=job))
        return [(level, f"raised {_clean(severity)} {_where(doc)}: "
                        f"{_clean(doc.get('message'))}{when}")]

    def _clear(self, key: tuple[str, ...], doc: dict[str, Any], at: float,
               now: float) -> list[tuple[int, str]]:
        episode = self._episodes.get(self._latest.get(key, -1))
        if episode is not None and not episode.holds:
            return []  # cleared (or ended) already: a repeated clear is not news
        if episode is None:  # raised before this agent started, or dropped off the record
            episode = _Episode(key, doc, at, at, 0, str(doc.get("severity")), now)
            self._start(key, episode)
            raised = "not raised since the agent started"
        else:
            times = "1 time" if episode.count == 1 else f"{episode.count} times"
            raised = f"raised {rfc3339(episode.first_seen)}, {times}"
        episode.doc = doc
        episode.cleared_at = at
        self._touch(key)
        return [(logging.INFO, f"cleared {_where(doc)}: {_clean(doc.get('message'))} "
                               f"({raised})")]

    def _start(self, key: tuple[str, ...], episode: _Episode) -> None:
        self._episodes[self._next_id] = episode
        self._latest[key] = self._next_id
        self._next_id += 1
        while len(self._episodes) > self._maxlen:
            number, old = self._episodes.popitem(last=False)
            if self._latest.get(old.key) == number:
                del self._latest[old.key]

    def _touch(self, key: tuple[str, ...]) -> None:
        self._episodes.move_to_end(self._latest[key])

    def counts(self) -> dict[tuple[str, str, str], int]:
        """``(detector, kind, severity) -> count`` since the agent started."""
        with self._lock:
            return dict(self._counts)

    def recent(self) -> list[dict[str, Any]]:
        """The findings of the last episodes, least recently raised or cleared first.

        Returns:
            One dict per episode: the finding's latest form at its worst severity (the clear's
            once cleared) plus
            ``first_seen`` and ``last_seen`` (RFC 3339, UTC: the first and last time it was
            raised), ``count`` (times raised, repeats included; 0 for a clear of a finding
            raised before the agent started, or taken up from a re-send: :meth:`hold`) and, once
            cleared, ``cleared_at`` and ``raised_message``; once its job ended while it held,
            ``ended_at``.
        """
        with self._lock:
            out = []
            for episode in self._episodes.values():
                doc = {**episode.doc, "first_seen": rfc3339(episode.first_seen),
                       "last_seen": rfc3339(episode.last_seen), "count": episode.count}
                if episode.cleared_at is not None:
                    doc["cleared_at"] = rfc3339(episode.cleared_at)
                    if episode.raised_message is not None:
                        doc["raised_message"] = episode.raised_message
                if episode.ended_at is not None:
                    doc["ended_at"] = rfc3339(episode.ended_at)
                out.append(doc)
            return out


@dataclass(slots=True)
class AgentContext:
    """Shared state handed to every collector factory.

    Attributes:
        findings: where collectors and detectors running in the agent put their findings.
        node: this node's name (``node`` label).
    """

    node: str
    findings: FindingLog = field(default_factory=FindingLog)
