"""``laggard analyze`` throughput on a large synthetic kernel log: lines parsed per second.

Writes a kernel log of ``--lines`` lines in syslog form (``Dec  2 11:38:47 node01 kernel:
[  219.47] ...``): ordinary kernel and daemon lines with, every ``--xid-every`` lines, a burst of
real Xid/SXid lines taken from the corpus formats (Xid 13 floods, Xid 48, 79, 119 with GSP
tables, NVSwitch SXid triplets). Then, in the same run:

* baseline: reading the same file line by line and doing nothing (``for line in f``);
* ``laggard analyze`` on it (kind detection, the screen, the parser, the rules), in process;
* the parser fed every line without the screen, for comparison;
* a worst case: a log made only of Xid lines.

Times are CPU seconds of this process (``time.process_time``): on a shared machine wall time
would include the neighbours' load.

Prints lines/s for each, the ratio of analyze to the plain read, and whether it meets the
target of 200 000 lines/s. Usage::

    python benchmarks/analyze_throughput.py [--lines 2000000] [--xid-every 50]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

from laggard.analyze.cli import analyze_paths
from laggard.parsers.kernel_log import KernelLogParser

TARGET_LINES_PER_SECOND = 200_000

_NOISE = [
    "Dec  2 11:38:47 node01 kernel: [  219.470994] mlx5_core 0000:0c:00.0 eth2: Link up",
    "Dec  2 11:38:47 node01 systemd[1]: Started Session 4242 of User root.",
    "Dec  2 11:38:47 node01 kernel: [  219.471050] audit: type=1400 audit(1700000000.123:42): "
    'apparmor="DENIED" operation="open" profile="snap.lxd" name="/proc/1/cmdline" pid=4242',
    "Dec  2 11:38:48 node01 kernel: [  220.000001] EXT4-fs (nvme0n1p2): mounted filesystem with "
    "ordered data mode. Quota mode: none.",
    "Dec  2 11:38:48 node01 containerd[1234]: time=\"2024-12-02T11:38:48Z\" level=info "
    "msg=\"shim disconnected\" id=abcdef0123456789",
]
_BURST = [
    "Dec  2 11:38:49 node01 kernel: [  221.1] NVRM: Xid (PCI:0000:38:00): 13, pid='<unknown>', "
    "name=<unknown>, Graphics SM Warp Exception on (GPC 9, TPC 1, SM 1): Out Of Range Address",
    "Dec  2 11:38:49 node01 kernel: [  221.2] NVRM: Xid (PCI:0000:38:00): 13, pid='<unknown>', "
    "name=<unknown>, Graphics Exception: ESR 0x546fb0=0x11f000e 0x546fb4=0x24",
    "Dec  2 11:38:49 node01 kernel: [  221.3] NVRM: Xid (PCI:0000:07:00): 48, pid='<unknown>', "
    "name=<unknown>, An uncorrectable double bit error (DBE) has been detected on GPU",
    "Dec  2 11:38:49 node01 kernel: [  221.4] NVRM: Xid (PCI:0000:9b:00): 119, pid=2024380, "
    "name=nvidia-smi, Timeout after 6s of waiting for RPC response from GPU4 GSP! Expected "
    "function 103 (GSP_RM_ALLOC) (0x2081 0x4).",
    "Dec  2 11:38:49 node01 kernel: [  221.5] NVRM:     -1    103  GSP_RM_ALLOC          "
    "0x0000000000002080 0x0000000000000004 0x00062ed1a6b51c6f 0x00062ed1a6b51f2a    699us",
    "Dec  2 11:38:49 node01 kernel: [  221.6] nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 20034, "
    "Fatal, Link 48 LTSSM Fault Up",
    "Dec  2 11:38:49 node01 kernel: [  221.7] nvidia-nvswitch2: SXid (PCI:0000:07:00.0): 20034, "
    "Severity 1 Engine instance 60 Sub-engine instance 00",
    "Dec  2 11:38:49 node01 kernel: [  221.8] NVRM: Xid (PCI:0000:91:00): 79, pid='<unknown>', "
    "name=<unknown>, GPU has fallen off the bus.",
]


def write_log(path: str, lines: int, xid_every: int) -> int:
    """Write ``lines`` lines; every ``xid_every``-th line starts a burst. Returns Xid lines."""
    xid_lines = 0
    with open(path, "w") as f:
        block = []
        for i in range(lines):
            if xid_every and i % xid_every == 0:
                block.append(_BURST[(i // xid_every) % len(_BURST)])
                xid_lines += 1
            else:
                block.append(_NOISE[i % len(_NOISE)])
            if len(block) >= 10_000:
                f.write("\n".join(block) + "\n")
                block = []
        if block:
            f.write("\n".join(block) + "\n")
    return xid_lines


def timed(fn) -> float:
    """CPU seconds of ``fn()`` (this process; the machine is shared, so wall time would measure
    the neighbours too)."""
    start = time.process_time()
    fn()
    return time.process_time() - start


def plain_read(path: str) -> None:
    with open(path, encoding="utf-8", errors="replace") as f:
        for _ in f:
            pass


def unscreened(path: str) -> None:
    parser = KernelLogParser()
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            parser.feed(line)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=2_000_000)
    ap.add_argument("--xid-every", type=int, default=50, help="one Xid-burst line every N lines")
    ap.add_argument("--compare-lines", type=int, default=200_000,
                    help="lines of the logs for the no-screen and all-Xid comparisons")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "kern.log")
        xid_lines = write_log(path, args.lines, args.xid_every)
        mib = os.path.getsize(path) / 2**20
        t_read = timed(lambda: plain_read(path))
        findings: list = []
        t_analyze = timed(lambda: findings.extend(analyze_paths([path])[0]))
        small = os.path.join(tmp, "small.log")
        write_log(small, args.compare_lines, args.xid_every)
        t_small = timed(lambda: analyze_paths([small]))
        t_naive = timed(lambda: unscreened(small))
        worst = os.path.join(tmp, "xid-only.log")
        write_log(worst, args.compare_lines, 1)
        t_worst = timed(lambda: analyze_paths([worst]))
    n, m = args.lines, args.compare_lines
    rate = n / t_analyze
    print(f"synthetic kernel log: {n} lines, {mib:.0f} MiB, {xid_lines} Xid/SXid/NVRM lines, "
          f"{len(findings)} findings; rates in lines per CPU second")
    print(f"baseline  plain line read          {n / t_read:12,.0f} lines/s")
    print(f"laggard analyze                    {rate:12,.0f} lines/s  "
          f"({rate / (n / t_read):.2f} x the plain read)")
    print(f"on {m} lines: analyze {m / t_small:,.0f} lines/s, the parser fed every line "
          f"(no screen) {m / t_naive:,.0f} lines/s: the screen is {t_naive / t_small:.1f} x")
    print(f"worst case, every line an Xid      {m / t_worst:12,.0f} lines/s")
    verdict = "meets" if rate >= TARGET_LINES_PER_SECOND else "MISSES"
    print(f"target {TARGET_LINES_PER_SECOND:,} lines/s: {verdict} it "
          f"(ratio {rate / TARGET_LINES_PER_SECOND:.2f})")


if __name__ == "__main__":
    main()
