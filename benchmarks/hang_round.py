"""One hang round at scale against a real ``torch.distributed.TCPStore``: node keys (each node's
leader writes one key for its 8 ranks) against today's per-rank keys, in the same run.

For each scale (``--nodes``, 8 ranks a node) and each scheme:

* **write**: simulated writers (``--writers`` processes, each its own store connection, as a
  job's ranks have) write one round of keys as fast as the store takes them: the node scheme
  one key per node (the ranks' real keys, :func:`~laggard.integrations.heartbeat_key.
  encode_node_key`), today's one key per rank (:func:`~laggard.integrations.heartbeat_key.
  encode_key`); same key sizes as a job's (two groups per rank: its node's TP group and its DP
  group). A ``check`` after the writes waits until the server has applied them (a ``set`` is
  not answered). The store's measured capacity: keys per second and MB per second.
* **read**: rank 0's read of the round on its own connection: the node scheme with
  :class:`~laggard.integrations.hang_read.RoundReader` (``check`` then ``multi_get`` in
  batches of 512), today's with one ``check`` and one ``multi_get`` of every key (its code).
* **verdict**: :meth:`~laggard.integrations.hang_watch.HangWatch.observe` on the round read, a
  job hung with one rank that never issued a DP all-reduce: decode every key, classify, the
  report (checked: that rank alone is named).

The round time (every rank's state at rank 0) is the write interval the job's write budget
sets (``max(store_seconds, keys / writes_per_second)``: 500 writes/s; the store's measured
capacity is far above) plus rank 0's read; the verdict's time is given apart, wall and CPU
(the wall time swings with this shared machine's load; a job's rank 0 has its cores). The
hang is then named, by the hang watch's rules (:mod:`laggard.integrations.hang_watch`:
interval I, silence after ``3 I + 1 s``, keys quiet for ``max(hang_after / 2, 3 I + 1 s)``),
within:

* a rank whose heartbeat threads live (data, python, skip): ``max(hang_after, quiet_after +
  s + I + s) + R`` for node keys (the member's key at most ``s = store_seconds`` old at its
  leader, the leader's key at most I old, rank 0 reading every s), ``max(hang_after,
  quiet_after + 2 I) + R`` for per-rank keys (rank 0 read every I);
* a silent rank (its process stopped): rank 0 starts watching once its own thread has been
  quiet one interval (checked every s: ``I + s``; per-rank keys every I: ``2 I``), then the
  silence threshold ``3 I + 1``, then at most one read period; R the read and verdict.

Usage::

    python benchmarks/hang_round.py                       # 2,048 and 8,192 nodes (16,384 and
    python benchmarks/hang_round.py --nodes 256 --writers 4          # 65,536 ranks)

The lead's ``benchmarks/scale.py`` calls :func:`hang_rounds`. Targets: the node round within
10 s at 16,384 ranks and 20 s at 65,536; the hang named within 30 s at 16,384.
"""

from __future__ import annotations

import argparse
import datetime
import multiprocessing
import os
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any

RUN = "hang-round"
RANKS_PER_NODE = 8
HUNG_RANK = 5  # never issues DP all-reduce #11


@dataclass(frozen=True)
class SchemeRound:
    """One scheme's round at one scale (seconds unless named otherwise)."""

    scheme: str  # "node" or "rank"
    ranks: int
    keys: int  # store keys in one round
    key_bytes: int  # bytes of one key (the mean)
    write_seconds: float  # the store took the round's writes (unthrottled, every writer)
    writes_per_second: float  # measured store capacity: keys / write_seconds
    mb_per_second: float
    read_seconds: float  # rank 0's read of the round (wall)
    multi_get_keys_per_second: float
    verdict_seconds: float  # decode every key, classify, report (wall)
    verdict_cpu_seconds: float  # the same, CPU time of rank 0's thread (load-independent)
    named: tuple[int, ...]  # the ranks the verdict named
    interval: float  # the write interval the budget sets
    round_seconds: float  # every rank's state at rank 0: interval + read
    named_live_seconds: float  # hang named, a rank whose threads live (arithmetic)
    named_silent_seconds: float  # hang named, a stopped rank (arithmetic)


def rank_snapshot(rank: int, nodes: int, hung: bool) -> Any:
    """A rank of a job hung in DP all-reduce #11: in its node's TP group (8 ranks) and its DP
    group (one rank a node); ``hung``: it never issued #11 (still in data)."""
    from laggard.integrations.heartbeat_key import RankSnapshot
    from laggard.wire import GroupProgress

    node, local = divmod(rank, RANKS_PER_NODE)
    tp, dp = f"tp:{node}", f"dp:{local}"
    issued = 10 if hung else 11
    groups = (GroupProgress(group=tp, issued=40, completed=40, op="allgather"),
              GroupProgress(group=dp, issued=issued, completed=10, op="allreduce"))
    members = {tp: tuple(range(node * RANKS_PER_NODE, (node + 1) * RANKS_PER_NODE)),
               dp: tuple(range(local, nodes * RANKS_PER_NODE, RANKS_PER_NODE))}
    return RankSnapshot(step=812, phase="data" if hung else "backward",
                        phase_seconds=95.0 if hung else 60.0, step_seconds=1.0,
                        quiet_seconds=60.0, groups=groups, members=members,
                        pending_seconds=(None, None if hung else 60.0), wall=time.time())


def rank_key(rank: int, nodes: int) -> bytes:
    from laggard.integrations.heartbeat_key import encode_key

    return encode_key(rank_snapshot(rank, nodes, rank == HUNG_RANK), rank=rank, run=RUN,
                      pid=1000 + rank, beat=7)


def _payloads(scheme: str, nodes: int, part: range) -> list[tuple[str, bytes]]:
    """The (key name, value) pairs of simulated writers ``part`` (nodes or ranks)."""
    from laggard.integrations.hang_read import node_key_name, rank_key_name
    from laggard.integrations.heartbeat_key import encode_node_key

    if scheme == "rank":
        return [(rank_key_name(r), rank_key(r, nodes)) for r in part]
    out = []
    for node in part:
        leader = node * RANKS_PER_NODE
        keys = {r: rank_key(r, nodes) for r in range(leader, leader + RANKS_PER_NODE)}
        out.append((node_key_name(leader), encode_node_key(keys, leader=leader, run=RUN,
                                                           beat=7)))
    return out


def _writer(port: int, tag: str, scheme: str, nodes: int, start: int, stop: int,
            ) -> tuple[float, int]:
    """One writer process's share: build its keys, wait for the go, write them, ``check`` the
    last (answered once the server has applied every ``set`` before it). Returns (its end on
    ``time.monotonic``, bytes written)."""
    import torch.distributed as dist

    items = _payloads(scheme, nodes, range(start, stop))
    store = dist.TCPStore("127.0.0.1", port, is_master=False,
                          timeout=datetime.timedelta(seconds=120))
    prefixed = dist.PrefixStore(f"laggard/{RUN}/{tag}/", store)
    store.add(f"{tag}/ready", 1)
    store.wait([f"{tag}/go"])
    for name, value in items:
        prefixed.set(name, value)
    prefixed.check([items[-1][0]])
    return time.monotonic(), sum(len(v) for _, v in items)


def _write_round(pool: ProcessPoolExecutor, server: Any, writers: int, tag: str, scheme: str,
                 nodes: int) -> tuple[float, int, int]:
    """All writers' round; (seconds from the go to the last writer's end, keys, bytes)."""
    count = nodes if scheme == "node" else nodes * RANKS_PER_NODE
    bounds = [count * i // writers for i in range(writers + 1)]
    futures = [pool.submit(_writer, server.port, tag, scheme, nodes, bounds[i], bounds[i + 1])
               for i in range(writers)]
    while server.add(f"{tag}/ready", 0) < writers:
        if any(f.done() for f in futures):
            [f.result() for f in futures if f.done()]  # a writer failed: raise its error
        time.sleep(0.01)
    go = time.monotonic()
    server.set(f"{tag}/go", b"1")
    ends = [f.result() for f in futures]
    return max(e for e, _ in ends) - go, count, sum(b for _, b in ends)


def _read_and_verdict(server: Any, tag: str, scheme: str, nodes: int,
                      ) -> tuple[float, float, float, tuple[int, ...]]:
    """Rank 0's read of the round and its verdict: (read s, verdict s, verdict CPU s, ranks
    named)."""
    import torch.distributed as dist

    from laggard.integrations.hang_read import RoundReader, rank_key_name
    from laggard.integrations.hang_watch import HangWatch, HeartbeatStats
    from laggard.integrations.heartbeat_node import NodeLayout

    world = nodes * RANKS_PER_NODE
    store = dist.PrefixStore(f"laggard/{RUN}/{tag}/", server.clone())
    stats = HeartbeatStats()
    began = time.perf_counter()
    if scheme == "node":
        layout = NodeLayout.of(0, world, 0, RANKS_PER_NODE)
        payloads = RoundReader(run=RUN, layout=layout, interval=2.0, stats=stats).read(
            store, began)
    else:  # today's read (heartbeat.py before node keys): one check, one multi_get
        names = [rank_key_name(r) for r in range(world)]
        assert store.check(names)
        payloads = {r: bytes(v) for r, v in enumerate(store.multi_get(names))}
    read = time.perf_counter() - began
    watch = HangWatch(run=RUN, world_size=world, interval=2.0, stats=stats, device=False)
    began, cpu = time.perf_counter(), time.thread_time()
    report = watch.observe(began, payloads, own_quiet=60.0, hang_after=10.0, own_step=812)
    verdict, verdict_cpu = time.perf_counter() - began, time.thread_time() - cpu
    assert stats.bad_keys == 0 and all(p is not None for p in payloads.values())
    return read, verdict, verdict_cpu, report.ranks if report is not None else ()


def named_seconds(scheme: str, interval: float, rest: float, *, store_seconds: float = 2.0,
                  hang_after: float = 10.0) -> tuple[float, float]:
    """The hang named by the watch's rules (the module docstring): (a rank whose threads live,
    a stopped rank), seconds after the hang; ``rest``: rank 0's read and verdict."""
    silent_after = 3.0 * interval + 1.0
    quiet_after = max(hang_after / 2.0, silent_after)
    if scheme == "node":  # member -> leader -> store; rank 0 reads every store_seconds
        staleness, period = store_seconds + interval, store_seconds
    else:  # rank -> store; rank 0 reads every interval
        staleness, period = interval, interval
    live = max(hang_after, quiet_after + staleness + period) + rest
    silent = (interval + period) + silent_after + period + rest
    return live, silent


def hang_rounds(nodes_list: tuple[int, ...] = (2048, 8192), *, writers: int = 16,
                writes_per_second: float = 500.0, store_seconds: float = 2.0,
                log: Callable[[str], None] | None = None) -> list[SchemeRound]:
    """Both schemes' rounds at each scale, on one real TCPStore server in this process.

    Args:
        nodes_list: simulated nodes (8 ranks each); writers: writer processes.
        writes_per_second, store_seconds: the job's write budget and interval (the monitor's
            defaults).
        log: called with a line per measurement (None: silent).

    Returns:
        One :class:`SchemeRound` per scale and scheme (node first).
    """
    import torch.distributed as dist

    server = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=datetime.timedelta(seconds=120))
    out: list[SchemeRound] = []
    ctx = multiprocessing.get_context("spawn")  # no fork of a process holding a store thread
    with ProcessPoolExecutor(writers, mp_context=ctx) as pool:
        for nodes in nodes_list:
            for scheme in ("node", "rank"):
                tag = f"{scheme}{nodes}"
                seconds, keys, nbytes = _write_round(pool, server, writers, tag, scheme, nodes)
                read, verdict, cpu, named = _read_and_verdict(server, tag, scheme, nodes)
                interval = max(store_seconds, keys / writes_per_second)
                live, silent = named_seconds(scheme, interval, read + verdict,
                                             store_seconds=store_seconds)
                row = SchemeRound(
                    scheme=scheme, ranks=nodes * RANKS_PER_NODE, keys=keys,
                    key_bytes=nbytes // keys, write_seconds=seconds,
                    writes_per_second=keys / seconds, mb_per_second=nbytes / seconds / 1e6,
                    read_seconds=read, multi_get_keys_per_second=keys / read,
                    verdict_seconds=verdict, verdict_cpu_seconds=cpu, named=named,
                    interval=interval, round_seconds=interval + read, named_live_seconds=live,
                    named_silent_seconds=silent)
                out.append(row)
                if log is not None:
                    log(" ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}"
                                 for k, v in asdict(row).items()))
    return out


def table(rows: list[SchemeRound], load: str) -> str:
    """The rounds as a Markdown table, each node row with its ratio to today's in that run."""
    lines = ["| ranks | scheme | keys x bytes | store takes the round (writes/s) | read "
             "(multi_get keys/s) | interval | **round** (interval + read) | verdict wall "
             "(CPU) | hang named: live / stopped rank | load |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    today = {r.ranks: r for r in rows if r.scheme == "rank"}
    for r in rows:
        ratio = ""
        if r.scheme == "node" and r.ranks in today:
            t = today[r.ranks]
            ratio = (f" ({t.round_seconds / r.round_seconds:.1f}x faster; named "
                     f"{t.named_silent_seconds / r.named_silent_seconds:.1f}x sooner)")
        lines.append(
            f"| {r.ranks:,} | {r.scheme} | {r.keys:,} x {r.key_bytes:,} B | "
            f"{r.write_seconds:.2f} s ({r.writes_per_second:,.0f}/s, "
            f"{r.mb_per_second:.0f} MB/s) | {r.read_seconds:.2f} s "
            f"({r.multi_get_keys_per_second:,.0f}/s) | {r.interval:.1f} s | "
            f"**{r.round_seconds:.1f} s**{ratio} | {r.verdict_seconds:.2f} s "
            f"({r.verdict_cpu_seconds:.2f} s) | "
            f"{r.named_live_seconds:.1f} / {r.named_silent_seconds:.1f} s | {load} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--nodes", type=int, nargs="+", default=[2048, 8192])
    p.add_argument("--writers", type=int, default=16)
    args = p.parse_args(argv)
    before = os.getloadavg()[0]
    rows = hang_rounds(tuple(args.nodes), writers=args.writers, log=print)
    load = f"{before:.1f}-{os.getloadavg()[0]:.1f}"
    print(table(rows, load))
    for r in rows:
        if r.named != (HUNG_RANK,):
            print(f"WRONG VERDICT at {r.ranks} ranks ({r.scheme}): named {r.named}")
            return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
