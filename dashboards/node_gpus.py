"""Node GPUs: is a GPU throttled, failing or gone?

The signals dcgm-exporter users look for, with laggard's corrections: XIDs are counters (every
event counts, repeats included) and clock-event reasons are one 0/1 series per reason, as NVML
reports them (``nvmlDeviceGetCurrentClocksEventReasons``).
"""

from __future__ import annotations

from grafana_foundation_sdk.builders import stat, statetimeline
from grafana_foundation_sdk.builders.dashboard import Dashboard
from grafana_foundation_sdk.models.common import GraphDrawStyle

from laggard.dashboards.panels import (
    NODE,
    RATE,
    Board,
    Query,
    label_variable,
    node_variable,
    series_panel,
)

UID = "laggard-node-gpus"
TITLE = "laggard / Node GPUs"

_SEL = f'{NODE}, gpu=~"$gpu"'
_GPU = "{{instance}} GPU {{gpu}}"


def build() -> Dashboard:
    """The node GPUs dashboard (uid ``laggard-node-gpus``)."""
    board = Board(
        UID,
        TITLE,
        "GPU clocks against their maximum, clock-event reasons, temperature, power, XID, ECC, "
        "PCIe and NVLink errors.",
        [
            node_variable("laggard_gpu_info"),
            label_variable("gpu", "gpu", "GPU", f"laggard_gpu_info{{{NODE}}}"),
        ],
    )
    board.row("Clocks and throttling")
    board.add(
        series_panel(
            "SM clock against its maximum",
            "percentunit",
            "Current SM clock divided by the maximum SM clock. Below 1 under load with a "
            "throttle reason active means the GPU is held back.",
        ).min(0).max(1.05),
        Query(
            f"laggard_gpu_sm_clock_hertz{{{_SEL}}} / laggard_gpu_sm_clock_max_hertz{{{_SEL}}}",
            _GPU,
        ),
    )
    board.add(
        series_panel(
            "SM clock against its maximum, by training rank",
            "percentunit",
            "The same ratio for the GPU each training rank drives: laggard_rank_info (the "
            "rank's device UUID and PCI bus id, resolved to the agent's NVML index) joined on "
            "(instance, gpu). A rank whose line sits below the others is slowed by its GPU.",
        ).min(0).max(1.05),
        Query(
            f'max by (instance, gpu, run, rank) (laggard_rank_info{{{_SEL}, gpu!=""}})'
            f" * on (instance, gpu) group_left () max by (instance, gpu) "
            f"(laggard_gpu_sm_clock_hertz{{{_SEL}}} / laggard_gpu_sm_clock_max_hertz{{{_SEL}}})",
            "{{run}} rank {{rank}} (" + _GPU + ")",
        ),
    )
    board.add(
        series_panel("SM clock", "hertz", "Current and maximum SM clock per GPU."),
        Query(f"laggard_gpu_sm_clock_hertz{{{_SEL}}}", _GPU),
        Query(f"laggard_gpu_sm_clock_max_hertz{{{_SEL}}}", _GPU + " max"),
    )
    board.add(
        statetimeline.Panel()
        .title("Active clock-event reasons")
        .description(
            "Why NVML says the clocks are below maximum (1 = active), one row per GPU and "
            "reason; gpu_idle is left out."
        ),
        Query(
            f'max by (instance, gpu, reason) (laggard_gpu_clock_event_active{{{_SEL}, '
            f'reason!="gpu_idle"}})',
            "{{instance}} GPU {{gpu}} {{reason}}",
        ),
        width=24,
    )
    board.add(
        series_panel(
            "Time with clocks held down, by reason",
            "percentunit",
            "Fraction of each interval NVML counted as clock-violation time (nvmlDeviceGet"
            "ViolationStatus): how long power, thermal or board limits cost full speed.",
        ),
        Query(
            f"rate(laggard_gpu_clock_violation_seconds_total{{{_SEL}}}[{RATE}])",
            "{{instance}} GPU {{gpu}} {{reason}}",
        ),
        width=24,
    )
    board.row("Thermal and power")
    board.add(
        series_panel("Temperature", "celsius", "GPU die temperature."),
        Query(f"laggard_gpu_temperature_celsius{{{_SEL}}}", _GPU),
        width=8,
    )
    board.add(
        series_panel("Power", "watt", "Power draw per GPU."),
        Query(f"laggard_gpu_power_watts{{{_SEL}}}", _GPU),
        width=8,
    )
    board.add(
        series_panel("Utilization", "percentunit", "Fraction of time a kernel was running."),
        Query(f"laggard_gpu_utilization_ratio{{{_SEL}}}", _GPU),
        width=8,
    )
    board.row("Errors")
    board.add(
        stat.Panel()
        .title("GPUs lost")
        .description("GPUs that fell off the bus or stopped answering NVML (GpuIsLost)."),
        Query(f"sum(laggard_gpu_lost{{{_SEL}}})", "lost"),
        width=4,
    )
    board.add(
        series_panel(
            "XID events by code",
            "short",
            "XID errors counted per GPU and XID code (every event, repeats included). See "
            "NVIDIA's XID catalog for each code's meaning and action.",
        ).draw_style(GraphDrawStyle.BARS),
        Query(
            f"sum by (instance, gpu, xid) (increase(laggard_gpu_xid_errors_total{{{_SEL}}}"
            f"[{RATE}]))",
            "{{instance}} GPU {{gpu}} XID {{xid}}",
        ),
        width=20,
    )
    board.add(
        series_panel("ECC errors", "short", "ECC errors per GPU and type, in each interval."),
        Query(
            f"sum by (instance, gpu, type) (increase(laggard_gpu_ecc_errors_total{{{_SEL}}}"
            f"[{RATE}]))",
            "{{instance}} GPU {{gpu}} {{type}}",
        ),
        width=8,
    )
    board.add(
        series_panel(
            "PCIe replays",
            "short",
            "PCIe link-level replays per GPU in each interval: a rising count means a bad link "
            "or riser.",
        ),
        Query(f"increase(laggard_gpu_pcie_replay_total{{{_SEL}}}[{RATE}])", _GPU),
        width=8,
    )
    board.add(
        series_panel(
            "NVLink errors",
            "short",
            "NVLink error counters per GPU and counter, in each interval.",
        ),
        Query(
            f"sum by (instance, gpu, type) (increase(laggard_gpu_nvlink_errors_total{{{_SEL}}}"
            f"[{RATE}]))",
            "{{instance}} GPU {{gpu}} {{type}}",
        ),
        width=8,
    )
    board.row("Interconnect")
    board.add(
        series_panel("PCIe throughput", "Bps", "PCIe bytes per second per GPU and direction."),
        Query(
            f"laggard_gpu_pcie_throughput_bytes_per_second{{{_SEL}}}",
            "{{instance}} GPU {{gpu}} {{direction}}",
        ),
    )
    board.add(
        series_panel(
            "NVLink throughput",
            "Bps",
            "NVLink bytes per second per GPU, summed over its links (GPUs without NVLink "
            "have no series).",
        ),
        Query(f"rate(laggard_gpu_nvlink_received_bytes_total{{{_SEL}}}[{RATE}])",
              _GPU + " receive"),
        Query(f"rate(laggard_gpu_nvlink_transmitted_bytes_total{{{_SEL}}}[{RATE}])",
              _GPU + " transmit"),
    )
    return board.build()
