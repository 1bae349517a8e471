"""The plain cumulative histogram behind the agent's phase and collective histograms: Prometheus
``le`` semantics (a value equal to a bound falls in that bucket), the ``+Inf`` bucket, sum and
count, and the family the exporter makes of it."""

from __future__ import annotations

from prometheus_client.core import HistogramMetricFamily

from laggard.collectors.histogram import DURATION_BUCKETS_SECONDS, Histogram


def test_a_value_on_a_bound_counts_in_that_bucket_and_buckets_are_cumulative():
    h = Histogram((0.1, 1.0, 10.0))
    for seconds in (0.05, 0.1, 0.5, 1.0, 60.0):
        h.observe(seconds)
    assert h.cumulative_buckets() == [("0.1", 2), ("1.0", 4), ("10.0", 4), ("+Inf", 5)]
    assert h.count == 5 and h.sum == 61.65


def test_an_empty_histogram_has_every_bucket_at_zero():
    h = Histogram()
    buckets = h.cumulative_buckets()
    assert [le for le, _ in buckets] == [repr(b) for b in DURATION_BUCKETS_SECONDS] + ["+Inf"]
    assert {n for _, n in buckets} == {0} and (h.count, h.sum) == (0, 0.0)


def test_the_default_bounds_are_sorted_and_span_1ms_to_60s():
    assert list(DURATION_BUCKETS_SECONDS) == sorted(DURATION_BUCKETS_SECONDS)
    assert DURATION_BUCKETS_SECONDS[0] == 0.001 and DURATION_BUCKETS_SECONDS[-1] == 60.0


def test_its_buckets_make_a_prometheus_histogram_family(expose, value):
    h = Histogram()
    for seconds in (0.004, 0.2, 0.2, 45.0):
        h.observe(seconds)

    class Phase:
        def collect(self):
            family = HistogramMetricFamily("laggard_step_phase_seconds", "Phase time.",
                                           labels=["phase"])
            family.add_metric(["backward"], h.cumulative_buckets(), h.sum)
            yield family

    text = expose(Phase())
    assert value(text, 'laggard_step_phase_seconds_bucket{le="0.25",phase="backward"}') == 3
    assert value(text, 'laggard_step_phase_seconds_count{phase="backward"}') == 4
    assert value(text, 'laggard_step_phase_seconds_bucket{le="+Inf",phase="backward"}') == 4
