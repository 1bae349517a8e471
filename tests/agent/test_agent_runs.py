"""A real agent with two training runs on its node: both runs' ranks, apart, each joined to
its GPU through the agent's (fake) NVML."""

import socket
import time

from prometheus_client.parser import text_string_to_metric_families
from support import budget

from laggard.wire import StepRecord, WindowReport


def _samples(text, name):
    return [s for f in text_string_to_metric_families(text) for s in f.samples if s.name == name]


def test_two_runs_on_one_agent_stay_apart_and_name_their_gpus(agent_factory):
    # --intake.rank-histograms: the checks here read each rank's counters and progress
    # (laggard_steps_total...), outside the default series set since issue 34
    agent = agent_factory("--intake.rank-histograms",
                          "--collector.nvml.fake-gpus", "4", "--collector.interval", "0.2",
                          "--intake.max-runs", "4", "--no-collector.host", "--no-collector.netdev",
                          "--no-collector.infiniband", "--no-collector.xid")
    records = []
    for step in range(3):
        # Run a: 2 ranks on GPUs 0 and 1 (by UUID); run b: 3 ranks, world size 3, GPU 2 by PCI
        # id for its rank 0 and a PCI id the node does not have for its rank 1.
        for rank in range(2):
            records.append(StepRecord(run="a", rank=rank, world_size=2, step=step,
                                      local_rank=rank, phases={"forward": 0.01},
                                      uuid=f"GPU-fa4e0000-0000-0000-0000-{rank:012d}"))
        records.append(StepRecord(run="b", rank=0, world_size=3, step=step, local_rank=2,
                                  phases={"forward": 0.05}, pci_bus_id="00000000:38:00.0"))
        records.append(StepRecord(run="b", rank=1, world_size=3, step=step, local_rank=3,
                                  phases={"forward": 0.05}, pci_bus_id="00000000:EE:00.0"))
    records.append(WindowReport(run="b", step=2, world_size=3, scores={0: 0.3}, findings=[
        {"detector": "straggler", "kind": "compute", "severity": "warning", "rank": 0}]))
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for record in records:
            s.sendto(record.encode(), ("127.0.0.1", agent.intake_port))
    deadline = time.monotonic() + budget(10)
    while True:
        text = agent.scrape()
        steps = {(x.labels["run"], x.labels["rank"]): x.value
                 for x in _samples(text, "laggard_steps_total")}
        info = {(x.labels["run"], x.labels["rank"]): x.labels["gpu"]
                for x in _samples(text, "laggard_rank_info")}
        if (len(steps) == 4 and all(v == 3 for v in steps.values())
                and info.get(("a", "0")) == "0") or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert steps == {("a", "0"): 3, ("a", "1"): 3, ("b", "0"): 3, ("b", "1"): 3}
    assert info == {("a", "0"): "0", ("a", "1"): "1", ("b", "0"): "2", ("b", "1"): ""}
    flags = {(x.labels["run"], x.labels["rank"])
             for x in _samples(text, "laggard_straggler_active")}
    assert flags == {("b", "0")}
    unresolved = {x.labels["reason"]: x.value
                  for x in _samples(text, "laggard_intake_gpu_unresolved_total")}
    assert unresolved == {"unknown_device": 1}  # a reason's series comes with its first count
    assert [x.value for x in _samples(text, "laggard_intake_runs_limit")] == [4]
    restarts = {x.labels["reason"]: x.value
                for x in _samples(text, "laggard_intake_ranks_forgotten_total")}
    assert "restart" not in restarts  # none counted: no series yet
