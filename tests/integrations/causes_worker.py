"""One rank of a real 4-rank gloo DDP job in which one rank is slow for a reason that is not its
hardware; launched by test_causes_job.py through ``python -m torch.distributed.run``.

Usage: ``causes_worker.py OUT_DIR SCENARIO`` with SCENARIO

* ``gc``: rank :data:`SLOW_RANK` builds cyclic garbage in its forward every step: many small
  self-referencing lists, so its collector runs gen-0 and gen-1 collections over them;
* ``tokens``: rank :data:`SLOW_RANK` gets :data:`TOKEN_RATIO` times the tokens per step (a
  really longer batch, not a sleep), and every rank notes its tokens (``monitor.note``);
* ``tokens-no-note``: the same batches, no note.

The model is a per-token MLP language model, so a step's compute grows with its tokens. Phases
are timed in thread CPU time (4 ranks share the machine's cores). Rank 0 writes ``result.json``:
the findings raised and cleared, the cause attribution's counters, and the last window's
per-rank ``compute_seconds``, ``gc_seconds`` and ``tokens`` (what the test prints on failure);
rank :data:`SLOW_RANK` writes ``gc-rank2.json``, its own GC timer's collection counts.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from laggard.detectors.straggler import StragglerDetector
from laggard.integrations.comm_timing import CommTimer, allreduce_timing_hook
from laggard.integrations.monitor import TrainingMonitor

SLOW_RANK = 2
#: 32 windows: the detector learns the noise in its first 5 and needs 3 or more of evidence; on
#: a loaded 2-core host (load average 9, 3 jobs like this one side by side) a 1.3x-token rank
#: was still unnamed after 24 windows once in 7 runs (its CPU time then only 16% over the
#: median's, the others' inflated), so the run leaves room.
#: 1.5x the tokens, not 1.3x: in a fresh-clone CI run a 1.3x rank's thread CPU time was only
#: 5-10% over the median's for 20 windows (per-step costs that do not grow with the tokens, and
#: a loaded host's noise, dilute the ratio) and nobody was named in 32 windows.
STEPS = 320
WINDOW = 10
BATCH, SEQ = 16, 96
TOKEN_RATIO = 1.5
#: Cyclic lists the gc rank builds per step, and the references each holds: about 4 ms of
#: young-generation collections per step (gen 0 and 1: every list dies young, so no full
#: collection, which in a process that imported torch takes ~150 ms), a third of a step's
#: compute, beside ~1 ms of building them. Lists of references are cheap to build (one C loop)
#: and dear to collect (the collector traverses each reference twice, the dealloc once);
#: 48 of them keep each list in pymalloc's small blocks, and the 700 a gen-0 collection finds
#: in the caches, so the pause, not the allocation, is the rank's excess.
GARBAGE_LISTS, GARBAGE_WIDTH = 16_000, 48


def build_garbage(count: int, width: int) -> None:
    """``count`` lists of ``width`` references, each holding itself: only the cyclic collector
    frees them (a gen-0 collection every 700 of them, a gen-1 one every ten of those)."""
    for _ in range(count):
        garbage = [None] * width
        garbage[0] = garbage


def main(out: Path, scenario: str) -> None:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(name)s %(levelname)s %(message)s")
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Embedding(256, 64), torch.nn.Linear(64, 512), torch.nn.ReLU(),
        torch.nn.Linear(512, 64), torch.nn.ReLU(), torch.nn.Linear(64, 256))
    ddp = DistributedDataParallel(model)
    timer = CommTimer()
    ddp.register_comm_hook(timer, allreduce_timing_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    config = TrainingMonitor.Config(
        agent_address="", window_steps=WINDOW, phase_clock="thread_cpu",
        heartbeat_seconds=0, hang_store_seconds=0,
        # ranks sharing two cores (with whatever else runs) differ by a few % in CPU time for
        # the same work, and the injected rank's extra CPU slows the others' caches: the
        # demo's floors (demo/worker.py)
        straggler=StragglerDetector.Config(min_slowdown=0.05, job_slowdown_threshold=0.5))
    monitor = TrainingMonitor(config, comm_timer=timer)
    slow = rank == SLOW_RANK
    seq = round(SEQ * TOKEN_RATIO) if slow and scenario.startswith("tokens") else SEQ
    generator = torch.Generator().manual_seed(rank)
    for _ in range(STEPS):
        with monitor.step():
            with monitor.phase("data"):
                x = torch.randint(0, 256, (BATCH, seq + 1), generator=generator)
            with monitor.phase("forward"):
                if slow and scenario == "gc":
                    build_garbage(GARBAGE_LISTS, GARBAGE_WIDTH)
                logits = ddp(x[:, :-1])
                loss = F.cross_entropy(logits.flatten(0, 1), x[:, 1:].flatten())
            with monitor.phase("backward"):
                loss.backward()
            with monitor.phase("optimizer"):
                opt.step()
                opt.zero_grad(set_to_none=True)
            if scenario == "tokens":
                monitor.note("tokens", BATCH * seq)
    monitor.wait_analysed()  # rank 0 analyses on a thread: its last window too
    if rank == 0:
        straggler = monitor.participant("straggler")
        last = monitor.windows[-1]
        doc = {
            "raised": [f.to_dict() for f in monitor.findings],
            "cleared": [f.to_dict() for f in monitor.cleared],
            "causes": straggler.causes.stats,
            "last_window": {name: [float(v) for v in last[name]]
                            for name in ("compute_seconds", "gc_seconds", "gc_generation",
                                         "tokens")},
            # every window's compute and wait per rank, ms: what a failure is read from
            "windows_ms": {name: [[round(1e3 * float(v), 2) for v in w[name]]
                                  for w in monitor.windows]
                           for name in ("compute_seconds", "collective_wait_seconds")},
            "bad_notes": monitor.stats.bad_notes,
        }
        (out / "result.json").write_text(json.dumps(doc, indent=1))
    if rank == SLOW_RANK:  # the rank that built the garbage: its collector's counts
        gc_stats = {"collections": monitor.stats.gc.collections,
                    "other_thread_collections": monitor.stats.gc.other_thread_collections}
        (out / f"gc-rank{rank}.json").write_text(json.dumps(gc_stats))
    monitor.close()
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
    sys.stdout.flush()  # torn down: now skip the C++ static destructors, where gloo's
    os._exit(0)  # threads abort a rank 1 run in 20 (ENVIRONMENT.md; demo/worker.py)
