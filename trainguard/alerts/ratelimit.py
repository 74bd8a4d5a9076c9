"""Per-channel rate limits: every window at once (e.g. 5 per second and 100 per minute).

A sliding log, pure: ``wait(now)`` says how long until one more request fits every window,
``record(now)`` counts one. In any interval of ``per_s`` seconds at most ``count`` are recorded
when callers wait as told.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Limit:
    count: int
    per_s: float

    def __post_init__(self) -> None:
        if self.count < 1 or self.per_s <= 0:
            raise ValueError(f"a rate limit needs count >= 1 and per_s > 0, got {self}")


class RateLimiter:
    def __init__(self, limits: Sequence[Limit]) -> None:
        self.limits = tuple(limits)
        self._sent: deque[float] = deque()
        self._keep = max((lim.per_s for lim in self.limits), default=0.0)

    def wait(self, now: float) -> float:
        delay = 0.0
        sent = list(self._sent)
        for lim in self.limits:
            if len(sent) >= lim.count:
                # the request count-th from the end must have left this window
                oldest = sent[-lim.count]
                delay = max(delay, oldest + lim.per_s - now)
        return delay

    def record(self, now: float) -> None:
        self._sent.append(now)
        while self._sent and self._sent[0] <= now - self._keep:
            self._sent.popleft()
