"""Follow a growing text file as ``tail -F`` does: the one file tailer of the collectors.

Used by the ``xid`` collector for a syslog or journal file and by ``nccl_inspector`` for NCCL
Inspector's per-process JSONL files.
"""

from __future__ import annotations

import errno
import os
import stat

__all__ = ["FileTailer"]


class FileTailer:
    """Non-blocking reader of the complete lines appended to a regular file.

    The file is followed across rotation (a new inode at the path), truncation (shorter than the
    offset read so far) and disappearance (reopened when it comes back). What was appended to
    the old file before a rotation is read before the switch; the new file is read from its
    start. A line longer than ``max_line_bytes`` without a newline is dropped (and counted)
    rather than held in memory or stalling the reader.

    Args:
        path: the file.
        start_at_end: at the first open, skip what the file already holds (a log's history);
            otherwise read it from its start. Files opened later (after a rotation, or that
            appear later) are always read from their start.
        max_read_bytes: most bytes read per call; the rest waits for the next call.
        max_line_bytes: longest partial line kept between calls.
        keep_open: hold the file descriptor between calls (one followed file); False closes it
            after each call and resumes by inode and offset (many files, few descriptors).

    Attributes:
        restarted: True after a call in which the file was (re)opened at its start after a
            rotation or truncation: the caller resets per-file parsing state.
        oversized_lines: lines dropped for exceeding ``max_line_bytes``.
        at_end: True after a call that read up to the end of what the file held (or found no
            file); False while ``max_read_bytes`` per call leaves more to read (a long history).
    """

    def __init__(self, path: str, *, start_at_end: bool, max_read_bytes: int,
                 max_line_bytes: int, keep_open: bool = True) -> None:
        self.path = path
        self.restarted = False
        self.oversized_lines = 0
        self.at_end = False
        self._max_read = max_read_bytes
        self._max_line = max_line_bytes
        self._keep_open = keep_open
        self._fd: int | None = None
        self._inode: tuple[int, int] | None = None
        self._offset = 0
        self._partial = b""
        self._opened_before = False
        self._seek_end = start_at_end  # only at the very first attempt to open

    def read_lines(self) -> list[bytes]:
        """Complete lines (without their newline) appended since the last call.

        Returns:
            The lines, oldest first; empty when nothing new was written or the file is absent.

        Raises:
            OSError: the file exists but cannot be opened (permission); absence is not an error.
        """
        self.restarted = False
        if self._fd is None and not self._open():
            self.at_end = True
            return []
        lines = self._read()
        self._check_rotation()
        if not self._keep_open:
            self.close()
        return lines

    def close(self) -> None:
        """Close the file descriptor, if open."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _open(self) -> bool:
        seek_end, self._seek_end = self._seek_end, False
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            return False
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            raise OSError(errno.EINVAL, "not a regular file", self.path)
        self._fd, inode = fd, (st.st_dev, st.st_ino)
        if inode == self._inode and st.st_size >= self._offset:
            return True  # the same file, reopened (keep_open=False): resume where we were
        self._inode, self._partial, self._offset = inode, b"", 0
        if self._opened_before:
            self.restarted = True
        elif seek_end:
            self._offset = os.lseek(fd, 0, os.SEEK_END)
        self._opened_before = True
        return True

    def _read(self) -> list[bytes]:
        assert self._fd is not None
        try:
            data = os.pread(self._fd, self._max_read, self._offset)
        except OSError:
            self.close()
            return []
        self.at_end = len(data) < self._max_read
        self._offset += len(data)
        *complete, self._partial = (self._partial + data).split(b"\n")
        if len(self._partial) > self._max_line:
            self._partial = b""  # a runaway line without newline: drop it
            self.oversized_lines += 1
        return complete

    def _check_rotation(self) -> None:
        try:
            st = os.stat(self.path)
        except OSError:
            st = None  # vanished: reopened (from its start) when it comes back
        if st is None or (st.st_dev, st.st_ino) != self._inode or st.st_size < self._offset:
            self.close()  # rotated or truncated: the next call reads the new file from its start
            self._inode = None
