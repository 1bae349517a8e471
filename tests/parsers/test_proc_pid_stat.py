"""parse_pid_stat: ``/proc/PID/stat`` lines, real and hostile."""

import os

import pytest

from laggard.parsers.proc_pid_stat import parse_pid_stat

# A real line (a Python process on Linux 6.x), 52 fields.
LINE = ("4242 (python3) S 4200 4242 4200 34816 4242 4194304 12345 0 0 0 311 24 0 0 20 0 3 0 "
        "98765432 1234567890 45678 18446744073709551615 1 1 0 0 0 0 0 16781312 134234626 0 0 0 "
        "17 3 0 0 0 0 0 0 0 0 0 0 0 0 0\n")


def test_a_real_line():
    stat = parse_pid_stat(LINE)
    assert (stat.pid, stat.comm, stat.state, stat.start_ticks) == (4242, "python3", "S",
                                                                   98765432)


def test_a_command_name_with_spaces_and_parentheses():
    # comm is what the process called itself (prctl PR_SET_NAME): ") R 1 (" is a valid one.
    line = LINE.replace("(python3)", "(a) R 1 (b c))")
    stat = parse_pid_stat(line)
    assert stat.comm == "a) R 1 (b c)"
    assert stat.start_ticks == 98765432


def test_this_process():
    with open(f"/proc/{os.getpid()}/stat") as f:
        stat = parse_pid_stat(f.read())
    assert stat.pid == os.getpid() and stat.state in "RS" and stat.start_ticks > 0


@pytest.mark.parametrize("text", ["", "4242 python3 S 1", "4242 (python3) S 1 2 3",
                                  LINE.replace("98765432", "-5"), LINE.replace("4242 (", "x (")])
def test_malformed_lines_raise_value_error(text):
    with pytest.raises(ValueError):
        parse_pid_stat(text)
