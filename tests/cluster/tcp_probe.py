"""A bounded TCP transfer between two emulated nodes, run inside their namespaces.

``tcp_probe.py serve ADDR PORT`` accepts one connection, reads to EOF (at most 64 MiB, at most
30 s idle-machine seconds) and prints ``{"bytes": n, "seconds": t}`` (t from the first byte to
EOF). ``tcp_probe.py send ADDR PORT NBYTES`` connects (retrying for 10 s) and sends NBYTES.
Both ceilings are scaled by the machine's load (``laggard.demo.harness.scaled``).
"""

from __future__ import annotations

import json
import socket
import sys
import time

from laggard.demo.harness import scaled

MAX_BYTES = 64 << 20
MAX_SECONDS = 30.0


def serve(addr: str, port: int) -> None:
    with socket.create_server((addr, port)) as server:
        server.settimeout(scaled(MAX_SECONDS))
        print("listening", flush=True)
        conn, _ = server.accept()
        with conn:
            conn.settimeout(scaled(MAX_SECONDS))
            total, first = 0, None
            while total < MAX_BYTES:
                chunk = conn.recv(1 << 20)
                if not chunk:
                    break
                first = first or time.perf_counter()
                total += len(chunk)
            seconds = time.perf_counter() - first if first else 0.0
    print(json.dumps({"bytes": total, "seconds": seconds}), flush=True)


def send(addr: str, port: int, nbytes: int) -> None:
    started = time.monotonic()
    while True:
        try:
            conn = socket.create_connection((addr, port), timeout=scaled(5))
            break
        except OSError:
            if time.monotonic() - started > scaled(10):
                raise
            time.sleep(0.05)
    with conn:
        conn.settimeout(scaled(MAX_SECONDS))
        block = b"\0" * (1 << 20)
        left = min(nbytes, MAX_BYTES)
        while left > 0:
            conn.sendall(block[:left])
            left -= min(left, len(block))


if __name__ == "__main__":
    mode, addr, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
    serve(addr, port) if mode == "serve" else send(addr, port, int(sys.argv[4]))
