"""The heartbeat's cost on the demo model's training step: heartbeat on vs off in one run.

Launches a W-rank gloo job with PyTorch's launcher. Every rank trains the demo's byte-level
transformer in DDP with the timing hook, a CollectiveTracer and a TrainingMonitor timing four
phases and sending step records to a Unix datagram sink in this process. Blocks of ``--block``
steps alternate (in rotating order) between the monitor's heartbeat threads **on** (datagrams
every ``heartbeat_seconds`` = 1 s to the sink, the rank's key written to the job's store every
``hang_store_seconds`` = 2 s: the defaults) and **off** (the threads stopped), on the same model
and monitor. Compared per pair of blocks: the CPU time of all the rank's threads per step
(``time.process_time``: the heartbeat threads' own CPU included) summed over the block, not a
median (a beat costs once a second, so a median over steps would never see it), and the wall
time per step. A block is several seconds long so that it holds several beats and key writes.

Also measured directly: one beat (snapshot, encode, send) and one key write (snapshot, encode,
``set`` on the job's store), and the training thread's own additions that are always on (the
phase publication and the tracer's progress counters) as the monitor's calls around no work.
Usage::

    python benchmarks/heartbeat_cost.py [--world-size 2] [--blocks 12] [--block 100]

Target: the heartbeat's cost per step not measurable above noise (within the off/off spread).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--blocks", type=int, default=12, help="rounds (one block per arm each)")
    p.add_argument("--block", type=int, default=100, help="steps per block")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--sink", default="", help=argparse.SUPPRESS)
    p.add_argument("--out", default="", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel

    from laggard.demo.model import BUCKET_CAP_MB, ByteBatches, ByteLM, load_stdlib_text
    from laggard.integrations.comm_timing import CommTimer, allreduce_timing_hook
    from laggard.integrations.heartbeat import heartbeat_datagram, take_snapshot
    from laggard.integrations.heartbeat_key import encode_key
    from laggard.integrations.monitor import TrainingMonitor
    from laggard.integrations.tracer import CollectiveTracer

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    batches = ByteBatches(load_stdlib_text(), batch_size=8, seq_len=64, seed=rank)
    torch.manual_seed(0)
    model = ByteLM()
    ddp = DistributedDataParallel(model, bucket_cap_mb=BUCKET_CAP_MB)
    tracer = CollectiveTracer()
    timer = CommTimer(tracer=tracer)
    ddp.register_comm_hook(timer, allreduce_timing_hook)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    monitor = TrainingMonitor(TrainingMonitor.Config(agent_address=args.sink, window_steps=20),
                              comm_timer=timer, tracer=tracer)

    def step() -> tuple[float, float]:
        start, start_cpu = time.perf_counter(), time.process_time()
        with monitor.step():
            with monitor.phase("data"):
                x, y = batches.next()
            with monitor.phase("forward"):
                loss = F.cross_entropy(ddp(x).flatten(0, 1), y.flatten())
            with monitor.phase("backward"):
                loss.backward()
            with monitor.phase("optimizer"):
                opt.step()
                opt.zero_grad(set_to_none=True)
        return time.perf_counter() - start, time.process_time() - start_cpu

    def toggle(on: bool) -> None:
        if on and monitor._heartbeat is None:
            monitor._start_heartbeat(dist)
        elif not on and monitor._heartbeat is not None:
            monitor._heartbeat.close()
            monitor._heartbeat = None

    for _ in range(40):  # warm-up: DDP's bucket rebuild, allocator
        step()
    cpu: dict[str, list[float]] = {"on": [], "off": []}
    wall: dict[str, list[float]] = {"on": [], "off": []}
    beats = writes = 0
    orders = list(itertools.permutations(("on", "off")))
    for block in range(args.blocks):
        for arm in orders[block % 2]:
            toggle(arm == "on")
            counters = monitor._heartbeat.stats if monitor._heartbeat is not None else None
            before = (counters.sent, counters.store_writes) if counters is not None else (0, 0)
            block_cpu = block_wall = 0.0
            for _ in range(args.block):
                w, c = step()
                block_cpu += c
                block_wall += w
            cpu[arm].append(block_cpu / args.block)
            wall[arm].append(block_wall / args.block)
            if counters is not None:
                beats += counters.sent - before[0]
                writes += counters.store_writes - before[1]
    toggle(False)

    # One beat and one key write, directly (the threads' work, off the training thread).
    from torch.distributed import distributed_c10d

    store = dist.PrefixStore("laggard/bench/", distributed_c10d._get_default_store().clone())
    sock = monitor._agent.sock
    start = time.process_time()
    for _ in range(500):
        payload = heartbeat_datagram(take_snapshot(monitor), rank=rank, world_size=2, run="b",
                                     pid=os.getpid(), node="n")
        if sock is not None:
            try:
                sock.send(payload)
            except OSError:
                pass
    beat_cost = (time.process_time() - start) / 500
    start = time.process_time()
    for i in range(200):
        store.set(f"hb/{rank}", encode_key(take_snapshot(monitor), rank=rank, run="b",
                                           pid=os.getpid(), beat=i))
    write_cost = (time.process_time() - start) / 200

    # The training thread's always-on additions: the monitor's calls around no work, and the
    # tracer's issue/complete of one collective.
    probe = TrainingMonitor(TrainingMonitor.Config(agent_address="", detect=False,
                                                   heartbeat_seconds=0, hang_store_seconds=0))
    start = time.process_time()
    for _ in range(5000):
        with probe.step():
            for phase in ("data", "forward", "backward", "optimizer"):
                with probe.phase(phase):
                    pass
    own_monitor = (time.process_time() - start) / 5000
    probe.close()
    groups = len(tracer.progress())
    start = time.process_time()
    for _ in range(5000):  # what the progress adds per collective: an issue, a completion
        handle = tracer.issue("allreduce", None)
        with tracer._lock:
            tracer._complete(handle, 0.0)
    own_progress = (time.process_time() - start) / 5000
    monitor.close()
    if rank == 0:
        Path(args.out).write_text(json.dumps({
            "cpu": cpu, "wall": wall, "beats": beats, "writes": writes,
            "beat_cost": beat_cost, "write_cost": write_cost, "own_monitor": own_monitor,
            "own_progress": own_progress, "groups": groups,
            "world_size": dist.get_world_size()}))
    dist.barrier()
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        path = str(Path(tmp) / "intake.sock")
        sink = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sink.bind(path)
        sink.settimeout(0.2)
        received = {"heartbeat": 0, "other": 0}
        stop = threading.Event()

        def drain() -> None:  # the agent's intake stand-in: receive and count
            while not stop.is_set():
                try:
                    payload = sink.recv(65536)
                except TimeoutError:
                    continue
                received["heartbeat" if b'"type":"heartbeat"' in payload else "other"] += 1

        drainer = threading.Thread(target=drain, daemon=True)
        drainer.start()
        out = Path(tmp) / "out.json"
        load = os.getloadavg()[0]
        subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
             str(args.world_size), __file__, "--worker", "--out", str(out), "--sink", path,
             "--blocks", str(args.blocks), "--block", str(args.block)],
            check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        stop.set()
        drainer.join(5)
        r = json.loads(out.read_text())
    load = max(load, os.getloadavg()[0])
    cpu_ratios = [on / off for on, off in zip(r["cpu"]["on"], r["cpu"]["off"], strict=True)]
    wall_ratios = [on / off for on, off in zip(r["wall"]["on"], r["wall"]["off"], strict=True)]
    # the noise floor: the same ratio between neighbouring off blocks
    offs = r["cpu"]["off"]
    noise = [a / b for a, b in itertools.pairwise(offs)]
    step_cpu = statistics.median(r["cpu"]["off"])
    print(f"load average {load:.1f} (1 min, the higher of start and end); {r['world_size']} "
          f"gloo ranks, {args.blocks} rounds x {args.block} steps per arm")
    print(f"CPU per step, off {1e3 * step_cpu:.2f} ms, on "
          f"{1e3 * statistics.median(r['cpu']['on']):.2f} ms; on/off per round: median "
          f"{statistics.median(cpu_ratios):.4f} (min {min(cpu_ratios):.4f}, max "
          f"{max(cpu_ratios):.4f}); off/off between neighbouring rounds: median "
          f"{statistics.median(noise):.4f} (min {min(noise):.4f}, max {max(noise):.4f})")
    print(f"wall per step, off {1e3 * statistics.median(r['wall']['off']):.2f} ms, on "
          f"{1e3 * statistics.median(r['wall']['on']):.2f} ms; on/off median "
          f"{statistics.median(wall_ratios):.4f}")
    print(f"rank 0 during the on blocks: {r['beats']} heartbeats sent, {r['writes']} keys "
          f"written (the sink received {received['other']} step records, all ranks)")
    print(f"one beat (snapshot, encode, send): {1e6 * r['beat_cost']:.1f} us CPU; one key "
          f"write (snapshot, encode, store set): {1e6 * r['write_cost']:.1f} us CPU; per "
          f"second at the defaults: {1e6 * (r['beat_cost'] + r['write_cost'] / 2):.1f} us, "
          f"{100 * (r['beat_cost'] + r['write_cost'] / 2):.4f}% of a core")
    print(f"always on, in the training thread: the monitor's step and 4 phases around no work "
          f"{1e6 * r['own_monitor']:.2f} us; the tracer's progress per collective "
          f"{1e6 * r['own_progress']:.2f} us ({r['groups']} group(s) traced)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
