"""The agent's socket: a Unix datagram socket, the default transport from the node's own training
processes, with the sender's pid, uid and gid from the kernel (UDP on loopback is the option,
``agent/udp_intake.py``).

An ``AF_UNIX``/``SOCK_DGRAM`` socket bound at a path (``--intake.socket``) with ``SO_PASSCRED``
on: the kernel attaches ``SCM_CREDENTIALS`` (``struct ucred``: pid, uid, gid, three int32) to
every datagram. A sender cannot claim another process's pid or another user's ids unless it has
``CAP_SYS_ADMIN`` or ``CAP_SETUID`` (``man 7 unix``), so these are the identity the agent trusts:
the optional allow-list (``--intake.allow-uids``, ``--intake.allow-gids``) is checked on them,
and the pid is turned into workload labels from its cgroup (``agent/workload.py``). The uid (and
the Slurm job of the cgroup) then own the runs the sender is the first to write: the run table
refuses another uid's records for them (``foreign_sender``; docs/agent.md, "Threat model").

Who can send at all is decided by the file system: write permission on the socket file
(``--intake.socket-mode``) and search permission on its directory (in Kubernetes, a pod must
mount the directory: the hostPath is the gate, as DogStatsD's socket is mounted).

Unlike UDP, the kernel never drops a Unix datagram: when the receive queue is full
(``net.unix.max_dgram_qlen`` datagrams: 10 by the kernel's default, 512 by systemd's; a larger
``SO_RCVBUF`` does not raise it) a non-blocking sender gets ``EAGAIN``. The TrainingMonitor
batches its step records to stay far below that, keeps a few unsent batches to retry, and
counts what it still drops (``send_dropped``); its batches tell us the count, exported as
``laggard_intake_sender_dropped_total`` (``agent/datagram_intake.py``).
"""

from __future__ import annotations

import errno
import logging
import os
import socket
import stat
import struct
from collections.abc import Iterable, Iterator

from prometheus_client.metrics_core import Metric

from laggard.agent.config import DEFAULT_SOCKET_MODE
from laggard.agent.datagram_intake import DatagramIntake, DatagramSink
from laggard.agent.sender import SenderIdentity
from laggard.agent.workload import WorkloadLabels
from laggard.log_once import LogOnce

log = logging.getLogger(__name__)

_UCRED = struct.Struct("3i")  # struct ucred: pid_t pid, uid_t uid, gid_t gid
_ANCILLARY_BYTES = socket.CMSG_SPACE(_UCRED.size)
#: ``laggard_intake_rejected_total`` reason of a datagram whose sender is not on the allow-list.
NOT_ALLOWED = "sender_not_allowed"


def bind_unix_datagram_socket(path: str, mode: int = DEFAULT_SOCKET_MODE,
                              group: int | None = None) -> tuple[socket.socket, int]:
    """A ``SOCK_DGRAM`` socket bound at ``path`` with ``mode``, ``SO_PASSCRED`` on.

    The directory is made if missing (mode 0755: others must search it to reach the socket). A
    socket file left at ``path`` by an agent that died (nobody receiving: ``connect`` refused)
    is replaced; a live one (another agent receiving) or anything that is not a socket (a file,
    a symlink, a directory) is left alone and raises. The socket is bound at a temporary name,
    given its mode and group, then renamed onto ``path``: it never appears with another mode.

    Args:
        path: file system path of the socket (at most 107 bytes with the temporary suffix).
        mode: permission bits of the socket file (write lets a process send).
        group: gid to give the file (``--intake.socket-group``), or None to keep the agent's.

    Returns:
        The socket and the inode of its file (to remove only our own file at stop).

    Raises:
        OSError: ``EADDRINUSE`` for a live socket at ``path``, ``EEXIST`` for a non-socket,
            or what ``mkdir``, ``bind``, ``chmod``, ``chown`` and ``rename`` raise.
    """
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        os.makedirs(directory, exist_ok=True)
        # Exactly 0755 whatever the umask (a service's may be 0077): senders must search it.
        # An existing directory is left as its owner made it (systemd's RuntimeDirectoryMode=).
        os.chmod(directory, 0o755)
    _check_replaceable(path)
    temporary = f"{path}.{os.getpid()}.tmp"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        # Before bind: every datagram ever queued on this socket carries its sender's ucred.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        _remove_socket_file(temporary)
        sock.bind(temporary)
        try:
            os.chmod(temporary, mode)
            if group is not None:
                os.chown(temporary, -1, group)
            os.rename(temporary, path)
        except OSError:
            _remove_socket_file(temporary)
            raise
        return sock, os.lstat(path).st_ino
    except OSError:
        sock.close()
        raise


def _check_replaceable(path: str) -> None:
    """Raise unless ``path`` is absent or a socket nobody receives on."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise OSError(errno.EEXIST, f"{path} exists and is not a socket (not replaced)")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(path)
        except ConnectionRefusedError:
            return  # stale: left by an agent that died
    raise OSError(errno.EADDRINUSE, f"{path}: another process receives on this socket")


def _remove_socket_file(path: str) -> None:
    """Remove ``path`` if it is a socket file; leave anything else."""
    try:
        if stat.S_ISSOCK(os.lstat(path).st_mode):
            os.unlink(path)
    except OSError:
        pass


def parse_id_list(text: str) -> frozenset[int]:
    """``"0,1000, 1001"`` -> ``{0, 1000, 1001}``; empty text -> empty set.

    Raises:
        ValueError: an item that is not a non-negative integer below 2^32.
    """
    ids = set()
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        if not item.isdigit() or int(item) >= 1 << 32:
            raise ValueError(f"{item!r} is not a numeric uid or gid")
        ids.add(int(item))
    return frozenset(ids)


class UnixIntake(DatagramIntake):
    """Receives datagrams on a Unix datagram socket, each with its sender's identity.

    Each datagram becomes ``table.ingest(payload, SenderIdentity(pid, uid, gid, labels))``: pid
    None where the kernel gives 0 (the sender's pid namespace is not visible from the agent's),
    labels from the sender's cgroup (empty without ``workload`` or when the process exited). A
    sender off the allow-lists (when either is set) is refused before decoding and counted as
    ``laggard_intake_rejected_total{reason="sender_not_allowed"}``; it is allowed when its uid
    is in ``allow_uids`` or its gid (the primary one the kernel reports) in ``allow_gids``.

    Args:
        path: socket path (``--intake.socket``).
        table: where datagrams go.
        mode: permission bits of the socket file (``--intake.socket-mode``).
        group: gid of the socket file, or None.
        allow_uids: uids allowed to send; with ``allow_gids`` both empty, everyone is.
        allow_gids: gids allowed to send.
        workload: the cgroup reader for workload labels, or None for none.

    Raises:
        OSError: the socket cannot be made (see :func:`bind_unix_datagram_socket`).
    """

    def __init__(self, path: str, table: DatagramSink, *, mode: int = DEFAULT_SOCKET_MODE,
                 group: int | None = None, allow_uids: Iterable[int] = (),
                 allow_gids: Iterable[int] = (), workload: WorkloadLabels | None = None) -> None:
        sock, self._inode = bind_unix_datagram_socket(path, mode, group)
        sock.settimeout(0.2)
        self.path = path
        self._allow_uids = frozenset(allow_uids)
        self._allow_gids = frozenset(allow_gids)
        self._workload = workload
        self._log_once = LogOnce(log)
        super().__init__(sock, table, "laggard-intake-unix")

    def _receive(self, bufsize: int) -> tuple[bytes, SenderIdentity | None] | None:
        payload, ancillary, _flags, _address = self._sock.recvmsg(bufsize, _ANCILLARY_BYTES)
        pid = uid = gid = None
        for level, kind, data in ancillary:
            if level != socket.SOL_SOCKET:
                continue
            if kind == socket.SCM_CREDENTIALS and len(data) >= _UCRED.size:
                pid, uid, gid = _UCRED.unpack_from(data)
            elif kind == socket.SCM_RIGHTS:
                # Descriptors a sender passed along (only if they fit the buffer): never ours.
                _close_descriptors(data)
        if (self._allow_uids or self._allow_gids) and not (
                uid in self._allow_uids or gid in self._allow_gids):
            self._log_once("refusal", "intake %s: refused a datagram from pid %s uid %s gid %s "
                           "(not on --intake.allow-uids/--intake.allow-gids; counted as %s, "
                           "logged once)", self.path, pid, uid, gid, NOT_ALLOWED)
            self._table.reject(NOT_ALLOWED)
            return None
        pid = pid or None  # 0: the sender's pid namespace is not visible from the agent's
        labels = self._workload.labels_for(pid) if self._workload is not None else {}
        return payload, SenderIdentity(pid=pid, uid=uid, gid=gid, labels=labels)

    def collect(self) -> Iterator[Metric]:
        """``laggard_intake_sender_dropped_total`` (:meth:`collect_drops`) and
        ``laggard_intake_sender_lookups_total{result}`` (with a workload reader)."""
        yield from self.collect_drops()
        if self._workload is not None:
            yield from self._workload.collect()

    def stop(self) -> None:
        """Stop the thread, close the socket and remove its file if it is still ours."""
        super().stop()
        try:
            st = os.lstat(self.path)
            if st.st_ino == self._inode and stat.S_ISSOCK(st.st_mode):
                os.unlink(self.path)
        except OSError:
            pass


def _close_descriptors(data: bytes) -> None:
    count = len(data) // 4
    for fd in struct.unpack(f"{count}i", data[:count * 4]):
        try:
            os.close(fd)
        except OSError:
            pass


def queue_limit(proc_root: str = "/proc") -> int | None:
    """``net.unix.max_dgram_qlen``: datagrams a Unix socket queues before senders get
    ``EAGAIN``; None where unreadable."""
    try:
        with open(os.path.join(proc_root, "sys/net/unix/max_dgram_qlen")) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None
