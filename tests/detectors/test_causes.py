"""CauseAttribution on hand-built window records: GC, extra work, a rank slow per token, bad and
partial work notes, clears that keep the kind."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from laggard.detectors.causes import PARTIAL_NOTES_MESSAGE, CauseAttribution
from laggard.detectors.finding import JOB_FINDING_KINDS, Finding, Severity
from laggard.detectors.window import WindowRecord

NAN = math.nan
ALL = (0, 1, 2, 3)


def _record(compute_ms, *, gc_ms=None, tokens=None, samples=None, generation=None,
            step=99) -> WindowRecord:
    """A gathered window of len(compute_ms) ranks; times in ms, columns in seconds."""
    ranks = len(compute_ms)
    columns = {"compute_seconds": 1e-3 * np.array(compute_ms, dtype=float),
               "data_seconds": np.full(ranks, 1e-4),
               "gc_seconds": 1e-3 * np.array(gc_ms if gc_ms is not None else [0.0] * ranks),
               "gc_generation": np.array(generation if generation is not None
                                         else [-1.0] * ranks, dtype=float),
               "tokens": np.array(tokens if tokens is not None else [NAN] * ranks, dtype=float),
               "samples": np.array(samples if samples is not None else [NAN] * ranks,
                                   dtype=float)}
    return WindowRecord(step=step, columns=columns, ranks=np.arange(ranks), world_size=ranks,
                        nodes=["node07"] * ranks)


def _compute_finding(rank=2, step=99, **evidence) -> Finding:
    return Finding(detector="straggler", kind="compute", severity=Severity.WARNING,
                   message=f"rank {rank} on node07: forward+backward 30% slower than the median "
                           "rank in its last 5 windows (+3.0 ms per step), and every other rank "
                           "waits for it in the gradient collective: check that GPU's clocks",
                   rank=rank, node="node07", step=step,
                   evidence={"slowdown": 0.3, **evidence})


def _apply(causes: CauseAttribution, record: WindowRecord, findings=(), peers=ALL):
    return causes.apply(list(findings), record, lambda rank: peers)


def test_an_excess_that_is_mostly_gc_becomes_kind_gc_with_what_helps():
    causes = CauseAttribution()
    record = _record([10, 10.2, 13, 9.8], gc_ms=[0.1, 0.1, 2.6, 0.1], generation=[0, 0, 2, 0])
    original = _compute_finding(lost_seconds_per_step=0.0029, lost_seconds_per_hour=360.0)
    original = dataclasses.replace(
        original, message=original.message + " [compared within its peer group pp=0]")
    [finding] = _apply(causes, record, [original])
    assert finding.kind == "gc" and finding.detector == "straggler" and finding.rank == 2
    assert finding.evidence["cause"] == "gc"
    parts = finding.evidence["decomposition"]
    # over the other ranks' median 10.0 ms (not 10.1 with rank 2 among them)
    assert parts["excess_seconds"] == pytest.approx(0.0030)
    assert parts["gc_seconds"] == pytest.approx(0.0025)
    assert parts["other_seconds"] == pytest.approx(0.0005)
    assert parts["gc_generation"] == 2 and parts["work_seconds"] is None
    assert finding.evidence["lost_seconds_per_hour"] == 360.0  # the detector's evidence kept
    msg = finding.message
    assert msg.startswith("rank 2 on node07: Python garbage collection, not a slow GPU")
    assert "pauses 2.6 ms per step" in msg and "up to generation 2" in msg
    assert "2.5 ms of its 3.0 ms per step" in msg
    assert "(costs the job 0.0029 s per step, 6.0 min per hour)" in msg
    assert msg.endswith("so no rank pauses alone [compared within its peer group pp=0]")
    assert "gc.freeze()" in msg and "Megatron-LM" in msg and "gc.collect() every N steps" in msg
    assert "GPU's clocks" not in msg
    assert causes.stats["gc"] == 1 and causes.kinds == {2: "gc"}
    assert {"gc", "load_imbalance"} <= JOB_FINDING_KINDS["straggler"]


def test_more_tokens_than_the_peers_is_a_load_imbalance_with_the_ranks_share():
    causes = CauseAttribution()
    record = _record([10, 10, 13, 10], tokens=[1000, 1000, 1300, 1000])
    [finding] = _apply(causes, record, [_compute_finding()])
    assert finding.kind == "load_imbalance" and finding.evidence["cause"] == "load_imbalance"
    parts = finding.evidence["decomposition"]
    assert parts["work_unit"] == "tokens"
    assert parts["seconds_per_unit"] == pytest.approx(1e-5)
    assert parts["work_seconds"] == pytest.approx(0.003)
    assert parts["work_ratio"] == pytest.approx(1.3)
    assert parts["work_share"] == pytest.approx(1300 / 4300, rel=1e-5)  # 6 digits kept
    msg = finding.message
    assert "1.30x the median rank's tokens per step (30.2% of its peer group's)" in msg
    assert "10.00 µs per token" in msg and "sequence packing" in msg
    assert "length-balanced batching" in msg


def test_samples_stand_in_when_tokens_are_not_noted():
    causes = CauseAttribution()
    record = _record([10, 10, 14, 10], samples=[8, 8, 11, 8])
    [finding] = _apply(causes, record, [_compute_finding()])
    assert finding.kind == "load_imbalance"
    assert finding.evidence["decomposition"]["work_unit"] == "samples"
    assert "the median rank's samples per step" in finding.message


def test_a_rank_slow_per_token_stays_compute_and_says_so():
    causes = CauseAttribution()
    record = _record([10, 10, 13, 10], tokens=[1000] * 4)
    original = _compute_finding()
    [finding] = _apply(causes, record, [original])
    assert finding.kind == "compute" and finding.evidence["cause"] == "compute"
    assert finding.message.startswith(original.message)  # the GPU hint stays
    assert "per token it is 30% slower than its peers' median (13.00 µs vs 10.00 µs" in \
        finding.message
    assert "not its work, the rank itself is slow" in finding.message
    assert finding.evidence["decomposition"]["other_seconds"] == pytest.approx(0.003)
    assert causes.kinds == {}


def test_without_gc_or_work_measured_a_compute_finding_keeps_its_message():
    causes = CauseAttribution()
    original = _compute_finding()
    [finding] = _apply(causes, _record([10, 10, 13, 10]), [original])
    assert finding.kind == "compute" and finding.message == original.message
    assert finding.evidence["decomposition"]["work_seconds"] is None


def test_a_token_note_on_some_ranks_only_is_not_normalised_and_is_counted():
    causes = CauseAttribution()
    record = _record([10, 10, 13, 10], tokens=[1000, NAN, 1300, 1000])
    [finding] = _apply(causes, record, [_compute_finding()])
    assert finding.kind == "compute"
    assert finding.evidence["decomposition"]["work_unit"] is None
    assert causes.stats["partial_work_notes"] == 1
    assert "on every rank" in PARTIAL_NOTES_MESSAGE
    # tokens partial, samples complete: samples are used
    record = _record([10, 10, 13, 10], tokens=[1000, NAN, 1300, 1000], samples=[4, 4, 5.2, 4])
    [finding] = _apply(CauseAttribution(), record, [_compute_finding()])
    assert finding.evidence["decomposition"]["work_unit"] == "samples"


@pytest.mark.parametrize("bad", [-5.0, math.inf, -math.inf])
def test_negative_or_infinite_work_counts_as_not_noted(bad):
    causes = CauseAttribution()
    record = _record([10, 10, 13, 10], tokens=[1000, bad, 1300, 1000])
    [finding] = _apply(causes, record, [_compute_finding()])
    assert finding.kind == "compute"
    assert causes.stats["invalid_work_values"] == 1 and causes.stats["partial_work_notes"] == 1


def test_nan_everywhere_is_no_note_at_all_not_a_partial_one():
    causes = CauseAttribution()
    _apply(causes, _record([10, 10, 13, 10]))
    assert causes.stats["partial_work_notes"] == 0 and causes.stats["windows"] == 1


def test_the_clear_of_a_gc_finding_is_a_gc_clear():
    causes = CauseAttribution()
    record = _record([10, 10, 13, 10], gc_ms=[0, 0, 2.8, 0])
    [raised] = _apply(causes, record, [_compute_finding()])
    assert raised.kind == "gc"
    # the detector clears its own (compute) finding some windows later
    detector_clear = _compute_finding(step=99).clear(step=199, reason="recovered",
                                                     message="rank 2: compute slowdown cleared")
    [cleared] = _apply(causes, _record([10] * 4, step=199), [detector_clear])
    assert cleared.cleared and cleared.kind == "gc" and cleared.evidence["cause"] == "gc"
    assert cleared.message == "rank 2: Python GC slowdown cleared (recovered)"
    assert causes.kinds == {}
    # a compute clear with no attributed raise passes unchanged
    other = _compute_finding(rank=1).clear(step=299, reason="reset", message="x")
    assert _apply(causes, _record([10] * 4, step=299), [other]) == [other]


def test_the_clear_of_a_load_imbalance_is_a_load_imbalance_clear():
    causes = CauseAttribution()
    _apply(causes, _record([10, 10, 13, 10], tokens=[100, 100, 130, 100]), [_compute_finding()])
    clear = _compute_finding().clear(step=199, reason="not_reporting", message="x")
    [cleared] = _apply(causes, _record([10] * 4, step=199), [clear])
    assert cleared.kind == "load_imbalance"
    assert cleared.message == "rank 2: load imbalance (extra work) cleared (not reporting)"


def test_other_findings_pass_through_untouched():
    causes = CauseAttribution()
    data = Finding(detector="straggler", kind="data", severity=Severity.WARNING, message="d",
                   rank=2, evidence={"lost_seconds_per_step": 0.01})
    job = Finding(detector="straggler", kind="job_slowdown", severity=Severity.WARNING,
                  message="j")
    link = Finding(detector="link", kind="link", severity=Severity.WARNING, message="l", rank=2)
    findings = [data, job, link]
    out = _apply(causes, _record([10, 10, 13, 10], gc_ms=[0, 0, 3, 0]), findings)
    assert out == findings and causes.stats["attributed"] == 0


def test_the_parts_are_medians_over_the_last_windows():
    causes = CauseAttribution(CauseAttribution.Config(history_windows=3))
    for gc_ms in ([0, 0, 2.8, 0], [0, 0, 2.7, 0]):
        _apply(causes, _record([10, 10, 13, 10], gc_ms=gc_ms))
    # one window in which the pause happened to be small: the median keeps the cause
    [finding] = _apply(causes, _record([10, 10, 13, 10], gc_ms=[0, 0, 0.2, 0]),
                       [_compute_finding()])
    assert finding.kind == "gc"
    assert finding.evidence["decomposition"]["windows"] == 3
    assert finding.evidence["decomposition"]["gc_seconds"] == pytest.approx(0.0027)


def test_a_rank_is_compared_with_its_peer_group_only():
    causes = CauseAttribution()
    # ranks 0-3 one stage (10 ms), 4-7 another (20 ms); rank 2 pauses in GC within its stage
    record = _record([10, 10, 13, 10, 20, 20, 20, 20], gc_ms=[0, 0, 2.9, 0, 0, 0, 0, 0])
    [finding] = causes.apply([_compute_finding()], record,
                             lambda rank: (0, 1, 2, 3) if rank < 4 else (4, 5, 6, 7))
    assert finding.kind == "gc"
    assert finding.evidence["decomposition"]["excess_seconds"] == pytest.approx(0.003)


def test_no_excess_in_the_window_or_a_failing_peer_lookup_leaves_the_finding():
    causes = CauseAttribution()
    original = _compute_finding()
    assert _apply(causes, _record([10, 10, 9, 10], gc_ms=[0, 0, 3, 0]), [original]) == \
        [original]
    assert causes.stats["unattributed"] == 1

    def broken(rank):
        raise KeyError(rank)

    assert causes.apply([original], _record([10, 10, 13, 10]), broken) == [original]
    assert causes.stats["errors"] == 1


def test_a_record_without_the_new_columns_attributes_nothing_but_breaks_nothing():
    causes = CauseAttribution()
    record = WindowRecord(step=9, columns={"compute_seconds": np.array([0.01, 0.01, 0.013])},
                          ranks=np.arange(3))
    [finding] = causes.apply([_compute_finding()], record, lambda rank: (0, 1, 2))
    assert finding.kind == "compute"
    assert finding.evidence["decomposition"]["gc_generation"] is None


def test_invalid_configuration_is_rejected():
    with pytest.raises(ValueError):
        CauseAttribution.Config(history_windows=0)
    with pytest.raises(ValueError):
        CauseAttribution.Config(min_share=0)
