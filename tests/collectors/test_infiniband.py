"""InfiniBand collector on a sysfs tree built from the corpus listing ib01 (3 devices of an H100
node, values as found)."""

from __future__ import annotations

import shutil

import pytest
from support import FIXTURES

from laggard.collectors.base import NoDataError
from laggard.collectors.infiniband import InfinibandCollector, parse_rate

SYSFS = FIXTURES / "infiniband" / "sys"



def test_corpus_answers(expose, value) -> None:
    text = expose(InfinibandCollector(str(SYSFS)))
    port = '{device="mlx5_0",port="1"}'
    # port_rcv_data counts 4-octet words
    assert value(text, f"laggard_infiniband_port_data_received_bytes_total{port}") == (
        230539874932483 * 4)
    assert value(text, f"laggard_infiniband_port_data_transmitted_bytes_total{port}") == (
        230442669431839 * 4)
    assert value(text, f"laggard_infiniband_rate_bytes_per_second{port}") == 400e9 / 8
    assert value(text, 'laggard_infiniband_rate_bytes_per_second{device="mlx5_bond_0",port="1"}'
                 ) == 200e9 / 8
    assert value(text, f"laggard_infiniband_link_downed_total{port}") == 0
    assert value(text, 'laggard_infiniband_link_downed_total{device="mlx5_1",port="1"}') == 255
    assert value(text, f"laggard_infiniband_port_transmit_wait_total{port}") == 2489603687
    assert value(text, 'laggard_infiniband_port_errors_total{device="mlx5_0",port="1",'
                       'type="port_rcv_errors"}') == 14
    assert value(text, 'laggard_infiniband_port_errors_total{device="mlx5_0",port="1",'
                       'type="excessive_buffer_overrun_errors"}') == 15
    assert value(text, f"laggard_infiniband_state_id{port}") == 4
    assert value(text, f"laggard_infiniband_physical_state_id{port}") == 5
    assert ('laggard_infiniband_info{device="mlx5_bond_0",firmware_version="32.38.3056",'
            'hca_type="MT41692",link_layer="Ethernet",port="1"} 1.0') in text
    assert 'event="lifespan"' not in text  # a cache period, not a count
    assert value(text, 'laggard_infiniband_hw_events_total{device="mlx5_0",'
                       'event="rx_write_requests",port="1"}') == 3809045607


def test_golden_exposition(expose, golden, promtool) -> None:
    text = expose(InfinibandCollector(str(SYSFS)))
    golden("infiniband/ib01.prom", text)
    promtool(text)


def test_no_infiniband_is_no_data(tmp_path) -> None:
    with pytest.raises(NoDataError):
        InfinibandCollector(str(tmp_path)).collect()
    (tmp_path / "class" / "infiniband").mkdir(parents=True)
    with pytest.raises(NoDataError):
        InfinibandCollector(str(tmp_path)).collect()


def test_partial_and_garbled_files_are_left_out(tmp_path, expose, value) -> None:
    shutil.copytree(SYSFS, tmp_path / "sys")
    port = tmp_path / "sys" / "class" / "infiniband" / "mlx5_0" / "ports" / "1"
    (port / "counters" / "port_rcv_data").unlink()
    (port / "counters" / "port_xmit_data").write_text("N/A\n")
    (port / "rate").write_text("garbage\n")
    shutil.rmtree(port / "hw_counters")
    text = expose(InfinibandCollector(str(tmp_path / "sys")))
    key = '{device="mlx5_0",port="1"}'
    assert value(text, f"laggard_infiniband_port_data_received_bytes_total{key}") is None
    assert value(text, f"laggard_infiniband_port_data_transmitted_bytes_total{key}") is None
    assert value(text, f"laggard_infiniband_rate_bytes_per_second{key}") is None
    assert 'device="mlx5_0",event="rx_write_requests"' not in text
    assert value(text, f"laggard_infiniband_link_downed_total{key}") == 0  # the rest is there
    assert value(text, 'laggard_infiniband_port_data_received_bytes_total{device="mlx5_1",'
                       'port="1"}') == 205128687774249 * 4


@pytest.mark.parametrize(("text", "expected"), [
    ("400 Gb/sec (4X NDR)", 50e9), ("200 Gb/sec (2X NDR)", 25e9), ("56 Gb/sec (4X FDR)", 7e9),
    ("2.5 Gb/sec (1X SDR)", 2.5e9 / 8), ("100 Mb/sec", 12.5e6), ("unknown", None),
])
def test_parse_rate(text: str, expected: float | None) -> None:
    assert parse_rate(text) == expected
