"""detectors/stats.py: the shared statistics, on plain arrays."""
import logging
import math

import numpy as np
import pytest

from laggard.detectors import stats
from laggard.log_once import LogOnce


def test_nanmedian_ignores_nan_inf_none_and_averages_even_counts():
    assert stats.nanmedian(np.array([1.0, np.nan, 3.0, np.inf])) == 2.0
    assert stats.nanmedian([None, 5.0, 1.0, 3.0]) == 3.0
    assert math.isnan(stats.nanmedian(np.array([np.nan, -np.inf])))
    assert math.isnan(stats.nanmedian([]))


def test_nanmedian_rows_per_column():
    matrix = np.array([[1.0, np.nan, np.nan], [3.0, 2.0, np.nan], [5.0, np.inf, np.nan]])
    out = stats.nanmedian_rows(matrix)
    assert out[0] == 3.0 and out[1] == 2.0 and math.isnan(out[2])
    with pytest.raises(ValueError):
        stats.nanmedian_rows(np.zeros(3))


def test_robust_sigma_matches_a_normal_sample_and_resists_an_outlier():
    rng = np.random.default_rng(0)
    sample = rng.normal(0.0, 2.0, 20_000)
    assert stats.robust_sigma(sample) == pytest.approx(2.0, rel=0.03)
    with_outlier = np.concatenate([sample[:99], [1e6]])
    assert stats.robust_sigma(with_outlier) < 3.0
    assert math.isnan(stats.robust_sigma(np.array([1.0, np.nan])))


def test_robust_sigma_small_sample_factor():
    values = np.array([0.0, 1.0, 2.0, 3.0])  # MAD 1.0, n = 4
    assert stats.robust_sigma(values) == pytest.approx(stats.MAD_TO_SIGMA * 1.363 * 1.0)


def test_evidence_round():
    assert stats.evidence_round(1.23456789) == 1.23457
    assert stats.evidence_round(1234.5678, 3) == 1230.0
    assert stats.evidence_round(None) is None
    assert stats.evidence_round(math.nan) is None
    assert stats.evidence_round(math.inf) is None


def test_log_once_logs_each_key_once(caplog):
    logger = logging.getLogger("laggard.test.once")
    once = LogOnce(logger)
    with caplog.at_level(logging.WARNING, logger="laggard.test.once"):
        assert once("socket", "socket failed: %s", "ENOENT")
        assert not once("socket", "socket failed: %s", "again")
        assert once("field", "bad field")
    assert [r.getMessage() for r in caplog.records] == ["socket failed: ENOENT", "bad field"]
    assert once.seen("socket") and not once.seen("other")


def test_group_index_gives_each_groups_median_and_sigma_bit_for_bit():
    """GroupIndex's per-group statistics equal nanmedian / robust_sigma of each group's rows
    taken alone (exactly: the straggler detector's replay depends on it), NaN and infinities
    left out, a group with no row or one value NaN."""
    rng = np.random.default_rng(31)
    for _ in range(50):
        rows, groups = int(rng.integers(0, 40)), int(rng.integers(1, 6))
        labels = rng.integers(0, groups, rows)
        values = rng.normal(size=(rows, 3))
        values[rng.random((rows, 3)) < 0.2] = np.nan
        values[rng.random((rows, 3)) < 0.05] = np.inf
        index = stats.GroupIndex(labels, groups)
        medians, sigmas = index.medians(values), index.robust_sigmas(values)
        assert index.counts.tolist() == np.bincount(labels, minlength=groups).tolist()
        for g in range(groups):
            for c in range(3):
                mine = values[labels == g, c]
                np.testing.assert_array_equal(medians[g, c], stats.nanmedian(mine))
                np.testing.assert_array_equal(sigmas[g, c], stats.robust_sigma(mine))
            np.testing.assert_array_equal(index.medians(values[:, 0])[g],
                                          stats.nanmedian(values[labels == g, 0]))
