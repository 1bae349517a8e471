"""StepRecord: what one training rank reports to its node agent per step, and its wire format.

The wire format is one UTF-8 JSON object per UDP datagram, versioned by the ``"v"`` key::

    {"v": 1, "rank": 3, "world_size": 4, "local_rank": 3, "node": "node01", "step": 120,
     "phases": {"data": 0.0012, "forward": 0.010, "backward": 0.021, "optimizer": 0.002},
     "collective_wait_seconds": 0.004, "step_seconds": 0.041,
     "collectives": [{"op": "allreduce", "seconds": 0.006, "bytes": 1048576}],
     "comm": {"total_seconds": 0.009, "exposed_seconds": 0.002, "bytes": 1048576},
     "checksums": [123, 456]}

JSON keeps the format debuggable with ``tcpdump -A`` and lets older agents skip keys they do not
know; a step's record is a few hundred bytes, far under :data:`MAX_DATAGRAM_BYTES`.
Durations are in seconds (float), sizes in bytes (int). Every field except ``v``, ``rank``,
``world_size`` and ``step`` is optional.

A second datagram type, ``{"v": 1, "type": "window", ...}`` (:class:`WindowReport`), is sent by
the rank that runs the in-job detectors (rank 0) once per detection window: straggler scores per
rank and the findings raised or cleared in that window. A datagram without ``"type"`` is a step.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

WIRE_VERSION = 1
#: UDP address the training ranks send StepRecords to (localhost: ranks run on this node).
DEFAULT_INTAKE_ADDRESS = "127.0.0.1:9478"
#: Largest datagram the agent accepts; anything larger is rejected as ``oversized``.
MAX_DATAGRAM_BYTES = 8192
#: Phase names with a meaning of their own; other names are accepted and exported as given.
STANDARD_PHASES = ("data", "forward", "backward", "optimizer", "collective_wait")
_MAX_PHASES = 16
_MAX_COLLECTIVES = 64
_MAX_NAME_LEN = 64


class RecordError(ValueError):
    """A datagram that is not a valid StepRecord.

    Attributes:
        reason: short label for ``laggard_intake_rejected_total{reason}``: ``oversized``,
            ``not_json``, ``version``, ``schema``.
    """

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


@dataclass(slots=True)
class CollectiveTiming:
    """One collective as the rank saw it: launch to completion.

    Attributes:
        op: collective name (``allreduce``, ``allgather``, ``reduce_scatter``, ``alltoall``...).
        seconds: launch-to-completion time in seconds.
        bytes: payload bytes this rank sent for it.
    """

    op: str
    seconds: float
    bytes: int = 0


@dataclass(slots=True)
class StepRecord:
    """Per-step statistics of one rank.

    Attributes:
        rank: global rank, 0 <= rank < world_size.
        world_size: number of ranks in the job.
        step: training step (0-based, monotonically increasing per rank).
        local_rank: rank on this node, if known.
        node: host name of this rank, if known.
        phases: phase name -> duration in seconds (``data``, ``forward``, ``backward``,
            ``optimizer``; others allowed).
        collective_wait_seconds: time this rank spent waiting for collectives to complete on the
            critical path (after its own work was done), in seconds.
        step_seconds: wall time of the whole step in seconds.
        collectives: per-collective timings of this step.
        comm: communication summary for the step: ``total_seconds``, ``exposed_seconds``,
            ``bytes`` (and any extra numeric keys a hook adds, e.g. ``raw_bytes``).
        checksums: integer fingerprints (gradient integrity), exported nowhere, kept for detectors.
    """

    rank: int
    world_size: int
    step: int
    local_rank: int | None = None
    node: str | None = None
    phases: dict[str, float] = field(default_factory=dict)
    collective_wait_seconds: float | None = None
    step_seconds: float | None = None
    collectives: list[CollectiveTiming] = field(default_factory=list)
    comm: dict[str, float] = field(default_factory=dict)
    checksums: list[int] = field(default_factory=list)

    def encode(self) -> bytes:
        """Serialise to one datagram payload (compact JSON, UTF-8)."""
        doc: dict[str, Any] = {
            "v": WIRE_VERSION,
            "rank": self.rank,
            "world_size": self.world_size,
            "step": self.step,
        }
        if self.local_rank is not None:
            doc["local_rank"] = self.local_rank
        if self.node is not None:
            doc["node"] = self.node
        if self.phases:
            doc["phases"] = self.phases
        if self.collective_wait_seconds is not None:
            doc["collective_wait_seconds"] = self.collective_wait_seconds
        if self.step_seconds is not None:
            doc["step_seconds"] = self.step_seconds
        if self.collectives:
            doc["collectives"] = [
                {"op": c.op, "seconds": c.seconds, "bytes": c.bytes} for c in self.collectives
            ]
        if self.comm:
            doc["comm"] = self.comm
        if self.checksums:
            doc["checksums"] = self.checksums
        return json.dumps(doc, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, payload: bytes) -> StepRecord:
        """Parse and validate one datagram payload.

        Raises:
            RecordError: oversized, not JSON, unknown version, or a field of the wrong type or
                range (negative or non-finite durations, rank outside the world size...).
        """
        if len(payload) > MAX_DATAGRAM_BYTES:
            raise RecordError("oversized", f"{len(payload)} bytes > {MAX_DATAGRAM_BYTES}")
        try:
            doc = json.loads(payload)
        except (UnicodeDecodeError, ValueError) as exc:
            raise RecordError("not_json", str(exc)[:80]) from None
        if not isinstance(doc, dict):
            raise RecordError("not_json", "top level is not an object")
        if doc.get("v") != WIRE_VERSION:
            raise RecordError("version", f"unsupported version {doc.get('v')!r}")
        rank = _int(doc, "rank")
        world_size = _int(doc, "world_size")
        step = _int(doc, "step")
        if world_size < 1 or not 0 <= rank < world_size or step < 0:
            raise RecordError("schema", f"rank {rank} world_size {world_size} step {step}")
        local_rank = doc.get("local_rank")
        if local_rank is not None:
            local_rank = _int(doc, "local_rank")
        node = doc.get("node")
        if node is not None and (not isinstance(node, str) or len(node) > _MAX_NAME_LEN):
            raise RecordError("schema", "node must be a short string")
        phases = doc.get("phases", {})
        if not isinstance(phases, dict) or len(phases) > _MAX_PHASES:
            raise RecordError("schema", "phases must be a small object")
        checked_phases = {_name(k): _duration(v, k) for k, v in phases.items()}
        wait = doc.get("collective_wait_seconds")
        step_seconds = doc.get("step_seconds")
        collectives_doc = doc.get("collectives", [])
        if not isinstance(collectives_doc, list) or len(collectives_doc) > _MAX_COLLECTIVES:
            raise RecordError("schema", "collectives must be a short list")
        collectives = []
        for c in collectives_doc:
            if not isinstance(c, dict):
                raise RecordError("schema", "collective must be an object")
            nbytes = c.get("bytes", 0)
            if not isinstance(nbytes, int) or isinstance(nbytes, bool) or nbytes < 0:
                raise RecordError("schema", "collective bytes must be a non-negative int")
            collectives.append(
                CollectiveTiming(_name(c.get("op")), _duration(c.get("seconds"), "op"), nbytes)
            )
        comm = doc.get("comm", {})
        if not isinstance(comm, dict) or len(comm) > _MAX_PHASES:
            raise RecordError("schema", "comm must be a small object")
        checked_comm = {_name(k): _duration(v, k) for k, v in comm.items()}
        checksums = doc.get("checksums", [])
        if not isinstance(checksums, list) or not all(
            isinstance(x, int) and not isinstance(x, bool) for x in checksums
        ):
            raise RecordError("schema", "checksums must be a list of ints")
        return cls(
            rank=rank,
            world_size=world_size,
            step=step,
            local_rank=local_rank,
            node=node,
            phases=checked_phases,
            collective_wait_seconds=None if wait is None else _duration(wait, "wait"),
            step_seconds=None if step_seconds is None else _duration(step_seconds, "step"),
            collectives=collectives,
            comm=checked_comm,
            checksums=checksums,
        )


#: Most ranks whose scores one WindowReport carries; the sender keeps the highest scores.
MAX_REPORT_RANKS = 128
#: Most findings (raised or cleared) one WindowReport carries.
MAX_REPORT_FINDINGS = 16


@dataclass(slots=True)
class WindowReport:
    """What the in-job detectors concluded over one window of steps.

    Attributes:
        step: last step of the window.
        world_size: number of ranks in the job.
        scores: rank -> straggler score (dimensionless; 0 = typical, larger = slower; the
            detector documents its scale). At most :data:`MAX_REPORT_RANKS` entries.
        findings: finding dicts (:meth:`laggard.detectors.Finding.to_dict`) raised in the window,
            each with an optional ``"cleared": true`` when a finding ends.
        comm: job-level communication summary (same keys as ``StepRecord.comm``), optional.
        detector_stats: the detector's cumulative counters of windows and of bad input
            (``StragglerDetector.stats``: ``windows``, ``missing_rank_reports``,
            ``invalid_durations``...), name -> non-negative int; optional.
    """

    step: int
    world_size: int
    scores: dict[int, float] = field(default_factory=dict)
    findings: list[dict[str, Any]] = field(default_factory=list)
    comm: dict[str, float] = field(default_factory=dict)
    detector_stats: dict[str, int] = field(default_factory=dict)

    def encode(self) -> bytes:
        """Serialise to one datagram payload (compact JSON, UTF-8)."""
        doc: dict[str, Any] = {
            "v": WIRE_VERSION,
            "type": "window",
            "step": self.step,
            "world_size": self.world_size,
            "scores": {str(r): s for r, s in self.scores.items()},
            "findings": self.findings,
        }
        if self.comm:
            doc["comm"] = self.comm
        if self.detector_stats:
            doc["detector_stats"] = self.detector_stats
        return json.dumps(doc, separators=(",", ":"), default=str).encode()

    @classmethod
    def from_doc(cls, doc: dict[str, Any]) -> WindowReport:
        """Validate an already-parsed ``"type": "window"`` document.

        Raises:
            RecordError: a field of the wrong type or out of range.
        """
        step = _int(doc, "step")
        world_size = _int(doc, "world_size")
        if step < 0 or world_size < 1:
            raise RecordError("schema", "step and world_size out of range")
        scores_doc = doc.get("scores", {})
        if not isinstance(scores_doc, dict) or len(scores_doc) > MAX_REPORT_RANKS:
            raise RecordError("schema", "scores must be a small object")
        scores: dict[int, float] = {}
        for key, value in scores_doc.items():
            try:
                rank = int(key)
            except ValueError:
                raise RecordError("schema", "score keys must be ranks") from None
            if not 0 <= rank < world_size:
                raise RecordError("schema", f"rank {rank} outside world size")
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise RecordError("schema", "scores must be numbers")
            if not math.isfinite(value):
                raise RecordError("schema", "scores must be finite")
            scores[rank] = float(value)
        findings = doc.get("findings", [])
        if not isinstance(findings, list) or len(findings) > MAX_REPORT_FINDINGS:
            raise RecordError("schema", "findings must be a short list")
        for f in findings:
            if not isinstance(f, dict):
                raise RecordError("schema", "finding must be an object")
            for key in ("detector", "kind", "severity"):
                _name(f.get(key))
        comm = doc.get("comm", {})
        if not isinstance(comm, dict) or len(comm) > _MAX_PHASES:
            raise RecordError("schema", "comm must be a small object")
        checked_comm = {_name(k): _duration(v, k) for k, v in comm.items()}
        stats = doc.get("detector_stats", {})
        if not isinstance(stats, dict) or len(stats) > _MAX_PHASES:
            raise RecordError("schema", "detector_stats must be a small object")
        for key, value in stats.items():
            _name(key)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise RecordError("schema", "detector_stats values must be non-negative ints")
        return cls(step=step, world_size=world_size, scores=scores, findings=findings,
                   comm=checked_comm, detector_stats=dict(stats))


def decode_datagram(payload: bytes) -> StepRecord | WindowReport:
    """Parse one datagram into a :class:`StepRecord` or a :class:`WindowReport`.

    Raises:
        RecordError: see :meth:`StepRecord.decode`; ``reason`` is the rejection label.
    """
    if len(payload) > MAX_DATAGRAM_BYTES:
        raise RecordError("oversized", f"{len(payload)} bytes > {MAX_DATAGRAM_BYTES}")
    if b'"type":"window"' in payload or b'"type": "window"' in payload:
        try:
            doc = json.loads(payload)
        except (UnicodeDecodeError, ValueError) as exc:
            raise RecordError("not_json", str(exc)[:80]) from None
        if isinstance(doc, dict) and doc.get("type") == "window":
            if doc.get("v") != WIRE_VERSION:
                raise RecordError("version", f"unsupported version {doc.get('v')!r}")
            return WindowReport.from_doc(doc)
    return StepRecord.decode(payload)


def _int(doc: dict[str, Any], key: str) -> int:
    value = doc.get(key)
    if not isinstance(value, int) or isinstance(value, bool):
        raise RecordError("schema", f"{key} must be an int")
    return value


def _name(value: Any) -> str:
    if not isinstance(value, str) or not value or len(value) > _MAX_NAME_LEN:
        raise RecordError("schema", "names must be non-empty short strings")
    return value


def _duration(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise RecordError("schema", f"{what}: duration must be a number")
    value = float(value)
    if not math.isfinite(value) or value < 0:
        raise RecordError("schema", f"{what}: duration must be finite and >= 0")
    return value


def parse_address(address: str) -> tuple[str, int]:
    """Split ``host:port`` (``[v6]:port`` accepted) into host and port.

    Raises:
        ValueError: no port, or a port outside 0..65535.
    """
    host, sep, port_text = address.rpartition(":")
    if not sep or not port_text.isdigit() or int(port_text) > 65535:
        raise ValueError(f"address {address!r} is not host:port")
    return host.strip("[]") or "0.0.0.0", int(port_text)
