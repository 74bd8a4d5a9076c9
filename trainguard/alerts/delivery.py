"""One worker per channel: its queue, its rate limit, its retries. A channel that fails never
stops the others or the service: every message ends as an outcome value.

Batches that wait while the channel is busy (rate limit, retries) are merged when the worker
takes them, so a slow channel gets digests instead of a backlog.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from trainguard.alerts.backoff import Backoff
from trainguard.alerts.channels.base import Channel
from trainguard.alerts.http import Poster, PostFailed
from trainguard.alerts.metrics import AlertMetrics
from trainguard.alerts.model import Notice
from trainguard.alerts.ratelimit import RateLimiter
from trainguard.alerts.render import Message, group
from trainguard.alerts.reply import Judged, Verdict, judge
from trainguard.alerts.secrets import Redactor

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Outcome:
    channel: str
    title: str
    delivered: bool
    attempts: int
    detail: str


def squash_refreshes(notices: Sequence[Notice]) -> list[Notice]:
    """Merged batches: a re-send is dropped when the batch says something real about the same
    incident, and only the last re-send of an incident is kept."""
    real = {n.incident_id for n in notices if not n.refresh}
    last_refresh = {n.incident_id: i for i, n in enumerate(notices) if n.refresh}
    return [n for i, n in enumerate(notices)
            if not n.refresh or (n.incident_id not in real and last_refresh[n.incident_id] == i)]


def message_kind(message: Message) -> str:
    """The metrics label of a message: its notice's kind, 'digest', or 'refresh'."""
    if all(n.refresh for n in message.notices):
        return "refresh"
    return "digest" if message.digest else message.notices[0].kind.value


class ChannelWorker:
    def __init__(
        self,
        channel: Channel,
        poster: Poster,
        *,
        redactor: Redactor,
        backoff: Backoff | None = None,
        metrics: AlertMetrics | None = None,
        timeout_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        rng: random.Random | None = None,
    ) -> None:
        self.channel = channel
        self.policy = channel.policy
        self.name = self.policy.name
        self.poster = poster
        self.redactor = redactor
        self.backoff = backoff or Backoff()
        self.metrics = metrics
        self.timeout_s = timeout_s
        self.limiter = RateLimiter(self.policy.limits)
        self.outcomes: deque[Outcome] = deque(maxlen=1000)
        self._clock = clock
        self._wall = wall
        self._sleep = sleep
        self._rng = rng or random.Random()
        self._queue: asyncio.Queue[tuple[Notice, ...]] = asyncio.Queue()
        self._busy = False

    def submit(self, notices: Sequence[Notice]) -> None:
        if notices:
            self._queue.put_nowait(tuple(notices))
            self._gauge()

    @property
    def idle(self) -> bool:
        return self._queue.empty() and not self._busy

    async def run(self) -> None:
        while True:
            notices = list(await self._queue.get())
            self._busy = True
            try:
                while not self._queue.empty():
                    notices.extend(self._queue.get_nowait())
                self._gauge()
                for message in group(squash_refreshes(notices), self.policy.max_individual):
                    await self.deliver(message)
            finally:
                self._busy = False

    async def deliver(self, message: Message) -> Outcome:
        try:
            outcome = await self._attempts(message)
        except asyncio.CancelledError:
            raise
        except Exception as err:  # a bug in a channel must not take the service down
            outcome = Outcome(self.name, message.title, False, 0,
                              self.redactor.scrub(f"{type(err).__name__}: {err}"))
            log.error("alerts: channel %s failed to build a message: %s", self.name,
                      outcome.detail)
        self.outcomes.append(outcome)
        if self.metrics is not None:
            kind = message_kind(message)
            counter = self.metrics.sent if outcome.delivered else self.metrics.failed
            counter.labels(self.name, kind).inc()
        return outcome

    async def _attempts(self, message: Message) -> Outcome:
        attempt = 0
        while True:
            attempt += 1
            await self._respect_limit()
            request = self.channel.build(message, self._wall())
            reply = await self.poster.post(request, self.timeout_s)
            if isinstance(reply, PostFailed):
                judged = Judged(Verdict.RETRY, reply.detail)
            else:
                judged = judge(reply.status, reply.body, reply.headers, request.check)
            detail = self.redactor.scrub(f"{request.shown}: {judged.detail}")
            if self.metrics is not None:
                self.metrics.attempts.labels(self.name, judged.verdict.value).inc()
            if judged.verdict == Verdict.DELIVERED:
                log.debug("alerts: %s delivered %r (attempt %d)", self.name, message.title,
                          attempt)
                return Outcome(self.name, message.title, True, attempt, detail)
            if judged.verdict == Verdict.REFUSED or self.backoff.gives_up_after(attempt):
                log.warning("alerts: %s gave up on %r after %d attempt(s): %s", self.name,
                            message.title, attempt, detail)
                return Outcome(self.name, message.title, False, attempt, detail)
            delay = self.backoff.delay(attempt, self._rng, judged.retry_after_s)
            log.info("alerts: %s attempt %d failed (%s); again in %.2f s", self.name, attempt,
                     detail, delay)
            await self._sleep(delay)

    async def _respect_limit(self) -> None:
        while (delay := self.limiter.wait(self._clock())) > 0:
            await self._sleep(delay)
        self.limiter.record(self._clock())

    def _gauge(self) -> None:
        if self.metrics is not None:
            self.metrics.queued.labels(self.name).set(self._queue.qsize())
