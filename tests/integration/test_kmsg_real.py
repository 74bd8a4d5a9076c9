"""The follower on the real /dev/kmsg: a line written into the kernel ring comes back out.

Needs root (writing /dev/kmsg). No broker: this test does not touch Kafka.
"""

from __future__ import annotations

import os
import time
import uuid

import pytest

from trainguard.collectors.kernel_log import KernelLogFollower, KmsgSource, TimeContext
from trainguard.events.clock import now_us
from trainguard.events.payloads import NodeHealth, NodeHealthKind

KMSG = "/dev/kmsg"

pytestmark = [
    pytest.mark.integration,
    # Outside CI a developer without root may skip; under CI=true it must run (and fail if it
    # cannot).
    pytest.mark.skipif(os.environ.get("CI") != "true"
                       and not (os.access(KMSG, os.W_OK) and os.access(KMSG, os.R_OK)),
                       reason=f"{KMSG} is not readable and writable here (needs root)"),
]


def test_a_line_written_to_kmsg_is_followed_as_an_xid() -> None:
    follower = KernelLogFollower(KmsgSource(KMSG), node="this-node",
                                 time_context=TimeContext.from_host())
    try:
        follower.collect(now_us())  # drain whatever the kernel logged meanwhile
        tag = uuid.uuid4().hex[:12]
        line = (f"<3>NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, name=python, "
                f"GPU has fallen off the bus. tg-test-{tag}\n")
        before = now_us()
        with open(KMSG, "w", encoding="utf-8") as f:
            f.write(line)
        found: list[tuple[NodeHealth, int]] = []
        deadline = time.monotonic() + 5
        while not found and time.monotonic() < deadline:
            for d in follower.collect(now_us()).discrete:
                if isinstance(d.payload, NodeHealth) and tag in d.payload.message:
                    found.append((d.payload, d.event_time))
            time.sleep(0.01)
        assert len(found) == 1, "the written line did not come back from /dev/kmsg"
        health, event_time = found[0]
        assert (health.kind, health.code, health.device, health.origin) == (
            NodeHealthKind.XID, 79, "0000:3b:00", "kmsg")
        # The record's own monotonic stamp, converted with the boot time, is about now.
        assert abs(event_time - before) < 2_000_000
    finally:
        follower.close()
