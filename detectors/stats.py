"""The statistics the detectors share, written once: the median of the finite values, its
row-wise form, the robust noise estimate, and evidence rounding.

Every function ignores NaN (and, where said, infinities): a rank that did not report a value
in a window carries NaN in the gathered record, and must neither count as 0 nor poison a median.
"""
from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np

__all__ = ["MAD_TO_SIGMA", "GroupIndex", "evidence_round", "mad", "nanmedian",
           "nanmedian_rows", "robust_sigma", "row_nanmedian"]

#: Consistency constant of the MAD for the normal distribution: 1 / Phi^-1(3/4)
#: (Rousseeuw & Croux 1993, "Alternatives to the median absolute deviation", JASA 88).
MAD_TO_SIGMA = 1.4826

#: Small-sample correction factors b_n of the MAD for n = 2..9 (Croux & Rousseeuw 1992,
#: "Time-efficient algorithms for two highly robust estimators of scale", Table 1); for larger n
#: the factor is n / (n - 0.8).
_MAD_SMALL_SAMPLE = {2: 1.196, 3: 1.495, 4: 1.363, 5: 1.206, 6: 1.200, 7: 1.140, 8: 1.129,
                     9: 1.107}


def nanmedian(values: np.ndarray | Iterable[float | None]) -> float:
    """The median of the finite values (NaN, +-inf and None left out).

    Args:
        values: any shape of float64 (flattened), or an iterable of floats / None.

    Returns:
        The median as a float (the mean of the two middle values for an even count, as
        ``numpy.median``); NaN when no value is finite.
    """
    if isinstance(values, np.ndarray):
        array = values.astype(np.float64, copy=False).ravel()
    else:
        array = np.array([math.nan if v is None else float(v) for v in values], dtype=np.float64)
    finite = array[np.isfinite(array)]
    return float(np.median(finite)) if finite.size else math.nan


def nanmedian_rows(matrix: np.ndarray) -> np.ndarray:
    """The median of each column over the rows where it is finite.

    Args:
        matrix: (N, C) float64.

    Returns:
        (C,) float64; NaN for a column with no finite value.

    Raises:
        ValueError: ``matrix`` is not 2-D.
    """
    matrix = np.asarray(matrix, dtype=np.float64)
    if matrix.ndim != 2:
        raise ValueError(f"nanmedian_rows takes an (N, C) matrix, got shape {matrix.shape}")
    return row_nanmedian(np.where(np.isfinite(matrix), matrix, np.nan).T)


def row_nanmedian(values: np.ndarray) -> np.ndarray:
    """Median along the last axis ignoring NaN, vectorised (numpy's ``nanmedian`` loops in
    Python over rows).

    Args:
        values: (..., K) float64; NaN is missing (infinities count as values: use
            :func:`nanmedian_rows` to leave them out).

    Returns:
        (...) float64; NaN where a row has no non-NaN value.
    """
    if values.shape[-1] == 0:
        return np.full(values.shape[:-1], math.nan)
    if values.shape[-1] == 1:
        return values[..., 0].copy()
    ordered = np.sort(values, axis=-1)  # NaN sort last
    count = np.sum(~np.isnan(ordered), axis=-1, keepdims=True)
    return _sorted_median(ordered, count)


def _sorted_median(ordered: np.ndarray, count: np.ndarray) -> np.ndarray:
    """Median of rows sorted with NaN last, given each row's count of non-NaN values."""
    last = ordered.shape[-1] - 1
    low = np.take_along_axis(ordered, np.clip((count - 1) // 2, 0, last), axis=-1)[..., 0]
    high = np.take_along_axis(ordered, np.clip(count // 2, 0, last), axis=-1)[..., 0]
    return np.where(count[..., 0] > 0, (low + high) / 2, np.nan)


def mad(values: np.ndarray) -> float:
    """The median absolute deviation from the median of the finite values.

    Args:
        values: (n,) float64.

    Returns:
        The MAD in the values' unit; NaN when no value is finite.
    """
    array = np.asarray(values, dtype=np.float64)
    finite = array[np.isfinite(array)]
    if not finite.size:
        return math.nan
    return float(np.median(np.abs(finite - np.median(finite))))


def robust_sigma(values: np.ndarray) -> float:
    """The standard deviation of the finite values, estimated from their MAD with the
    small-sample factor (robust to a minority of outliers, such as a straggler's own excess).

    Args:
        values: (n,) float64; NaN and infinities ignored.

    Returns:
        ``MAD_TO_SIGMA * b_n * MAD``; NaN when fewer than 2 values are finite.
    """
    array = np.asarray(values, dtype=np.float64)
    finite = array[np.isfinite(array)]
    n = finite.size
    if n < 2:
        return math.nan
    factor = _MAD_SMALL_SAMPLE.get(n, n / (n - 0.8))
    return MAD_TO_SIGMA * factor * mad(finite)


class GroupIndex:
    """Rows labelled by group, for the per-group statistics of one window in one pass: each
    group's rows scattered into a row of a NaN-padded ``(G, L)`` matrix (L the largest group's
    row count), whose sorted rows give every group's median at once.

    The medians equal :func:`nanmedian` of each group's rows taken alone, bit for bit (the same
    two middle values, averaged as ``(low + high) / 2`` like ``numpy.median``), and
    :meth:`robust_sigmas` equals :func:`robust_sigma` per group. Cost: one sort of G x L values
    per column (G x L is R when groups are of one size; a job of very uneven groups pads the
    small ones up to the largest).

    Args:
        labels: (R,) int64 group of each row, in ``[0, groups)``.
        groups: G, the number of groups.

    Attributes:
        counts: (G,) int64 rows of each group.
    """

    def __init__(self, labels: np.ndarray, groups: int) -> None:
        labels = np.asarray(labels, dtype=np.int64).ravel()
        self.groups = groups
        self.counts = np.bincount(labels, minlength=groups)
        order = np.argsort(labels, kind="stable")
        starts = np.concatenate([[0], np.cumsum(self.counts)[:-1]])
        self._labels = labels
        self._rows = labels[order]  # the group of each scattered value
        self._columns = np.arange(labels.size) - starts[self._rows]  # its place in that row
        self._order = order
        self._width = max(int(self.counts.max()) if labels.size else 0, 1)

    def padded(self, values: np.ndarray) -> np.ndarray:
        """(R,) or (R, C) values as (G, L) or (G, C, L) float64, NaN where a group has no row;
        non-finite values become NaN (left out, as :func:`nanmedian` leaves them)."""
        values = np.asarray(values, dtype=np.float64)
        finite = np.where(np.isfinite(values), values, np.nan)[self._order]
        if values.ndim == 1:
            out = np.full((self.groups, self._width), np.nan)
            out[self._rows, self._columns] = finite
            return out
        out = np.full((self.groups, values.shape[1], self._width), np.nan)
        out[self._rows, :, self._columns] = finite
        return out

    def medians(self, values: np.ndarray) -> np.ndarray:
        """Each group's median of its finite values: (R,) -> (G,), (R, C) -> (G, C) float64;
        NaN for a group (and column) with no finite value."""
        return row_nanmedian(self.padded(values))

    def robust_sigmas(self, values: np.ndarray) -> np.ndarray:
        """:func:`robust_sigma` of each group's finite values: (R,) -> (G,), (R, C) -> (G, C)
        float64; NaN for fewer than 2 finite values."""
        padded = self.padded(values)
        ordered = np.sort(padded, axis=-1)  # NaN last
        count = np.sum(~np.isnan(ordered), axis=-1, keepdims=True)
        centre = _sorted_median(ordered, count)
        deviation = row_nanmedian(np.abs(padded - centre[..., None]))
        n = count[..., 0]
        factor = np.array([_MAD_SMALL_SAMPLE.get(int(k), k / (k - 0.8) if k > 1 else math.nan)
                           for k in n.ravel().tolist()]).reshape(n.shape)
        return np.where(n >= 2, MAD_TO_SIGMA * factor * deviation, math.nan)

    def of_rows(self, per_group: np.ndarray) -> np.ndarray:
        """A per-group array (G, ...) taken at each row's group: (R, ...)."""
        return per_group[self._labels]


def evidence_round(value: float | None, digits: int = 6) -> float | None:
    """A figure for a finding's evidence: ``digits`` significant digits, None for None, NaN or
    an infinity (JSON has neither).

    Args:
        value: the figure, or None.
        digits: significant digits kept (>= 1).

    Returns:
        The rounded float, or None.
    """
    if value is None or not math.isfinite(value):
        return None
    return float(f"{value:.{digits}g}")
