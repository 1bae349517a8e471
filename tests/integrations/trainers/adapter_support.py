"""Shared by the trainer-adapter workers (run as scripts, so imported as a sibling module): a UDP
sink for the monitor's StepRecords and the result file."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

from laggard.wire import StepRecord, decode_datagram


class RecordSink:
    """A UDP socket on loopback the monitor sends to; :meth:`records` drains it."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.setblocking(False)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.sock.getsockname()[1]}"

    def records(self) -> list[StepRecord]:
        out = []
        while True:
            try:
                item = decode_datagram(self.sock.recv(65536))
            except BlockingIOError:
                return out
            if isinstance(item, StepRecord):
                out.append(item)


def summarize(records: list[StepRecord]) -> dict[str, Any]:
    """What the tests assert on: steps, phase names seen, collective ops seen."""
    return {"steps": [r.step for r in records],
            "phases": sorted({p for r in records for p in r.phases}),
            "ops": sorted({c.op for r in records for c in r.collectives})}


def write_result(out_dir: str, rank: int, result: dict[str, Any]) -> None:
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result))
