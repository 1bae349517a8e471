"""Simulated per-rank step timings of a synchronous data-parallel job, with injected stragglers.

Each step every rank loads data, computes forward and backward, then enters the gradient
collective, which cannot finish before the last rank arrives and the slowest link has carried its
share. So, as in the issue's model, each rank's wait is::

    wait[r] = max_j(data[j] + compute[j]) - (data[r] + compute[r]) + max_j(transfer[j])

and every rank's step wall time is the same (up to a few microseconds of timer noise): the
reason wall time cannot name a straggler.

Noise, all independent per rank and step unless said otherwise:
- log-normal jitter of compute, data and transfer times (``jitter`` = sigma of the log);
- a static per-rank speed spread (GPUs of one model differ a little, for good);
- one-step pauses (garbage collection) and short data stalls of 1 to 3 steps;
- a slow sinusoidal drift of the whole job, and optionally a step change of the whole job.

Injected stragglers (:class:`Straggler`) slow one rank by a fraction ``slowdown`` of the nominal
per-step work (compute + data), through one cause: ``compute`` (its GPU computes
``1 + slowdown`` times slower), ``data`` (its input pipeline adds that much time) or ``link``
(its link adds that much transfer time, which every rank then waits for). Each therefore makes
the whole job about ``slowdown`` slower. Intermittent stragglers are slow for ``on_steps`` out of
every ``period_steps``.

Used by ``benchmarks/straggler_quality.py`` and the detector's tests; pure numpy.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from laggard.detectors.stats import row_nanmedian
from laggard.detectors.straggler import RankWindow

CAUSES = ("compute", "data", "link")
#: The kind of finding that names each injected cause.
CAUSE_KIND = {"compute": "compute", "data": "data", "link": "communication"}


@dataclass(kw_only=True, slots=True)
class Straggler:
    """One slow rank.

    Attributes:
        rank: global rank slowed.
        cause: ``compute``, ``data`` or ``link``.
        slowdown: added time as a fraction of the nominal per-step work (0.05 = 5%).
        start_step: first slow step.
        period_steps: 0 for a persistent straggler; else slow for the first ``on_steps`` of
            every ``period_steps`` steps from ``start_step`` (thermal cycling, a noisy
            neighbour).
        on_steps: slow steps per period (intermittent only).
    """

    rank: int
    cause: str
    slowdown: float
    start_step: int
    period_steps: int = 0
    on_steps: int = 0

    def __post_init__(self) -> None:
        if self.cause not in CAUSES:
            raise ValueError(f"cause must be one of {CAUSES}, got {self.cause!r}")
        if self.period_steps and not 0 < self.on_steps <= self.period_steps:
            raise ValueError("need 0 < on_steps <= period_steps")

    def slow_at(self, steps: np.ndarray) -> np.ndarray:
        """(K,) bool: whether this rank is slow at each of ``steps``."""
        since = steps - self.start_step
        if not self.period_steps:
            return since >= 0
        return (since >= 0) & (since % self.period_steps < self.on_steps)


@dataclass(kw_only=True, slots=True)
class JobModel:
    """A synchronous job's timings (seconds) and noise.

    Attributes:
        world_size: ranks.
        compute_seconds, data_seconds, transfer_seconds: nominal per-step times.
        jitter: sigma of the log-normal per-rank, per-step jitter (0.02 = about 2%).
        heterogeneity: sigma of the log of each rank's static speed factor.
        pause_probability: chance per rank-step of a one-step pause (garbage collection).
        pause_seconds: (low, high) range of a pause.
        stall_probability: chance per rank-step that a data stall starts (lasts 1-3 steps).
        stall_seconds: (low, high) range of a stall's added data time per step.
        drift: amplitude of the slow sinusoidal drift of the whole job (0.03 = +-3%: a genuine
            6% swing, under the job-slowdown threshold of 10%).
        drift_period_steps: period of that drift.
        job_slowdown: (first step, factor) of a step change of the whole job's compute, or None.
        ranks_per_node: ranks per host, for node names and local ranks.
        timer_noise_seconds: sigma of the per-rank step wall time measurement noise.
        stragglers: injected slow ranks.
        seed: random seed.
    """

    world_size: int
    compute_seconds: float = 0.100
    data_seconds: float = 0.005
    transfer_seconds: float = 0.020
    jitter: float = 0.02
    heterogeneity: float = 0.003
    pause_probability: float = 2e-3
    pause_seconds: tuple[float, float] = (0.05, 0.5)
    stall_probability: float = 5e-4
    stall_seconds: tuple[float, float] = (0.02, 0.2)
    drift: float = 0.03
    drift_period_steps: int = 500
    job_slowdown: tuple[int, float] | None = None
    ranks_per_node: int = 8
    timer_noise_seconds: float = 20e-6
    stragglers: list[Straggler] = field(default_factory=list)
    seed: int = 0


@dataclass(slots=True)
class SimWindow:
    """K steps of every rank: (R, K) float64 arrays, seconds."""

    step: int
    compute: np.ndarray
    data: np.ndarray
    wait: np.ndarray
    transfer: np.ndarray
    step_seconds: np.ndarray
    ranks: np.ndarray
    nodes: list[str]
    local_ranks: np.ndarray
    world_size: int

    def rank_window(self, *, summarized: bool = True) -> RankWindow:
        """The detector's input: per-rank medians (K=1, what the monitor gathers) or raw K."""
        if summarized:
            def median(a: np.ndarray) -> np.ndarray:
                return row_nanmedian(a)[:, None]

            return RankWindow(
                step=self.step, ranks=self.ranks, compute_seconds=median(self.compute),
                data_seconds=median(self.data), collective_wait_seconds=median(self.wait),
                transfer_seconds=median(self.transfer), world_size=self.world_size,
                nodes=self.nodes, local_ranks=self.local_ranks,
            )
        return RankWindow(
            step=self.step, ranks=self.ranks, compute_seconds=self.compute,
            data_seconds=self.data, collective_wait_seconds=self.wait,
            transfer_seconds=self.transfer, world_size=self.world_size, nodes=self.nodes,
            local_ranks=self.local_ranks,
        )


def simulate(model: JobModel, *, steps: int, window_steps: int) -> Iterator[SimWindow]:
    """Yield consecutive windows of ``window_steps`` steps until ``steps`` steps are done.

    Args:
        model: the job.
        steps: total steps (a last partial window is dropped).
        window_steps: K, steps per window.
    """
    rng = np.random.default_rng(model.seed)
    r, k = model.world_size, window_steps
    ranks = np.arange(r, dtype=np.int64)
    nodes = [f"node{i // model.ranks_per_node:04d}" for i in range(r)]
    local_ranks = ranks % model.ranks_per_node
    speed = np.exp(rng.normal(0.0, model.heterogeneity, r))[:, None]
    work_nominal = model.compute_seconds + model.data_seconds
    stall_left = np.zeros(r, dtype=np.int64)
    stall_amount = np.zeros(r)
    drift_phase = rng.uniform(0, 2 * np.pi)

    for first in range(0, steps - k + 1, k):
        step_ids = np.arange(first, first + k)
        job = 1 + model.drift * np.sin(2 * np.pi * step_ids / model.drift_period_steps
                                       + drift_phase)
        if model.job_slowdown is not None:
            job = job * np.where(step_ids >= model.job_slowdown[0], model.job_slowdown[1], 1.0)
        compute = model.compute_seconds * speed * job * rng.lognormal(0, model.jitter, (r, k))
        data = model.data_seconds * rng.lognormal(0, model.jitter, (r, k))
        transfer = model.transfer_seconds * rng.lognormal(0, model.jitter, (r, k))

        pauses = rng.random((r, k)) < model.pause_probability
        compute[pauses] += rng.uniform(*model.pause_seconds, int(pauses.sum()))
        for j in range(k):  # stalls carry over steps (and windows)
            start = (stall_left == 0) & (rng.random(r) < model.stall_probability)
            stall_left[start] = rng.integers(1, 4, int(start.sum()))
            stall_amount[start] = rng.uniform(*model.stall_seconds, int(start.sum()))
            stalled = stall_left > 0
            data[stalled, j] += stall_amount[stalled]
            stall_left[stalled] -= 1

        for s in model.stragglers:
            slow = s.slow_at(step_ids)
            if s.cause == "compute":
                compute[s.rank, slow] *= 1 + s.slowdown
            elif s.cause == "data":
                data[s.rank, slow] += s.slowdown * work_nominal
            else:
                transfer[s.rank, slow] += s.slowdown * work_nominal

        work = compute + data
        wait = work.max(axis=0) - work + transfer.max(axis=0)
        step_seconds = work + wait + np.abs(rng.normal(0, model.timer_noise_seconds, (r, k)))
        yield SimWindow(
            step=first + k - 1, compute=compute, data=data, wait=wait, transfer=transfer,
            step_seconds=step_seconds, ranks=ranks, nodes=nodes, local_ranks=local_ranks,
            world_size=r,
        )


@dataclass(slots=True)
class LongRun:
    """Long-run flap figures of the detector on simulated jobs (:func:`long_run`).

    Attributes:
        jobs, windows: simulated jobs and windows in all.
        clean_rank_steps: rank-steps of ranks never slowed.
        slowed_rank_steps: rank-steps of slowed ranks from their onset on.
        false_alarms: findings raised on a rank never slowed.
        false_recoveries: findings on a slowed rank cleared while it was still slowed (flaps).
        wrong_kinds: findings on a slowed rank naming another cause.
        named, stragglers: slowed ranks named after onset, of all slowed ranks.
        windows_to_name: for each named slowed rank, windows from onset to its finding.
    """

    jobs: int = 0
    windows: int = 0
    clean_rank_steps: int = 0
    slowed_rank_steps: int = 0
    false_alarms: int = 0
    false_recoveries: int = 0
    wrong_kinds: int = 0
    named: int = 0
    stragglers: int = 0
    windows_to_name: list[int] = field(default_factory=list)


def long_run(*, world_size: int, slowed: int, slowdown: float, rank_steps: float,
             window_steps: int = 20, jitter: float = 0.02, cause: str = "compute",
             steps_per_job: int = 200_000, seed: int = 0, config: object = None) -> LongRun:
    """Jobs of ``world_size`` ranks, ``slowed`` of them slowed by ``slowdown`` from the 10th
    window to the end, until ``rank_steps`` rank-steps are counted (clean ones when ``slowed``
    is 0, slowed ones otherwise), each job its own detector; the flaps and false alarms.

    Vectorised over ranks (one numpy array per window of the whole job): 64 ranks run at about
    1.5 ms per window on this machine, so 1e8 rank-steps take about two minutes.

    Args:
        slowed: slowed ranks per job, spread evenly over the ranks (a minority: the median rank
            must stay a clean one).
        rank_steps: how many rank-steps to simulate (clean or slowed, as above).
        steps_per_job: steps of each job (a new seed and a fresh detector each).
        config: the detector's ``StragglerDetector.Config`` (its default when None).
    """
    from laggard.detectors.straggler import StragglerDetector

    out = LongRun()
    onset = 10 * window_steps
    slowed_ranks = (np.linspace(0, world_size, slowed, endpoint=False).astype(int) + 1
                    if slowed else np.zeros(0, dtype=int))
    per_step = slowed if slowed else world_size
    job = 0
    while (out.slowed_rank_steps if slowed else out.clean_rank_steps) < rank_steps:
        left = rank_steps - (out.slowed_rank_steps if slowed else out.clean_rank_steps)
        steps = int(min(steps_per_job, onset + np.ceil(left / per_step / window_steps)
                        * window_steps))
        model = JobModel(world_size=world_size, jitter=jitter, seed=seed * 10_007 + job,
                         stragglers=[Straggler(rank=int(r), cause=cause, slowdown=slowdown,
                                               start_step=onset) for r in slowed_ranks])
        detector = StragglerDetector(config)  # type: ignore[arg-type]
        first: dict[int, int] = {}
        for index, window in enumerate(simulate(model, steps=steps, window_steps=window_steps)):
            for finding in detector.update(window.rank_window()):
                if finding.rank is None:
                    continue
                if finding.rank not in slowed_ranks:
                    out.false_alarms += 0 if finding.cleared else 1
                elif window.step < onset:
                    out.false_alarms += 0 if finding.cleared else 1
                elif finding.cleared:
                    out.false_recoveries += 1
                else:
                    first.setdefault(finding.rank, index - onset // window_steps + 1)
                    if finding.kind != CAUSE_KIND[cause]:
                        out.wrong_kinds += 1
            out.windows += 1
        done = (steps // window_steps) * window_steps
        out.clean_rank_steps += (world_size - slowed) * done
        out.slowed_rank_steps += slowed * max(done - onset, 0)
        out.stragglers += slowed
        out.named += len(first)
        out.windows_to_name += list(first.values())
        out.jobs += 1
        job += 1
    return out


def main(argv: list[str] | None = None) -> int:
    """The long-run flap figure (issue 26): false alarms in clean rank-steps, false recoveries
    of slowed ranks, windows from onset to name."""
    import argparse
    import time

    p = argparse.ArgumentParser(description=main.__doc__)
    p.add_argument("--world-size", type=int, default=64)
    p.add_argument("--slowed", type=int, default=8, help="slowed ranks per slowed job")
    p.add_argument("--slowdown", type=float, default=0.10)
    p.add_argument("--jitter", type=float, default=0.02)
    p.add_argument("--cause", choices=CAUSES, default="compute")
    p.add_argument("--clean-rank-steps", type=float, default=1e8)
    p.add_argument("--slowed-rank-steps", type=float, default=1e7)
    p.add_argument("--steps-per-job", type=int, default=200_000)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    print("| jobs | ranks | slowed per job | jitter | windows | clean rank-steps | false alarms | "
          "slowed rank-steps | false recoveries | named | windows onset→name median / p95 / "
          "max | CPU s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for slowed, target in ((0, args.clean_rank_steps), (args.slowed, args.slowed_rank_steps)):
        started = time.process_time()
        r = long_run(world_size=args.world_size, slowed=slowed, slowdown=args.slowdown,
                     rank_steps=target, jitter=args.jitter, cause=args.cause,
                     steps_per_job=args.steps_per_job,
                     seed=args.seed + slowed)
        delays = (f"{np.median(r.windows_to_name):g} / {np.percentile(r.windows_to_name, 95):g}"
                  f" / {max(r.windows_to_name)}" if r.windows_to_name else "-")
        named = f"{r.named} of {r.stragglers}" if slowed else "-"
        recoveries = r.false_recoveries if slowed else "-"
        what = f"{slowed} ({100 * args.slowdown:g}% {args.cause})" if slowed else "0"
        print(f"| {r.jobs} | {args.world_size} | {what} | "
              f"{100 * args.jitter:g}% | {r.windows:,} | {r.clean_rank_steps:.3g} | "
              f"{r.false_alarms} | {r.slowed_rank_steps:.3g} | {recoveries} | {named} | "
              f"{delays} | {time.process_time() - started:.0f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
