"""StepRecord: what one training rank reports to its node agent per step, and its wire format.

The wire format is one UTF-8 JSON object per datagram sent to the agent's socket (a Unix datagram
socket, :data:`DEFAULT_INTAKE_SOCKET`, by default; UDP on loopback optional,
:data:`DEFAULT_INTAKE_ADDRESS`), versioned by the ``"v"`` key::

    {"v": 1, "run": "train-42", "rank": 3, "world_size": 4, "local_rank": 3, "node": "node01",
     "step": 120, "uuid": "GPU-5d1c...", "pci_bus_id": "00000000:9B:00.0",
     "phases": {"data": 0.0012, "forward": 0.010, "backward": 0.021, "optimizer": 0.002},
     "collective_wait_seconds": 0.004, "step_seconds": 0.041,
     "collectives": [{"op": "allreduce", "seconds": 0.006, "bytes": 1048576}],
     "comm": {"total_seconds": 0.009, "exposed_seconds": 0.002, "bytes": 1048576},
     "checksums": [123, 456]}

JSON keeps the format readable as it travels (``tcpdump -A`` on the UDP intake) and lets older
agents skip keys they do not know; a step's record is a few hundred bytes, far under
:data:`MAX_DATAGRAM_BYTES`.
Durations are in seconds (float), sizes in bytes (int). Every field except ``v``, ``rank``,
``world_size`` and ``step`` is optional.

``run`` names the training run the rank belongs to (:func:`check_run`: at most
:data:`MAX_RUN_LEN` characters of :data:`RUN_ALPHABET`); the agent keeps each run's ranks apart
and labels their series with it. A record without one (an older sender) belongs to run ``""``.
``uuid`` and ``pci_bus_id`` name the rank's CUDA device (as NVML prints them), so that the agent
joins the rank to its GPU's series.

A second datagram type, ``{"v": 1, "type": "window", ...}`` (:class:`WindowReport`), is sent by
the rank that runs the in-job detectors (rank 0) once per detection window: straggler scores per
rank and the findings raised or cleared in that window. A datagram without ``"type"`` is a step.
A window report also carries, in ``"active"``, the findings that still hold (level, not edge: an
agent restarted mid-run has the run's verdict back within one window), and the sender's last one,
``"end": true``, says the run ended (its monitor closed): the agent ends its findings at once.

A rank batches its step records (``integrations/agent_reports.py``): one datagram of a
header line ``{"v": 1, "type": "batch", "run": ..., "rank": ..., "count": N, "dropped": D}``
and N records, one a line (:func:`encode_batch`, :func:`split_batch`), within
:data:`MAX_DATAGRAM_BYTES`: a node's ranks fill the agent's socket queue
(``net.unix.max_dgram_qlen`` datagrams, 10 by the kernel's default) N times slower.

A third, ``{"v": 1, "type": "heartbeat", ...}`` (:class:`Heartbeat`), is sent by every rank about
once a second from a thread of its own, whether or not the training thread makes progress: the
step and phase the training thread is in and since when, and per watched process group how far
the rank has issued and completed its collectives (:class:`GroupProgress`). A rank whose steps
stop while its heartbeats go on is *stalled*; one whose heartbeats stop too, while its process
lives, holds the GIL or is stuck in native code::

    {"v": 1, "type": "heartbeat", "run": "train-42", "rank": 3, "world_size": 8, "pid": 4242,
     "step": 4812, "phase": "data", "phase_seconds": 95.2, "step_seconds": 0.41,
     "groups": [{"group": "dp", "issued": 20536, "completed": 20536, "op": "allreduce",
                 "issued_age_seconds": 95.1, "completed_age_seconds": 95.1},
                {"group": "pp", "peer": 7, "issued": 301, "completed": 300, "op": "send",
                 "issued_age_seconds": 0.2, "completed_age_seconds": 0.3}]}
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

WIRE_VERSION = 1
#: Address of the agent's optional UDP intake, on loopback (ranks run on this node); the
#: default transport is the Unix datagram socket :data:`DEFAULT_INTAKE_SOCKET`.
DEFAULT_INTAKE_ADDRESS = "127.0.0.1:9478"
#: The agent's socket, its default intake: a Unix datagram socket (``laggard agent
#: --intake.socket``).
DEFAULT_INTAKE_SOCKET = "/run/laggard/intake.sock"
#: Environment variable naming the intake a training process sends to: the agent's socket
#: (``/run/laggard/intake.sock``, ``unix:PATH``) or the optional UDP ``host:port``.
INTAKE_ENV = "LAGGARD_INTAKE"
#: Largest datagram the agent accepts; anything larger is rejected as ``oversized``.
MAX_DATAGRAM_BYTES = 8192
#: Phase names with a meaning of their own; other names are accepted and exported as given.
STANDARD_PHASES = ("data", "forward", "backward", "optimizer", "collective_wait")
_MAX_PHASES = 16
_MAX_COLLECTIVES = 64
_MAX_NAME_LEN = 64
#: Longest run id accepted (a label value on every per-rank series: keep it short).
MAX_RUN_LEN = 64
#: Characters a run id may hold: letters, digits and ``_ . : - + = @ /`` (what Slurm, torchrun,
#: Kubernetes and uuid4 produce), nothing a person could mistake or a terminal interpret.
RUN_ALPHABET = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.:-+=@/")
#: Longest device identity string accepted (``GPU-`` + a 36-character UUID; MIG ids are longer).
_MAX_DEVICE_ID_LEN = 96
#: Deepest nesting of arrays and objects accepted. The format itself is 3 levels deep (a window
#: report's finding evidence a few more); the limit is checked before ``json.loads``, whose
#: recursion a few thousand ``[`` would otherwise exhaust.
MAX_JSON_DEPTH = 16
#: Largest rank or world size accepted (ranks are label values: keep them small integers).
MAX_RANKS_ON_WIRE = 1 << 24
#: Largest magnitude of any number accepted: every integer up to it is exact as a float, so
#: every counter and gauge built from it can be exported (Python ints beyond float range cannot).
MAX_WIRE_NUMBER = 1 << 53


class RecordError(ValueError):
    """A datagram that is not a valid StepRecord.

    Attributes:
        reason: short label for ``laggard_intake_rejected_total{reason}``: ``oversized``,
            ``too_deep``, ``not_json``, ``version``, ``schema``, ``range`` (a number outside its
            range: a rank outside ``[0, world_size)``, an integer too large to export),
            ``decoder_error`` (anything else the decoder raised).
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
        run: training run id (:func:`check_run`); ``""`` when the sender names none.
        uuid: the rank's CUDA device UUID as NVML prints it (``GPU-...``), if known.
        pci_bus_id: the rank's CUDA device PCI bus id (``00000000:9B:00.0``), if known.
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
    run: str = ""
    uuid: str | None = None
    pci_bus_id: str | None = None

    def encode(self) -> bytes:
        """Serialise to one datagram payload (compact JSON, UTF-8)."""
        doc: dict[str, Any] = {
            "v": WIRE_VERSION,
            "rank": self.rank,
            "world_size": self.world_size,
            "step": self.step,
        }
        if self.run:
            doc["run"] = self.run
        if self.local_rank is not None:
            doc["local_rank"] = self.local_rank
        if self.node is not None:
            doc["node"] = self.node
        if self.uuid is not None:
            doc["uuid"] = self.uuid
        if self.pci_bus_id is not None:
            doc["pci_bus_id"] = self.pci_bus_id
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
            RecordError: oversized, too deep, not JSON, unknown version, a window report, or a
                field of the wrong type or range (negative or non-finite durations, rank outside
                the world size...).
        """
        item = decode_datagram(payload)
        if not isinstance(item, StepRecord):
            raise RecordError("schema", f"a {type(item).__name__}, not a step record")
        return item

    @classmethod
    def from_doc(cls, doc: dict[str, Any]) -> StepRecord:
        """Validate an already-parsed step document (version already checked).

        Raises:
            RecordError: a field of the wrong type or out of range.
        """
        run, world_size, rank, step = _rank_identity(doc)
        uuid, pci_bus_id = _device_id(doc, "uuid"), _device_id(doc, "pci_bus_id")
        local_rank = doc.get("local_rank")
        if local_rank is not None:
            local_rank = _int(doc, "local_rank", 0, MAX_RANKS_ON_WIRE)
        node = _node(doc)
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
            nbytes = _int(c, "bytes", 0, MAX_WIRE_NUMBER) if "bytes" in c else 0
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
        # Fingerprints are 64-bit words, signed or not; anything wider is not one.
        if any(not -(1 << 63) <= x < (1 << 64) for x in checksums):
            raise RecordError("range", "checksums must fit in 64 bits")
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
            run=run,
            uuid=uuid,
            pci_bus_id=pci_bus_id,
        )


#: Most ranks whose scores one WindowReport carries; the sender keeps the highest scores.
MAX_REPORT_RANKS = 128
#: Most findings (raised or cleared) one WindowReport carries; as many active ones
#: (``WindowReport.active``).
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
        run: training run id (:func:`check_run`); ``""`` when the sender names none.
        active: finding dicts that still hold at the end of the window (raised in it or
            before, not cleared since), at most :data:`MAX_REPORT_FINDINGS`; none cleared. Sent
            with every window, so the agent's verdict is a level: an agent that missed the
            raise (restarted) has it back; one that has it already changes nothing.
        end: the run ended (the sender's monitor closed): the agent ends the run's active
            findings. Such a report carries no scores or findings.
    """

    step: int
    world_size: int
    scores: dict[int, float] = field(default_factory=dict)
    findings: list[dict[str, Any]] = field(default_factory=list)
    comm: dict[str, float] = field(default_factory=dict)
    detector_stats: dict[str, int] = field(default_factory=dict)
    run: str = ""
    active: list[dict[str, Any]] = field(default_factory=list)
    end: bool = False

    def encode(self) -> bytes:
        """Serialise to one datagram payload (compact JSON, UTF-8)."""
        doc: dict[str, Any] = {
            "v": WIRE_VERSION,
            "type": "window",
            **({"run": self.run} if self.run else {}),
            "step": self.step,
            "world_size": self.world_size,
            "scores": {str(r): s for r, s in self.scores.items()},
            "findings": self.findings,
        }
        if self.comm:
            doc["comm"] = self.comm
        if self.detector_stats:
            doc["detector_stats"] = self.detector_stats
        # Only when set: an older agent ignores keys it does not know.
        if self.active:
            doc["active"] = self.active
        if self.end:
            doc["end"] = True
        return json.dumps(doc, separators=(",", ":"), default=str).encode()

    @classmethod
    def from_doc(cls, doc: dict[str, Any]) -> WindowReport:
        """Validate an already-parsed ``"type": "window"`` document.

        Raises:
            RecordError: a field of the wrong type or out of range.
        """
        run = check_run(doc.get("run", ""))
        step = _int(doc, "step", 0, MAX_WIRE_NUMBER)
        world_size = _int(doc, "world_size", 1, MAX_RANKS_ON_WIRE)
        scores_doc = doc.get("scores", {})
        if not isinstance(scores_doc, dict) or len(scores_doc) > MAX_REPORT_RANKS:
            raise RecordError("schema", "scores must be a small object")
        scores: dict[int, float] = {}
        for key, value in scores_doc.items():
            if not (isinstance(key, str) and key.isdigit() and len(key) <= 8):
                raise RecordError("schema", "score keys must be ranks")
            rank = int(key)
            if not 0 <= rank < world_size:
                raise RecordError("range", f"rank {rank} outside world size")
            scores[rank] = _number(value, "score")
        findings = _findings(doc, "findings", world_size)
        active = _findings(doc, "active", world_size)
        if any(f.get("cleared") for f in active):
            raise RecordError("schema", "an active finding is not cleared")
        end = doc.get("end", False)
        if not isinstance(end, bool):
            raise RecordError("schema", "end must be true or false")
        comm = doc.get("comm", {})
        if not isinstance(comm, dict) or len(comm) > _MAX_PHASES:
            raise RecordError("schema", "comm must be a small object")
        checked_comm = {_name(k): _duration(v, k) for k, v in comm.items()}
        stats = doc.get("detector_stats", {})
        if not isinstance(stats, dict) or len(stats) > _MAX_PHASES:
            raise RecordError("schema", "detector_stats must be a small object")
        for key in stats:
            _name(key)
            _int(stats, key, 0, MAX_WIRE_NUMBER)
        return cls(step=step, world_size=world_size, scores=scores, findings=findings,
                   comm=checked_comm, detector_stats=dict(stats), run=run, active=active,
                   end=end)


def _findings(doc: dict[str, Any], key: str, world_size: int) -> list[dict[str, Any]]:
    """A window report's list of finding dicts under ``key`` (``findings``, ``active``),
    checked: at most :data:`MAX_REPORT_FINDINGS`, each with a detector, kind and severity, a
    rank of this job or none (a job-level finding).

    Raises:
        RecordError: ``schema`` or ``range``.
    """
    findings = doc.get(key, [])
    if not isinstance(findings, list) or len(findings) > MAX_REPORT_FINDINGS:
        raise RecordError("schema", f"{key} must be a short list")
    for f in findings:
        if not isinstance(f, dict):
            raise RecordError("schema", "finding must be an object")
        for name in ("detector", "kind", "severity"):
            _name(f.get(name))
        if f.get("rank") is not None:
            _int(f, "rank", 0, world_size - 1)
        if f.get("step") is not None:
            _int(f, "step", 0, MAX_WIRE_NUMBER)
    return findings


#: The ``phase`` of a rank's last heartbeat, sent when its monitor closes: nothing more will
#: come, and the agent lets the rank expire instead of keeping it as stalled.
CLOSED_PHASE = "closed"
#: Most group entries (collective groups and P2P pairs) one Heartbeat carries.
MAX_HEARTBEAT_GROUPS = 32
#: Decimals of the ages a heartbeat and a hang-store key carry: a millisecond is finer than any
#: hang or stall threshold, and keeps a key near 150 bytes.
AGE_DECIMALS = 3


def group_desc(group: str) -> str:
    """What a person calls a group, from its key on the wire (``GroupProgress.group``):
    ``dp:3`` -> ``dp``; a key without ``:`` (``pg3``) as it is."""
    return group.rsplit(":", 1)[0] if ":" in group else group


def round_age(value: float | None) -> float | None:
    """An age or duration as the heartbeat and the hang-store key carry it: seconds rounded to
    :data:`AGE_DECIMALS` decimals (a millisecond); None stays None."""
    return None if value is None else round(value, AGE_DECIMALS)


@dataclass(frozen=True, slots=True)
class GroupProgress:
    """How far one rank has issued and completed the collectives of one process group.

    The counters are the rank's own: a sequence number per group, incremented at every
    collective the rank issues in it, the same on every member that issued the same collectives
    (as ``collective_seq_id`` in PyTorch's flight recorder). For point-to-point traffic (a
    pipeline group) they count one *pair* only (``peer`` set): send/recv sequence numbers are
    per pair and their completion is not a watermark, so they are never compared across all
    members of the group (see ``../shared/ENVIRONMENT.md``, flight-recorder format facts).

    Attributes:
        group: the group's key, the same on every member and unique in the job (the tracer's
            :attr:`~laggard.integrations.trace_records.GroupInfo.key`: ``dp:3``, ``pg3``...;
            :func:`group_desc` gives what a person calls it).
        issued: sequence number of the last collective this rank issued in the group (0: none).
        completed: collectives of the group completed on this rank, in issue order (the
            highest ``n`` such that collectives ``1..n`` all completed); ``completed <= issued``.
        op: the last issued collective's op (``allreduce``, ``send``...), if any.
        issued_age_seconds: seconds since the last collective was issued, on the sender's
            monotonic clock; None when none was.
        completed_age_seconds: seconds since the last completion; None when none was.
        peer: for a P2P pair, the other rank (global); None for a collective group.
    """

    group: str
    issued: int
    completed: int
    op: str | None = None
    issued_age_seconds: float | None = None
    completed_age_seconds: float | None = None
    peer: int | None = None

    @property
    def pending(self) -> int:
        """Collectives issued and not completed (``issued - completed``)."""
        return self.issued - self.completed

    def rounded(self) -> GroupProgress:
        """This entry as a heartbeat carries it: a plain :class:`GroupProgress` (a subclass's
        extra fields dropped) with its ages to the millisecond (:func:`round_age`)."""
        return GroupProgress(group=self.group, issued=self.issued, completed=self.completed,
                             op=self.op, issued_age_seconds=round_age(self.issued_age_seconds),
                             completed_age_seconds=round_age(self.completed_age_seconds),
                             peer=self.peer)

    def to_doc(self) -> dict[str, Any]:
        """The JSON object of this entry (optional fields left out when unset)."""
        doc: dict[str, Any] = {"group": self.group, "issued": self.issued,
                               "completed": self.completed}
        for key in ("op", "issued_age_seconds", "completed_age_seconds", "peer"):
            value = getattr(self, key)
            if value is not None:
                doc[key] = value
        return doc

    @classmethod
    def from_doc(cls, doc: Any, world_size: int) -> GroupProgress:
        """Validate one ``groups`` entry of a heartbeat.

        Raises:
            RecordError: ``schema`` for a missing or mistyped field, ``range`` for a counter out
                of range (``completed > issued``, a peer outside the world size).
        """
        if not isinstance(doc, dict):
            raise RecordError("schema", "group progress must be an object")
        issued = _int(doc, "issued", 0, MAX_WIRE_NUMBER)
        completed = _int(doc, "completed", 0, issued)
        op = doc.get("op")
        ages = [doc.get(k) for k in ("issued_age_seconds", "completed_age_seconds")]
        peer = doc.get("peer")
        return cls(
            group=_name(doc.get("group")),
            issued=issued,
            completed=completed,
            op=None if op is None else _name(op),
            issued_age_seconds=None if ages[0] is None else _duration(ages[0], "age"),
            completed_age_seconds=None if ages[1] is None else _duration(ages[1], "age"),
            peer=None if peer is None else _int(doc, "peer", 0, world_size - 1),
        )


@dataclass(slots=True)
class Heartbeat:
    """A rank's liveness and collective progress, sent about once a second off the training thread.

    Attributes:
        rank: global rank, 0 <= rank < world_size.
        world_size: number of ranks in the job.
        step: the step the training thread is in (the last one it began), 0 before the first.
        run: training run id (:func:`check_run`); ``""`` when the sender names none.
        pid: the sending process' id (the agent checks ``/proc/PID`` when heartbeats stop);
            None when unknown.
        node: host name of this rank, if known.
        phase: the phase the training thread is in (``data``, ``forward``, ``backward``,
            ``optimizer``, ``collective_wait``, ``outside``: between steps), if known.
        phase_seconds: seconds the training thread has been in ``phase``.
        step_seconds: the rank's typical step time (seconds; the median of its recent steps),
            from which a stall threshold is set; None before the first steps.
        groups: progress per watched group and P2P pair, at most :data:`MAX_HEARTBEAT_GROUPS`.
    """

    rank: int
    world_size: int
    step: int
    run: str = ""
    pid: int | None = None
    node: str | None = None
    phase: str | None = None
    phase_seconds: float | None = None
    step_seconds: float | None = None
    groups: list[GroupProgress] = field(default_factory=list)

    def encode(self) -> bytes:
        """Serialise to one datagram payload (compact JSON, UTF-8)."""
        doc: dict[str, Any] = {"v": WIRE_VERSION, "type": "heartbeat"}
        if self.run:
            doc["run"] = self.run
        doc.update(rank=self.rank, world_size=self.world_size, step=self.step)
        for key in ("pid", "node", "phase", "phase_seconds", "step_seconds"):
            value = getattr(self, key)
            if value is not None:
                doc[key] = value
        if self.groups:
            doc["groups"] = [g.to_doc() for g in self.groups]
        return json.dumps(doc, separators=(",", ":")).encode()

    @classmethod
    def from_doc(cls, doc: dict[str, Any]) -> Heartbeat:
        """Validate an already-parsed ``"type": "heartbeat"`` document.

        Raises:
            RecordError: a field of the wrong type or out of range.
        """
        run, world_size, rank, step = _rank_identity(doc)
        pid = None if doc.get("pid") is None else _int(doc, "pid", 1, (1 << 31) - 1)
        node = _node(doc)
        phase = doc.get("phase")
        phase_seconds, step_seconds = doc.get("phase_seconds"), doc.get("step_seconds")
        groups_doc = doc.get("groups", [])
        if not isinstance(groups_doc, list) or len(groups_doc) > MAX_HEARTBEAT_GROUPS:
            raise RecordError("schema", "groups must be a short list")
        return cls(
            rank=rank,
            world_size=world_size,
            step=step,
            run=run,
            pid=pid,
            node=node,
            phase=None if phase is None else _name(phase),
            phase_seconds=None if phase_seconds is None else _duration(phase_seconds, "phase"),
            step_seconds=None if step_seconds is None else _duration(step_seconds, "step"),
            groups=[GroupProgress.from_doc(g, world_size) for g in groups_doc],
        )


def check_run(value: Any) -> str:
    """Validate a run id from the wire.

    Args:
        value: the ``run`` field as decoded from JSON.

    Returns:
        ``value``: a string of at most :data:`MAX_RUN_LEN` characters of :data:`RUN_ALPHABET`
        (``""`` included: no run named).

    Raises:
        RecordError: ``run_charset`` when it is not a string or holds another character
            (a control character, a space, a quote), ``run_length`` when it is longer.
    """
    if not isinstance(value, str):
        raise RecordError("run_charset", "run must be a string")
    if len(value) > MAX_RUN_LEN:
        raise RecordError("run_length", f"run id of {len(value)} characters > {MAX_RUN_LEN}")
    if not RUN_ALPHABET.issuperset(value):
        raise RecordError("run_charset", "run id holds characters outside [A-Za-z0-9_.:-+=@/]")
    return value


def sanitise_run(text: str) -> str:
    """Turn any text into a run id :func:`check_run` accepts (the sending side's counterpart).

    Characters outside :data:`RUN_ALPHABET` become ``_``; a result longer than
    :data:`MAX_RUN_LEN` keeps its first 55 characters and appends ``-`` and 8 hex digits of the
    SHA-1 of the whole text, so two long ids that share a prefix stay two runs.

    Args:
        text: a run id from a config or the environment.

    Returns:
        A valid run id (``""`` for ``""``).
    """
    cleaned = "".join(c if c in RUN_ALPHABET else "_" for c in text)
    if len(cleaned) <= MAX_RUN_LEN:
        return cleaned
    digest = hashlib.sha1(text.encode("utf-8", "surrogatepass")).hexdigest()[:8]
    return f"{cleaned[:MAX_RUN_LEN - 9]}-{digest}"


def _device_id(doc: dict[str, Any], key: str) -> str | None:
    """An optional device identity string (UUID, PCI bus id): short and printable."""
    value = doc.get(key)
    if value is None:
        return None
    if (not isinstance(value, str) or not value or len(value) > _MAX_DEVICE_ID_LEN
            or not value.isascii() or not value.isprintable()):
        raise RecordError("schema", f"{key} must be a short printable string")
    return value


def decode_datagram(payload: bytes) -> StepRecord | WindowReport | Heartbeat:
    """Parse one datagram into a :class:`StepRecord`, a :class:`WindowReport` or a
    :class:`Heartbeat`.

    Total: whatever the bytes, it returns a record or raises :class:`RecordError`, never
    anything else (the intake thread counts the reason and goes on).

    Raises:
        RecordError: ``reason`` is the rejection label (see :class:`RecordError`).
    """
    try:
        return _decode(payload)
    except RecordError:
        raise
    except Exception as exc:  # noqa: BLE001 - a decoder bug must cost one datagram, not the intake
        raise RecordError("decoder_error", f"{type(exc).__name__}: {exc}"[:120]) from None


def _decode(payload: bytes) -> StepRecord | WindowReport | Heartbeat:
    if len(payload) > MAX_DATAGRAM_BYTES:
        raise RecordError("oversized", f"{len(payload)} bytes > {MAX_DATAGRAM_BYTES}")
    if json_depth(payload) > MAX_JSON_DEPTH:
        raise RecordError("too_deep", f"nested deeper than {MAX_JSON_DEPTH}")
    try:
        doc = json.loads(payload)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise RecordError("not_json", str(exc)[:80]) from None
    if not isinstance(doc, dict):
        raise RecordError("not_json", "top level is not an object")
    if doc.get("v") != WIRE_VERSION:
        raise RecordError("version", f"unsupported version {str(doc.get('v'))[:20]}")
    kind = doc.get("type")
    if kind == "window":
        return WindowReport.from_doc(doc)
    if kind == "heartbeat":
        return Heartbeat.from_doc(doc)
    if kind is not None:
        raise RecordError("schema", f"unknown datagram type {str(kind)[:20]}")
    return StepRecord.from_doc(doc)


#: Most records one batch datagram carries (a batch is also bounded by
#: :data:`MAX_DATAGRAM_BYTES`; ~20 step records of ~400 bytes fill it first).
MAX_BATCH_ITEMS = 64
#: The ``type`` of a batch's header line.
BATCH_TYPE = "batch"


@dataclass(frozen=True, slots=True)
class BatchHeader:
    """The first line of a batch datagram (:func:`encode_batch`).

    Attributes:
        run: the sender's run id (:func:`check_run`).
        rank: the sender's global rank (>= 0).
        count: records in the batch, 1 to :data:`MAX_BATCH_ITEMS`.
        dropped: records this sender dropped so far (its queue to the agent full: ``EAGAIN``),
            cumulative, so the agent counts the sender's losses too (a later batch tells it).
    """

    run: str
    rank: int
    count: int
    dropped: int


def encode_batch(items: list[bytes], *, run: str, rank: int, dropped: int) -> bytes:
    """One datagram carrying several encoded records: a header line, then one record a line::

        {"v":1,"type":"batch","run":"train-42","rank":3,"count":2,"dropped":0}
        {"v":1,"rank":3,"world_size":4,"step":120,...}
        {"v":1,"rank":3,"world_size":4,"step":121,...}

    Compact JSON holds no raw newline (``json.dumps`` escapes one inside a string), so a newline
    ends a record. An agent before batches rejects the datagram as ``not_json`` (counted).

    Args:
        items: encoded records (:meth:`StepRecord.encode`...), none a batch, at most
            :data:`MAX_BATCH_ITEMS`.
        run, rank: the sender's identity; dropped: see :class:`BatchHeader`.

    Raises:
        ValueError: no items, too many, or one holding a newline.
    """
    if not 1 <= len(items) <= MAX_BATCH_ITEMS or any(b"\n" in item for item in items):
        raise ValueError(f"a batch holds 1 to {MAX_BATCH_ITEMS} one-line records")
    header = json.dumps({"v": WIRE_VERSION, "type": BATCH_TYPE, "run": run, "rank": rank,
                         "count": len(items), "dropped": dropped}, separators=(",", ":"))
    return b"\n".join([header.encode(), *items])


def split_batch(payload: bytes) -> tuple[BatchHeader, list[bytes]] | None:
    """The header and records of a batch datagram; None for any other datagram.

    A datagram is a batch when its first line is a JSON object whose ``type`` is ``"batch"``;
    each record is then decoded on its own (:func:`decode_datagram`, where a nested batch is an
    unknown type), so a bad record costs itself, not its batch.

    Total like :func:`decode_datagram`: returns or raises :class:`RecordError`.

    Raises:
        RecordError: a malformed batch: ``oversized``, ``version``, ``schema`` (a count that is
            not the number of records, out of ``[1, MAX_BATCH_ITEMS]``, an empty record),
            ``range``, ``run_charset`` / ``run_length``, ``decoder_error``.
    """
    end = payload.find(b"\n")
    if end < 0:
        return None
    try:
        return _split_batch(payload, end)
    except RecordError:
        raise
    except Exception as exc:  # noqa: BLE001 - a decoder bug must cost one datagram
        raise RecordError("decoder_error", f"{type(exc).__name__}: {exc}"[:120]) from None


def _split_batch(payload: bytes, end: int) -> tuple[BatchHeader, list[bytes]] | None:
    first = payload[:end]
    if json_depth(first) > 1:
        return None  # not a header: the whole datagram goes to decode_datagram
    try:
        doc = json.loads(first)
    except (UnicodeDecodeError, ValueError):
        return None
    if not isinstance(doc, dict) or doc.get("type") != BATCH_TYPE:
        return None
    if len(payload) > MAX_DATAGRAM_BYTES:
        raise RecordError("oversized", f"{len(payload)} bytes > {MAX_DATAGRAM_BYTES}")
    if doc.get("v") != WIRE_VERSION:
        raise RecordError("version", f"unsupported batch version {str(doc.get('v'))[:20]}")
    items = payload[end + 1:].split(b"\n")
    count = _int(doc, "count", 1, MAX_BATCH_ITEMS)
    if count != len(items) or not all(items):
        raise RecordError("schema", f"batch count {count} is not its {len(items)} records")
    header = BatchHeader(run=check_run(doc.get("run", "")),
                         rank=_int(doc, "rank", 0, MAX_RANKS_ON_WIRE),
                         count=count, dropped=_int(doc, "dropped", 0, MAX_WIRE_NUMBER))
    return header, items


# A JSON string (escapes included): brackets inside strings do not nest.
_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.S)
_NOT_BRACKETS = bytes(c for c in range(256) if c not in b"[]{}")


def json_depth(payload: bytes, limit: int = MAX_JSON_DEPTH) -> int:
    """Nesting depth of arrays and objects in ``payload``, found without parsing it.

    Strings are cut out, then empty ``[]`` / ``{}`` pairs removed, one level per pass (C-speed
    byte replaces, at most ``limit`` passes), so even a datagram full of brackets costs well
    under a millisecond.

    Args:
        payload: candidate JSON text.
        limit: deepest nesting of interest.

    Returns:
        The depth when it is at most ``limit``; ``limit + 1`` when the payload nests deeper or its
        brackets do not pair up (either way ``json.loads`` must not see it).
    """
    if payload.count(b"[") + payload.count(b"{") <= limit:
        return payload.count(b"[") + payload.count(b"{")  # an upper bound within the limit
    brackets = _JSON_STRING.sub(b"", payload).translate(None, _NOT_BRACKETS)
    if b"[" * (limit + 1) in brackets or b"{" * (limit + 1) in brackets:
        return limit + 1
    for depth in range(limit + 1):
        if not brackets:
            return depth
        # Empty pairs become a marker first, so that a pair they leave behind waits for the
        # next pass: exactly one level per pass, both kinds.
        reduced = brackets.replace(b"[]", b"\0").replace(b"{}", b"\0").replace(b"\0", b"")
        if reduced == brackets:  # brackets left that do not pair up
            break
        brackets = reduced
    return limit + 1


def _rank_identity(doc: dict[str, Any]) -> tuple[str, int, int, int]:
    """A per-rank datagram's ``run``, ``world_size``, ``rank`` and ``step``, validated."""
    run = check_run(doc.get("run", ""))
    world_size = _int(doc, "world_size", 1, MAX_RANKS_ON_WIRE)
    return (run, world_size, _int(doc, "rank", 0, world_size - 1),
            _int(doc, "step", 0, MAX_WIRE_NUMBER))


def _node(doc: dict[str, Any]) -> str | None:
    """The optional ``node``: a short string."""
    node = doc.get("node")
    if node is not None and (not isinstance(node, str) or len(node) > _MAX_NAME_LEN):
        raise RecordError("schema", "node must be a short string")
    return node


def _int(doc: dict[str, Any], key: str, low: int, high: int) -> int:
    value = doc.get(key)
    if not isinstance(value, int) or isinstance(value, bool):
        raise RecordError("schema", f"{key} must be an int")
    if not low <= value <= high:
        raise RecordError("range", f"{key} outside [{low}, {high}]")
    return value


def _number(value: Any, what: str) -> float:
    """A finite number of magnitude at most :data:`MAX_WIRE_NUMBER`, as a float."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise RecordError("schema", f"{what}: must be a number")
    if isinstance(value, int) and abs(value) > MAX_WIRE_NUMBER:
        raise RecordError("range", f"{what}: too large")
    value = float(value)
    if not math.isfinite(value) or abs(value) > MAX_WIRE_NUMBER:
        raise RecordError("range", f"{what}: must be finite and at most 2**53")
    return value


def _name(value: Any) -> str:
    if not isinstance(value, str) or not value or len(value) > _MAX_NAME_LEN:
        raise RecordError("schema", "names must be non-empty short strings")
    return value


def _duration(value: Any, what: str) -> float:
    value = _number(value, what)
    if value < 0:
        raise RecordError("range", f"{what}: must be >= 0")
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


def decode_items(payload: bytes) -> list[StepRecord | WindowReport | Heartbeat]:
    """Every item one datagram carries: a batch's records (:func:`split_batch`) in order, or
    the one item of any other datagram (:func:`decode_datagram`). For readers of the wire
    outside the agent (a capture, a test's sink), which see batches as the agent does.

    Raises:
        RecordError: a malformed datagram, batch or record in it (the agent, unlike this
            function, skips a bad record of a batch and keeps the others).
    """
    batch = split_batch(payload)
    if batch is None:
        return [decode_datagram(payload)]
    return [decode_datagram(line) for line in batch[1]]

