"""PyTorch profiler (Kineto) traces: a streaming reader of the Chrome trace-event JSON that
``torch.profiler.profile.export_chrome_trace`` and ``tensorboard_trace_handler`` write.

The document is one JSON object (Kineto ``output_json.cpp``)::

    {"schemaVersion": 1, "deviceProperties": [...],
     "distributedInfo": {"backend": "nccl", "rank": 3, "world_size": 8,
                         "pg_config": [{"pg_name", "pg_desc", "pg_size", "ranks"}, ...]},
     "traceEvents": [{"ph": "X", "cat": "cpu_op" | "user_annotation" | "kernel" |
                      "gpu_memcpy" | "gpu_memset" | "gpu_user_annotation" | "cuda_runtime" ...,
                      "name", "pid", "tid", "ts": microseconds, "dur": microseconds,
                      "args": {...}}, ...],
     "traceName": ..., "baseTimeNanoseconds": ...}

:class:`KinetoReader` yields the events one at a time from a text stream read in fixed-size
chunks (each event decoded with :meth:`json.JSONDecoder.raw_decode`), so a trace of any size is
read in memory bounded by the chunk and the largest single event; every other top-level field is
kept in :attr:`KinetoReader.meta` (``distributedInfo`` may come before or after the events).
No I/O beyond the stream handed in.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import IO, Any

__all__ = ["CHUNK_CHARS", "KinetoReader", "TraceError"]

#: Characters read from the stream at a time.
CHUNK_CHARS = 1 << 20
#: Largest single value (an event, or a top-level field) accepted, in characters.
MAX_VALUE_CHARS = 64 << 20
_WHITESPACE = " \t\r\n"
_DECODER = json.JSONDecoder()


class TraceError(ValueError):
    """The stream is not a Kineto trace, or it ends before its closing brackets."""


class KinetoReader:
    """Stream the events of one trace.

    Args:
        stream: a text stream positioned at the start of the document.

    Attributes:
        meta: top-level fields other than ``traceEvents`` (complete once :meth:`events` has
            been exhausted).
        events_read: events yielded so far.
    """

    def __init__(self, stream: IO[str]) -> None:
        self._f = stream
        self._buf = ""
        self._pos = 0
        self._eof = False
        self.meta: dict[str, Any] = {}
        self.events_read = 0

    def _fill(self) -> bool:
        if self._eof:
            return False
        data = self._f.read(CHUNK_CHARS)
        if not data:
            self._eof = True
            return False
        self._buf = self._buf[self._pos:] + data
        self._pos = 0
        return True

    def _peek(self) -> str:
        while True:
            buf, pos = self._buf, self._pos
            while pos < len(buf) and buf[pos] in _WHITESPACE:
                pos += 1
            self._pos = pos
            if pos < len(buf):
                return buf[pos]
            if not self._fill():
                raise TraceError("the trace ends early (truncated file?)")

    def _expect(self, char: str) -> None:
        found = self._peek()
        if found != char:
            raise TraceError(f"expected {char!r} at character {self._pos}, found {found!r}: not "
                             f"a Chrome/Kineto trace")
        self._pos += 1

    def _value(self) -> Any:
        self._peek()
        while True:
            try:
                value, end = _DECODER.raw_decode(self._buf, self._pos)
            except json.JSONDecodeError as exc:
                if len(self._buf) - self._pos > MAX_VALUE_CHARS:
                    raise TraceError(f"a value longer than {MAX_VALUE_CHARS} characters") \
                        from exc
                if not self._fill():
                    raise TraceError(f"the trace ends inside a value (truncated file?): "
                                     f"{exc.msg}") from exc
                continue
            if end == len(self._buf) and self._fill():
                continue  # a number cut at the chunk's end: decode it again, whole
            self._pos = end
            return value

    def events(self) -> Iterator[dict[str, Any]]:
        """Yield each trace event (a dict), in file order.

        Raises:
            TraceError: not a JSON object with a ``traceEvents`` list, or truncated.
        """
        self._expect("{")
        seen_events = False
        while self._peek() != "}":
            key = self._value()
            if not isinstance(key, str):
                raise TraceError("not a Chrome/Kineto trace: a key that is not a string")
            self._expect(":")
            if key == "traceEvents":
                seen_events = True
                yield from self._event_list()
            else:
                self.meta[key] = self._value()
            if self._peek() == ",":
                self._pos += 1
        self._pos += 1
        if not seen_events:
            raise TraceError("no 'traceEvents' list: not a Chrome/Kineto trace")

    def _event_list(self) -> Iterator[dict[str, Any]]:
        self._expect("[")
        while True:
            if self._peek() == "]":
                self._pos += 1
                return
            event = self._value()
            if isinstance(event, dict) and event:
                self.events_read += 1
                yield event
            if self._peek() == ",":
                self._pos += 1
