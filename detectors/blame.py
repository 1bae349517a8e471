"""Blame: the seconds of a synchronous job lost to each rank, summed per window, whatever the
shape of the rank's slowness (every step, a stall now and then, a burst).

In a synchronous collective every rank leaves when the last one arrives, so the time the
others spend waiting for rank r is their wait beyond r's own: on a step where r stalls for S
seconds every other rank's exposed wait grows by S while r's does not. Summed over a window,
``loo_median(wait) - wait[r]`` (the median of the *other* ranks' wait sums less r's) is the
job's time lost to r in that window, the last arrival's lead over the rest; it is exact for one
slow rank (steady or intermittent) and for several (each is compared with the others, so two
slow ranks of four, or a node holding half the job, still stand out against the rest). A
victim waits more than the median and gets no blame. A window *median* cannot see a stall on
fewer than half a window's steps; the *sum* sees every second of it.

Each rank reduces its own steps to a few sums (:data:`BLAME_COLUMNS`, :func:`window_blame`);
rank 0 compares the ranks (:mod:`laggard.detectors.blame_detector`). Only durations are
compared, never timestamps (hosts' clocks are not synchronised). Pipelines: the exposed P2P wait
counts as wait (a stage waiting for its neighbour's activations waits for that neighbour), and
ranks are compared within their peer group. FSDP: the exposed all-gather / reduce-scatter waits
are the collective wait the monitor already measures.
"""

from __future__ import annotations

import math

import numpy as np

from laggard.detectors.stats import robust_sigma
from laggard.detectors.window import WindowColumn

__all__ = ["BLAME_COLUMNS", "SPIKE_SIGMAS", "SPIKE_STEP_SHARE", "leave_one_out_median",
           "window_blame"]

#: A step's wait is a *spike* when it exceeds the rank's window median wait by more than this
#: share of the median step: a stall of a tenth of a step or more is one a reader counts.
SPIKE_STEP_SHARE = 0.1
#: ... and by more than this many robust sigmas of the rank's own per-step waits (3 sigmas:
#: about 1 step in 740 of a normal wait, so a noisy rank's ordinary steps are not spikes).
SPIKE_SIGMAS = 3.0

#: The per-window sums each rank adds to the window record beside the step medians.
BLAME_COLUMNS: tuple[WindowColumn, ...] = (
    WindowColumn("wait_sum_seconds", "seconds", "sum",
                 "exposed waits (collective + P2P) summed over the window's steps: what the "
                 "others' wait is compared with to blame a rank"),
    WindowColumn("step_sum_seconds", "seconds", "sum",
                 "step wall time summed over the window's steps: the job's time"),
    WindowColumn("wait_spike_count", "count", "sum",
                 "steps whose wait exceeded the rank's window median wait by more than a tenth "
                 "of the median step and 3 robust sigmas: the steps this rank waited for "
                 "someone's stall"),
    WindowColumn("wait_spike_seconds", "seconds", "sum",
                 "those steps' wait beyond the rank's window median"),
    WindowColumn("steps_count", "count", "sum", "steps with a finite step time in the window"),
    WindowColumn("work_spike_count", "count", "sum",
                 "steps whose work (compute + data, on the phase clock) exceeded the rank's "
                 "window median by more than a tenth of the median step and 3 robust sigmas: "
                 "this rank's own stalls"),
    WindowColumn("work_spike_seconds", "seconds", "sum",
                 "those steps' work beyond the rank's window median"),
    WindowColumn("monitor_cpu_seconds", "seconds", "sum",
                 "rank 0: CPU seconds of the monitor's analysis thread since the last window "
                 "(it holds the interpreter lock the training thread needs: laggard's cost, "
                 "held out of rank 0's blame); 0 on the other ranks"),
)


def window_blame(wait: np.ndarray, step: np.ndarray,
                 work: np.ndarray | None = None) -> dict[str, float]:
    """One rank's :data:`BLAME_COLUMNS` from its window's per-step values.

    Args:
        wait: (K,) float64 exposed wait of each step (collective + P2P), seconds; NaN where
            unmeasured.
        step: (K,) float64 step wall time, seconds; NaN where unmeasured.
        work: (K,) float64 compute + data of each step on the phase clock, seconds; None or
            NaN where unmeasured.

    Returns:
        Column name -> value; the sums are over the finite values (0 for none), the spike
        figures 0 when fewer than 3 values are finite.
    """
    steps = np.asarray(step, dtype=np.float64)
    steps = steps[np.isfinite(steps)]
    typical = float(np.median(steps)) if steps.size else math.nan
    waits = _finite(wait)
    wait_spikes = _spikes(waits, typical)
    work_spikes = _spikes(_finite(work), typical)
    return {"wait_sum_seconds": float(waits.sum()), "step_sum_seconds": float(steps.sum()),
            "wait_spike_count": wait_spikes[0], "wait_spike_seconds": wait_spikes[1],
            "steps_count": float(steps.size),
            "work_spike_count": work_spikes[0], "work_spike_seconds": work_spikes[1]}


def _finite(values: np.ndarray | None) -> np.ndarray:
    if values is None:
        return np.zeros(0)
    array = np.asarray(values, dtype=np.float64)
    return array[np.isfinite(array)]


def _spikes(values: np.ndarray, typical_step: float) -> tuple[float, float]:
    """(count, seconds beyond the median) of the values that are spikes (module constants)."""
    if values.size < 3 or not math.isfinite(typical_step):
        return 0.0, 0.0
    excess = values - np.median(values)
    sigma = robust_sigma(values)
    threshold = max(SPIKE_STEP_SHARE * typical_step,
                    SPIKE_SIGMAS * sigma if math.isfinite(sigma) else 0.0)
    over = excess > threshold
    return float(over.sum()), float(excess[over].sum())


def leave_one_out_median(values: np.ndarray) -> np.ndarray:
    """For each value, the median of all the *other* values, in one sort.

    Args:
        values: (n,) float64, all finite, n >= 2.

    Returns:
        (n,) float64: ``out[i] = median(values without values[i])`` (the mean of the two
        middle values for an even count, as ``numpy.median``).

    Raises:
        ValueError: fewer than 2 values.
    """
    values = np.asarray(values, dtype=np.float64)
    n = values.size
    if n < 2:
        raise ValueError("a leave-one-out median needs at least 2 values")
    order = np.argsort(values, kind="stable")
    ordered = values[order]
    position = np.empty(n, dtype=np.int64)
    position[order] = np.arange(n)
    m = n - 1  # values left
    # the rest's k-th smallest is ordered[k] below the removed one's place, ordered[k + 1] from it
    def kth(k: int) -> np.ndarray:
        return np.where(k < position, ordered[k], ordered[min(k + 1, n - 1)])
    if m % 2:
        return kth(m // 2)
    return (kth(m // 2 - 1) + kth(m // 2)) / 2
