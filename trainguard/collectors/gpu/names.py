"""Names shared by every GPU source: clock-event (throttle) reasons, recovery actions, PCI ids.

The throttle names are nvidia-smi's (``clocks_event_reasons.<name>`` in ``--query-gpu``, the
``clocks_event_reason_<name>`` / ``clocks_throttle_reason_<name>`` tags in ``-q -x``), so NVML,
dcgm-exporter and nvidia-smi give the same strings for the same bit.
"""

from __future__ import annotations

# NVML nvmlClocksEventReason* / nvmlClocksThrottleReason* bits (nvml.h, pynvml).
THROTTLE_BITS: tuple[tuple[int, str], ...] = (
    (0x0000000000000001, "gpu_idle"),
    (0x0000000000000002, "applications_clocks_setting"),
    (0x0000000000000004, "sw_power_cap"),
    (0x0000000000000008, "hw_slowdown"),
    (0x0000000000000010, "sync_boost"),
    (0x0000000000000020, "sw_thermal_slowdown"),
    (0x0000000000000040, "hw_thermal_slowdown"),
    (0x0000000000000080, "hw_power_brake_slowdown"),
    (0x0000000000000100, "display_clocks_setting"),
    (0x0000000000000200, "board_limit"),
    (0x0000000000000400, "reliability"),
)
THROTTLE_NAMES = frozenset(name for _, name in THROTTLE_BITS)

# NVML_GPU_RECOVERY_ACTION_* (value of field NVML_FI_DEV_GET_GPU_RECOVERY_ACTION).
RECOVERY_ACTIONS: dict[int, str] = {
    0: "none",
    1: "gpu_reset",
    2: "node_reboot",
    3: "drain_p2p",
    4: "drain_and_reset",
    5: "recover_imex_domain",
    6: "bus_reset",
    7: "system_reboot",
}


def decode_throttle(mask: int) -> list[str]:
    """A clocks-event bitmask -> reason names, in bit order; unknown bits as ``bit_0x...``."""
    if mask < 0:
        return []
    names = [name for bit, name in THROTTLE_BITS if mask & bit]
    known = 0
    for bit, _ in THROTTLE_BITS:
        known |= bit
    rest = mask & ~known
    bit = 1
    while rest:
        if rest & bit:
            names.append(f"bit_{bit:#x}")
            rest &= ~bit
        bit <<= 1
    return names


def recovery_action_name(code: int) -> str:
    return RECOVERY_ACTIONS.get(code, f"unknown_{code}")


def recovery_action_from_text(text: str) -> str | None:
    """nvidia-smi's ``gpu_recovery_action`` text ("None", "Gpu Reset", "4") -> our name."""
    t = text.strip()
    if not t:
        return None
    if t.isdigit():
        return recovery_action_name(int(t))
    name = t.lower().replace("-", "_").replace(" ", "_")
    return name if name in RECOVERY_ACTIONS.values() else f"unknown_{name}"


def kernel_pci(bus_id: str) -> str:
    """NVML/nvidia-smi ``00000000:3B:00.0`` -> the kernel log's ``0000:3b:00`` (Xid lines).

    The node-health stream names a GPU the way ``NVRM: Xid (PCI:0000:3b:00)`` does, so an Xid
    seen both by NVML and in the kernel log carries one device string.
    """
    s = bus_id.strip().lower()
    if "." in s:
        s = s.rsplit(".", 1)[0]
    parts = s.split(":")
    if len(parts) == 3:
        domain = parts[0][-4:].rjust(4, "0")
        return f"{domain}:{parts[1]}:{parts[2]}"
    if len(parts) == 2:
        return f"0000:{parts[0]}:{parts[1]}"
    return s
