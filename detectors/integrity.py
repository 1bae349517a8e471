"""Gradient integrity: compare the fingerprints every rank took of its collectives, name the odd
rank, and decide the float sum check. Pure: integers in, :class:`Finding` objects out.

What a rank records (``laggard.integrations.integrity`` computes it; this module only compares):
one **record** per collective payload of a gradient bucket, and one per replica check, each a
fixed row of :data:`RECORD_FIELDS` int64. A window's records travel as one int64 vector per rank
(:func:`encode_window`), gathered by the training monitor's per-window ``all_gather``; every rank
may run :class:`IntegrityDetector` on the gathered ``(W, L)`` matrix and reach the same verdict.

Checks, by ``op`` of the record:

* ``allreduce`` (uncompressed, fp16, PowerSGD factors): after the collective every rank holds the
  same bytes, so the hash of the result (``recv_a``) must be equal on every rank; a rank whose
  hash differs from the majority is named (memory corruption of its reduced bucket). Corruption
  that reaches every rank alike (a send buffer altered after it was fingerprinted, a flipped bit
  on the wire before the reduction) leaves the results equal, so a linear check decides it: the
  float64 sum of the reduced result against the sum over ranks of each rank's float64 sum of its
  payload, within the rounding bound of :func:`sum_tolerance`.
* ``allgather`` (top-k values and indices, sign bits): each rank hashes the exact bytes it sends
  (``sent_a``); each receiver hashes every received chunk and keeps three sums of those hashes:
  wrapping mod 2**64 (detects any changed chunk), and mod the prime ``P = 2**61 - 1`` plain and
  weighted by ``sender + 1``, so that one altered chunk's sender is ``weighted / plain - 1`` (mod
  ``P``; single-error location as in Reed-Solomon syndrome decoding).
* ``alltoall``: the same sums taken over the sent chunks (weighted by receiver) and the received
  chunks (weighted by sender): one altered chunk names both its sender and its receiver.
* ``result``: hash of the hook's output (the averaged bucket), equal on every rank for every
  compressor (decompression is deterministic); the catch-all for a corrupted result.
* ``replica``: hash of all parameters, equal on every data-parallel rank.

NaN and Inf counts of each payload before sending and of each result ride in the same record.

A row that cannot be decoded (wrong length, unknown version) is reported as a fault of the check
itself (``kind="check_fault"``), never as a corrupt gradient, and left out of the comparison.

Why one module of ~500 lines: the window wire format (:func:`encode_window`/:func:`decode_window`)
and the checks that read it (sum bound, hash agreement, localisation) change together.
"""

from __future__ import annotations

import math
import struct
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from laggard.detectors.finding import Finding, Severity

DETECTOR = "integrity"

#: First word of every window vector: ASCII "LGINTEGR" as a big-endian int64.
MAGIC = int.from_bytes(b"LGINTEGR", "big")
#: Wire version of the window vector; bump on any layout change.
VERSION = 1
#: Header words: magic, version, rank, world_size, records, capacity, dropped, pending (records
#: whose device values had not reached the host at the gather; 0 from senders that predate it).
HEADER_WORDS = 8
#: Field names of one record, in order (each an int64).
RECORD_FIELDS = (
    "step", "bucket", "stage", "op", "dtype", "numel",
    "sent_a", "sent_b", "sent_c", "recv_a", "recv_b", "recv_c",
    "nan_sent", "inf_sent", "nan_recv", "inf_recv",
)
RECORD_WORDS = len(RECORD_FIELDS)
(F_STEP, F_BUCKET, F_STAGE, F_OP, F_DTYPE, F_NUMEL, F_SENT_A, F_SENT_B, F_SENT_C,
 F_RECV_A, F_RECV_B, F_RECV_C, F_NAN_SENT, F_INF_SENT, F_NAN_RECV, F_INF_RECV) = range(RECORD_WORDS)

#: Record ``op`` codes.
OPS = {"allreduce": 1, "allgather": 2, "alltoall": 3, "result": 4, "replica": 5}
OP_NAMES = {code: name for name, code in OPS.items()}
#: Payload ``dtype`` codes -> (name, unit roundoff u = 2**-p for p significand bits, IEEE 754).
DTYPES = {1: ("float32", 2.0**-24), 2: ("float16", 2.0**-11), 3: ("bfloat16", 2.0**-8),
          4: ("float64", 2.0**-53), 5: ("integer", 0.0), 0: ("other", 0.0)}
#: Unit roundoff of the float64 arithmetic the sums are taken in.
U64 = 2.0**-53
#: Prime modulus of the chunk-locating sums (a Mersenne prime: 2**61 - 1).
P = (1 << 61) - 1
_MASK64 = (1 << 64) - 1


class WindowFormatError(ValueError):
    """A window vector that cannot be decoded (wrong length, magic or version, bad header)."""


@dataclass(frozen=True, slots=True)
class Record:
    """One decoded record (field meanings in the module docstring), all Python ints."""

    values: tuple[int, ...]

    def __getitem__(self, index: int) -> int:
        return self.values[index]

    @property
    def key(self) -> tuple[int, int, int, int]:
        """(step, bucket, stage, op): what identifies the same collective on every rank."""
        v = self.values
        return v[F_STEP], v[F_BUCKET], v[F_STAGE], v[F_OP]


@dataclass(frozen=True, slots=True)
class WindowMessage:
    """One rank's decoded window vector."""

    rank: int
    world_size: int
    capacity: int
    dropped: int
    records: tuple[Record, ...]
    pending: int = 0


def window_words(capacity: int) -> int:
    """Length in int64 words of a window vector holding ``capacity`` records."""
    return HEADER_WORDS + capacity * RECORD_WORDS


def encode_window(rank: int, world_size: int, records: Sequence[Sequence[int]], capacity: int,
                  dropped: int = 0, pending: int = 0) -> list[int]:
    """Build one rank's fixed-size window vector.

    Args:
        rank, world_size: this rank's place in the data-parallel group.
        records: at most ``capacity`` rows of :data:`RECORD_WORDS` ints (int64 range).
        capacity: records the vector has room for (its length is :func:`window_words`).
        dropped: records of this window that did not fit (reported, not compared).
        pending: records left out because their device values were still being copied to the
            host at the gather (reported, not compared; ``laggard.integrations.integrity``).

    Returns:
        ``window_words(capacity)`` Python ints (to become an int64 tensor); unused slots are 0.

    Raises:
        ValueError: more records than ``capacity`` or a row of the wrong length.
    """
    if len(records) > capacity:
        raise ValueError(f"{len(records)} records > capacity {capacity}")
    out = [MAGIC, VERSION, rank, world_size, len(records), capacity, dropped, pending]
    for row in records:
        if len(row) != RECORD_WORDS:
            raise ValueError(f"record of {len(row)} words, expected {RECORD_WORDS}")
        out.extend(int(v) for v in row)
    out.extend([0] * (window_words(capacity) - len(out)))
    return out


def decode_window(row: Sequence[int]) -> WindowMessage:
    """Parse one rank's window vector.

    Raises:
        WindowFormatError: too short, wrong magic or version, or a header inconsistent with the
            row's length.
    """
    if len(row) < HEADER_WORDS:
        raise WindowFormatError(f"{len(row)} words, shorter than the {HEADER_WORDS}-word header")
    magic, version, rank, world, count, capacity, dropped, pending = (
        int(v) for v in row[:HEADER_WORDS])
    if magic != MAGIC:
        raise WindowFormatError(f"bad magic {magic:#x}")
    if version != VERSION:
        raise WindowFormatError(f"unknown version {version} (this detector reads {VERSION})")
    if capacity < 0 or len(row) != window_words(capacity):
        raise WindowFormatError(f"{len(row)} words for capacity {capacity}, expected "
                                f"{window_words(max(capacity, 0))}")
    if not 0 <= count <= capacity or world < 1 or not 0 <= rank < world or dropped < 0 \
            or pending < 0:
        raise WindowFormatError(f"bad header: rank {rank} world {world} records {count}")
    records = tuple(
        Record(tuple(int(v) for v in row[HEADER_WORDS + i * RECORD_WORDS:
                                          HEADER_WORDS + (i + 1) * RECORD_WORDS]))
        for i in range(count))
    return WindowMessage(rank, world, capacity, dropped, records, pending)


def gamma(k: int, u: float) -> float:
    """Higham's ``gamma_k = k u / (1 - k u)`` (Accuracy and Stability of Numerical Algorithms,
    2nd ed., SIAM 2002, §3.1, Lemma 3.1); ``inf`` when ``k u >= 1``."""
    ku = k * u
    return math.inf if ku >= 1 else ku / (1 - ku)


def sum_tolerance(abs_sum: float, numel: int, world_size: int, unit_roundoff: float) -> float:
    """Largest ``|sum(reduced) - sum_r sum(payload_r)|`` that rounding alone can produce.

    Bound (Higham, 2nd ed., §4.2, eq. (4.4)): any summation of ``m`` floating-point numbers, in
    any order, has ``|computed - exact| <= gamma_{m-1} * sum |x_i|``. Applied to

    * the reduction: each of the ``n`` reduced elements is a sum of ``W`` payload values
      rounded to the payload format (unit roundoff ``u``): error ``<= gamma_{W-1}(u) * A``
      summed over elements, ``A = sum_r sum_i |x_ri|``;
    * the float64 sums (payload sums, abs sums, the result's sum, the sum over ranks): each
      ``<= gamma_{n+W}(2**-53) * A`` up to factors ``1 + gamma``, four of them.

    So ``tau = (gamma_{W-1}(u) + 4 gamma_{n+W}(2**-53)) * A * (1 + 2**-40)``, the last factor
    covering the few roundings of this function. Underflow adds no error (IEEE 754 gradual
    underflow makes subnormal sums exact), so the bound holds for every finite payload: the
    check raises no false alarm from reduction order. A flip that changes the sum by more than
    ``2 tau`` is always caught.

    Args:
        abs_sum: ``A``, the sum over ranks of each rank's float64 sum of ``|payload|``.
        numel: ``n``, elements per payload.
        world_size: ``W``, ranks summed.
        unit_roundoff: ``u`` of the payload format (2**-24 for float32).

    Returns:
        ``tau`` (same unit as the gradients); ``inf`` when the bound is vacuous.
    """
    coefficient = gamma(world_size - 1, unit_roundoff) + 4 * gamma(numel + world_size, U64)
    return coefficient * abs_sum * (1 + 2.0**-40)


def float_of(bits: int) -> float:
    """The float64 whose IEEE 754 bit pattern is the int64 ``bits``."""
    return struct.unpack("<d", struct.pack("<q", bits))[0]


def bits_of(value: float) -> int:
    """The int64 bit pattern of the float64 ``value`` (inverse of :func:`float_of`)."""
    return struct.unpack("<q", struct.pack("<d", value))[0]


def to_int64(value: int) -> int:
    """``value`` mod 2**64 as a signed int64 (how wrapping torch sums come out)."""
    value &= _MASK64
    return value - (1 << 64) if value >> 63 else value


def chunk_sums(hashes: Iterable[int]) -> tuple[int, int, int]:
    """Syndrome of a list of chunk hashes ``h_0..h_{W-1}`` (index = sender or receiver).

    Returns:
        ``(sum h_j mod 2**64 as int64, sum h_j mod P, sum (j + 1) h_j mod P)`` with each
        ``h_j`` read as unsigned 64-bit.
    """
    wrap = plain = weighted = 0
    for j, h in enumerate(hashes):
        h &= _MASK64
        wrap += h
        plain += h
        weighted += (j + 1) * h
    return to_int64(wrap), plain % P, weighted % P


def locate(plain_delta: int, weighted_delta: int, world_size: int) -> int | None:
    """Index of the one altered chunk from syndrome differences, or None (several, or none)."""
    plain_delta %= P
    if plain_delta == 0:
        return None
    index = weighted_delta % P * pow(plain_delta, P - 2, P) % P - 1
    return index if 0 <= index < world_size else None


@dataclass(kw_only=True, slots=True)
class IntegrityStats:
    """Counters of the detector (never reset).

    Attributes:
        windows: windows checked.
        records: records compared (one per collective per step, across ranks counted once).
        sum_checks: allreduce sum checks decided.
        faults: undecodable rows and records missing on some ranks.
    """

    windows: int = 0
    records: int = 0
    sum_checks: int = 0
    faults: int = 0


class IntegrityDetector:
    """Compares the gathered window vectors of all ranks (see the module docstring).

    Deterministic: every rank running it on the same matrix gets the same findings, which is
    what lets the ``skip_step`` and ``raise`` policies act the same way on every rank.

    Attributes:
        stats: :class:`IntegrityStats`.
    """

    #: The ``detector`` of its findings.
    name = DETECTOR

    def __init__(self) -> None:
        self.stats = IntegrityStats()

    def update(self, rows: Sequence[Sequence[int]]) -> list[Finding]:
        """Check one window.

        Args:
            rows: ``W`` window vectors, row ``r`` gathered from rank ``r``.

        Returns:
            Findings, critical ones (corruption) first in rank order; ``check_fault`` warnings
            for rows that could not be decoded or records missing on some ranks.
        """
        self.stats.windows += 1
        world = len(rows)
        findings: list[Finding] = []
        by_key: dict[tuple[int, int, int, int], dict[int, Record]] = {}
        decoded: set[int] = set()
        pending: Counter[int] = Counter()
        for r, row in enumerate(rows):
            try:
                message = decode_window(row)
                if message.rank != r or message.world_size != world:
                    raise WindowFormatError(f"row {r} claims rank {message.rank} of "
                                            f"{message.world_size}, gathered from {world} ranks")
            except WindowFormatError as exc:
                self.stats.faults += 1
                findings.append(_fault(r, f"fingerprint message from rank {r} unreadable: {exc}",
                                       {"error": str(exc)}))
                continue
            decoded.add(r)
            if message.dropped:
                findings.append(_fault(r, f"rank {r} dropped {message.dropped} fingerprint "
                                       "records (raise max_records)",
                                       {"dropped": message.dropped}, Severity.INFO))
            if message.pending:
                pending[r] = message.pending
                findings.append(_fault(r, f"rank {r} left out {message.pending} fingerprint "
                                       "records still on their way from the device at the "
                                       "gather (read one window late; not compared)",
                                       {"pending": message.pending}, Severity.INFO))
            for record in message.records:
                by_key.setdefault(record.key, {})[r] = record
        missing: Counter[int] = Counter()
        for key in sorted(by_key):
            records = by_key[key]
            for r in decoded - records.keys():
                missing[r] += 1
            self.stats.records += 1
            findings.extend(self._check(key, records, world))
        for r, count in sorted(missing.items()):
            if count <= pending[r]:
                continue  # the rank said why: its records were still on the device
            self.stats.faults += 1
            findings.append(_fault(r, f"{count} fingerprint records missing from rank {r}",
                                   {"missing_records": count}))
        findings.sort(key=lambda f: (f.severity is not Severity.CRITICAL, f.rank or 0))
        return findings

    # ------------------------------------------------------------------------------ checks
    def _check(self, key: tuple[int, int, int, int], records: dict[int, Record],
               world: int) -> list[Finding]:
        op = key[3]
        out = _nonfinite(key, records)
        if op == OPS["alltoall"]:
            out.extend(_alltoall(key, records, world))
            return out
        sums_ok: dict[int, bool] = {}
        if op == OPS["allreduce"] and len(records) == world:
            sums_ok = self._sum_check(key, records, world, out)
        out.extend(_agreement(key, records, world, sums_ok))
        if op == OPS["allgather"] and len(records) == world:
            out.extend(_allgather(key, records, world))
        return out

    def _sum_check(self, key: tuple[int, int, int, int], records: dict[int, Record], world: int,
                   out: list[Finding]) -> dict[int, bool]:
        """Decide the sum check for every receiver's result; append a finding when the result
        every rank agrees on fails it. Returns rank -> passed (for breaking a tie)."""
        first = records[min(records)]
        dtype_name, u = DTYPES.get(first[F_DTYPE], DTYPES[0])
        if u == 0.0:
            return {}
        sent = [float_of(rec[F_SENT_A]) for rec in records.values()]
        abs_sum = sum(float_of(rec[F_SENT_B]) for rec in records.values())
        if not all(math.isfinite(v) for v in sent) or not math.isfinite(abs_sum):
            return {}  # a rank sent NaN/Inf: reported by _nonfinite, the sum says nothing more
        expected = sum(sent)
        tau = sum_tolerance(abs_sum, first[F_NUMEL], world, u)
        passed: dict[int, bool] = {}
        residuals: dict[int, float] = {}
        for r, rec in records.items():
            reduced = float_of(rec[F_RECV_B])
            residuals[r] = reduced - expected if math.isfinite(reduced) else math.inf
            passed[r] = abs(residuals[r]) <= tau
        self.stats.sum_checks += 1
        if any(passed.values()):
            return passed  # results that differ between ranks are _agreement's to name
        step, bucket, stage, _ = key
        r0 = next(r for r in sorted(records) if not passed[r])
        residual = residuals[r0]
        out.append(Finding(
            detector=DETECTOR, kind="sum_mismatch", severity=Severity.CRITICAL, step=step,
            message=(f"bucket {bucket} at step {step}: reduced gradient sum is off by "
                     f"{residual:.3g}, over {abs(residual) / tau if tau else math.inf:.3g}x "
                     "the rounding bound: corrupted before or during the reduction "
                     "(a send buffer or the wire), rank unknown"),
            evidence={"check": "sum", "bucket": bucket, "stage": stage, "step": step,
                      "residual": residual, "tolerance": tau, "abs_sum": abs_sum,
                      "expected_sum": expected, "numel": first[F_NUMEL], "world_size": world,
                      "dtype": dtype_name,
                      "bound": "Higham 2002 §4.2 (4.4): (gamma_{W-1}(u)+4 gamma_{n+W}(2^-53)) A"},
        ))
        return passed


def _fault(rank: int, message: str, evidence: dict[str, object],
           severity: Severity = Severity.WARNING) -> Finding:
    return Finding(detector=DETECTOR, kind="check_fault", severity=severity, rank=rank,
                   message=message + " (a fault of the check, not of the gradients)",
                   evidence={"check": "message", **evidence})


def _describe(key: tuple[int, int, int, int]) -> tuple[str, dict[str, object]]:
    step, bucket, stage, op = key
    name = OP_NAMES.get(op, str(op))
    if op == OPS["replica"]:
        return f"parameters at step {step}", {"step": step, "op": name}
    return (f"bucket {bucket} {name} (stage {stage}) at step {step}",
            {"step": step, "bucket": bucket, "stage": stage, "op": name})


def _nonfinite(key: tuple[int, int, int, int], records: dict[int, Record]) -> list[Finding]:
    """NaN/Inf before sending names the rank that produced them; NaN/Inf in a result that no
    rank sent appeared in transit or in the reduction (an overflow or a flipped exponent bit)."""
    what, where = _describe(key)
    out = []
    senders = 0
    for r, rec in sorted(records.items()):
        if rec[F_NAN_SENT] or rec[F_INF_SENT]:
            senders += 1
            out.append(Finding(
                detector=DETECTOR, kind="nonfinite", severity=Severity.CRITICAL, rank=r,
                step=key[0],
                message=(f"rank {r} sent {rec[F_NAN_SENT]} NaN and {rec[F_INF_SENT]} Inf in "
                         f"{what}"),
                evidence={"check": "nonfinite_sent", **where, "nan": rec[F_NAN_SENT],
                          "inf": rec[F_INF_SENT]}))
    if senders == 0:
        received = {r: (rec[F_NAN_RECV], rec[F_INF_RECV]) for r, rec in records.items()
                    if rec[F_NAN_RECV] or rec[F_INF_RECV]}
        if received:
            everyone = len(received) == len(records)
            nan, inf = received[min(received)]
            place = ("on every rank: an overflow or corruption before the reduction" if everyone
                     else f"on rank {min(received)}")
            out.append(Finding(
                detector=DETECTOR, kind="nonfinite", severity=Severity.CRITICAL,
                rank=None if everyone else min(received), step=key[0],
                message=f"{nan} NaN and {inf} Inf appeared in {what} that no rank sent ({place})",
                evidence={"check": "nonfinite_received", **where, "nan": nan, "inf": inf,
                          "ranks": sorted(received)}))
    return out


def _agreement(key: tuple[int, int, int, int], records: dict[int, Record], world: int,
               sums_ok: dict[int, bool]) -> list[Finding]:
    """Every rank must hold the same result bytes: name the ranks outside the majority."""
    if key[3] == OPS["allreduce"]:
        # the hash alone: a float64 sum of equal bytes may still differ in its last bits between
        # ranks that reduce with different thread counts
        value = {r: (rec[F_RECV_A], 0, 0) for r, rec in records.items()}
    else:
        value = {r: (rec[F_RECV_A], rec[F_RECV_B], rec[F_RECV_C]) for r, rec in records.items()}
    counts = Counter(value.values())
    if len(counts) == 1:
        return []
    what, where = _describe(key)
    check = "replica" if key[3] == OPS["replica"] else "result_hash"
    kind = "replica_mismatch" if key[3] == OPS["replica"] else "result_mismatch"
    top, n_top = counts.most_common(1)[0]
    if n_top * 2 <= len(records):
        # No strict majority (two ranks, say). The sum check can still tell which results are
        # the true reduction: keep them as the reference when exactly one group passes it.
        passing = {value[r] for r, ok in sums_ok.items() if ok}
        if len(passing) != 1:
            groups = {str(v[0]): sorted(r for r in value if value[r] == v) for v in counts}
            return [Finding(
                detector=DETECTOR, kind=kind, severity=Severity.CRITICAL, step=key[0],
                message=f"ranks disagree on {what} with no majority: {sorted(groups.values())}",
                evidence={"check": check, **where, "groups": groups})]
        top = passing.pop()
        n_top = sum(1 for v in value.values() if v == top)
    out = []
    for r in sorted(value):
        if value[r] != top:
            out.append(Finding(
                detector=DETECTOR, kind=kind, severity=Severity.CRITICAL, rank=r, step=key[0],
                message=(f"rank {r} holds different {what} than {n_top} of {len(records)} "
                         "ranks: corrupted in its memory or on its receive path"),
                evidence={"check": check, **where, "fingerprint": value[r][0],
                          "majority_fingerprint": top[0], "agreeing_ranks": n_top}))
    return out


def _allgather(key: tuple[int, int, int, int], records: dict[int, Record],
               world: int) -> list[Finding]:
    """Received chunks against what each sender fingerprinted before sending."""
    expected = chunk_sums(records[r][F_SENT_A] for r in range(world))
    received = Counter((rec[F_RECV_A], rec[F_RECV_B], rec[F_RECV_C]) for rec in records.values())
    common, _ = received.most_common(1)[0]
    if common == expected:
        return []  # any receiver that differs was named by _agreement
    what, where = _describe(key)
    sender = locate(common[1] - expected[1], common[2] - expected[2], world)
    return [Finding(
        detector=DETECTOR, kind="payload_mismatch", severity=Severity.CRITICAL, rank=sender,
        step=key[0],
        message=(f"the payload {'of rank ' + str(sender) if sender is not None else ''} in "
                 f"{what} was altered after its sender fingerprinted it (send buffer or wire)"),
        evidence={"check": "payload_hash", **where, "sender": sender})]


def _alltoall(key: tuple[int, int, int, int], records: dict[int, Record],
              world: int) -> list[Finding]:
    """Sent chunk sums (weighted by receiver) against received ones (weighted by sender)."""
    if len(records) != world:
        return []
    sent_wrap = to_int64(sum(records[j][F_SENT_A] for j in range(world)))
    recv_wrap = to_int64(sum(records[r][F_RECV_A] for r in range(world)))
    if sent_wrap == recv_wrap:
        return []
    plain = sum(records[r][F_RECV_B] for r in range(world)) - sum(
        records[j][F_SENT_C] for j in range(world))
    by_sender = sum(records[r][F_RECV_C] for r in range(world)) - sum(
        (j + 1) * records[j][F_SENT_C] for j in range(world))
    by_receiver = sum((r + 1) * records[r][F_RECV_B] for r in range(world)) - sum(
        records[j][F_SENT_B] for j in range(world))
    sender = locate(plain, by_sender, world)
    receiver = locate(plain, by_receiver, world)
    what, where = _describe(key)
    link = (f"from rank {sender} to rank {receiver}" if sender is not None and receiver is not None
            else "(several chunks)")
    return [Finding(
        detector=DETECTOR, kind="payload_mismatch", severity=Severity.CRITICAL, rank=sender,
        step=key[0],
        message=f"a chunk {link} in {what} was altered after its sender fingerprinted it",
        evidence={"check": "payload_hash", **where, "sender": sender, "receiver": receiver})]


__all__ = [
    "DETECTOR", "MAGIC", "OPS", "P", "RECORD_FIELDS", "RECORD_WORDS", "VERSION",
    "IntegrityDetector", "IntegrityStats", "Record", "WindowFormatError",
    "WindowMessage", "bits_of", "chunk_sums", "decode_window", "encode_window", "float_of",
    "gamma", "locate", "sum_tolerance", "to_int64", "window_words",
]
