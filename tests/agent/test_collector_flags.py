"""Each collector declares its flags beside its code (``COLLECTOR = CollectorSpec(...)``); the
registry finds every one, the daemon's parser offers them in one dotted style, and their values
reach the collector through ``AgentConfig.collector_flags``."""

from __future__ import annotations

import argparse
import importlib
import re
from pathlib import Path

import pytest

from laggard.agent import daemon, registry
from laggard.agent.config import AgentConfig
from laggard.collectors import netdev, nvml
from laggard.collectors.base import CollectorSpec

COLLECTORS_DIR = Path(netdev.__file__).parent
#: node_exporter's and Prometheus' style: lower-case dotted namespaces, words joined by '-'
#: (a collector's name keeps its '_', as in --collector.nccl_inspector).
FLAG_STYLE = re.compile(r"--(no-)?[a-z]+(\.[a-z0-9_]+(-[a-z0-9]+)*)+")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    daemon.add_arguments(parser)
    return parser


def test_every_collector_module_registers_under_its_file_name() -> None:
    specs = registry.collectors()
    assert set(specs) == {"host", "netdev", "nvml", "xid", "infiniband", "nccl_inspector",
                          "flight_recorder"}
    for path in COLLECTORS_DIR.glob("*.py"):
        module = importlib.import_module(f"laggard.collectors.{path.stem}")
        spec = getattr(module, "COLLECTOR", None)
        if spec is not None:
            assert isinstance(spec, CollectorSpec) and specs[path.stem] is spec
    for name, spec in specs.items():
        for flag in spec.flags:  # a collector's flags are in its namespace, or a --path.*
            assert flag.name.startswith((f"collector.{name}.", "path.")), flag.name


def test_every_agent_flag_is_in_the_dotted_style() -> None:
    options = [option for action in _parser()._actions for option in action.option_strings
               if option.startswith("--") and option != "--help"]
    assert len(options) > 30
    for option in options:
        assert FLAG_STYLE.fullmatch(option), option
    for old in ("--intake-address", "--max-ranks", "--log-level", "--collect-interval",
                "--fake-gpus", "--fake-gpus-scenario", "--node"):
        assert old not in options


def test_the_collector_flags_reach_the_config_and_their_defaults_stand() -> None:
    config = daemon.config_from_args(_parser().parse_args(
        ["--collector.nvml.fake-gpus", "2", "--collector.netdev.max-devices", "9",
         "--path.kmsg", "/var/log/syslog", "--intake.max-ranks", "64", "--node.name", "n7",
         "--collector.interval", "0.5", "--log.level", "debug"]))
    assert config.flag(nvml.FAKE_GPUS) == 2
    assert config.flag(netdev.MAX_DEVICES) == 9
    assert config.collector_flags["path.kmsg"] == "/var/log/syslog"
    assert config.flag(nvml.FAKE_GPUS_SCENARIO) == "default"
    assert (config.max_ranks, config.node, config.collect_interval) == (64, "n7", 0.5)
    assert AgentConfig().flag(netdev.MAX_DEVICES) == netdev.DEFAULT_MAX_DEVICES


def test_naming_a_collectors_input_turns_it_on_unless_it_is_turned_off() -> None:
    parser = _parser()
    defaults = daemon.config_from_args(parser.parse_args([]))
    assert defaults.collectors == {"host", "netdev", "nvml", "xid", "infiniband"}
    given = daemon.config_from_args(parser.parse_args(
        ["--collector.nccl_inspector.dir", "/tmp/nccl", "--no-collector.xid"]))
    assert "nccl_inspector" in given.collectors and "xid" not in given.collectors
    off = daemon.config_from_args(parser.parse_args(
        ["--collector.flight_recorder.path", "/tmp/fr", "--no-collector.flight_recorder"]))
    assert "flight_recorder" not in off.collectors


def test_a_bad_collector_flag_names_itself() -> None:
    with pytest.raises(ValueError, match="--collector.nvml.fake-gpus -1"):
        AgentConfig(collector_flags={"collector.nvml.fake-gpus": -1})
    with pytest.raises(ValueError, match="only 2 fake GPUs"):
        AgentConfig(collector_flags={"collector.nvml.fake-gpus": 2,
                                     "collector.nvml.fake-gpus-scenario": "throttle:3"})
    with pytest.raises(ValueError, match="unknown fake NVML scenario"):
        AgentConfig(collector_flags={"collector.nvml.fake-gpus-scenario": "nope"})
    with pytest.raises(ValueError, match="collector.nope.flag"):
        AgentConfig(collector_flags={"collector.nope.flag": 1})


def test_each_collector_has_its_own_interval_else_the_agents() -> None:
    config = daemon.config_from_args(_parser().parse_args(
        ["--collector.nvml.interval", "0.1", "--collector.interval", "2"]))
    assert daemon.collector_interval(config, "nvml") == 0.1
    assert daemon.collector_interval(config, "netdev") == 2.0  # no interval of its own given
    assert daemon.collector_interval(daemon.config_from_args(_parser().parse_args([])),
                                     "host") == 1.0
    for name, spec in registry.collectors().items():
        assert spec.interval_flag.name == f"collector.{name}.interval"
    with pytest.raises(SystemExit):  # argparse: out of range, exit status 2
        _parser().parse_args(["--collector.xid.interval", "0.01"])
    with pytest.raises(ValueError, match="--collector.host.interval 9999"):
        AgentConfig(collector_flags={"collector.host.interval": 9999.0})


def test_the_agent_samples_each_collector_at_its_own_interval() -> None:
    config = daemon.config_from_args(_parser().parse_args(
        ["--collector.nvml.fake-gpus", "1", "--collector.nvml.interval", "0.1",
         "--intake.socket", "", "--web.listen-address", "127.0.0.1:0"]))
    agent = daemon.Agent(config)  # built, not started: no thread runs
    try:
        intervals = {t.collector.name: t.interval for t in agent.threads}
        assert intervals["nvml"] == 0.1 and intervals["host"] == 1.0
    finally:
        agent.server.server_close()


def test_the_all_fields_switch_takes_no_value() -> None:
    args = _parser().parse_args(["--collector.nvml.all-fields"])
    assert daemon.config_from_args(args).flag(nvml.ALL_FIELDS) is True
    assert daemon.config_from_args(_parser().parse_args([])).flag(nvml.ALL_FIELDS) is False
