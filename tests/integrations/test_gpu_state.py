"""GpuStateParticipant with the fake NVML and a fake torch.cuda, and the straggler finding that
names the cause from it."""

from __future__ import annotations

import math
import time
from types import SimpleNamespace

import numpy as np
import pytest
from support import budget

from laggard.detectors.finding import Finding, Severity
from laggard.detectors.gpu_state import (
    SOURCE_NONE,
    SOURCE_NVML,
    SOURCE_TORCH,
    SOURCE_UNAVAILABLE,
    reason_column,
)
from laggard.detectors.window import WindowLayout, WindowRecord
from laggard.integrations.gpu_state import FAKE_NVML_ENV, GpuStateParticipant
from laggard.integrations.participants import MonitorContext, with_gpu_cause
from laggard.nvml.fake import FakeNvml

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")


def fake_cuda(*, uuid: str | None, bus: int = 0x18, available: bool = True) -> SimpleNamespace:
    """torch.cuda as a job with CUDA_VISIBLE_DEVICES sees it: device 0 is whichever GPU."""
    props = SimpleNamespace(uuid=uuid, pci_domain_id=0, pci_bus_id=bus, pci_device_id=0,
                            clock_rate=1_980_000)  # kHz, as cudaDeviceProp.clockRate

    def clock_rate(device=None):
        raise ModuleNotFoundError("No module named 'pynvml'")  # torch's own needs pynvml

    return SimpleNamespace(is_available=lambda: available, current_device=lambda: 0,
                           get_device_properties=lambda device: props, clock_rate=clock_rate)


def torch_uuid(index: int) -> str:
    """The fake NVML's GPU ``index`` as torch prints its UUID (no ``GPU-`` prefix)."""
    return f"fa4e0000-0000-0000-0000-{index:012d}"


def context(rank: int = 0, local_rank: int | None = 0) -> MonitorContext:
    errors: list[str] = []
    ctx = MonitorContext(rank=rank, world_size=4, node="node07", local_rank=local_rank,
                         window_steps=5, group=lambda: None,
                         log_once=lambda key, msg, *args: None,
                         count_error=lambda where, exc: errors.append(f"{where}: {exc}"))
    ctx.errors = errors  # type: ignore[attr-defined]
    return ctx


def participant(nvml=None, cuda=None, *, local_rank: int | None = 0,
                interval: float = 0.0) -> GpuStateParticipant:
    p = GpuStateParticipant(GpuStateParticipant.Config(sample_interval_seconds=interval,
                                                       nvml=nvml, cuda=cuda))
    p.attach(context(local_rank=local_rank))
    return p


def window(p: GpuStateParticipant, steps: int = 5) -> dict[str, float]:
    for step in range(steps):
        p.end_step(step, step % 5)
    return dict(p.contribute(steps - 1))  # type: ignore[arg-type]


def test_throttled_gpu_found_by_uuid_not_by_cuda_index() -> None:
    # CUDA device 0 of this rank is NVML's GPU 2 (CUDA_VISIBLE_DEVICES=2): matched by UUID.
    p = participant(FakeNvml(4, scenario="throttle:2:sw_thermal"), fake_cuda(uuid=torch_uuid(2)))
    values = window(p)
    assert p.gpu_index == 2 and values["gpu_index"] == 2
    assert values["gpu_state_source"] == SOURCE_NVML and values["gpu_state_samples"] == 5
    assert values[reason_column("sw_thermal")] == 1.0
    assert values[reason_column("hw_thermal")] == 0.0
    assert values["gpu_sm_clock_hertz"] == 1410e6 and values["gpu_sm_clock_max_hertz"] == 1980e6
    assert math.isclose(values["gpu_sm_clock_ratio"], 1410 / 1980)
    other = participant(FakeNvml(4, scenario="throttle:2:sw_thermal"),
                        fake_cuda(uuid=torch_uuid(1)))
    assert window(other)[reason_column("sw_thermal")] == 0.0


def test_pci_bus_id_is_the_fallback_and_an_unknown_one_is_counted() -> None:
    p = participant(FakeNvml(4, scenario="steady"), fake_cuda(uuid=None, bus=0x38))
    assert p.gpu_index == 2 and window(p)["gpu_state_source"] == SOURCE_NVML
    unknown = participant(FakeNvml(4, scenario="steady"), fake_cuda(uuid=None, bus=0xEE))
    values = window(unknown)
    assert unknown.stats["unknown_device"] == 1 and unknown.gpu_index is None
    # torch.cuda is what is left: the maximum clock from its properties, reasons unknown
    assert values["gpu_state_source"] == SOURCE_TORCH
    assert values["gpu_sm_clock_max_hertz"] == 1980e6
    assert math.isnan(values[reason_column("sw_thermal")])


def test_no_nvml_in_the_job_falls_back_to_torch_cuda() -> None:
    p = participant(FakeNvml(2, driver="no_library"), fake_cuda(uuid=torch_uuid(0)))
    values = window(p)
    assert p.stats["nvml_unavailable"] == 1 and values["gpu_state_source"] == SOURCE_TORCH
    assert math.isnan(values["gpu_sm_clock_hertz"])  # torch.cuda.clock_rate needs pynvml


def test_cpu_job_has_nan_columns(monkeypatch) -> None:
    monkeypatch.delenv(FAKE_NVML_ENV, raising=False)
    p = participant(None, fake_cuda(uuid=None, available=False), interval=0.05)
    values = window(p)
    assert p._thread is not None
    p._thread.join(timeout=budget(2))  # a CPU job's sampler resolves and ends
    assert not p._thread.is_alive()
    values = dict(p.contribute(9))
    assert values["gpu_state_source"] == SOURCE_NONE and values["gpu_state_samples"] == 0
    assert math.isnan(values["gpu_sm_clock_ratio"]) and math.isnan(values["gpu_index"])


def test_gpu_lost_mid_run_is_counted_and_sampling_resumes() -> None:
    fake = FakeNvml(2)  # default scenario: the last GPU is lost at steps 50-59
    p = participant(fake, fake_cuda(uuid=torch_uuid(1), bus=0x28))
    assert window(p)["gpu_state_samples"] == 5
    fake.advance(50)
    lost = window(p)
    assert p.stats["gpu_lost"] == 1 and lost["gpu_state_samples"] == 0
    assert lost["gpu_state_source"] == SOURCE_UNAVAILABLE
    fake.advance(10)  # the period wraps: the GPU is reset and answers again
    p._library._next_attempt = 0.0  # skip the re-init backoff
    for _ in range(3):
        again = window(p)
    assert again["gpu_state_source"] == SOURCE_NVML and again["gpu_state_samples"] > 0
    assert p.gpu_index == 1


def test_fake_nvml_hook_from_the_environment(monkeypatch) -> None:
    monkeypatch.setenv(FAKE_NVML_ENV, "4:throttle:3:hw_power_brake")
    p = participant(None, fake_cuda(uuid=None, available=False), local_rank=3)
    values = window(p)
    assert p.gpu_index == 3 and values[reason_column("hw_power_brake")] == 1.0
    monkeypatch.setenv(FAKE_NVML_ENV, "4:no-such-scenario")
    bad = participant(None, fake_cuda(uuid=None, available=False))
    assert bad.stats["fake_nvml_invalid"] == 1
    assert window(bad)["gpu_state_source"] == SOURCE_UNAVAILABLE
    monkeypatch.setenv(FAKE_NVML_ENV, "4:throttle:9")  # a GPU the fake does not have
    assert participant(None, None).stats["fake_nvml_invalid"] == 1


def test_sampler_thread_fills_the_window_without_the_training_thread() -> None:
    p = participant(FakeNvml(2, scenario="throttle:0"), fake_cuda(uuid=torch_uuid(0)),
                    interval=0.01)
    deadline = time.monotonic() + budget(5)
    while p.stats["samples"] < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    values = dict(p.contribute(19))
    p.close()
    assert values["gpu_state_samples"] >= 3 and values[reason_column("sw_thermal")] == 1.0
    assert not p._thread.is_alive()


def test_columns_pack_into_the_window_layout() -> None:
    p = participant(FakeNvml(1, scenario="steady"), fake_cuda(uuid=torch_uuid(0)))
    layout = WindowLayout(p.columns)
    rows = np.stack([layout.pack(window(p)) for _ in range(2)])
    assert layout.unpack(rows)["gpu_sm_clock_ratio"].tolist() == [1.0, 1.0]


# ------------------------------------------------------------------------- the finding
def _gathered(participants: list[GpuStateParticipant]) -> WindowRecord:
    layout = WindowLayout(participants[0].columns)
    rows = np.stack([layout.pack(window(p)) for p in participants])
    return WindowRecord(step=19, columns=layout.unpack(rows), ranks=np.arange(len(rows)),
                        world_size=len(rows), nodes=["node07"] * len(rows))


def _compute_finding(rank: int) -> Finding:
    return Finding(detector="straggler", kind="compute", severity=Severity.WARNING,
                   message=f"rank {rank} on node07: forward+backward 25% slower", rank=rank,
                   node="node07", evidence={"slowdown": 0.25})


def test_compute_finding_names_the_throttle_of_its_gpu() -> None:
    fakes = [FakeNvml(4, scenario="throttle:3:sw_thermal") for _ in range(4)]
    record = _gathered([participant(f, fake_cuda(uuid=torch_uuid(r)))
                        for r, f in enumerate(fakes)])
    named = with_gpu_cause(_compute_finding(3), record)
    assert named.message.endswith("; compute: GPU 3 (node07) sw_thermal active in 100% of the "
                                  "window, SM clock 1.41 of 1.98 GHz")
    assert named.gpu == 3 and named.evidence["gpu_state"]["cause"] == ["sw_thermal"]
    assert named.evidence["slowdown"] == 0.25


def test_compute_finding_without_a_throttle_names_none() -> None:
    record = _gathered([participant(FakeNvml(4, scenario="steady"), fake_cuda(uuid=torch_uuid(r)))
                        for r in range(4)])
    named = with_gpu_cause(_compute_finding(2), record)
    assert "; compute: no clock event on its GPU (GPU 2 on node07" in named.message
    assert named.evidence["gpu_state"]["cause"] is None


def test_cpu_job_finding_says_no_gpu_state(monkeypatch) -> None:
    monkeypatch.delenv(FAKE_NVML_ENV, raising=False)
    record = _gathered([participant(None, fake_cuda(uuid=None, available=False))
                        for _ in range(3)])
    assert with_gpu_cause(_compute_finding(1), record).message.endswith(
        "; compute: no GPU state: CPU job")


def test_other_findings_and_records_without_gpu_state_are_untouched() -> None:
    record = _gathered([participant(FakeNvml(2, scenario="throttle:1"),
                                    fake_cuda(uuid=torch_uuid(r))) for r in range(2)])
    data = Finding(detector="straggler", kind="data", severity=Severity.WARNING,
                   message="rank 1: data", rank=1)
    assert with_gpu_cause(data, record) is data
    bare = WindowRecord(step=0, columns={}, ranks=np.arange(2))
    finding = _compute_finding(1)
    assert with_gpu_cause(finding, bare) is finding


def test_a_window_before_the_sampler_resolved_the_gpu_is_not_called_a_cpu_job() -> None:
    p = GpuStateParticipant(GpuStateParticipant.Config(sample_interval_seconds=0.05))
    values = dict(p.contribute(0))  # not attached: nothing resolved yet
    assert math.isnan(values["gpu_state_source"])
