"""NVIDIA Xid catalog: code -> name, description, severity and recommended action.

Source: NVIDIA, "Analyzing Xid Errors with the Xid Catalog", Table 1 "Xids" (Ampere and newer),
https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html : the Mnemonic column gives
``name``, the "Resolution Bucket (Immediate Action)" column gives ``catalog_action``. Older
descriptions come from NVIDIA's "Xid Errors" guide (https://docs.nvidia.com/deploy/xid-errors/).
The same codes and buckets are shipped by NVIDIA/NVSentinel as ``xiderrorsmapping.csv``.

Bucket -> :class:`Action`, as the catalog explains its buckets:

* ``RESTART_APP`` -> restart the application; ``RESET_GPU`` -> reset the GPU;
  ``RESTART_BM`` / ``RESTART_VM`` -> reboot the node (VM); ``IGNORE`` -> nothing to do;
  ``CONTACT_SUPPORT`` (and unused codes) -> contact support; ``UPDATE_SWFW`` -> update
  driver/firmware; ``CHECK_MECHANICALS`` -> check cooling and power; ``CHECK_UVM`` -> restart the
  application (a UVM client fault).
* workflows: ``WORKFLOW_XID_45`` (Xid 45 follows another Xid: act on that one) -> ignore;
  ``WORKFLOW_XID_48`` (DBE: the row is remapped at the next reset) and ``WORKFLOW_NVLINK_ERR``
  (Xid 74) -> reset the GPU; ``WORKFLOW_NVLINK5_ERR`` (Xid 144-150) -> reset the GPU when the
  line carries the ``Fatal`` token, nothing when ``Nonfatal``.
* Xid 154 ("GPU recovery action changed") names the action in its message:
  ``... to 0x1 (GPU Reset Required)`` -> reset, ``Node Reboot Required`` -> reboot,
  ``Drain P2P`` / ``Drain and Reset`` -> drain the node (``nvmlDeviceGetGpuRecoveryAction``).

Severity: fatal buckets (reset, reboot, contact support) are critical; restart-application
buckets are warnings; ignore is info.

Why one module of ~520 lines: most of it is NVIDIA's catalog itself, kept as the table the
documentation prints (one row per Xid) so it can be checked against the source line by line.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

from laggard.detectors.finding import Finding, Severity

CATALOG_URL = "https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html"


class Action(str, enum.Enum):
    """What a person should do about an Xid (NVIDIA's resolution buckets, simplified)."""

    IGNORE = "ignore"
    RESTART_APP = "restart_app"
    RESET_GPU = "reset_gpu"
    REBOOT = "reboot"
    DRAIN_NODE = "drain_node"
    CHECK_HARDWARE = "check_hardware"
    UPDATE_SOFTWARE = "update_software"
    CONTACT_SUPPORT = "contact_support"


_BUCKET_ACTION = {
    "IGNORE": Action.IGNORE,
    "RESTART_APP": Action.RESTART_APP,
    "CHECK_UVM": Action.RESTART_APP,
    "RESET_GPU": Action.RESET_GPU,
    "RESTART_BM": Action.REBOOT,
    "RESTART_VM": Action.REBOOT,
    "CONTACT_SUPPORT": Action.CONTACT_SUPPORT,
    "UPDATE_SWFW": Action.UPDATE_SOFTWARE,
    "CHECK_MECHANICALS": Action.CHECK_HARDWARE,
    "WORKFLOW_XID_45": Action.IGNORE,
    "WORKFLOW_XID_48": Action.RESET_GPU,
    "WORKFLOW_NVLINK_ERR": Action.RESET_GPU,
    "WORKFLOW_NVLINK5_ERR": Action.RESET_GPU,
    "XID_154": Action.CONTACT_SUPPORT,  # replaced by the action the message names
}

_ACTION_SEVERITY = {
    Action.IGNORE: Severity.INFO,
    Action.RESTART_APP: Severity.WARNING,
    Action.CHECK_HARDWARE: Severity.WARNING,
    Action.UPDATE_SOFTWARE: Severity.WARNING,
    Action.RESET_GPU: Severity.CRITICAL,
    Action.REBOOT: Severity.CRITICAL,
    Action.DRAIN_NODE: Severity.CRITICAL,
    Action.CONTACT_SUPPORT: Severity.CRITICAL,
}

# code | mnemonic | immediate-action bucket | description ("-" = unused by current drivers)
_TABLE = """
1|ROBUST_CHANNEL_FIFO_ERROR_FIFO_METHOD|CONTACT_SUPPORT|-
2|ROBUST_CHANNEL_FIFO_ERROR_SW_METHOD|CONTACT_SUPPORT|-
3|ROBUST_CHANNEL_FIFO_ERROR_UNK_METHOD|CONTACT_SUPPORT|-
4|ROBUST_CHANNEL_FIFO_ERROR_CHANNEL_BUSY|CONTACT_SUPPORT|-
5|ROBUST_CHANNEL_FIFO_ERROR_RUNOUT_OVERFLOW|CONTACT_SUPPORT|-
6|ROBUST_CHANNEL_FIFO_ERROR_PARSE_ERR|CONTACT_SUPPORT|-
7|ROBUST_CHANNEL_FIFO_ERROR_PTE_ERR|CONTACT_SUPPORT|-
8|ROBUST_CHANNEL_FIFO_ERROR_IDLE_TIMEOUT|RESTART_APP|GPU stopped processing
9|ROBUST_CHANNEL_GR_ERROR_INSTANCE|CONTACT_SUPPORT|-
10|ROBUST_CHANNEL_GR_ERROR_SINGLE_STEP|CONTACT_SUPPORT|-
11|ROBUST_CHANNEL_GR_ERROR_MISSING_HW|RESTART_APP|Invalid or corrupted push buffer stream
12|ROBUST_CHANNEL_GR_ERROR_SW_METHOD|CONTACT_SUPPORT|-
13|ROBUST_CHANNEL_GR_EXCEPTION|RESTART_APP|Graphics engine exception (usually an application fault)
14|ROBUST_CHANNEL_FAKE_ERROR|IGNORE|Test error injected by the driver
15|ROBUST_CHANNEL_SCANLINE_TIMEOUT|CONTACT_SUPPORT|-
16|ROBUST_CHANNEL_VBLANK_CALLBACK_TIMEOUT|CONTACT_SUPPORT|-
17|ROBUST_CHANNEL_PARAMETER_ERROR|CONTACT_SUPPORT|-
18|ROBUST_CHANNEL_BUS_MASTER_TIMEOUT_ERROR|CONTACT_SUPPORT|-
19|ROBUST_CHANNEL_DISP_MISSED_NOTIFIER|CONTACT_SUPPORT|-
20|ROBUST_CHANNEL_MPEG_ERROR_SW_METHOD|CONTACT_SUPPORT|-
21|ROBUST_CHANNEL_ME_ERROR_SW_METHOD|CONTACT_SUPPORT|-
22|ROBUST_CHANNEL_VP_ERROR_SW_METHOD|CONTACT_SUPPORT|-
23|ROBUST_CHANNEL_RC_LOGGING_ENABLED|CONTACT_SUPPORT|-
24|ROBUST_CHANNEL_GR_SEMAPHORE_TIMEOUT|CONTACT_SUPPORT|-
25|ROBUST_CHANNEL_GR_ILLEGAL_NOTIFY|RESTART_APP|Illegal notifier in the graphics engine
26|ROBUST_CHANNEL_FIFO_ERROR_FBISTATE_TIMEOUT|CONTACT_SUPPORT|-
27|ROBUST_CHANNEL_VP_ERROR|CONTACT_SUPPORT|-
28|ROBUST_CHANNEL_VP2_ERROR|CONTACT_SUPPORT|-
29|ROBUST_CHANNEL_BSP_ERROR|CONTACT_SUPPORT|-
30|ROBUST_CHANNEL_BAD_ADDR_ACCESS|CONTACT_SUPPORT|-
31|ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT|RESTART_APP|GPU memory page fault (MMU)
32|ROBUST_CHANNEL_PBDMA_ERROR|RESTART_APP|Invalid or corrupted push buffer stream (PBDMA)
33|ROBUST_CHANNEL_SEC_ERROR|CONTACT_SUPPORT|-
34|ROBUST_CHANNEL_MSVLD_ERROR|CONTACT_SUPPORT|-
35|ROBUST_CHANNEL_MSPDEC_ERROR|CONTACT_SUPPORT|-
36|ROBUST_CHANNEL_MSPPP_ERROR|CONTACT_SUPPORT|-
37|ROBUST_CHANNEL_FECS_ERR_UNIMP_FIRMWARE_METHOD|IGNORE|Unimplemented firmware method
38|ROBUST_CHANNEL_FECS_ERR_WATCHDOG_TIMEOUT|IGNORE|Firmware watchdog timeout
39|ROBUST_CHANNEL_CE0_ERROR|RESTART_APP|Copy engine 0 error
40|ROBUST_CHANNEL_CE1_ERROR|RESTART_APP|Copy engine 1 error
41|ROBUST_CHANNEL_CE2_ERROR|RESTART_APP|Copy engine 2 error
42|ROBUST_CHANNEL_VIC_ERROR|CONTACT_SUPPORT|-
43|ROBUST_CHANNEL_RESETCHANNEL_VERIF_ERROR|IGNORE|Application fault; channel reset, GPU healthy
44|ROBUST_CHANNEL_GR_FAULT_DURING_CTXSW|IGNORE|Graphics engine fault during context switch
45|ROBUST_CHANNEL_PREEMPTIVE_REMOVAL|WORKFLOW_XID_45|Channel cleanup after an earlier error
46|ROBUST_CHANNEL_GPU_TIMEOUT_ERROR|RESET_GPU|GPU stopped processing (timeout)
47|ROBUST_CHANNEL_NVENC0_ERROR|CONTACT_SUPPORT|-
48|ROBUST_CHANNEL_GPU_ECC_DBE|WORKFLOW_XID_48|Uncorrectable (double-bit) ECC error
49|SILENT_RUNNING_CONSTANT_LEVEL_SET_BY_REGISTRY|CONTACT_SUPPORT|-
50|SILENT_RUNNING_LEVEL_TRANSITION_DUE_TO_RC_ERROR|CONTACT_SUPPORT|-
51|SILENT_RUNNING_STRESS_TEST_FAILURE|CONTACT_SUPPORT|-
52|SILENT_RUNNING_LEVEL_TRANS_DUE_TO_TEMP_RISE|CONTACT_SUPPORT|-
53|SILENT_RUNNING_TEMP_REDUCED_CLOCKING|CONTACT_SUPPORT|-
54|SILENT_RUNNING_PWR_REDUCED_CLOCKING|CHECK_MECHANICALS|Auxiliary power missing: clocks reduced
55|SILENT_RUNNING_TEMPERATURE_READ_ERROR|CONTACT_SUPPORT|-
56|DISPLAY_CHANNEL_EXCEPTION|CONTACT_SUPPORT|-
57|FB_LINK_TRAINING_FAILURE_ERROR|CONTACT_SUPPORT|-
58|FB_MEMORY_ERROR|CONTACT_SUPPORT|-
59|PMU_ERROR|CONTACT_SUPPORT|-
60|ROBUST_CHANNEL_SEC2_ERROR|RESTART_APP|SEC2 engine error
61|PMU_BREAKPOINT|CONTACT_SUPPORT|Internal micro-controller breakpoint or warning
62|PMU_HALT_ERROR|RESET_GPU|Internal micro-controller halt
63|INFOROM_DRAM_RETIREMENT_EVENT|IGNORE|ECC page retirement or row-remapping recorded in the InfoROM
64|INFOROM_DRAM_RETIREMENT_FAILURE|RESET_GPU|ECC page retirement or row-remapping recording failure
65|ROBUST_CHANNEL_NVENC1_ERROR|CONTACT_SUPPORT|-
66|ROBUST_CHANNEL_FECS_ERR_REG_ACCESS_VIOLATION|IGNORE|Firmware register access violation
67|ROBUST_CHANNEL_FECS_ERR_VERIF_VIOLATION|IGNORE|Firmware verification violation
68|ROBUST_CHANNEL_NVDEC0_ERROR|RESTART_APP|Video decoder 0 exception
69|ROBUST_CHANNEL_GR_CLASS_ERROR|RESTART_APP|Graphics engine class error
70|ROBUST_CHANNEL_CE3_ERROR|RESTART_APP|Copy engine 3 error
71|ROBUST_CHANNEL_CE4_ERROR|RESTART_APP|Copy engine 4 error
72|ROBUST_CHANNEL_CE5_ERROR|RESTART_APP|Copy engine 5 error
73|ROBUST_CHANNEL_NVENC2_ERROR|CONTACT_SUPPORT|-
74|NVLINK_ERROR|WORKFLOW_NVLINK_ERR|NVLink error: a link to another GPU or NVSwitch failed
75|ROBUST_CHANNEL_CE6_ERROR|RESTART_APP|Copy engine 6 error
76|ROBUST_CHANNEL_CE7_ERROR|RESTART_APP|Copy engine 7 error
77|ROBUST_CHANNEL_CE8_ERROR|RESTART_APP|Copy engine 8 error
78|VGPU_START_ERROR|UPDATE_SWFW|vGPU start failed
79|ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS|RESTART_BM|GPU has fallen off the bus (PCIe)
80|PBDMA_PUSHBUFFER_CRC_MISMATCH|RESTART_APP|Push buffer CRC mismatch (corrupted data)
81|ROBUST_CHANNEL_VGA_SUBSYSTEM_ERROR|CONTACT_SUPPORT|-
82|ROBUST_CHANNEL_NVJPG0_ERROR|RESTART_APP|JPEG engine 0 error
83|ROBUST_CHANNEL_NVDEC1_ERROR|RESTART_APP|Video decoder 1 exception
84|ROBUST_CHANNEL_NVDEC2_ERROR|RESTART_APP|Video decoder 2 exception
85|ROBUST_CHANNEL_CE9_ERROR|RESTART_APP|Copy engine 9 error
86|ROBUST_CHANNEL_OFA0_ERROR|RESTART_APP|Optical flow accelerator 0 error
87|NVTELEMETRY_DRIVER_REPORT|CONTACT_SUPPORT|-
88|ROBUST_CHANNEL_NVDEC3_ERROR|RESTART_APP|Video decoder 3 exception
89|ROBUST_CHANNEL_NVDEC4_ERROR|RESTART_APP|Video decoder 4 exception
90|LTC_ERROR|CONTACT_SUPPORT|-
91|RESERVED_XID|CONTACT_SUPPORT|-
92|EXCESSIVE_SBE_INTERRUPTS|IGNORE|High single-bit ECC error rate
93|INFOROM_ERASE_LIMIT_EXCEEDED|IGNORE|InfoROM erase limit exceeded
94|ROBUST_CHANNEL_CONTAINED_ERROR|RESTART_APP|Contained uncorrectable ECC error (one application)
95|ROBUST_CHANNEL_UNCONTAINED_ERROR|RESET_GPU|Uncontained uncorrectable ECC error (whole GPU)
96|ROBUST_CHANNEL_NVDEC5_ERROR|RESTART_APP|Video decoder 5 exception
97|ROBUST_CHANNEL_NVDEC6_ERROR|RESTART_APP|Video decoder 6 exception
98|ROBUST_CHANNEL_NVDEC7_ERROR|RESTART_APP|Video decoder 7 exception
99|ROBUST_CHANNEL_NVJPG1_ERROR|RESTART_APP|JPEG engine 1 error
100|ROBUST_CHANNEL_NVJPG2_ERROR|RESTART_APP|JPEG engine 2 error
101|ROBUST_CHANNEL_NVJPG3_ERROR|RESTART_APP|JPEG engine 3 error
102|ROBUST_CHANNEL_NVJPG4_ERROR|RESTART_APP|JPEG engine 4 error
103|ROBUST_CHANNEL_NVJPG5_ERROR|RESTART_APP|JPEG engine 5 error
104|ROBUST_CHANNEL_NVJPG6_ERROR|RESTART_APP|JPEG engine 6 error
105|ROBUST_CHANNEL_NVJPG7_ERROR|RESTART_APP|JPEG engine 7 error
106|SMBPBI_TEST_MESSAGE|IGNORE|SMBPBI test message
107|SMBPBI_TEST_MESSAGE_SILENT|IGNORE|SMBPBI test message (silent)
108|DESTINATION_FLA_TRANSLATION_ERROR|CONTACT_SUPPORT|-
109|ROBUST_CHANNEL_CTXSW_TIMEOUT_ERROR|RESET_GPU|Context switch timeout
110|SEC_FAULT_ERROR|RESET_GPU|Security fault
111|BUNDLE_ERROR_EVENT|CONTACT_SUPPORT|-
112|DISP_SUPERVISOR_ERROR|CONTACT_SUPPORT|-
113|DP_LT_FAILURE|CONTACT_SUPPORT|-
114|HEAD_RG_UNDERFLOW|CONTACT_SUPPORT|-
115|CORE_CHANNEL_REGS|CONTACT_SUPPORT|-
116|WINDOW_CHANNEL_REGS|CONTACT_SUPPORT|-
117|CURSOR_CHANNEL_REGS|CONTACT_SUPPORT|-
118|HEAD_REGS|CONTACT_SUPPORT|-
119|GSP_RPC_TIMEOUT|RESET_GPU|GSP firmware did not answer an RPC in time
120|GSP_ERROR|RESET_GPU|GSP firmware error
121|C2C_ERROR|IGNORE|Chip-to-chip (C2C) link error, corrected
122|SPI_PMU_RPC_READ_FAIL|CONTACT_SUPPORT|-
123|SPI_PMU_RPC_WRITE_FAIL|CONTACT_SUPPORT|-
124|SPI_PMU_RPC_ERASE_FAIL|CONTACT_SUPPORT|-
125|INFOROM_FS_ERROR|CONTACT_SUPPORT|-
126|ROBUST_CHANNEL_CE10_ERROR|RESTART_APP|Copy engine 10 error
127|ROBUST_CHANNEL_CE11_ERROR|RESTART_APP|Copy engine 11 error
128|ROBUST_CHANNEL_CE12_ERROR|RESTART_APP|Copy engine 12 error
129|ROBUST_CHANNEL_CE13_ERROR|RESTART_APP|Copy engine 13 error
130|ROBUST_CHANNEL_CE14_ERROR|RESTART_APP|Copy engine 14 error
131|ROBUST_CHANNEL_CE15_ERROR|RESTART_APP|Copy engine 15 error
132|ROBUST_CHANNEL_CE16_ERROR|RESTART_APP|Copy engine 16 error
133|ROBUST_CHANNEL_CE17_ERROR|RESTART_APP|Copy engine 17 error
134|ROBUST_CHANNEL_CE18_ERROR|RESTART_APP|Copy engine 18 error
135|ROBUST_CHANNEL_CE19_ERROR|RESTART_APP|Copy engine 19 error
136|ALI_TRAINING_FAIL|RESET_GPU|NVLink training (ALI) failed
137|NVLINK_FLA_PRIV_ERR|IGNORE|NVLink fabric address privilege error
138|ROBUST_CHANNEL_DLA_ERROR|CONTACT_SUPPORT|-
139|ROBUST_CHANNEL_OFA1_ERROR|RESTART_APP|Optical flow accelerator 1 error
140|UNRECOVERABLE_ECC_ERROR_ESCAPE|RESET_GPU|Unrecovered ECC error escaped containment
141|ROBUST_CHANNEL_FAST_PATH_ERROR|IGNORE|Fast-path error
142|ROBUST_CHANNEL_NVENC3_ERROR|CONTACT_SUPPORT|-
143|GPU_INIT_ERROR|RESET_GPU|GPU initialisation failed
144|NVLINK_SAW_ERROR|WORKFLOW_NVLINK5_ERR|NVLink5 SAW error
145|NVLINK_RLW_ERROR|WORKFLOW_NVLINK5_ERR|NVLink5 RLW error
146|NVLINK_TLW_ERROR|WORKFLOW_NVLINK5_ERR|NVLink5 TLW error
147|NVLINK_TREX_ERROR|WORKFLOW_NVLINK5_ERR|NVLink5 TREX error
148|NVLINK_NVLPW_CTRL_ERROR|WORKFLOW_NVLINK5_ERR|NVLink5 NVLPW control error
149|NVLINK_NETIR_ERROR|WORKFLOW_NVLINK5_ERR|NVLink5 NETIR (link) error
150|NVLINK_MSE_ERROR|WORKFLOW_NVLINK5_ERR|NVLink5 MSE error
151|ROBUST_CHANNEL_KEY_ROTATION_ERROR|RESTART_VM|Confidential-computing key rotation error
152|ROBUST_CHANNEL_DLA_SMMU_ERROR|IGNORE|DLA SMMU error
153|ROBUST_CHANNEL_DLA_TIMEOUT|IGNORE|DLA timeout
154|GPU_RECOVERY_ACTION_CHANGED|XID_154|GPU recovery action changed (the message names the action)
155|NVLINK_SW_DEFINED_ERROR|RESET_GPU|NVLink software-defined error
156|RESOURCE_RETIREMENT_EVENT|RESET_GPU|Resource retirement recorded
157|RESOURCE_RETIREMENT_FAILURE|IGNORE|Resource retirement failure
158|GPU_FATAL_TIMEOUT|RESET_GPU|Fatal GPU timeout
159|ROBUST_CHANNEL_CHI_NON_DATA_ERROR|CHECK_UVM|CHI non-data error (UVM client)
160|CHANNEL_RETIREMENT_EVENT|RESTART_BM|Channel retirement recorded: memory marked for repair
161|CHANNEL_RETIREMENT_FAILURE|IGNORE|Channel retirement failure
"""

_RECOVERY_ACTION = re.compile(r"to 0x[0-9a-fA-F]+ \(([^)]*)\)")
_RECOVERY_TEXT = (("reboot", Action.REBOOT), ("drain", Action.DRAIN_NODE),
                  ("reset", Action.RESET_GPU), ("none", Action.IGNORE))


@dataclass(frozen=True, slots=True)
class XidInfo:
    """What NVIDIA's catalog says about one Xid.

    Attributes:
        xid: the code.
        name: NVIDIA's mnemonic (``"ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS"``), or
            ``"UNKNOWN"`` for a code the catalog does not list.
        description: one line.
        catalog_action: NVIDIA's immediate-action bucket, verbatim.
        action: what to do (see module doc).
        severity: info / warning / critical.
    """

    xid: int
    name: str
    description: str
    catalog_action: str
    action: Action
    severity: Severity


def _load() -> dict[int, tuple[str, str, str]]:
    rows: dict[int, tuple[str, str, str]] = {}
    for line in _TABLE.strip().splitlines():
        code, name, bucket, description = line.split("|", 3)
        rows[int(code)] = (name, bucket, "Unused by current drivers" if description == "-"
                           else description)
    return rows


_ROWS = _load()


def lookup(xid: int, message: str = "", fatal_token: str | None = None) -> XidInfo:
    """Catalog entry for ``xid``, refined by what the line itself says.

    Args:
        xid: the Xid number.
        message: the driver's message (Xid 154 names the recovery action there).
        fatal_token: ``"Fatal"``/``"Nonfatal"`` of NVLink5 Xids (144-150), if printed.

    Returns:
        The entry; a code the catalog does not list gets ``name="UNKNOWN"`` and
        ``Action.CONTACT_SUPPORT``.
    """
    name, bucket, description = _ROWS.get(xid, ("UNKNOWN", "CONTACT_SUPPORT",
                                                "Not in NVIDIA's Xid catalog"))
    action = _BUCKET_ACTION.get(bucket, Action.CONTACT_SUPPORT)
    if bucket == "WORKFLOW_NVLINK5_ERR" and fatal_token == "Nonfatal":
        action = Action.IGNORE
    if bucket == "XID_154" and (m := _RECOVERY_ACTION.search(message)):
        wanted = m.group(1).lower()
        action = next((a for text, a in _RECOVERY_TEXT if text in wanted), action)
    return XidInfo(xid, name, description, bucket, action, _ACTION_SEVERITY[action])


def xid_finding(*, xid: int, pci_bus_id: str, gpu: int | None, message: str = "",
                fatal_token: str | None = None, node: str | None = None,
                source: str = "kernel_log") -> Finding:
    """A finding for one Xid event, carrying the catalog's recommended action.

    Args:
        xid: Xid number.
        pci_bus_id: ``"dddd:bb:dd"`` of the GPU.
        gpu: NVML index of that GPU, None when not mapped.
        message: the driver's message.
        fatal_token: NVLink5 ``Fatal``/``Nonfatal`` token, if any.
        node: this node's name.
        source: ``"kernel_log"`` or ``"nvml"``.

    Returns:
        A :class:`Finding` with ``detector="xid"``, ``kind="xid"`` and the action in evidence.
    """
    info = lookup(xid, message, fatal_token)
    where = f"GPU {gpu}" if gpu is not None else f"GPU at {pci_bus_id}"
    return Finding(
        detector="xid", kind="xid", severity=info.severity, node=node, gpu=gpu,
        message=f"Xid {xid} ({info.name}) on {where}: {info.description}; "
                f"action: {info.action.value.replace('_', ' ')}",
        evidence={"xid": xid, "name": info.name, "pci_bus_id": pci_bus_id,
                  "action": info.action.value, "catalog_action": info.catalog_action,
                  "driver_message": message[:200], "fatal_token": fatal_token,
                  "source": source, "catalog": CATALOG_URL},
    )


# ---- NVSwitch SXids ---------------------------------------------------------------------------
#
# NVIDIA Fabric Manager User Guide (DU-09883-001), appendix "NVSwitch SXid Errors": tables
# "Non-Fatal NVSwitch SXid Errors", "Fatal NVSwitch SXid Errors" (fatal to the port's partition:
# reset the access port / restart the guest VM) and "Always Fatal NVSwitch SXid Errors" (fatal to
# the whole fabric: restart the host). Codes the guide does not list are "unknown".

#: code -> (class, name); class is ``non_fatal``, ``fatal`` or ``always_fatal``.
_SXID_TABLE = """
11004|non_fatal|Ingress invalid ACL
11012|non_fatal|Single bit ECC error
11021|non_fatal|Single bit ECC error
11022|non_fatal|Single bit ECC error
11023|non_fatal|Single bit ECC error
12021|non_fatal|Single bit ECC error
12023|non_fatal|Single bit ECC error
15008|non_fatal|Single bit ECC error
15011|non_fatal|Single bit ECC error
19049|non_fatal|Single bit ECC error
19055|non_fatal|Single bit ECC error
19057|non_fatal|Single bit ECC error
19059|non_fatal|Single bit ECC error
19062|non_fatal|Single bit ECC error
19065|non_fatal|Single bit ECC error
19068|non_fatal|Single bit ECC error
19071|non_fatal|Single bit ECC error
20001|non_fatal|TX Replay Error
20012|non_fatal|Broken/inconsistent connection
22013|non_fatal|Minion Link DLREQ interrupt
24001|non_fatal|Single bit ECC error
24002|non_fatal|Single bit ECC error
24003|non_fatal|Single bit ECC error
11001|fatal|Ingress invalid command
11009|fatal|Ingress invalid VCSet
11013|fatal|Ingress header DBE
11018|fatal|Ingress RID DBE
11019|fatal|Ingress RLAN DBE
11020|fatal|Ingress control parity
12001|fatal|Egress crossbar overflow
12002|fatal|Egress packet route
12022|fatal|Egress input ECC DBE error
12024|fatal|Egress output ECC DBE error
12025|fatal|Egress credit overflow
12026|fatal|Egress destination request ID error
12027|fatal|Egress destination response ID error
12028|fatal|Egress non-posted PRIV error
12030|fatal|Egress control parity error
12031|fatal|Egress credit parity error
12032|fatal|Egress flit type mismatch
14017|fatal|TS ATO timeout
15001|fatal|Route buffer over/underflow
15006|fatal|Route transdone over/underflow
15009|fatal|Route GLT DBE
15010|fatal|Route parity
15012|fatal|Route incoming DBE
15013|fatal|Route credit parity
19047|fatal|NCISOC HDR ECC DBE Error
19048|fatal|NCISOC DAT ECC DBE Error
19054|fatal|HDR RAM ECC DBE Error
19056|fatal|DAT0 RAM ECC DBE Error
19058|fatal|DAT1 RAM ECC DBE Error
19060|fatal|CREQ RAM HDR ECC DBE Error
19061|fatal|CREQ RAM DAT ECC DBE Error
19063|fatal|Response RAM HDR ECC DBE Error
19064|fatal|Response RAM DAT ECC DBE Error
19066|fatal|COM RAM HDR ECC DBE Error
19067|fatal|COM RAM DAT ECC DBE Error
19069|fatal|RSP1 RAM HDR ECC DBE Error
19070|fatal|RSP1 RAM DAT ECC DBE Error
19084|fatal|AN1 Heartbeat Timeout Error
20034|fatal|LTSSM Fault Up
22012|fatal|Minion Link NA interrupt
24004|fatal|Sourcetrack TCEN0 crumbstore DBE
23001|always_fatal|Ingress SRC-VC buffer overflow
23002|always_fatal|Ingress SRC-VC buffer underflow
23003|always_fatal|Egress DST-VC credit overflow
23004|always_fatal|Egress DST-VC credit underflow
23005|always_fatal|Ingress packet burst error
23006|always_fatal|Ingress packet sticky error
23007|always_fatal|Possible bubbles at ingress
23008|always_fatal|Ingress packet invalid dst error
23009|always_fatal|Ingress packet parity error
23010|always_fatal|Ingress SRC-VC buffer overflow
23011|always_fatal|Ingress SRC-VC buffer underflow
23012|always_fatal|Egress DST-VC credit overflow
23013|always_fatal|Egress DST-VC credit underflow
23014|always_fatal|Ingress packet burst error
23015|always_fatal|Ingress packet sticky error
23016|always_fatal|Possible bubbles at ingress
"""

_SXID_ROWS = {int(code): (cls, name) for code, cls, name in
              (line.split("|", 2) for line in _SXID_TABLE.strip().splitlines())}

#: The driver's severity word for one event (``NVSWITCH_REPORT_FATAL`` / ``_NONFATAL`` /
#: ``_CORRECTABLE`` in ``src/common/nvswitch``) -> finding severity.
_PRINTED_SEVERITY = {"fatal": Severity.CRITICAL, "nonfatal": Severity.WARNING,
                     "correctable": Severity.INFO}
_CLASS_SEVERITY = {"always_fatal": Severity.CRITICAL, "fatal": Severity.CRITICAL,
                   "non_fatal": Severity.WARNING, "unknown": Severity.WARNING}


@dataclass(frozen=True, slots=True)
class SXidInfo:
    """What the Fabric Manager guide and the line say about one SXid event.

    Attributes:
        sxid: the code.
        name: the guide's name, or ``"UNKNOWN"``.
        catalog_class: ``non_fatal``, ``fatal``, ``always_fatal`` or ``unknown``.
        printed: the severity word the driver printed for this event (``fatal``, ``nonfatal``,
            ``correctable``), None when the line carried none (a ``Data {...}`` line alone).
        severity: the finding's severity: the printed word when there is one (the driver
            decides per event: ``NVSWITCH_REPORT_CONTAIN`` reports one code as fatal or not),
            else the catalog class.
        action: what to do, from the guide's recovery column.
    """

    sxid: int
    name: str
    catalog_class: str
    printed: str | None
    severity: Severity
    action: str


def sxid_lookup(sxid: int, printed: str | None = None) -> SXidInfo:
    """The one place SXid severity is decided (the agent's XID collector and ``laggard
    analyze`` both call it).

    Args:
        sxid: the SXid number.
        printed: ``"fatal"``, ``"nonfatal"`` or ``"correctable"`` as the line said, or None.

    Returns:
        The :class:`SXidInfo`; an unlisted code is ``unknown`` (warning when nothing was
        printed).
    """
    catalog_class, name = _SXID_ROWS.get(sxid, ("unknown", "UNKNOWN"))
    severity = _PRINTED_SEVERITY.get(printed or "", _CLASS_SEVERITY[catalog_class])
    if catalog_class == "always_fatal":
        severity = Severity.CRITICAL  # fatal to the whole fabric whatever the line says
    if catalog_class == "always_fatal":
        action = "restart the host to reset the whole NVLink fabric"
    elif severity is Severity.CRITICAL:
        action = ("the NVLink fabric is degraded: drain the node, reset the NVSwitch port "
                  "(restart its partition); inspect the switch if it recurs")
    elif severity is Severity.WARNING:
        action = "watch the link; no job impact unless it repeats"
    else:
        action = "corrected by the switch: nothing to do"
    return SXidInfo(sxid=sxid, name=name, catalog_class=catalog_class, printed=printed,
                    severity=severity, action=action)


def sxid_finding(*, sxid: int, pci_bus_id: str, link: int | None, printed: str | None,
                 message: str, device: str | None, node: str | None) -> Finding:
    """A finding for one NVSwitch SXid event, severity from :func:`sxid_lookup`.

    Args:
        sxid: SXid number.
        pci_bus_id: the switch's ``"dddd:bb:dd.f"``.
        link: NVLink port, if the line names one.
        printed: the driver's severity word for the event, None when the line printed none.
        message: the driver's text.
        device: the switch device name (``nvidia-nvswitch1``), if printed.
        node: this node's name.

    Returns:
        A :class:`Finding` with ``detector="xid"``, ``kind="sxid"``.
    """
    info = sxid_lookup(sxid, printed)
    where = f" link {link}" if link is not None else ""
    said = {"fatal": "Fatal", "nonfatal": "Non-fatal", "correctable": "Correctable"}.get(
        printed or "", f"{info.catalog_class.replace('_', '-')} per the catalog")
    return Finding(
        detector="xid", kind="sxid", severity=info.severity, node=node,
        message=(f"SXid {sxid} ({info.name}, {said}) on NVSwitch {pci_bus_id}{where}: "
                 f"{message}; {info.action}"),
        evidence={"sxid": sxid, "name": info.name, "pci_bus_id": pci_bus_id, "link": link,
                  "severity": printed, "catalog_class": info.catalog_class, "device": device},
    )
