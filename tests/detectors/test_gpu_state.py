"""The GPU-state columns and the cause they name (pure: plain window records)."""

from __future__ import annotations

import math

import numpy as np

from laggard.detectors.gpu_state import (
    GPU_STATE_COLUMN_NAMES,
    REASONS,
    SOURCE_NONE,
    SOURCE_NVML,
    SOURCE_TORCH,
    SOURCE_UNAVAILABLE,
    GpuStateWindow,
    describe_cause,
    reason_column,
)
from laggard.detectors.window import WindowRecord
from laggard.nvml.library import CLOCK_EVENT_REASONS


def _record(rows: list[dict[str, float]], nodes: list[str] | None = None) -> WindowRecord:
    columns = {name: np.array([row.get(name, math.nan) for row in rows])
               for name in GPU_STATE_COLUMN_NAMES}
    return WindowRecord(step=19, columns=columns, ranks=np.arange(len(rows)),
                        world_size=len(rows), nodes=nodes)


def _window(samples: list[tuple[float, float, list[str] | None]], *, source: float = SOURCE_NVML,
            gpu: int | None = 3) -> dict[str, float]:
    window = GpuStateWindow()
    for clock, clock_max, reasons in samples:
        window.add(sm_clock_hertz=clock, sm_clock_max_hertz=clock_max, reasons=reasons)
    return window.values(source=source, gpu_index=gpu)


def test_reason_names_are_those_of_the_nvml_wrapper() -> None:
    assert REASONS == tuple(CLOCK_EVENT_REASONS)


def test_window_reduces_samples_to_mean_clock_ratio_and_reason_fractions() -> None:
    values = _window([(1.41e9, 1.98e9, ["sw_thermal"]), (1.98e9, 1.98e9, []),
                      (1.41e9, 1.98e9, ["sw_thermal", "hw_thermal"]), (1.98e9, 1.98e9, [])])
    assert values["gpu_state_samples"] == 4 and values["gpu_index"] == 3
    assert math.isclose(values["gpu_sm_clock_hertz"], (2 * 1.41e9 + 2 * 1.98e9) / 4)
    assert math.isclose(values["gpu_sm_clock_ratio"], (2 * 1.41 / 1.98 + 2) / 4)
    assert values["gpu_sm_clock_max_hertz"] == 1.98e9
    assert values[reason_column("sw_thermal")] == 0.5
    assert values[reason_column("hw_thermal")] == 0.25
    assert values[reason_column("sw_power_cap")] == 0.0


def test_an_empty_or_reasonless_window_is_nan_not_zero() -> None:
    values = GpuStateWindow().values(source=SOURCE_NONE, gpu_index=None)
    assert values["gpu_state_samples"] == 0
    assert all(math.isnan(values[n]) for n in GPU_STATE_COLUMN_NAMES
               if n not in ("gpu_state_source", "gpu_state_samples"))
    torch_only = _window([(None, 1.98e9, None)], source=SOURCE_TORCH)
    assert math.isnan(torch_only[reason_column("sw_thermal")])
    assert torch_only["gpu_sm_clock_max_hertz"] == 1.98e9


def test_a_throttled_gpu_is_named_with_reason_share_and_clocks() -> None:
    steady = _window([(1.98e9, 1.98e9, [])] * 5, gpu=0)
    hot = _window([(1.41e9, 1.98e9, ["sw_thermal"])] * 5, gpu=3)
    record = _record([steady, steady, steady, hot], nodes=["node07"] * 4)
    cause = describe_cause(record, 3)
    assert cause is not None
    assert cause.text == "GPU 3 (node07) sw_thermal active in 100% of the window, " \
                         "SM clock 1.41 of 1.98 GHz"
    assert cause.gpu == 3 and cause.reasons == {"sw_thermal": 1.0}
    assert cause.evidence["cause"] == ["sw_thermal"] and cause.evidence["source"] == "nvml"


def test_idle_and_brief_reasons_are_not_causes() -> None:
    samples = [(1.98e9, 1.98e9, ["gpu_idle"])] * 19 + [(1.9e9, 1.98e9, ["sw_power_cap"])]
    record = _record([_window(samples, gpu=1)], nodes=["n1"])
    cause = describe_cause(record, 0)
    assert cause is not None and cause.reasons == {}
    assert cause.text == "no clock event on its GPU (GPU 1 on n1, SM clock 1.98 of 1.98 GHz)"
    assert cause.evidence["reasons"] == {"gpu_idle": 0.95, "sw_power_cap": 0.05}


def test_cpu_job_torch_only_and_lost_gpu_say_so() -> None:
    cpu = GpuStateWindow().values(source=SOURCE_NONE, gpu_index=None)
    torch_only = _window([(None, 1.98e9, None)], source=SOURCE_TORCH, gpu=None)
    lost = GpuStateWindow().values(source=SOURCE_UNAVAILABLE, gpu_index=2)
    record = _record([cpu, torch_only, lost])
    assert describe_cause(record, 0).text == "no GPU state: CPU job"
    assert describe_cause(record, 1).text == "its GPU: clock-event reasons unknown (no NVML in " \
                                             "the job)"
    assert describe_cause(record, 2).text.startswith("no GPU state: its GPU gave none")


def test_a_record_without_gpu_state_or_without_the_rank_has_no_cause() -> None:
    bare = WindowRecord(step=0, columns={"compute_seconds": np.ones(2)}, ranks=np.arange(2))
    assert describe_cause(bare, 0) is None
    assert describe_cause(_record([_window([])]), 5) is None
