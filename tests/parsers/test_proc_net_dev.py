"""``/proc/net/dev`` (Linux ``net/core/net-procfs.c``, ``dev_seq_show``): the corpus' net01 with
its echoed command and date (answers from corpus/EXPECTED.md), counters glued to the colon, the
columns read from the header, malformed and truncated rows skipped."""

from __future__ import annotations

from support import FIXTURES

from laggard.parsers.proc_net_dev import parse_proc_net_dev

NET01 = FIXTURES / "netdev" / "net01_proc_net_dev_bond_bridge_host_rx_drops.txt"
HEADER = (
    "Inter-|   Receive                                                |  Transmit\n"
    " face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs "
    "drop fifo colls carrier compressed\n")


def test_corpus_net01_bridge_drops_and_bond_counters():
    devices = parse_proc_net_dev(NET01.read_text())
    assert devices["br0"]["receive_drop"] == 17015
    assert devices["bond0"]["receive_bytes"] == 1263036860348
    assert devices["bond0"]["receive_packets"] == 1658934221
    assert devices["bond0"]["receive_multicast"] == 6855409
    assert devices["bond0"]["transmit_bytes"] == 2547124549840
    nonzero = {(d, k) for d, c in devices.items() for k, v in c.items()
               if v and k.split("_")[1] in ("errs", "drop")}
    assert nonzero == {("br0", "receive_drop")}
    # the echoed command and the date are not devices
    assert sorted(devices) == ["bond0", "br0", "vnet1", "vnet3", "vnet4", "vnet6", "vnet7"]
    assert len(next(iter(devices.values()))) == 16  # 8 receive and 8 transmit columns


def test_counters_glued_to_the_colon_parse():
    devices = parse_proc_net_dev((FIXTURES / "netdev" / "proc" / "net" / "dev").read_text())
    assert sorted(devices) == ["eth0", "lo"]
    assert devices["eth0"]["receive_bytes"] == 1263036860348
    assert devices["eth0"]["receive_errs"] == 3
    assert devices["lo"]["transmit_packets"] == 48213


def test_columns_come_from_the_header_line():
    # a kernel that adds a column: the row has 17 counters and still parses, by name
    header = HEADER.replace("multicast|", "multicast otherhost|")
    row = "  eth1: 10 2 0 0 0 0 0 0 99 30 4 0 0 0 0 0 0\n"
    devices = parse_proc_net_dev(header + row)
    assert devices["eth1"]["receive_otherhost"] == 99
    assert devices["eth1"]["transmit_bytes"] == 30 and devices["eth1"]["transmit_packets"] == 4


def test_malformed_and_truncated_rows_are_skipped():
    rows = ("    lo: 4423185   48213    0    0    0     0          0         0  4423185   48213"
            "    0    0    0     0       0          0\n"
            "  eth0: 12 3 0 0 0 0 0 0 N/A 7 0 0 0 0 0 0\n"  # a non-numeric counter
            "  my dev: 1 2 3 4 5 6 7 8 1 2 3 4 5 6 7 8\n"  # a name with a space is not a row
            " : 1 2 3 4 5 6 7 8 1 2 3 4 5 6 7 8\n"  # no name
            "  eth1: 1263036860348 1658934221    0  17015")  # cut mid-row (a partial read)
    devices = parse_proc_net_dev(HEADER + rows)
    assert sorted(devices) == ["lo"]
    assert devices["lo"]["receive_bytes"] == 4423185


def test_empty_and_header_only_text_is_no_device():
    assert parse_proc_net_dev("") == {}
    assert parse_proc_net_dev(HEADER) == {}
