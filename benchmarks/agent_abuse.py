"""A real ``laggard agent`` under abuse, on loopback only, bounded in count and time.

What is sent to its UDP intake (issue 17); the garbage as fast as one sender can push it (most
of it is dropped by the kernel: that is what the accounting checks), the rest paced by the
socket's receive queue (read from /proc/net/udp) so that the agent really processes it:

1. ``--garbage`` random and hostile datagrams: random bytes, deep brackets, integers beyond float
   range, NaN and Infinity, truncated and oversized JSON, ranks outside the world;
2. ``--windows`` WindowReports whose findings carry fresh detector, kind and severity strings;
3. records with huge and NaN numbers mixed with valid ones;
4. ``--ranks`` ranks x 32 names of 64 characters (16 phases, 16 collective ops), twice.

A thread scrapes ``/metrics`` all along and counts HTTP errors. Afterwards: the exposition's size
and scrape time (median of 5), the agent's RSS (and peak), thread restarts, and whether every
datagram sent is accounted for (accepted + rejected + dropped by the kernel). Finally the
intake goes quiet and the time until every rank and straggler flag is forgotten is measured
against ``--rank-ttl``. The baseline, measured in the same run before any abuse, is the same
agent idle: its scrape size, scrape time and RSS.

Targets: 0 dead threads, 0 HTTP errors; /metrics < 5 MB and < 0.5 s; RSS < 150 MiB; stale ranks
gone within the TTL (+ the 1 s expiry tick); every datagram accounted for within 1 %.

Usage: ``python benchmarks/agent_abuse.py [--garbage 200000] [--windows 30000] [--ranks 4096]
[--rank-ttl 20]``
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from laggard.demo.harness import free_port, wait_until_ready
from laggard.wire import CollectiveTiming, StepRecord, WindowReport

LONG = "x" * 56


def _receive_queue_bytes(port: int) -> int:
    """Bytes waiting in the receive queue of the UDP socket bound to 127.0.0.1:``port``."""
    local = f"0100007F:{port:04X}"
    with open("/proc/net/udp") as f:
        for line in f:
            fields = line.split()
            if len(fields) > 4 and fields[1] == local:
                return int(fields[4].split(":")[1], 16)
    return 0


def _send(sender: socket.socket, port: int, payloads: list[bytes], paced: bool) -> None:
    for i, payload in enumerate(payloads):
        if paced and i % 64 == 0:
            while _receive_queue_bytes(port) > 64 * 1024:
                time.sleep(0.001)
        sender.sendto(payload, ("127.0.0.1", port))


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def _total(samples: dict, name: str) -> float:
    return sum(v for (n, _), v in samples.items() if n == name)


def _rss_kib(pid: int) -> tuple[int, int]:
    fields = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            fields[key] = value.split()[0] if value.split() else "0"
    return int(fields["VmRSS"]), int(fields["VmHWM"])


def _garbage(rng: random.Random, n: int) -> list[bytes]:
    makers = [
        lambda: rng.randbytes(rng.randint(0, 200)),
        lambda: b"[" * rng.randint(17, 8000),
        lambda: b'{"v":1,"rank":0,"world_size":1,"step":1' + b"0" * rng.randint(20, 4000) + b"}",
        lambda: b'{"v":1,"rank":0,"world_size":1,"step":0,"phases":{"f":NaN}}',
        lambda: b'{"v":1,"rank":0,"world_size":1,"step":0,"comm":{"bytes":Infinity}}',
        lambda: b'{"v":1,"rank":0,"world_size":1,"step":0,"collectives":[{"op":"a","seconds":0,'
                b'"bytes":' + b"9" * rng.randint(20, 300) + b"}]}",
        lambda: b'{"v":1,"rank":' + str(rng.randint(4, 10 ** 9)).encode()
                + b',"world_size":4,"step":0}',
        lambda: b'{"v":1,"type":"window","step":0,"world_size":4,"findings":[{"detector":'
                b'"straggler","kind":"compute","severity":"warning","rank":999999999}]}',
        lambda: StepRecord(rank=0, world_size=1, step=1).encode()[:rng.randint(0, 40)],
        lambda: b"z" * 9000,
        lambda: json.dumps({"v": rng.randint(2, 99)}).encode(),
    ]
    return [rng.choice(makers)() for _ in range(n)]


def _windows(n: int) -> list[bytes]:
    out = []
    for i in range(n):
        finding = {"detector": f"det{i}{LONG}", "kind": f"kind{i}", "severity": f"sev{i}",
                   "rank": i % 4, "message": f"fresh label {i}", "evidence": {"v": i}}
        out.append(WindowReport(step=i, world_size=4, scores={i % 4: 0.5},
                                findings=[finding]).encode())
    return out


def _many_ranks(ranks: int, round_: int) -> list[bytes]:
    out = []
    for rank in range(ranks):
        out.append(StepRecord(
            rank=rank, world_size=ranks, step=round_,
            phases={f"phase{i:02d}{round_}{LONG}"[:64]: 0.01 for i in range(16)},
            collectives=[CollectiveTiming(f"op{i:02d}{round_}{LONG}"[:64], 0.01, 1 << 20)
                         for i in range(16)],
        ).encode())
    return out


def _numbers(rng: random.Random, n: int) -> list[bytes]:
    out = []
    for i in range(n):
        if i % 2:
            out.append(StepRecord(rank=i % 8, world_size=8, step=1000 + i,
                                  phases={"forward": 0.01}, step_seconds=0.02,
                                  comm={"bytes": float(2 ** 53)}).encode())
        else:
            value = rng.choice([b"1e308", b"NaN", b"-Infinity", b"9" * 400, b"1e-320"])
            out.append(b'{"v":1,"rank":1,"world_size":8,"step":5,"phases":{"forward":'
                       + value + b"}}")
    return out


class _Scraper(threading.Thread):
    """Scrapes /metrics every ``interval`` seconds; counts errors and keeps the worst time."""

    def __init__(self, url: str, interval: float = 0.25) -> None:
        super().__init__(daemon=True)
        self.url, self.interval = url, interval
        self.errors: list[str] = []
        self.count = 0
        self.worst = 0.0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(self.interval):
            start = time.perf_counter()
            try:
                with urllib.request.urlopen(self.url, timeout=30) as response:
                    response.read()
            except (urllib.error.URLError, OSError) as exc:
                self.errors.append(str(exc))
            self.count += 1
            self.worst = max(self.worst, time.perf_counter() - start)


def _scrape(url: str) -> tuple[str, float]:
    start = time.perf_counter()
    with urllib.request.urlopen(url, timeout=30) as response:
        body = response.read()
    return body.decode(), time.perf_counter() - start


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def _measure(url: str, pid: int) -> dict[str, float]:
    times, text = [], ""
    cpu = _cpu_seconds(pid)
    for _ in range(5):
        text, seconds = _scrape(url)
        times.append(seconds)
    cpu = (_cpu_seconds(pid) - cpu) / 5  # the agent's CPU per scrape (and its idle threads')
    rss, peak = _rss_kib(pid)
    return {"bytes": len(text.encode()), "seconds": statistics.median(times), "cpu": cpu,
            "samples": sum(1 for line in text.splitlines() if line and line[0] != "#"),
            "rss_mib": rss / 1024, "peak_mib": peak / 1024}


def _wait_accounted(url: str, sent: int, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        samples = _samples(_scrape(url)[0])
        accounted = (_total(samples, "laggard_intake_datagrams_total")
                     + _total(samples, "laggard_intake_rejected_total")
                     + _total(samples, "laggard_intake_kernel_drops_total"))
        if accounted >= sent or time.monotonic() > deadline:
            return samples
        time.sleep(0.2)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--garbage", type=int, default=200_000)
    parser.add_argument("--windows", type=int, default=30_000)
    parser.add_argument("--ranks", type=int, default=4096)
    parser.add_argument("--numbers", type=int, default=20_000)
    parser.add_argument("--rank-ttl", type=float, default=20.0,
                        help="the agent's --intake.rank-ttl: longer than the measurements "
                             "after the abuse, which the ranks must outlive (default 20)")
    parser.add_argument("--seed", type=int, default=17)
    args = parser.parse_args()
    rng = random.Random(args.seed)

    port, intake_port = free_port(), free_port(socket.SOCK_DGRAM)
    proc = subprocess.Popen(
        [sys.executable, "-m", "laggard.cli", "agent",
         "--web.listen-address", f"127.0.0.1:{port}",
         "--intake.address", f"127.0.0.1:{intake_port}", "--intake.rank-ttl", str(args.rank_ttl),
         "--log.level", "warning"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        wait_until_ready(url, timeout=20, what="laggard agent", procs=[proc])
        time.sleep(1.5)  # one collector round
        baseline = _measure(url, proc.pid)
        scraper = _Scraper(url)
        scraper.start()
        sent = 0
        phases = [
            ("garbage, unpaced", _garbage(rng, args.garbage), False),
            ("window reports, fresh labels", _windows(args.windows), True),
            ("huge and NaN numbers", _numbers(rng, args.numbers), True),
            (f"{args.ranks} ranks x 32 long names, round 1", _many_ranks(args.ranks, 1), True),
            # Last, and in reverse, so that the ranks the budget admitted (the first ones) are
            # fresh when the exposition is measured: the worst case, not an expired one.
            (f"{args.ranks} ranks x 32 long names, round 2",
             _many_ranks(args.ranks, 2)[::-1], True),
        ]
        rows = []
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sender:
            for name, payloads, paced in phases:
                start = time.perf_counter()
                _send(sender, intake_port, payloads, paced)
                sent += len(payloads)
                rows.append((name, len(payloads), time.perf_counter() - start))
                print(f"sent {len(payloads):>7} {name} in {rows[-1][2]:.1f} s", flush=True)
        last_sent = time.monotonic()
        samples = _wait_accounted(url, sent, 60)
        scraper.stop.set()
        scraper.join()
        after = _measure(url, proc.pid)
        accepted = _total(samples, "laggard_intake_datagrams_total")
        rejected = _total(samples, "laggard_intake_rejected_total")
        kernel = _total(samples, "laggard_intake_kernel_drops_total")
        restarts = _total(samples, "laggard_agent_thread_restarts_total")
        ranks_at_end = _total(samples, "laggard_intake_ranks")
        findings_series = sum(1 for (n, _) in samples if n == "laggard_findings_total")
        # Staleness: the intake is quiet from now on; every rank and flag must go within the TTL.
        gone_after = None
        while time.monotonic() - last_sent < args.rank_ttl + 30:
            # The answer reflects the agent's state when the request arrived: time from there.
            asked = time.monotonic()
            s = _samples(_scrape(url)[0])
            if os.environ.get("ABUSE_DEBUG"):
                print(round(time.monotonic() - last_sent, 2), _total(s, "laggard_intake_ranks"),
                      sum(1 for (n, _) in s if n in ("laggard_straggler_active",
                                                     "laggard_straggler_score")))
            if (_total(s, "laggard_intake_ranks") == 0
                    and not any(n == "laggard_straggler_active" for (n, _) in s)
                    and not any(n == "laggard_straggler_score" for (n, _) in s)):
                gone_after = asked - last_sent
                break
            time.sleep(0.05)
        alive = proc.poll() is None
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=20)

    unaccounted = sent - (accepted + rejected + kernel)
    print()
    print("| what | value | target | ratio to target |")
    print("|---|---|---|---|")
    print(f"| datagrams sent | {sent} | | |")
    print(f"| accepted / rejected / dropped by the kernel | {accepted:.0f} / {rejected:.0f} / "
          f"{kernel:.0f} | | |")
    print(f"| unaccounted | {unaccounted:.0f} ({100 * abs(unaccounted) / sent:.3f} %) | < 1 % | "
          f"{abs(unaccounted) / sent / 0.01:.3f} |")
    print(f"| agent alive, thread restarts | {alive}, {restarts:.0f} | True, 0 | |")
    print(f"| HTTP errors over {scraper.count} scrapes during the abuse (worst {scraper.worst:.3f}"
          f" s) | {len(scraper.errors)} | 0 | |")
    print(f"| `laggard_findings_total` series after {args.windows} fresh labels | "
          f"{findings_series} | bounded | |")
    print(f"| ranks held at the end (of {args.ranks} sent) | {ranks_at_end:.0f} | budget | |")
    print(f"| /metrics size, idle agent (baseline) | {baseline['bytes'] / 1e6:.3f} MB "
          f"({baseline['samples']} samples) | | |")
    print(f"| /metrics size after the abuse | {after['bytes'] / 1e6:.3f} MB ({after['samples']}"
          f" samples) | < 5 MB | {after['bytes'] / 5e6:.3f} |")
    print(f"| scrape time, idle (baseline) / after, median of 5 | "
          f"{1000 * baseline['seconds']:.1f} ms / {1000 * after['seconds']:.1f} ms | < 500 ms | "
          f"{after['seconds'] / 0.5:.3f} |")
    print(f"| agent CPU per scrape, idle (baseline) / after, mean of 5 | "
          f"{1000 * baseline['cpu']:.0f} ms / {1000 * after['cpu']:.0f} ms | | "
          f"{after['cpu'] / max(baseline['cpu'], 1e-3):.1f} x baseline |")
    print(f"| RSS idle (baseline) / after / peak | {baseline['rss_mib']:.1f} / "
          f"{after['rss_mib']:.1f} / {after['peak_mib']:.1f} MiB | < 150 MiB | "
          f"{after['peak_mib'] / 150:.3f} |")
    gone = "never" if gone_after is None else f"{gone_after:.1f} s"
    print(f"| every rank, score and flag gone after the last datagram (TTL {args.rank_ttl} s) | "
          f"{gone} | <= TTL + 1 s | "
          f"{'-' if gone_after is None else f'{gone_after / (args.rank_ttl + 1):.3f}'} |")
    if scraper.errors:
        print("first HTTP errors:", scraper.errors[:3])
    if "Traceback" in stderr:
        print("agent stderr had a traceback:\n" + stderr[-2000:])
    ok = (alive and restarts == 0 and not scraper.errors and abs(unaccounted) <= 0.01 * sent
          and after["bytes"] < 5e6 and after["seconds"] < 0.5 and after["peak_mib"] < 150
          and gone_after is not None and gone_after <= args.rank_ttl + 1)
    print("\nall targets met" if ok else "\nTARGETS MISSED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
