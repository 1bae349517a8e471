"""GPU collector against the fake NVML module (same function names and constants as pynvml; no GPU
on this machine), and against the real pynvml where no driver exists."""

from __future__ import annotations

import itertools
import re
import time
from types import SimpleNamespace

import pytest
from support import budget, stop_agent

from laggard.agent.context import FindingLog
from laggard.collectors.base import NoDataError
from laggard.collectors.nvml import NvmlCollector, from_config
from laggard.nvml.fake import FakeNvml
from laggard.nvml.library import NvmlLibrary, normalise_bus_id


def stepping_clock(seconds: float = 1.0):  # noqa: ANN201 - a clock
    """A clock that moves ``seconds`` on every reading: each collect() is one full round."""
    ticks = itertools.count()
    return lambda: next(ticks) * seconds


def collector_for(fake: FakeNvml, **options: object) -> tuple[NvmlCollector, FindingLog]:
    findings = FindingLog()
    return NvmlCollector(NvmlLibrary(fake), findings=findings, node="node01",
                         clock=stepping_clock(), **options), findings  # type: ignore[arg-type]



def scrape_until(agent, needle: str, timeout: float = 5.0) -> str:
    """Scrape until ``needle`` appears (the collectors' first rounds run after the server is
    up); fails when it has not within ``budget(timeout)``."""
    deadline = time.monotonic() + budget(timeout)
    text = agent.scrape()
    while needle not in text:
        assert time.monotonic() < deadline, f"no {needle!r} in:\n{text[-3000:]}"
        time.sleep(0.05)
        text = agent.scrape()
    return text


def test_golden_exposition_two_fake_gpus_during_power_cap(expose, golden, promtool) -> None:
    fake = FakeNvml(2)
    collector, _ = collector_for(fake)
    fake.advance(12)  # GPU 0 inside its power-cap episode
    text = expose(collector)
    golden("nvml/fake2_step12.prom", text)
    promtool(text)


def test_units_are_converted_at_the_edge(expose, value) -> None:
    fake = FakeNvml(2)
    collector, _ = collector_for(fake)
    fake.advance(12)
    text = expose(collector)
    assert value(text, 'laggard_gpu_sm_clock_hertz{gpu="0"}') == 1410e6  # MHz -> Hz
    assert value(text, 'laggard_gpu_sm_clock_max_hertz{gpu="0"}') == 1980e6
    assert value(text, 'laggard_gpu_power_watts{gpu="0"}') == 700.0  # mW -> W
    assert value(text, 'laggard_gpu_utilization_ratio{gpu="1"}') == 0.93  # % -> ratio
    energy_mj = fake.nvmlDeviceGetTotalEnergyConsumption(fake.nvmlDeviceGetHandleByIndex(0))
    assert value(text, 'laggard_gpu_energy_joules_total{gpu="0"}') == energy_mj / 1e3
    # steps 10, 11 and 12 were power-capped: three 1 s steps of violation time
    assert value(text, 'laggard_gpu_clock_violation_seconds_total{gpu="0",reason="power"}') == 3.0
    assert value(text, 'laggard_gpu_pcie_throughput_bytes_per_second{direction="receive",gpu="0"}'
                 ) == round(0.93 * 3_000_000) * 1024


@pytest.mark.parametrize("all_fields", [False, True])
def test_clock_event_reasons_expand_the_bitmask(expose, all_fields: bool) -> None:
    fake = FakeNvml(3)
    collector, _ = collector_for(fake, all_fields=all_fields)
    fake.advance(31)  # GPU 1 thermal episode; GPU 2 idle
    text = expose(collector)
    active = {(m.group(1), m.group(2)) for m in re.finditer(
        r'laggard_gpu_clock_event_active\{gpu="(\d)",reason="(\w+)"\} 1\.0', text)}
    assert active == {("1", "sw_thermal"), ("1", "hw_thermal"), ("2", "gpu_idle")}
    # by default a reason has a series only while active (the budget); all fields: 0 or 1 each
    assert text.count("laggard_gpu_clock_event_active{") == (3 * 9 if all_fields else 3)


def test_unsupported_fields_are_left_out_not_zero(expose) -> None:
    fake = FakeNvml(2)
    collector, _ = collector_for(fake, all_fields=True)
    text = expose(collector)
    assert 'reason="reliability"' not in text  # NotSupported violation counter
    assert 'laggard_gpu_nvlink_links{gpu="0"} 18.0' in text
    assert 'laggard_gpu_nvlink_active_links{gpu="0"} 17.0' in text  # one link down
    assert 'laggard_gpu_nvlink_active_links{gpu="1"}' not in text  # no NVLink on odd GPUs
    assert 'laggard_gpu_nvlink_errors_total{gpu="1"' not in text


def test_throttle_finding_after_three_samples_and_not_for_idle() -> None:
    fake = FakeNvml(3)
    collector, findings = collector_for(fake)
    fake.advance(10)
    for _ in range(2):
        list(collector.collect())
        fake.advance()
    assert findings.recent() == []
    list(collector.collect())
    (finding,) = findings.recent()
    assert (finding["detector"], finding["gpu"], finding["severity"]) == ("throttle", 0, "warning")
    assert finding["evidence"]["reasons"] == ["sw_power_cap"]
    assert finding["evidence"]["clock_ratio"] == pytest.approx(1410 / 1980, abs=1e-4)
    for _ in range(5):  # same episode: no second finding; idle GPU 2 never raises one
        fake.advance()
        list(collector.collect())
    assert len(findings.recent()) == 1


def test_lost_gpu_is_marked_and_the_others_go_on(expose, value) -> None:
    fake = FakeNvml(2)
    collector, findings = collector_for(fake)
    fake.advance(50)  # GPU 1 is lost from step 50
    for _ in range(3):
        text = expose(collector)
        fake.advance()
    assert value(text, 'laggard_gpu_lost{gpu="1"}') == 1.0
    assert value(text, 'laggard_gpu_lost{gpu="0"}') == 0.0
    assert value(text, 'laggard_gpu_temperature_celsius{gpu="0"}') == 41.0
    assert value(text, 'laggard_gpu_temperature_celsius{gpu="1"}') is None
    lost = [f for f in findings.recent() if f["kind"] == "gpu_lost"]
    assert len(lost) == 1 and lost[0]["gpu"] == 1 and lost[0]["severity"] == "critical"
    fake.advance(10)  # the period wraps: the GPU was reset
    text = expose(collector)
    assert value(text, 'laggard_gpu_lost{gpu="1"}') == 0.0
    assert value(text, 'laggard_gpu_temperature_celsius{gpu="1"}') == 42.0


@pytest.mark.parametrize("driver", ["no_library", "no_driver"])
def test_no_nvml_is_no_data_with_backoff(driver: str) -> None:
    now = [0.0]
    fake = FakeNvml(1, driver=driver)
    collector = NvmlCollector(NvmlLibrary(fake, clock=lambda: now[0]))
    with pytest.raises(NoDataError, match="not found|not loaded"):
        list(collector.collect())
    calls = fake.calls
    with pytest.raises(NoDataError, match="not found|not loaded"):
        list(collector.collect())
    assert fake.calls == calls  # inside the backoff nvmlInit is not even tried
    now[0] = 1.5
    with pytest.raises(NoDataError, match="not found|not loaded"):
        list(collector.collect())
    assert fake.calls == calls + 1


def test_real_pynvml_without_a_driver_is_no_data() -> None:
    pytest.importorskip("pynvml")
    from laggard.agent.config import AgentConfig

    collector = from_config(AgentConfig(), SimpleNamespace(findings=FindingLog(), node="node01"))
    try:
        count = collector.library.start()
    except NoDataError as exc:
        assert "NVML shared library not found" in str(exc) or "driver" in str(exc)
    else:  # a machine with a GPU: the collector must then work
        assert count >= 1 and list(collector.collect())


def test_legacy_throttle_reason_names_are_mapped(expose, value) -> None:
    class LegacyNvml(FakeNvml):
        """A pre-530 binding: only nvmlClocksThrottleReason* and the old getter."""

        def __init__(self) -> None:
            super().__init__(1)
            for name in [n for n in vars(self) if n.startswith("nvmlClocksEventReason")]:
                setattr(self, name.replace("EventReason", "ThrottleReason"), getattr(self, name))
                delattr(self, name)
            self.nvmlDeviceGetCurrentClocksEventReasons = None

        def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle):  # noqa: N802
            return FakeNvml.nvmlDeviceGetCurrentClocksEventReasons(self, handle)

    fake = LegacyNvml()
    collector, _ = collector_for(fake)
    fake.advance(12)
    text = expose(collector)
    assert value(text, 'laggard_gpu_clock_event_active{gpu="0",reason="sw_power_cap"}') == 1.0


def test_bus_id_normalisation() -> None:
    assert normalise_bus_id(b"00000000:9B:00.0") == "0000:9b:00"
    assert normalise_bus_id("00010000:05:00.0") == "10000:05:00"


def test_agent_with_fake_gpus_serves_every_family(agent_factory, promtool) -> None:
    agent = agent_factory("--collector.nvml.fake-gpus", "2", "--collector.interval", "0.1",
                          "--collector.nvml.all-fields")
    # 1.0: a first round may fail while the fake's NVML comes up; the next one counts
    scrape_until(agent, 'laggard_collector_success{collector="xid"} 1.0')
    text = scrape_until(agent, 'laggard_collector_success{collector="nvml"} 1.0')
    families = {"laggard_gpu_info", "laggard_gpu_sm_clock_hertz", "laggard_gpu_memory_clock_hertz",
                "laggard_gpu_sm_clock_max_hertz", "laggard_gpu_clock_event_active",
                "laggard_gpu_clock_violation_seconds_total", "laggard_gpu_temperature_celsius",
                "laggard_gpu_power_watts", "laggard_gpu_energy_joules_total",
                "laggard_gpu_utilization_ratio", "laggard_gpu_ecc_errors_total",
                "laggard_gpu_remapped_rows", "laggard_gpu_pcie_replay_total",
                "laggard_gpu_pcie_throughput_bytes_per_second", "laggard_gpu_nvlink_errors_total",
                "laggard_gpu_nvlink_transmitted_bytes_total", "laggard_gpu_lost",
                "laggard_gpu_xid_errors_total", "laggard_gpu_xid_last_timestamp_seconds"}
    typed = set(re.findall(r"^# TYPE (\S+) ", text, re.M))
    missing = {f.removesuffix("_total") for f in families} - {t.removesuffix("_total")
                                                              for t in typed}
    assert not missing
    assert 'laggard_collector_success{collector="nvml"} 1.0' in text
    promtool(text)


def test_agent_without_gpu_runs_with_nvml_success_zero_and_no_traceback(agent_factory) -> None:
    agent = agent_factory("--collector.interval", "0.1", "--no-collector.xid")
    text = scrape_until(agent, 'laggard_collector_success{collector="nvml"}')
    time.sleep(0.5)  # a few more rounds: repeated failures must not log again
    text = agent.scrape()
    if 'laggard_collector_success{collector="nvml"} 1.0' in text:
        pytest.skip("this machine has a working NVIDIA driver")
    assert 'laggard_collector_success{collector="nvml"} 0.0' in text
    # no GPU here: absent, not failing (LaggardCollectorFailing leaves it alone)
    assert 'laggard_collector_absent{collector="nvml"} 1.0' in text
    assert 'laggard_collector_success{collector="host"} 1.0' in text
    assert 'laggard_collector_absent{collector="host"} 0.0' in text
    code, output = stop_agent(agent)
    assert code == 0
    assert "Traceback" not in output
    assert len([line for line in output.splitlines() if "collector nvml" in line]) == 1, output


def test_an_unexpected_field_error_costs_only_that_field(expose, value) -> None:
    class FlakyNvml(FakeNvml):
        def nvmlDeviceGetTemperature(self, handle, sensor):  # noqa: N802
            if handle.index == 0:
                raise self.NVMLError(self.NVML_ERROR_UNKNOWN)
            return super().nvmlDeviceGetTemperature(handle, sensor)

    collector, _ = collector_for(FlakyNvml(2))
    text = expose(collector)
    assert value(text, 'laggard_gpu_temperature_celsius{gpu="0"}') is None
    assert value(text, 'laggard_gpu_temperature_celsius{gpu="1"}') == 42.0
    assert value(text, 'laggard_gpu_power_watts{gpu="0"}') == 450.0
    assert value(text, 'laggard_nvml_errors_total{function="nvmlDeviceGetTemperature"}') == 1.0


def test_lost_gpu_triggers_reinit_with_backoff() -> None:
    class CountingNvml(FakeNvml):
        inits = 0

        def nvmlInit(self) -> None:  # noqa: N802
            CountingNvml.inits += 1
            super().nvmlInit()

    now = [0.0]
    fake = CountingNvml(2)
    library = NvmlLibrary(fake, clock=lambda: now[0])
    collector = NvmlCollector(library, clock=lambda: now[0])
    fake.advance(50)  # GPU 1 lost
    list(collector.collect())
    assert CountingNvml.inits == 1
    now[0] = 0.5  # inside the first 1 s backoff: keep the handles, GPU 0 goes on
    list(collector.collect())
    assert CountingNvml.inits == 1
    now[0] = 1.1  # backoff over: shutdown and init again
    list(collector.collect())
    assert CountingNvml.inits == 2
    now[0] = 2.2  # still lost: the next attempt waits twice as long (2 s)
    list(collector.collect())
    assert CountingNvml.inits == 2
    now[0] = 3.2
    list(collector.collect())
    assert CountingNvml.inits == 3


def test_gpu_lost_before_init_costs_only_that_gpu(expose, value) -> None:
    fake = FakeNvml(2)
    fake.advance(50)  # GPU 1 lost already when NVML starts: no handle for it
    original = fake.nvmlDeviceGetHandleByIndex

    def handle_by_index(index: int):  # noqa: ANN202 - mirrors pynvml
        if index == 1:
            raise fake.NVMLError(fake.NVML_ERROR_GPU_IS_LOST)
        return original(index)

    fake.nvmlDeviceGetHandleByIndex = handle_by_index
    collector, findings = collector_for(fake)
    text = expose(collector)
    assert value(text, 'laggard_gpu_lost{gpu="1"}') == 1.0
    assert value(text, 'laggard_gpu_temperature_celsius{gpu="0"}') == 41.0
    assert [f["kind"] for f in findings.recent()] == ["gpu_lost"]


def test_the_collectors_no_data_error_is_the_nvml_wrappers() -> None:
    import laggard.nvml.library as library

    assert NoDataError is library.NoDataError  # one class for the collectors and the job


def test_throttle_scenario_holds_one_gpu_and_steady_holds_none(expose, value) -> None:
    text = expose(collector_for(FakeNvml(4, scenario="throttle:1:sw_thermal"))[0])
    def active(gpu: str, reason: str) -> float | None:
        return value(text, f'laggard_gpu_clock_event_active{{gpu="{gpu}",reason="{reason}"}}')

    assert active("1", "sw_thermal") == 1
    assert value(text, 'laggard_gpu_sm_clock_hertz{gpu="1"}') == 1410e6
    assert value(text, 'laggard_gpu_temperature_celsius{gpu="1"}') == 88
    for gpu in ("0", "2", "3"):  # no series for a reason not active (the series budget)
        assert active(gpu, "sw_thermal") is None and active(gpu, "gpu_idle") is None
    steady = FakeNvml(4, scenario="steady")
    steady.advance(55)  # past every event of the default story: nothing lost, nothing raised
    text = expose(collector_for(steady)[0])
    assert "laggard_gpu_lost{gpu=\"3\"} 0.0" in text
    assert 'reason="sw_thermal"} 1.0' not in text and 'reason="sw_power_cap"} 1.0' not in text


@pytest.mark.parametrize("spec", ["nope", "steady:1", "throttle", "throttle:x",
                                  "throttle:1:cold"])
def test_bad_scenarios_are_refused(spec: str) -> None:
    with pytest.raises(ValueError):
        FakeNvml(2, scenario=spec)
    with pytest.raises(ValueError):
        FakeNvml(2, scenario="throttle:2")  # only GPUs 0 and 1


class ScriptedNvml(FakeNvml):
    """The fake NVML with each GPU's SM clock (MHz) and clock-event bitmask set by the test."""

    def __init__(self, gpus: int) -> None:
        super().__init__(gpus, scenario="steady")
        self.sm = [1980] * gpus
        self.mask = [0] * gpus
        self.fast_calls: list[str] = []

    def nvmlDeviceGetClockInfo(self, handle, clock):  # noqa: N802
        if clock == self.NVML_CLOCK_SM:
            self.fast_calls.append("clock")
            self._gpu(handle)
            return self.sm[handle.index]
        return super().nvmlDeviceGetClockInfo(handle, clock)

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle):  # noqa: N802
        self.fast_calls.append("reasons")
        self._gpu(handle)
        return self.mask[handle.index]


def test_sub_second_state_reaches_the_scrape_as_what_happened(expose, value) -> None:
    """At a 0.1 s interval: a 0.2 s dip to 900 MHz under hw_slowdown between two full rounds
    shows as the window's minimum and 0.2 s of reason time, though neither sample the next
    full round reads is throttled; the families are built once a second."""
    fake = ScriptedNvml(2)
    now = [0.0]
    collector = NvmlCollector(NvmlLibrary(fake), clock=lambda: now[0], interval=0.1)
    first = collector.collect()  # a full round at t = 0
    returned = []
    for tick in range(1, 10):  # t = 0.1 .. 0.9: fast rounds only
        now[0] = tick * 0.1
        throttled = tick in (4, 5)
        fake.sm[1], fake.mask[1] = (900, fake.nvmlClocksEventReasonHwSlowdown) if throttled else (
            1980, 0)
        fake.fast_calls.clear()
        returned.append(collector.collect())
        assert fake.fast_calls == ["clock", "reasons"] * 2  # two NVML calls per GPU
    assert all(r is first for r in returned)  # no family built between full rounds
    now[0] = 1.0
    text = expose(collector)  # the full round at t = 1.0
    assert value(text, 'laggard_gpu_sm_clock_hertz{gpu="1"}') == 1980e6
    assert value(text, 'laggard_gpu_sm_clock_min_hertz{gpu="1"}') == 900e6
    assert value(text, 'laggard_gpu_sm_clock_min_hertz{gpu="0"}') == 1980e6
    assert value(text, 'laggard_gpu_clock_event_seconds_total{gpu="1",reason="hw_slowdown"}'
                 ) == pytest.approx(0.2)
    assert value(text, 'laggard_gpu_clock_event_active{gpu="1",reason="hw_slowdown"}') is None
    assert 'gpu="0",reason=' not in text  # GPU 0 never held down: no reason series at all


def test_a_scrape_after_the_window_no_longer_shows_the_dip(expose, value) -> None:
    fake = ScriptedNvml(1)
    now = [0.0]
    collector = NvmlCollector(NvmlLibrary(fake), clock=lambda: now[0], interval=0.5,
                              clock_window=2.0)
    fake.sm[0] = 1000
    collector.collect()
    fake.sm[0] = 1980
    for tick in range(1, 7):  # full rounds at 1, 2 and 3 s (the dip at 0 s left at 2 s)
        now[0] = tick * 0.5
        text = expose(collector)
    assert value(text, 'laggard_gpu_sm_clock_min_hertz{gpu="0"}') == 1980e6


def per_gpu_series(text: str, gpus: int) -> list[int]:
    counts = [0] * gpus
    for m in re.finditer(r'^laggard_gpu_\w+\{[^}]*gpu="(\d+)"', text, re.M):
        counts[int(m.group(1))] += 1
    return counts


@pytest.mark.parametrize("step", [12, 31, 45])
def test_the_default_series_budget_per_gpu(expose, step: int) -> None:
    """dcgm-exporter's default is 26 fields per GPU: every GPU of the fake story stays within
    it (a power cap, a thermal episode on two reasons, NVLink errors, an idle GPU, XID
    counters); --collector.nvml.all-fields exports the rest."""
    fake = FakeNvml(8)
    collector, _ = collector_for(fake)
    all_fields, _ = collector_for(fake, all_fields=True)
    for _ in range(step):
        fake.advance()
        collector.collect()
        all_fields.collect()
    counts = per_gpu_series(expose(collector), 8)
    assert max(counts) <= 26, counts
    assert min(per_gpu_series(expose(all_fields), 8)) > 30


def test_a_broken_nvml_is_failing_not_absent() -> None:
    class BrokenNvml(FakeNvml):
        def nvmlInit(self) -> None:  # noqa: N802 - a driver that is there and answers badly
            raise self.NVMLError(self.NVML_ERROR_UNKNOWN)

    from laggard.agent.sampler import CollectorThread

    thread = CollectorThread(NvmlCollector(NvmlLibrary(BrokenNvml(1))), 1.0)
    sample = thread.collect_once()
    assert not sample.success and not sample.absent and sample.failures == 1
    absent = CollectorThread(NvmlCollector(NvmlLibrary(FakeNvml(1, driver="no_driver"))), 1.0)
    sample = absent.collect_once()
    assert not sample.success and sample.absent and sample.failures == 0
