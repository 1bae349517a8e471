"""The receive loop both intakes share (the agent's socket, a Unix datagram socket,
``agent/unix_intake.py``; the optional UDP intake, ``agent/udp_intake.py``): one bounded read per
datagram, oversized ones counted, stale ranks expired once a second even without scrapes, and
nothing a datagram does stops the loop.

The loop reads ahead: between two datagrams' ingests it empties the kernel's queue (for a Unix
socket ``net.unix.max_dgram_qlen`` datagrams, 10 by the kernel's default; a larger ``SO_RCVBUF``
does not raise it) into a queue of its own of up to :data:`MAX_PENDING_DATAGRAMS`, so a burst
that arrives while a batch is ingested waits instead of being refused.

A batch datagram (:func:`laggard.wire.split_batch`: a rank's step records, one a line) is split
here and each record ingested on its own with the batch's sender; a malformed batch is rejected
and counted like any datagram. Its header's ``dropped`` (the records the sender lost, its queue
to us full) is summed per sender into ``laggard_intake_sender_dropped_total`` and said once in
the agent's log as a warning with the cure (``sysctl net.unix.max_dgram_qlen``): a Unix datagram
socket drops nothing itself, its senders do.
"""

from __future__ import annotations

import logging
import select
import socket
import threading
import time
from collections import deque
from collections.abc import Iterator
from typing import Protocol

from prometheus_client.core import CounterMetricFamily
from prometheus_client.metrics_core import Metric

from laggard.agent.sender import SenderIdentity
from laggard.agent.supervisor import RestartableThread
from laggard.log_once import LogOnce
from laggard.wire import MAX_DATAGRAM_BYTES, RecordError, split_batch

log = logging.getLogger(__name__)

#: Senders whose last reported ``dropped`` is remembered (a new process of a rank is a new
#: sender); beyond it the memory starts over (a sender then counts from its next report).
MAX_SENDERS_TRACKED = 4096
#: Datagrams read ahead of the ingest (<= 8 KiB each: 8 MiB at most); when full the kernel's
#: queue fills and senders are refused (``EAGAIN``, counted on their side).
MAX_PENDING_DATAGRAMS = 1024


class DatagramSink(Protocol):
    """Where an intake puts what it reads: :class:`laggard.agent.run_table.RankTable`."""

    def ingest(self, payload: bytes, sender: SenderIdentity | None = None) -> None: ...

    def reject(self, reason: str) -> None: ...

    def expire(self) -> None: ...


class DatagramIntake:
    """A socket read in a :class:`RestartableThread`, each datagram handed to a table.

    Subclasses open ``self._sock`` (with a timeout, so that :meth:`stop` is seen) and override
    :meth:`_receive`; the loop does the rest.

    Args:
        sock: a bound datagram socket with a timeout.
        table: where datagrams go.
        thread_name: name of the receiving thread (``laggard_agent_thread_restarts_total``).

    Attributes:
        batches: batch datagrams received and split (malformed ones are in the table's
            ``rejected``).
        sender_dropped: records senders said they dropped (their queue to this socket full),
            summed over senders from their batches' ``dropped``.
    """

    def __init__(self, sock: socket.socket, table: DatagramSink, thread_name: str) -> None:
        self._sock = sock
        self._table = table
        self._stop = threading.Event()
        self.thread = RestartableThread(self._run, thread_name)
        self.batches = 0
        self.sender_dropped = 0
        self._senders_dropped: dict[tuple[str, int, int | None], int] = {}
        self._warn_once = LogOnce(log)

    def start(self) -> None:
        """Start receiving."""
        self.thread.start()

    def _receive(self, bufsize: int) -> tuple[bytes, SenderIdentity | None] | None:
        """One datagram of at most ``bufsize`` bytes and who sent it; None to skip it (already
        counted by the subclass). Raises what ``socket.recv`` raises."""
        return self._sock.recv(bufsize), None

    def _run(self) -> None:
        # One byte more than the limit tells an oversized datagram from one that just fits.
        bufsize = MAX_DATAGRAM_BYTES + 1
        next_expiry = time.monotonic() + 1.0
        # Datagrams read but not yet ingested: the kernel's queue (net.unix.max_dgram_qlen
        # datagrams, 10 by default, whatever SO_RCVBUF says) is emptied into it between two
        # datagrams' ingests, so a burst waits here instead of being refused to its senders.
        pending: deque[tuple[bytes, SenderIdentity | None] | None] = deque()
        poller = select.poll()
        poller.register(self._sock, select.POLLIN)
        while not self._stop.is_set():
            if time.monotonic() >= next_expiry:
                # Stale ranks go even when no scrape comes (the scrape expires them too).
                self._table.expire()
                next_expiry = time.monotonic() + 1.0
            try:
                if not pending:
                    pending.append(self._receive(bufsize))  # waits up to the socket's timeout
                while len(pending) < MAX_PENDING_DATAGRAMS and poller.poll(0):
                    pending.append(self._receive(bufsize))
            except TimeoutError:
                continue
            except OSError as exc:
                if self._stop.is_set():
                    return
                log.warning("intake receive failed: %s", exc)
                time.sleep(0.1)
                continue
            received = pending.popleft()
            if received is None:
                continue
            payload, sender = received
            if len(payload) > MAX_DATAGRAM_BYTES:
                self._table.reject("oversized")
                continue
            self._ingest(payload, sender)

    def _ingest(self, payload: bytes, sender: SenderIdentity | None) -> None:
        """One datagram to the table: a batch's records one by one, anything else whole."""
        try:
            batch = split_batch(payload)
        except RecordError as exc:
            self._table.reject(exc.reason)
            return
        if batch is None:
            self._table.ingest(payload, sender)
            return
        header, items = batch
        self.batches += 1
        self._note_dropped(header.run, header.rank, sender, header.dropped)
        for item in items:
            self._table.ingest(item, sender)

    def _note_dropped(self, run: str, rank: int, sender: SenderIdentity | None,
                      dropped: int) -> None:
        """Add what a sender dropped since its last batch to :attr:`sender_dropped`."""
        key = (run, rank, sender.pid if sender is not None else None)
        last = self._senders_dropped.get(key)
        if last is None and len(self._senders_dropped) >= MAX_SENDERS_TRACKED:
            self._senders_dropped.clear()
        self._senders_dropped[key] = dropped
        # A first report counts all it says: what the sender lost before we heard from it.
        new = dropped - (last or 0) if last is None or dropped >= last else 0
        if new > 0:
            self.sender_dropped += new
            self._warn_once(
                "sender_dropped", "senders dropped records for this agent (first: run %r rank "
                "%d, %d records): its socket queue was full. A Unix datagram socket queues "
                "net.unix.max_dgram_qlen datagrams (10 by the kernel's default): raise it, e.g. "
                "sysctl -w net.unix.max_dgram_qlen=512, then restart the agent (counted in "
                "laggard_intake_sender_dropped_total; logged once)", run, rank, dropped)

    def collect_drops(self) -> Iterator[Metric]:
        """``laggard_intake_sender_dropped_total``: records senders dropped, their queue to this
        intake full (from their batches)."""
        family = CounterMetricFamily(
            "laggard_intake_sender_dropped_total",
            "Records the node's ranks dropped because this intake's queue was full (EAGAIN), "
            "as their batches report them.")
        family.add_metric([], self.sender_dropped)
        yield family

    def stop(self) -> None:
        """Stop the thread and close the socket."""
        self._stop.set()
        self.thread.join(timeout=2)
        self._sock.close()
