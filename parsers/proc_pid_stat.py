"""``/proc/PID/stat``: one process's status line (``man 5 proc_pid_stat``).

The line is ``pid (comm) state ppid pgrp ...``: 52 space-separated fields on current kernels,
of which the second, the command name in parentheses, may itself hold spaces and parentheses
(``comm`` is whatever the process named itself, up to 15 bytes). The fields after it are cut at
the *last* ``)``, as procps does. Field 22, ``starttime``, is the time the process started after
system boot, in clock ticks (``sysconf(_SC_CLK_TCK)``): with the pid it names one process for the
life of the system, which a pid alone does not (pids are reused).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["PidStat", "parse_pid_stat"]

#: Most bytes of a stat line read: 52 fields of at most 20 digits and a 15-byte comm fit.
MAX_PID_STAT_BYTES = 4096


@dataclass(frozen=True, slots=True)
class PidStat:
    """What laggard reads of one process's stat line.

    Attributes:
        pid: process id (field 1).
        comm: command name, without the parentheses (field 2).
        state: one-letter state (field 3): ``R`` running, ``S`` sleeping, ``D`` disk sleep,
            ``Z`` zombie, ``X`` dead, ``T``/``t`` stopped, ``I`` idle...
        start_ticks: start time after boot, in clock ticks (field 22).
    """

    pid: int
    comm: str
    state: str
    start_ticks: int


def parse_pid_stat(text: str) -> PidStat:
    """Parse the text of one ``/proc/PID/stat`` file.

    Args:
        text: the file's content (one line; a trailing newline is fine).

    Returns:
        The pid, command name, state and start time of the process.

    Raises:
        ValueError: no ``(comm)``, fewer than 22 fields, or a pid or start time that is not a
            non-negative integer.
    """
    open_paren, close_paren = text.find("("), text.rfind(")")
    if open_paren < 0 or close_paren < open_paren:
        raise ValueError("no (comm) field")
    pid_text = text[:open_paren].strip()
    rest = text[close_paren + 1:].split()
    # rest[0] is field 3 (state), so field 22 (starttime) is rest[19].
    if len(rest) < 20:
        raise ValueError(f"{len(rest) + 2} fields, fewer than 22")
    if not pid_text.isdigit() or not rest[19].isdigit():
        raise ValueError("pid and starttime must be non-negative integers")
    return PidStat(pid=int(pid_text), comm=text[open_paren + 1:close_paren], state=rest[0],
                   start_ticks=int(rest[19]))
