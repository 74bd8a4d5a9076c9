"""Trace plans -> OpenTelemetry spans, with the planned ids and event-time timestamps.

The SDK draws ids from its IdGenerator; ``PlannedIds`` hands it the planned ones while a plan is
being emitted (random ones otherwise, so the provider can serve other spans too).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.id_generator import IdGenerator, RandomIdGenerator
from opentelemetry.trace import Span, Status, StatusCode

from trainguard.traces.plan import SpanPlan, TracePlan

NS_PER_US = 1_000
TRACER_NAME = "trainguard.incidents"


class PlannedIds(IdGenerator):
    def __init__(self) -> None:
        self._local = threading.local()
        self._random = RandomIdGenerator()

    @contextmanager
    def planned(self, trace_id: int, span_id: int) -> Iterator[None]:
        self._local.ids = (trace_id, span_id)
        try:
            yield
        finally:
            self._local.ids = None

    def generate_trace_id(self) -> int:
        ids: tuple[int, int] | None = getattr(self._local, "ids", None)
        return ids[0] if ids else self._random.generate_trace_id()

    def generate_span_id(self) -> int:
        ids: tuple[int, int] | None = getattr(self._local, "ids", None)
        return ids[1] if ids else self._random.generate_span_id()


class TraceEmitter:
    """Emits trace plans through a provider whose id generator is ``ids``."""

    def __init__(self, provider: TracerProvider, ids: PlannedIds) -> None:
        self.provider = provider
        self.ids = ids
        self._tracer = provider.get_tracer(TRACER_NAME)
        self._lock = threading.Lock()

    def emit(self, plan: TracePlan) -> None:
        with self._lock:
            root = self._start(plan, plan.root, Context())
            parent_ctx = trace.set_span_in_context(root)
            for child in plan.spans[1:]:
                self._finish(self._start(plan, child, parent_ctx), child)
            self._finish(root, plan.root)

    def _start(self, plan: TracePlan, sp: SpanPlan, ctx: Context) -> Span:
        with self.ids.planned(plan.trace_id, sp.span_id):
            span = self._tracer.start_span(sp.name, context=ctx, start_time=sp.start_us * NS_PER_US,
                                           attributes=dict(sp.attributes))
        for ev in sp.events:
            span.add_event(ev.name, dict(ev.attributes), timestamp=ev.time_us * NS_PER_US)
        return span

    @staticmethod
    def _finish(span: Span, sp: SpanPlan) -> None:
        if sp.error:
            span.set_status(Status(StatusCode.ERROR))
        span.end(end_time=sp.end_us * NS_PER_US)
