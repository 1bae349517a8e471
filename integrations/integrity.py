"""Gradient integrity inside the job: fingerprints of every gradient collective, a replica check
of the parameters, and what to do when they disagree (``warn``, ``skip_step``, ``raise``).

Per gradient bucket and step, the communication hook records (comparison and the floating-point
bound: :mod:`laggard.detectors.integrity`):

* before sending: a float64 sum and a float64 sum of magnitudes of the payload (for the linear
  sum check), or the hash of its exact bytes for integer payloads (sign bits, top-k indices);
* after the collective: the hash of the result, its float64 sum, per-chunk hashes of gathered
  payloads;
* NaN and Inf counts of the payload and of the result;
* every ``replica_every`` steps, the hash of all parameters.

The records of a window travel as one fixed-size int64 vector per rank in the training monitor's
per-window ``all_gather`` (:meth:`GradientIntegrity.window_vector`), or, standalone, in a small
``all_gather`` of this object's own every ``gather_every`` steps. Every rank runs the detector on
the gathered matrix, so every rank reaches the same verdict and the ``skip_step`` and ``raise``
policies act alike everywhere.

Usage with the plain averaging all-reduce::

    integrity = GradientIntegrity(GradientIntegrity.Config(policy="skip_step"))
    ddp.register_comm_hook(IntegrityHookState(integrity), integrity_allreduce_hook)
    for batch in loader:
        loss_fn(ddp(x), y).backward()
        if integrity.end_step(ddp):           # False on every rank: drop this update
            opt.step()
        opt.zero_grad()

and with a compressor of :func:`laggard.compression.make_hook`, which hands its
exact payloads to :meth:`GradientIntegrity.allgather_sent` and friends when given
``integrity=``; ``with_integrity(hook)`` adds the hash of the averaged result and the NaN/Inf
counts of the local gradients (for any hook)::

    state, hook = make_hook("topk", integrity=integrity)
    ddp.register_comm_hook(IntegrityHookState(integrity, state), with_integrity(hook))

To carry the fingerprints in the training monitor's window gather instead of gathering them
here, pass ``TrainingMonitor.Config(integrity=integrity)`` and keep ``gather_every=0``.

On a device (CUDA) the hooks read nothing back to the host: records are read one window late,
never waited for, except by ``skip_step`` (:mod:`laggard.integrations.integrity_records`).

The rooms: the fingerprint kernels (hash, float64 sums, NaN/Inf counts) are
:mod:`laggard.integrations.integrity_fingerprints`; a record whose words are still on the device,
:mod:`laggard.integrations.integrity_records`; the DDP hook wrappers,
:mod:`laggard.integrations.integrity_hooks` (their names are importable from here too, the
public entry); this module holds :class:`GradientIntegrity`, which records and checks, its
:class:`IntegrityError` and :class:`IntegrityParticipant`, which rides the monitor's gather.
"""

from __future__ import annotations

import collections
import logging
import math
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from laggard.detectors.finding import Finding
from laggard.detectors.integrity import (
    F_INF_RECV,
    F_INF_SENT,
    F_NAN_RECV,
    F_NAN_SENT,
    F_NUMEL,
    F_RECV_A,
    F_RECV_B,
    F_RECV_C,
    F_SENT_A,
    F_SENT_B,
    F_SENT_C,
    OPS,
    RECORD_WORDS,
    IntegrityDetector,
    bits_of,
    chunk_sums,
    encode_window,
    to_int64,
    window_words,
)
from laggard.detectors.window import WindowColumn, WindowRecord
from laggard.integrations.device_reads import on_host
from laggard.integrations.integrity_fingerprints import (
    bits_tensor,
    device_pair,
    fingerprint,
    fingerprint_tensor,
    float64_sum_tensors,
    float64_sums,
    nonfinite_count_tensor,
    nonfinite_counts,
    row_fingerprints,
)
from laggard.integrations.integrity_hooks import (
    IntegrityHookState,
    integrity_allreduce_hook,
    with_integrity,
)
from laggard.integrations.integrity_records import ChunkHashes, DeviceRecord
from laggard.integrations.participants import StopJob, WindowOutcome, WindowParticipant
from laggard.log_once import LogOnce

if TYPE_CHECKING:
    from laggard.integrations.faults import BitFlipInjector

log = logging.getLogger(__name__)

POLICIES = ("warn", "skip_step", "raise")
_DTYPE_CODES = {torch.float32: 1, torch.float16: 2, torch.bfloat16: 3, torch.float64: 4}


class IntegrityError(StopJob):
    """Raised on every rank by the ``raise`` policy when a check finds corruption (a
    :class:`~laggard.integrations.participants.StopJob`: the monitor reports it, then lets it
    through).

    Attributes:
        findings: the critical findings.
    """

    def __init__(self, findings: list[Finding]) -> None:
        super().__init__("; ".join(f.message for f in findings[:3]), findings)


# ---------------------------------------------------------------------------- the recorder
class GradientIntegrity:
    """Per-rank recorder of fingerprints, replica checks and the policy (module docstring).

    Thread-safe: hooks record on the autograd thread and in collective callbacks. Failures of
    the recorder itself are counted in :attr:`errors` and logged once; only the ``raise`` policy
    raises into the training loop, and only :class:`IntegrityError`.

    Args:
        config: see :class:`GradientIntegrity.Config`.
        process_group: the data-parallel group the gradients are reduced over (default: WORLD).
            The replica check and the standalone gathers run on it; it must be able to
            all-gather CPU int64 tensors (gloo, or a device-mixed group).
        injector: a :class:`~laggard.integrations.faults.BitFlipInjector` to test the checks.

    Raises:
        ValueError: an invalid configuration.

    Attributes:
        step: the step being recorded (advanced by :meth:`end_step`).
        findings: corruption and check-fault findings so far (newest 256).
        skipped_steps: steps whose update was dropped by ``skip_step``.
        errors: the recorder's own failures (a bug; never raised).
        detector: the :class:`~laggard.detectors.integrity.IntegrityDetector`.
    """

    @dataclass(kw_only=True, slots=True)
    class Config:
        """Configuration of :class:`GradientIntegrity`."""

        policy: str = "warn"
        """``warn`` (log findings), ``skip_step`` (every rank drops the update of a step with a
        corrupt gradient; needs a verdict every step, so it gathers every step), ``raise``
        (raise :class:`IntegrityError` on every rank)."""

        replica_every: int = 100
        """Steps between replica checks of all parameters; 0 turns them off."""

        gather_every: int = 0
        """Standalone: gather and check every this many steps in :meth:`end_step`. 0: the
        training monitor carries the fingerprints in its window gather. ``skip_step`` forces 1."""

        max_records: int = 256
        """Records one window vector holds (16 int64 each); more are dropped and reported."""

        sum_check: bool = True
        """Take the float64 sums of all-reduce payloads (one extra read of each bucket)."""

        def __post_init__(self) -> None:
            if self.policy not in POLICIES:
                raise ValueError(f"policy {self.policy!r} not in {POLICIES}")
            if self.replica_every < 0 or self.gather_every < 0:
                raise ValueError("replica_every and gather_every must be >= 0")
            if self.max_records < 1:
                raise ValueError("max_records must be >= 1")
            if self.policy == "skip_step":
                self.gather_every = 1

    def __init__(self, config: GradientIntegrity.Config | None = None, *,
                 process_group: dist.ProcessGroup | None = None,
                 injector: BitFlipInjector | None = None) -> None:
        self.config = config if config is not None else GradientIntegrity.Config()
        self.process_group = process_group
        initialised = dist.is_available() and dist.is_initialized()
        self.rank = dist.get_rank(process_group) if initialised else 0
        self.world_size = dist.get_world_size(process_group) if initialised else 1
        self.injector = injector
        self.step = 0
        self.skipped_steps = 0
        self.errors = 0
        self.detector = IntegrityDetector()
        self.findings: collections.deque[Finding] = collections.deque(maxlen=256)
        self._records: list[list[int] | DeviceRecord] = []
        # sent-side fields wait here, keyed (step, bucket, stage, op), until the receive side
        # completes the record: one row per collective
        self._sent: dict[tuple[int, int, int, str], dict[Any, Any]] = {}
        self._dropped = 0
        # device records of the last window, read at the next window_vector (one window late)
        self._held: list[DeviceRecord] = []
        #: records left out because their device copy had not completed by their gather
        self.pending_records = 0
        self._lock = threading.Lock()
        self._log_once = LogOnce(log)

    # ------------------------------------------------------------------ hook-side API
    def allreduce_sent(self, bucket: int, payload: torch.Tensor, stage: int = 0) -> None:
        """Fingerprint a payload about to be summed by an all-reduce, then apply a
        ``before_send`` fault if one is due. Call right before launching the collective."""
        self._guard(self._allreduce_sent, bucket, payload, stage)
        self.inject("before_send", bucket, payload, stage)

    def allreduce_received(self, bucket: int, result: torch.Tensor, stage: int = 0) -> None:
        """Fingerprint the result of that all-reduce (call once it completed)."""
        self._guard(self._allreduce_received, bucket, result, stage)

    def allgather_sent(self, bucket: int, payload: torch.Tensor, stage: int = 0) -> None:
        """Hash the exact bytes this rank contributes to an all-gather, then apply a
        ``before_send`` fault if one is due."""
        self._guard(self._gather_sent, bucket, payload, stage)
        self.inject("before_send", bucket, payload, stage)

    def allgather_received(self, bucket: int, gathered: torch.Tensor | Sequence[torch.Tensor],
                           stage: int = 0) -> None:
        """Hash each rank's chunk of a completed all-gather.

        Args:
            gathered: ``(W, ...)`` tensor (``all_gather_single`` output) or a list of ``W``
                tensors (``all_gather``), chunk ``j`` from rank ``j``.
        """
        self._guard(self._gather_received, bucket, gathered, stage)

    def alltoall_sent(self, bucket: int, payload: torch.Tensor, stage: int = 0) -> None:
        """Hash each destination's chunk of an all-to-all input (``(W, ...)``, row ``r`` goes
        to rank ``r``), then apply a ``before_send`` fault if one is due."""
        self._guard(self._alltoall_sent, bucket, payload, stage)
        self.inject("before_send", bucket, payload, stage)

    def alltoall_received(self, bucket: int, received: torch.Tensor, stage: int = 0) -> None:
        """Hash each source's chunk of a completed all-to-all output (``(W, ...)``)."""
        self._guard(self._alltoall_received, bucket, received, stage)

    def result(self, bucket: int, result: torch.Tensor,
               local_nonfinite: tuple[int, int] | torch.Tensor = (0, 0)) -> None:
        """Record the hook's final averaged bucket: its hash and NaN/Inf counts, with the
        ``(NaN, Inf)`` counts of this rank's gradients taken before the hook ran (ints, or
        :func:`nonfinite_count_tensor`'s int64 ``(2,)`` on a device)."""
        self._guard(self._result, bucket, result, local_nonfinite)

    def inject(self, where: str, bucket: int, tensor: torch.Tensor, stage: int = 0) -> None:
        """Let the injector flip its bit in ``tensor`` if this is its rank, step, bucket and
        place (``before_send`` only at its stage). No-op without an injector."""
        if self.injector is not None:
            try:
                self.injector.maybe_flip(where, self.rank, self.step, bucket, tensor, stage)
            except Exception as exc:  # noqa: BLE001 - a broken injector is a test bug, not ours
                self._error("inject", exc)

    # --------------------------------------------------------------------- the step API
    def end_step(self, model: torch.nn.Module | None = None) -> bool:
        """Close this step's records; call after ``backward()``, before ``optimizer.step()``.

        Applies a due ``param`` fault, takes the replica check when due, gathers and checks when
        due (always under ``skip_step``), applies the policy, and advances :attr:`step`.

        Args:
            model: the model (or DDP wrapper) whose parameters the replica check hashes.

        Returns:
            True when the optimizer may apply this step's update; False when ``skip_step``
            found a corrupt gradient this step (every rank returns False alike).

        Raises:
            IntegrityError: policy ``raise`` and a check found corruption (on every rank).
        """
        apply = True
        if model is not None:
            params = [p for p in model.parameters() if p.requires_grad]
            if self.injector is not None:
                self.inject_param(params)
            every = self.config.replica_every
            if every and self.step % every == 0:
                self._guard(self._replica, params)
        every = self.config.gather_every
        if every and self.world_size > 1 and (self.step + 1) % every == 0:
            apply = not self._gather_and_check()
        self.step += 1
        return apply

    def inject_param(self, params: Sequence[torch.Tensor]) -> None:
        """Apply a due ``param`` fault: ``element`` indexes the parameters concatenated in
        ``model.parameters()`` order."""
        injector = self.injector
        if injector is None or injector.where != "param":
            return
        element = injector.element
        for p in params:
            if element < p.numel():
                with torch.no_grad():
                    self.inject("param", injector.bucket, p.data.view(-1)[element:element + 1])
                return
            element -= p.numel()

    def window_vector(self, wait: bool = False) -> torch.Tensor:
        """This window's records as the fixed-size int64 vector of
        :func:`laggard.detectors.integrity.encode_window` (``window_words(max_records)``
        words), and forget them. For the training monitor's per-window gather.

        Records of device tensors are one window late: those of the previous window are read
        now if their copy's event has completed (``query()``), else left out and counted in
        :attr:`pending_records` and the header's ``pending``; this window's are held for the
        next call. Never blocks, unless ``wait`` (the ``skip_step`` policy's per-step verdict):
        then every held and current device record is read, waiting for its event.

        Returns:
            int64 ``(vector_words(),)`` CPU tensor.
        """
        with self._lock:
            records, self._records = self._records, []
            dropped, self._dropped = self._dropped, 0
        rows = [r for r in records if not isinstance(r, DeviceRecord)]
        current = [r for r in records if isinstance(r, DeviceRecord)]
        due, self._held = (self._held + current, []) if wait else (self._held, current)
        pending = 0
        for record in due:
            try:
                host = record.readback.wait() if wait else record.readback.result()
            except Exception as exc:  # noqa: BLE001 - a failed event query drops one record
                self._error("readback", exc)
                host = None
            if host is None:
                pending += 1
            else:
                rows.append(record.decode(host.tolist()))  # a CPU tensor: no device read
        self.pending_records += pending
        capacity = self.config.max_records
        if len(rows) > capacity:
            dropped += len(rows) - capacity
            rows = rows[:capacity]
        words = encode_window(self.rank, self.world_size, rows, capacity, dropped, pending)
        return torch.tensor(words, dtype=torch.int64)

    def vector_words(self) -> int:
        """Length of :meth:`window_vector` (fixed for the run)."""
        return window_words(self.config.max_records)

    def check_window(self, gathered: torch.Tensor | Sequence[Sequence[int]], *,
                     log_findings: bool = True) -> list[Finding]:
        """Run the detector on the gathered window vectors and apply the policy.

        Args:
            gathered: ``(W, vector_words())`` int64, row ``r`` from rank ``r``.
            log_findings: log each finding on rank 0 (the monitor, which logs every
                participant's findings itself, passes False).

        Returns:
            The findings (also appended to :attr:`findings` and logged).

        Raises:
            IntegrityError: policy ``raise`` and a finding of corruption.
        """
        try:
            rows = gathered.tolist() if isinstance(gathered, torch.Tensor) else gathered
            findings = self.detector.update(rows)
        except Exception as exc:  # noqa: BLE001 - a detector bug must not stop training
            self._error("check", exc)
            return []
        for finding in findings:
            self.findings.append(finding)
            if self.rank == 0 and log_findings:
                log.warning("laggard: integrity: %s (evidence %s)", finding.message,
                            finding.evidence)
        corrupt = [f for f in findings if f.severity.value == "critical"]
        if corrupt and self.config.policy == "raise":
            raise IntegrityError(corrupt)
        return findings

    # ------------------------------------------------------------------------ internals
    def _gather_and_check(self) -> bool:
        """All-gather the records so far and check them; True when corruption was found."""
        try:
            local = self.window_vector(wait=self.config.policy == "skip_step")
            # gloo's all-gather wants a flat output
            gathered = torch.empty(self.world_size * local.numel(), dtype=torch.int64)
            dist.all_gather_single(gathered, local, group=self.process_group)
            gathered = gathered.view(self.world_size, -1)
        except Exception as exc:  # noqa: BLE001 - a failed gather must not stop training
            self._error("gather", exc)
            return False
        findings = self.check_window(gathered)
        corrupt = any(f.severity.value == "critical" for f in findings)
        if corrupt and self.config.policy == "skip_step":
            self.skipped_steps += 1
            if self.rank == 0:
                log.warning("laggard: integrity: step %d update dropped on every rank", self.step)
        return corrupt

    def _add(self, bucket: int, stage: int, op: str, tensor: torch.Tensor,
             fields: dict[Any, Any]) -> None:
        """Close a record. ``fields``: field -> int (host), or, off the CPU, field -> 0-d
        tensor, ``(field, field)`` -> ``(2,)`` tensor, key -> :class:`ChunkHashes`."""
        row = [0] * RECORD_WORDS
        row[0], row[1], row[2], row[3] = self.step, bucket, stage, OPS[op]
        row[4] = _DTYPE_CODES.get(tensor.dtype, 0 if tensor.is_floating_point() else 5)
        row[F_NUMEL] = tensor.numel()
        deferred = []
        for index, value in fields.items():
            if isinstance(value, (torch.Tensor, ChunkHashes)):
                deferred.append((index, value))
            else:
                row[index] = value
        record: list[int] | DeviceRecord = DeviceRecord(row, deferred) if deferred else row
        with self._lock:
            if len(self._records) < self.config.max_records:
                self._records.append(record)
            else:
                self._dropped += 1

    def _allreduce_sent(self, bucket: int, payload: torch.Tensor, stage: int) -> None:
        if not on_host(payload):
            fields: dict[Any, Any] = {(F_NAN_SENT, F_INF_SENT): nonfinite_count_tensor(payload)}
            if self.config.sum_check and payload.is_floating_point():
                total_t, magnitude_t = float64_sum_tensors(payload)
                assert magnitude_t is not None
                fields[F_SENT_A], fields[F_SENT_B] = bits_tensor(total_t), \
                    bits_tensor(magnitude_t)
            self._pending(bucket, stage, "allreduce", fields)
            return
        fields = {}
        total = magnitude = 0.0
        if self.config.sum_check and payload.is_floating_point():
            total, magnitude = float64_sums(payload)
            fields[F_SENT_A], fields[F_SENT_B] = bits_of(total), bits_of(magnitude)
        # a float64 sum of at most 2**64 float32/16 values cannot overflow: when it is finite
        # there is no NaN or Inf, and the counting pass is skipped
        if not (math.isfinite(total) and fields):
            fields[F_NAN_SENT], fields[F_INF_SENT] = nonfinite_counts(payload)
        self._pending(bucket, stage, "allreduce", fields)

    def _allreduce_received(self, bucket: int, result: torch.Tensor, stage: int) -> None:
        fields = self._take_pending(bucket, stage, "allreduce")
        if not on_host(result):
            fields[F_RECV_A] = fingerprint_tensor(result)
            if self.config.sum_check and result.is_floating_point():
                fields[F_RECV_B] = bits_tensor(float64_sum_tensors(result, magnitude=False)[0])
            fields[(F_NAN_RECV, F_INF_RECV)] = nonfinite_count_tensor(result)
            self._add(bucket, stage, "allreduce", result, fields)
            return
        fields[F_RECV_A] = fingerprint(result)
        total = math.nan
        if self.config.sum_check and result.is_floating_point():
            total = float64_sums(result, magnitude=False)[0]
            fields[F_RECV_B] = bits_of(total)
        if not math.isfinite(total):
            fields[F_NAN_RECV], fields[F_INF_RECV] = nonfinite_counts(result)
        self._add(bucket, stage, "allreduce", result, fields)

    def _gather_sent(self, bucket: int, payload: torch.Tensor, stage: int) -> None:
        if not on_host(payload):
            self._pending(bucket, stage, "allgather", {
                F_SENT_A: fingerprint_tensor(payload),
                (F_NAN_SENT, F_INF_SENT): nonfinite_count_tensor(payload)})
            return
        nan, inf = nonfinite_counts(payload)
        self._pending(bucket, stage, "allgather",
                      {F_SENT_A: fingerprint(payload), F_NAN_SENT: nan, F_INF_SENT: inf})

    def _gather_received(self, bucket: int, gathered: Any, stage: int) -> None:
        rows = torch.stack(list(gathered)) if not isinstance(gathered, torch.Tensor) else gathered
        self._rows_received(bucket, stage, "allgather", rows)

    def _alltoall_sent(self, bucket: int, payload: torch.Tensor, stage: int) -> None:
        if not on_host(payload):  # chunk_sums order: wrap, plain, weighted
            self._pending(bucket, stage, "alltoall", {
                "sent": ChunkHashes(row_fingerprints(payload), (F_SENT_A, F_SENT_C, F_SENT_B)),
                (F_NAN_SENT, F_INF_SENT): nonfinite_count_tensor(payload)})
            return
        hashes = row_fingerprints(payload).tolist()
        wrap, plain, weighted = chunk_sums(hashes)
        nan, inf = nonfinite_counts(payload)
        self._pending(bucket, stage, "alltoall",
                      {F_SENT_A: wrap, F_SENT_B: weighted, F_SENT_C: plain,
                       F_NAN_SENT: nan, F_INF_SENT: inf})

    def _alltoall_received(self, bucket: int, received: torch.Tensor, stage: int) -> None:
        self._rows_received(bucket, stage, "alltoall", received)

    def _rows_received(self, bucket: int, stage: int, op: str, rows: torch.Tensor) -> None:
        """The receiving side of a gather-like collective (all-gather, all-to-all): one
        fingerprint per received row, chunk-summed as the sender's side was, and the rows'
        NaN/Inf counts; on a device, kept as tensors and read one window late."""
        fields = self._take_pending(bucket, stage, op)
        if not on_host(rows):
            fields["recv"] = ChunkHashes(row_fingerprints(rows), (F_RECV_A, F_RECV_B, F_RECV_C))
            fields[(F_NAN_RECV, F_INF_RECV)] = nonfinite_count_tensor(rows)
            self._add(bucket, stage, op, rows[0], fields)
            return
        fields[F_RECV_A], fields[F_RECV_B], fields[F_RECV_C] = chunk_sums(
            row_fingerprints(rows).tolist())
        fields[F_NAN_RECV], fields[F_INF_RECV] = nonfinite_counts(rows)
        self._add(bucket, stage, op, rows[0], fields)

    def _result(self, bucket: int, result: torch.Tensor,
                local: tuple[int, int] | torch.Tensor) -> None:
        if not on_host(result):
            self._add(bucket, 0, "result", result, {
                F_RECV_A: fingerprint_tensor(result),
                (F_NAN_SENT, F_INF_SENT): local if isinstance(local, torch.Tensor)
                else device_pair(local, result.device),
                (F_NAN_RECV, F_INF_RECV): nonfinite_count_tensor(result)})
            return
        assert not isinstance(local, torch.Tensor)
        fields = {F_RECV_A: fingerprint(result), F_NAN_SENT: local[0], F_INF_SENT: local[1]}
        fields[F_NAN_RECV], fields[F_INF_RECV] = nonfinite_counts(result)
        self._add(bucket, 0, "result", result, fields)

    def _replica(self, params: Sequence[torch.Tensor]) -> None:
        if params and not on_host(params[0]):
            # the same combination in wrapping int64 arithmetic, on the device: (2i+1) h mod
            # 2**64 has the same bits whether h is read as signed or unsigned
            hashes_t = torch.stack([fingerprint_tensor(p.detach()) for p in params])
            odd = torch.arange(1, 2 * len(params), 2, dtype=torch.int64, device=hashes_t.device)
            self._add(0, 0, "replica", torch.empty(0), {
                F_RECV_A: (hashes_t * odd).sum(), F_NUMEL: sum(p.numel() for p in params)})
            return
        hashes = [fingerprint(p.detach()) for p in params]
        # position-weighted like the blocks of one hash, so swapped parameters differ too
        combined = to_int64(sum((2 * i + 1) * (h & ((1 << 64) - 1)) for i, h in enumerate(hashes)))
        numel = sum(p.numel() for p in params)
        self._add(0, 0, "replica", torch.empty(0), {F_RECV_A: combined, F_NUMEL: numel})

    def _pending(self, bucket: int, stage: int, op: str, fields: dict[Any, Any]) -> None:
        with self._lock:
            self._sent[(self.step, bucket, stage, op)] = fields

    def _take_pending(self, bucket: int, stage: int, op: str) -> dict[Any, Any]:
        with self._lock:
            return self._sent.pop((self.step, bucket, stage, op), {})

    def _guard(self, fn: Callable[..., None], *args: Any) -> None:
        try:
            fn(*args)
        except Exception as exc:  # noqa: BLE001 - observability never breaks the job
            self._error(fn.__name__, exc)

    def _error(self, where: str, exc: BaseException) -> None:
        self.errors += 1
        self._log_once(where, "laggard: integrity error in %s: %r (ignored; training goes on)",
                       where, exc)


# ------------------------------------------------------------------ the monitor's participant
class IntegrityParticipant(WindowParticipant):
    """Carries a :class:`GradientIntegrity`'s window fingerprints in the monitor's window
    gather (one int64 column, ``integrity_words``) and checks them on every rank, so its
    policy acts alike everywhere (``TrainingMonitor.Config(integrity=...)``).

    Args:
        integrity: the recorder (keep its ``gather_every=0``).
    """

    name = "integrity"
    #: Checked on the training thread of every rank: policy ``raise`` must stop every rank
    #: at the same window (``laggard.integrations.window_analysis``).
    inline = True

    def __init__(self, integrity: GradientIntegrity) -> None:
        super().__init__()
        self.integrity = integrity
        self.columns = (WindowColumn(
            "integrity_words", "words", "last",
            "the window's gradient fingerprints (laggard.detectors.integrity.encode_window)",
            width=integrity.vector_words(), dtype="int64"),)

    def contribute(self, step: int) -> dict[str, object]:
        return {"integrity_words": self.integrity.window_vector().numpy()}

    def on_window(self, record: WindowRecord) -> WindowOutcome | None:
        """Check the gathered fingerprints; raises :class:`IntegrityError` (policy ``raise``)."""
        rows = record.get("integrity_words")
        if rows is None:
            return None
        return WindowOutcome(findings=self.integrity.check_window(rows.tolist(),
                                                                  log_findings=False))


__all__ = [
    "POLICIES", "GradientIntegrity", "IntegrityError", "IntegrityHookState",
    "IntegrityParticipant", "integrity_allreduce_hook", "with_integrity",
]
