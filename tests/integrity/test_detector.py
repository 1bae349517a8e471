"""The pure integrity detector on hand-built window vectors: message faults, majority votes,
the float sum check's bound against real float32 reductions in random orders, payload location."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from laggard.detectors.finding import Severity
from laggard.detectors.integrity import (
    F_RECV_A,
    OPS,
    RECORD_FIELDS,
    RECORD_WORDS,
    IntegrityDetector,
    WindowFormatError,
    bits_of,
    chunk_sums,
    decode_window,
    encode_window,
    locate,
    sum_tolerance,
)


def record(step: int = 0, bucket: int = 0, op: str = "allreduce", **fields: int) -> list[int]:
    row = [0] * RECORD_WORDS
    row[0], row[1], row[3], row[4], row[5] = step, bucket, OPS[op], 1, 100
    for name, value in fields.items():
        row[RECORD_FIELDS.index(name)] = value
    return row


def window(rows_per_rank: list[list[list[int]]], capacity: int = 8) -> list[list[int]]:
    world = len(rows_per_rank)
    return [encode_window(r, world, rows, capacity) for r, rows in enumerate(rows_per_rank)]


def allreduce_rows(payloads: np.ndarray, reduced: np.ndarray) -> list[list[list[int]]]:
    """One allreduce record per rank from float32 payloads (W, n) and a reduced vector."""
    total = math.fsum(reduced.astype(np.float64))
    return [[record(sent_a=bits_of(math.fsum(p.astype(np.float64))),
                    sent_b=bits_of(math.fsum(np.abs(p).astype(np.float64))),
                    recv_a=12345, recv_b=bits_of(total), numel=p.size)]
            for p in payloads]


def test_round_trip() -> None:
    rows = [record(step=3, bucket=1, recv_a=-5), record(step=3, bucket=2, op="replica")]
    message = decode_window(encode_window(2, 4, rows, capacity=5, dropped=1))
    assert (message.rank, message.world_size, message.capacity, message.dropped) == (2, 4, 5, 1)
    assert [list(r.values) for r in message.records] == rows


@pytest.mark.parametrize("mutate, error", [
    (lambda v: v[:-1], "words for capacity"),
    (lambda v: [v[0], 2, *v[2:]], "unknown version 2"),
    (lambda v: [7, *v[1:]], "bad magic"),
    (lambda v: v[:3], "shorter than"),
    (lambda v: [*v[:4], 99, *v[5:]], "bad header"),
])
def test_corrupt_message_is_a_fault_of_the_check(mutate, error) -> None:  # type: ignore[no-untyped-def]
    rows = window([[record(recv_a=1)] for _ in range(3)])
    with pytest.raises(WindowFormatError, match=error):
        decode_window(mutate(rows[1]))
    rows[1] = mutate(rows[1])
    findings = IntegrityDetector().update(rows)
    assert [(f.kind, f.rank, f.severity) for f in findings] == [
        ("check_fault", 1, Severity.WARNING)]
    assert "not of the gradients" in findings[0].message


def test_result_majority_names_the_odd_rank() -> None:
    rows = window([[record(step=7, bucket=2, op="result", recv_a=h)] for h in (5, 5, 9, 5)])
    (finding,) = IntegrityDetector().update(rows)
    assert (finding.kind, finding.rank, finding.step) == ("result_mismatch", 2, 7)
    assert finding.evidence["bucket"] == 2 and finding.evidence["agreeing_ranks"] == 3


def test_replica_mismatch_and_missing_records() -> None:
    rows = window([[record(op="replica", recv_a=1)], [record(op="replica", recv_a=2)],
                   [record(op="replica", recv_a=1)], []])
    findings = IntegrityDetector().update(rows)
    assert [(f.kind, f.rank) for f in findings] == [("replica_mismatch", 1), ("check_fault", 3)]


def test_two_ranks_without_majority() -> None:
    rows = window([[record(op="result", recv_a=1)], [record(op="result", recv_a=2)]])
    (finding,) = IntegrityDetector().update(rows)
    assert finding.kind == "result_mismatch" and finding.rank is None


@pytest.mark.parametrize("world", [2, 3, 4, 8])
def test_sum_check_no_false_alarm_over_random_reduction_orders(world: int) -> None:
    # Real float32 reductions in random orders, with heavy-tailed values and cancellation, are
    # always within the bound (the claim of sum_tolerance): 300 windows per world size.
    rng = np.random.default_rng(world)
    detector = IntegrityDetector()
    for trial in range(300):
        n = int(rng.integers(1, 3000))
        scale = rng.lognormal(0, 4, size=(world, n)).astype(np.float32)
        payloads = (rng.standard_normal((world, n)).astype(np.float32) * scale)
        payloads[:, ::7] *= np.float32(1e-30)  # subnormal-range values too
        # element-wise sum of the W terms in a random order per element, rounded at each add
        order = np.argsort(rng.random((world, n)), axis=0)
        terms = np.take_along_axis(payloads, order, axis=0)
        reduced = terms[0].copy()
        for r in range(1, world):
            reduced = reduced + terms[r]  # float32 + float32: one rounding
        findings = detector.update(window(allreduce_rows(payloads, reduced)))
        assert findings == [], (trial, findings)
    assert detector.stats.sum_checks == 300


def test_sum_check_catches_what_exceeds_twice_the_bound() -> None:
    rng = np.random.default_rng(0)
    payloads = rng.standard_normal((4, 1000)).astype(np.float32)
    reduced = payloads.sum(0, dtype=np.float32)
    abs_sum = float(np.abs(payloads.astype(np.float64)).sum())
    tau = sum_tolerance(abs_sum, 1000, 4, 2.0**-24)
    reduced[10] += np.float32(3 * tau)
    (finding,) = IntegrityDetector().update(window(allreduce_rows(payloads, reduced)))
    assert finding.kind == "sum_mismatch" and finding.rank is None
    assert abs(finding.evidence["residual"]) > finding.evidence["tolerance"]


def test_sum_check_breaks_a_two_rank_tie() -> None:
    payloads = np.array([[1.0, 2.0], [3.0, 4.0]], dtype=np.float32)
    good = allreduce_rows(payloads, payloads.sum(0))
    bad = allreduce_rows(payloads, payloads.sum(0) + np.float32(1e3))
    good[0][0][F_RECV_A], bad[1][0][F_RECV_A] = 1, 2  # results differ between the two ranks
    (finding,) = IntegrityDetector().update(window([good[0], bad[1]]))
    assert (finding.kind, finding.rank) == ("result_mismatch", 1)


def test_nonfinite_sent_names_the_rank_and_received_is_transit() -> None:
    rows = window([[record(nan_sent=0)], [record(nan_sent=3, inf_sent=1)], [record()]])
    (finding,) = IntegrityDetector().update(rows)
    assert (finding.kind, finding.rank, finding.evidence["nan"]) == ("nonfinite", 1, 3)
    rows = window([[record(op="result", inf_recv=2)] for _ in range(3)])
    (finding,) = IntegrityDetector().update(rows)
    assert finding.kind == "nonfinite" and finding.rank is None
    assert finding.evidence["check"] == "nonfinite_received"


def gather_window(hashes: list[int], received: list[list[int]]) -> list[list[int]]:
    return window([[record(op="allgather", sent_a=h, **dict(zip(
        ("recv_a", "recv_b", "recv_c"), chunk_sums(got), strict=True)))]
        for h, got in zip(hashes, received, strict=True)])


def test_allgather_locates_the_sender() -> None:
    sent = [random.Random(i).getrandbits(63) for i in range(5)]
    assert IntegrityDetector().update(gather_window(sent, [sent] * 5)) == []
    altered = list(sent)
    altered[3] ^= 1 << 17
    (finding,) = IntegrityDetector().update(gather_window(sent, [altered] * 5))
    assert (finding.kind, finding.rank) == ("payload_mismatch", 3)
    # one receiver's copy corrupted: the receiver is named, not a sender
    received = [sent] * 5
    received[1] = altered
    (finding,) = IntegrityDetector().update(gather_window(sent, received))
    assert (finding.kind, finding.rank) == ("result_mismatch", 1)


def test_alltoall_locates_sender_and_receiver() -> None:
    world = 4
    h = [[random.Random(10 * j + r).getrandbits(64) for r in range(world)] for j in range(world)]

    def rows(recv: list[list[int]]) -> list[list[int]]:
        out = []
        for j in range(world):
            wrap, plain, by_receiver = chunk_sums(h[j])  # h[j][r]: rank j's chunk for rank r
            fields = dict(sent_a=wrap, sent_b=by_receiver, sent_c=plain)
            fields.update(zip(("recv_a", "recv_b", "recv_c"),
                              chunk_sums(recv[i][j] for i in range(world)), strict=True))
            out.append([record(op="alltoall", **fields)])
        return window(out)

    assert IntegrityDetector().update(rows(h)) == []
    altered = [list(row) for row in h]
    altered[2][1] ^= 1 << 40  # the chunk rank 2 sends rank 1
    (finding,) = IntegrityDetector().update(rows(altered))
    assert finding.kind == "payload_mismatch"
    assert (finding.evidence["sender"], finding.evidence["receiver"]) == (2, 1)


def test_locate_rejects_out_of_range() -> None:
    assert locate(0, 5, 4) is None
    assert locate(1, 9, 4) is None  # index 8 is not a rank of 4
    assert locate(5, 15, 4) == 2
