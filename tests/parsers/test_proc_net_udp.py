"""``/proc/net/udp`` and ``udp6`` (Linux ``net/ipv4/udp.c`` ``udp4_format_sock``, ``net/ipv6``
``__ip6_dgram_sock_seq_show``): drops per socket inode from fixture files in the kernel's
format, the header and cut or malformed lines skipped, and this machine's own file read back for
a socket opened here."""

from __future__ import annotations

import os
import socket

import pytest
from support import FIXTURES

from laggard.parsers.proc_net_udp import parse_udp_drops

DIR = FIXTURES / "proc_net_udp"


def test_ipv4_sockets_by_inode():
    with open(DIR / "udp") as f:
        assert parse_udp_drops(f) == {41372: 17, 20931: 0, 18564: 0}


def test_ipv6_addresses_do_not_shift_the_columns():
    with open(DIR / "udp6") as f:
        assert parse_udp_drops(f) == {77001: 5}


def test_header_cut_and_malformed_lines_are_skipped():
    lines = (DIR / "udp").read_text().splitlines()
    cut = lines[1][:60]  # a read that stopped mid-line: fewer than 13 columns
    garbled = lines[2].replace(" 20931 ", " inode ")
    no_drops = lines[3].rsplit(" ", 1)[0] + " -"
    assert parse_udp_drops([lines[0], cut, garbled, no_drops]) == {}
    assert parse_udp_drops([]) == {}


def test_this_machines_file_lists_a_socket_opened_here():
    path = "/proc/self/net/udp"
    if not os.path.exists(path):
        pytest.skip("no procfs here")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        with open(path) as f:
            drops = parse_udp_drops(f)
        assert drops[os.fstat(sock.fileno()).st_ino] == 0
