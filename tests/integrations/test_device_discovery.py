"""Rank, device and phase-clock discovery (``integrations/device_discovery.py``), no GPU."""

from __future__ import annotations

import pytest

from laggard.integrations.device_discovery import (
    job_position,
    model_devices,
    rank_device,
    resolve_phase_clock,
)

torch = pytest.importorskip("torch")


def test_the_position_comes_from_the_arguments_else_the_environment() -> None:
    env = {"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1"}
    assert job_position(None, None, None, None, env) == (3, 8, 1)
    assert job_position(0, 2, None, None, {}) == (0, 2, None)
    assert job_position(None, None, None, None, {}) == (0, 1, None)


def _resolve(wanted: str, **kwargs: object):
    logged: list[tuple[str, tuple[object, ...]]] = []
    kwargs = {"device": None, "model": None, "dist_mod": None, "comm_timer": None} | kwargs
    clock = resolve_phase_clock(wanted, window_steps=4, pool_events=16,
                                log_once=lambda key, msg, *a: logged.append((key, a)),
                                **kwargs)
    return clock, logged


def test_the_cpu_clocks_are_taken_as_asked_and_auto_on_cpu_is_the_wall_clock() -> None:
    for wanted in ("wall", "thread_cpu"):
        clock, logged = _resolve(wanted)
        assert (clock.name, clock.device_clock, clock.refused, logged) == (wanted, None, "", [])
    clock, logged = _resolve("auto", model=torch.nn.Linear(2, 2))
    assert (clock.name, clock.refused, logged) == ("wall", "", [])


def test_a_refused_device_clock_says_why_once_and_falls_back_to_the_wall_clock() -> None:
    clock, logged = _resolve("device")  # no CUDA here
    assert clock.name == "wall" and clock.refused == "no CUDA device"
    assert [key for key, _ in logged] == ["device-refused"]
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2, device="meta"))
    clock, _ = _resolve("device", model=model)
    assert clock.name == "wall" and "several devices" in clock.refused


def test_a_models_devices_and_no_cuda_identity_on_cpu() -> None:
    assert model_devices(None) == set()
    assert model_devices([torch.nn.Linear(2, 2)]) == {"cpu"}
    assert rank_device(torch.nn.Linear(2, 2)) is None
