"""A gradient-integrity record whose words are still on the device: what
:class:`~laggard.integrations.integrity.GradientIntegrity` keeps for a collective of device
tensors until its window is read, one window late, without a blocking host read. The record's
layout (``RECORD_WORDS`` int64 words, the ``F_*`` field indices) is
:mod:`laggard.detectors.integrity`'s.

On a device (CUDA) the hooks of gradient integrity read nothing back to the host: a record's
hashes, float64 sums and NaN/Inf counts stay device tensors, are copied ``non_blocking`` into
pinned memory behind an event when the record is complete, and are read at the next
``GradientIntegrity.window_vector`` after the one that closed their window (**one window
late**, as the monitor's device clock), only if that event has completed (``query()``, never
``synchronize()``); a record still pending then is left out and counted (``pending_records``,
and in the window header). The replica check's hashes are combined on the device too. The one
exception is the ``skip_step`` policy, whose verdict the optimizer step needs:
``GradientIntegrity.end_step`` waits for that step's events (one host wait per step, after
``backward()``). CPU tensors take the host path, unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from laggard.detectors.integrity import chunk_sums
from laggard.integrations.device_reads import Readback


@dataclass(frozen=True, slots=True)
class ChunkHashes:
    """Per-chunk hashes (int64 ``(W,)`` device tensor) whose :func:`chunk_sums` (wrap, plain,
    weighted) go into ``fields``, taken on the host when the record is read."""

    hashes: torch.Tensor
    fields: tuple[int, int, int]


class DeviceRecord:
    """A record whose device-computed fields are on their way to the host.

    The host-known words (step, bucket, op, dtype, numel, ...) are in ``row``; the device ones
    are concatenated into one int64 vector, copied ``non_blocking`` into pinned memory behind an
    event (:class:`~laggard.integrations.device_reads.Readback`); :meth:`decode` fills the row
    from that copy once the event has completed.
    """

    __slots__ = ("row", "layout", "readback")

    def __init__(self, row: list[int], deferred: list[tuple[Any, Any]]) -> None:
        self.row = row
        parts, self.layout = [], []
        for key, value in deferred:
            words = (value.hashes if isinstance(value, ChunkHashes) else value)
            words = words.reshape(-1).to(torch.int64)
            parts.append(words)
            self.layout.append((key, value, words.numel()))
        self.readback = Readback(torch.cat(parts) if len(parts) > 1 else parts[0])

    def decode(self, words: list[int]) -> list[int]:
        """The full record row from the host copy's words."""
        row, at = list(self.row), 0
        for key, value, n in self.layout:
            chunk, at = words[at : at + n], at + n
            if isinstance(value, ChunkHashes):
                for field, word in zip(value.fields, chunk_sums(chunk), strict=True):
                    row[field] = word
            elif isinstance(key, tuple):
                for field, word in zip(key, chunk, strict=True):
                    row[field] = word
            else:
                row[key] = chunk[0]
        return row


__all__ = ["ChunkHashes", "DeviceRecord"]
