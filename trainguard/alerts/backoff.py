"""Retries: bounded attempts, exponential backoff with full jitter, the server's Retry-After
honoured up to a cap. Pure: the random source is passed in."""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class Backoff:
    base_s: float = 0.5
    cap_s: float = 30.0
    max_attempts: int = 5
    max_retry_after_s: float = 120.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts: must be >= 1 (got {self.max_attempts})")
        if self.base_s < 0:
            raise ValueError(f"base_s: must be >= 0 (got {self.base_s})")
        if self.cap_s < self.base_s:
            raise ValueError(f"cap_s: must be >= base_s {self.base_s} (got {self.cap_s})")

    def delay(self, attempt: int, rng: random.Random, retry_after_s: float | None = None) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1-based)."""
        ceiling = min(self.cap_s, self.base_s * 2 ** (attempt - 1))
        jittered = rng.uniform(0, ceiling)
        if retry_after_s is not None and retry_after_s > 0:
            return min(max(retry_after_s, jittered), self.max_retry_after_s)
        return jittered

    def gives_up_after(self, attempt: int) -> bool:
        return attempt >= self.max_attempts
