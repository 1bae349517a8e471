#!/usr/bin/env python3
"""Run laggard's GPU collectors once against the real NVML and print what came back.

For a machine with an NVIDIA driver (issue 3, item 7): prints the ``nvml`` collector's exposition,
the number of series per family, which NVML fields were not supported (left out), the round's
wall time, and any Xid seen through NVML events during ``--wait`` seconds. Exits 2 when NVML is
not available here. Usage: ``python scripts/gpu_probe.py [--wait 2]``
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time

from prometheus_client import CollectorRegistry, generate_latest

from laggard.agent.context import FindingLog
from laggard.collectors.base import NoDataError
from laggard.collectors.nvml import NvmlCollector
from laggard.collectors.xid import KernelLogSource, XidCollector
from laggard.nvml.library import NvmlLibrary


class _Adapter:
    def __init__(self, collector: object) -> None:
        self.collector = collector

    def collect(self) -> object:
        return self.collector.collect()  # type: ignore[attr-defined]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wait", type=float, default=2.0, help="seconds to listen for Xids")
    args = parser.parse_args()
    findings = FindingLog()
    library = NvmlLibrary()
    collector = NvmlCollector(library, findings=findings, node="probe")
    start = time.perf_counter()
    try:
        families = list(collector.collect())
    except NoDataError as exc:
        print(f"no NVML here: {exc}", file=sys.stderr)
        return 2
    elapsed = time.perf_counter() - start
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Adapter(collector))  # type: ignore[arg-type]
    print(generate_latest(registry).decode())
    print(f"# driver {library.driver_version}; first round {elapsed * 1e3:.1f} ms (with init)")
    for family in families:
        print(f"# {family.name}: {len(family.samples)} series")
    with tempfile.NamedTemporaryFile("w") as empty_log:
        xid = XidCollector(kernel_log=KernelLogSource(empty_log.name), library=library,
                           findings=findings)
        xid.collect()
        time.sleep(args.wait)
        xid_text = [m for m in xid.collect() if m.name == "laggard_gpu_xid_errors"]
        xid.stop()
    print(f"# xid series after {args.wait} s: {sum(len(m.samples) for m in xid_text)}")
    for finding in findings.recent():
        print(f"# finding: {finding['message']}")
    library.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
