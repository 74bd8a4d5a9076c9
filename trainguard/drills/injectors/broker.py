"""A control-plane outage: the real Kafka broker stopped (SIGTERM, clean) or killed
(SIGKILL) and started again on undo, keeping its data and ports."""

from __future__ import annotations

from trainguard.dev.kafka import BrokerError, KafkaBroker
from trainguard.drills.injectors.base import Acted, InjectionError


class BrokerOutage:
    def __init__(self, broker: KafkaBroker, mode: str = "stop",
                 restart_timeout_s: float = 120.0) -> None:
        if mode not in ("stop", "kill"):
            raise InjectionError(f"mode: stop or kill (got {mode!r})")
        self.broker, self.mode, self.timeout = broker, mode, restart_timeout_s
        self.down = False

    def inject(self) -> Acted:
        info = self.broker.running()
        if info is None:
            raise InjectionError("the broker is not running")
        done = self.broker.stop() if self.mode == "stop" else self.broker.kill()
        if not done:
            raise InjectionError("the broker was already gone")
        self.down = True
        return Acted.now(mode=self.mode, pid=info.pid, bootstrap=info.bootstrap)

    def undo(self) -> Acted:
        if not self.down:
            return Acted.now(undo="nothing to undo")
        try:
            info = self.broker.start(timeout_s=self.timeout)
        except BrokerError as exc:
            raise InjectionError(f"the broker did not come back: {exc}") from None
        self.down = False
        return Acted.now(pid=info.pid, bootstrap=info.bootstrap)
