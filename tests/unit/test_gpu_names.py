"""Names shared by the GPU sources: throttle bits, recovery actions, PCI ids as the kernel log
writes them."""

from __future__ import annotations

import pytest

from trainguard.collectors.gpu.names import (
    decode_throttle,
    kernel_pci,
    recovery_action_from_text,
    recovery_action_name,
)


def test_decode_throttle_bits_in_order_and_unknown_bits() -> None:
    assert decode_throttle(0) == []
    assert decode_throttle(0x1) == ["gpu_idle"]
    assert decode_throttle(0x1FF) == [
        "gpu_idle", "applications_clocks_setting", "sw_power_cap", "hw_slowdown", "sync_boost",
        "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown",
        "display_clocks_setting"]
    assert decode_throttle(0x8 | 0x1000) == ["hw_slowdown", "bit_0x1000"]
    assert decode_throttle(-1) == []


@pytest.mark.parametrize(("bus", "want"), [
    ("00000000:3B:00.0", "0000:3b:00"),
    ("0000:3b:00.0", "0000:3b:00"),
    ("3b:00.0", "0000:3b:00"),
    ("00000001:00:1E.0", "0001:00:1e"),
])
def test_kernel_pci(bus: str, want: str) -> None:
    assert kernel_pci(bus) == want


def test_recovery_actions() -> None:
    assert recovery_action_name(0) == "none"
    assert recovery_action_name(4) == "drain_and_reset"
    assert recovery_action_name(42) == "unknown_42"
    assert recovery_action_from_text("None") == "none"
    assert recovery_action_from_text("Node Reboot") == "node_reboot"
    assert recovery_action_from_text("2") == "node_reboot"
    assert recovery_action_from_text("Something New") == "unknown_something_new"
    assert recovery_action_from_text("") is None
