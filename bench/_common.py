"""Shared bench helpers: medians over repeats, a broker for the bus benchmarks."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from tempfile import TemporaryDirectory

from trainguard.dev.kafka import BrokerInfo, KafkaBroker


def median_rate(fn: Callable[[], int], repeats: int = 5) -> float:
    """Items per second: the median over ``repeats`` runs of ``fn`` (which returns its count)."""
    rates = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        n = fn()
        rates.append(n / (time.perf_counter() - t0))
    return statistics.median(rates)


@contextmanager
def bench_broker() -> Iterator[BrokerInfo]:
    """The running dev broker if there is one, else a fresh one for this run."""
    dev = KafkaBroker().running()
    if dev is not None:
        yield dev
        return
    with TemporaryDirectory(prefix="tg-bench-kafka-") as tmp:
        broker = KafkaBroker(Path(tmp))
        info = broker.start(fresh=True)
        try:
            yield info
        finally:
            broker.stop()
