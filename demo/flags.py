"""Flags of ``laggard demo``: the parser's half of :mod:`laggard.demo.local`, kept apart so that
building it imports nothing but :mod:`argparse` (``laggard demo --help`` must not import torch,
numpy or the report; :mod:`laggard.cli` imports ``local`` only to run).
"""

from __future__ import annotations

import argparse

#: ``laggard.compression.COMPRESSORS`` (not imported: that imports torch).
COMPRESSION_CHOICES = ("none", "fp16", "sign", "topk", "powersgd", "onebit_adam")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``laggard demo``."""
    parser.add_argument("--world-size", type=int, default=4, metavar="W",
                        help="ranks to launch on this machine, at least 3 (default: 4)")
    parser.add_argument("--steps", type=int, default=600,
                        help="training steps (default: 600)")
    parser.add_argument("--slow-rank", default=None, metavar="R[,R...]",
                        help="rank to slow down, or a comma list of ranks (1,3), each slowed by "
                             "--slowdown (default: W // 2)")
    parser.add_argument("--nodes", type=int, default=0, metavar="N",
                        help="place the ranks on N emulated nodes node-0..node-{N-1}, "
                             "consecutive ranks each (TrainingMonitor.Config(node=...)); N must "
                             "divide --world-size (default: none, the host's name)")
    parser.add_argument("--slowdown", type=float, default=None,
                        help="factor applied to the slow rank's forward+backward time; 1.0 "
                             "injects nothing (default: 1.25; 1.0 with --inject)")
    parser.add_argument("--slow-from", type=int, default=None, metavar="S",
                        help="first slowed step (default: a third of --steps)")
    parser.add_argument("--window", type=int, default=20, metavar="K",
                        help="steps per detection window (default: 20)")
    parser.add_argument("--seed", type=int, default=0, help="model and data seed (default: 0)")
    parser.add_argument("--report", metavar="PATH", help="also write the report as JSON")
    parser.add_argument("--html", metavar="PATH",
                        help="also write the run report as one self-contained HTML page "
                             "(heatmaps of each rank's excess, findings over the loss, phases)")
    parser.add_argument("--keep-agent", action="store_true",
                        help="keep the agent (and its /metrics) up after the report until you "
                             "press Enter or Ctrl-C (default: it stops with the demo)")
    parser.add_argument("--windows", metavar="PATH",
                        help="also keep rank 0's gathered windows as JSON lines (what "
                             "`laggard report PATH --html OUT` reads)")
    parser.add_argument("--metrics-address", default="127.0.0.1:0", metavar="HOST:PORT",
                        help="where the demo's agent serves /metrics (default: a free "
                             "loopback port)")
    parser.add_argument("--intake-address", default="127.0.0.1:0", metavar="HOST:PORT",
                        help="UDP address of the demo's agent intake (default: a free "
                             "loopback port)")
    parser.add_argument("--compression", default="none", choices=COMPRESSION_CHOICES,
                        help="gradient compression in the DDP communication hook: none (the "
                             "timed fp32 all-reduce), fp16, sign (1-bit, error feedback), topk "
                             "(1%%, error feedback), powersgd (rank 4), onebit_adam (1-bit "
                             "Adam: AdamW for 100 steps, then the momentum compressed to 1 bit) "
                             "(default: none)")
    parser.add_argument("--parallel", choices=["ddp", "fsdp", "pp"], default="ddp",
                        help="ddp (DistributedDataParallel, default), fsdp (FSDP2 fully_shard "
                             "per block, ZeRO-3) or pp (2 pipeline stages x W/2 data-parallel "
                             "ranks: torch.distributed.pipelining, Schedule1F1B; ranks 0..W/2-1 "
                             "are stage 0)")
    parser.add_argument("--no-prefetch", dest="prefetch", action="store_false",
                        help="fsdp: issue each all-gather when its block needs it, not before")
    parser.add_argument("--run", default="", metavar="ID",
                        help="the job's run id (TrainingMonitor.Config(run=...)); default: "
                             "the launcher's (TORCHELASTIC_RUN_ID)")
    parser.add_argument("--use-agent", default="", metavar="HOST:PORT",
                        help="report to the laggard agent already serving /metrics at "
                             "HOST:PORT (give its --intake-address too) instead of starting "
                             "one: two demos at once on one agent")
    parser.add_argument("--fake-gpus", action="store_true",
                        help="give every rank a fake GPU (the agent runs "
                             "--collector.nvml.fake-gpus W, the ranks read the same fake NVML "
                             "through LAGGARD_FAKE_NVML) whose state the straggler finding "
                             "reports: here, no clock event")
    parser.add_argument("--throttle-slow-gpu", nargs="?", const="sw_thermal", default="",
                        metavar="REASON",
                        help="--fake-gpus, with the slowed rank's GPU held at 1.41 of 1.98 GHz "
                             "by REASON (default sw_thermal; or sw_power_cap, hw_slowdown, "
                             "hw_thermal, hw_power_brake): the finding names it")
    parser.add_argument("--device", choices=["cpu", "emulated-async"], default="cpu",
                        help="cpu (default): the model runs on the training thread, phases "
                             "timed in its CPU time; emulated-async: an emulated asynchronous "
                             "accelerator, each rank's model work on a stream thread of its own "
                             "that the loop only launches and synchronises, timed by the "
                             "monitor's device clock beside the CPU clock (see docs/demo.md)")
    parser.add_argument("--inject-bitflip", default="", metavar="SPEC",
                        help="flip one bit and watch the gradient-integrity checks name the rank: "
                             "rank=R,step=S,bucket=B,element=E,bit=N,where=W with W in "
                             "before_send, after_reduce, param (e.g. rank=1,step=30,bucket=0,"
                             "element=100,bit=30,where=after_reduce)")
    parser.add_argument("--inject", action="append", default=[], metavar="SPEC",
                        help="hang=rank:R,step:S,kind:K with K in python (holds the "
                             "interpreter lock: the rank falls silent), spin (a pure-Python "
                             "loop), data (the data loader blocks), skip (skips one "
                             "all-reduce), device (--device emulated-async: the stream never "
                             "completes an all-reduce): the demo reports who rank 0 named and "
                             "how fast, then stops the job; or checkpoint=step:S,factor:F (step "
                             "S takes F times the usual on every rank: slow, not hung); "
                             "gc=rank:R (rank R makes cyclic garbage: ~30%% of its step in "
                             "Python's GC), tokens=rank:R[,factor:F][,note:off] (rank R's "
                             "sequences F times longer, default 1.3; every rank notes its tokens "
                             "unless note:off; pp: R's whole pipeline), stage=stage:S,layers:N "
                             "(pp: stage S holds N more blocks); shapes of a slowness, from "
                             "--slow-from on: stall=rank:R,every:N,seconds:S[,mode:sleep] (rank "
                             "R computes, or sleeps, S seconds more every N-th step), "
                             "burst=rank:R,steps:K,every:M,factor:F (R F times slower on K "
                             "steps of every M), node=node:NAME,factor:F (--nodes: every rank of "
                             "node NAME F times slower), moving=every:N,factor:F[,rank:R] (one "
                             "rank F times slower, the next one every N steps, from R, default "
                             "1). Once each at most")
    parser.add_argument("--hang-bound", type=float, default=60.0, metavar="SECONDS",
                        help="with an injected hang: stop the job, exit status 1, when rank 0 "
                             "has not named it this many seconds after it began (default: 60)")
