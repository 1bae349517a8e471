"""Moved: the datagram format is :mod:`laggard.wire` (shared by the training side and the agent).

This name stays for code written against earlier releases; new code imports ``laggard.wire``.
"""

from laggard.wire import (
    MAX_DATAGRAM_BYTES,
    MAX_REPORT_RANKS,
    STANDARD_PHASES,
    WIRE_VERSION,
    CollectiveTiming,
    RecordError,
    StepRecord,
    WindowReport,
    decode_datagram,
)

__all__ = ["MAX_DATAGRAM_BYTES", "MAX_REPORT_RANKS", "STANDARD_PHASES", "WIRE_VERSION",
           "CollectiveTiming", "RecordError", "StepRecord", "WindowReport", "decode_datagram"]
