"""Delivery: retries with bounded jittered backoff, rate limits, outcomes, no secret in logs."""

from __future__ import annotations

import asyncio
import itertools
import logging
import random
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainguard.alerts.backoff import Backoff
from trainguard.alerts.channels.base import HttpRequest
from trainguard.alerts.channels.dingtalk import DingTalkChannel
from trainguard.alerts.channels.slack import SlackChannel
from trainguard.alerts.delivery import ChannelWorker, message_kind, squash_refreshes
from trainguard.alerts.http import AiohttpPoster, PostFailed, Reply
from trainguard.alerts.metrics import AlertMetrics
from trainguard.alerts.model import Notice, NoticeKind
from trainguard.alerts.ratelimit import Limit, RateLimiter
from trainguard.alerts.render import Message
from trainguard.alerts.secrets import (
    RedactingFilter,
    Redactor,
    Secret,
    install_redaction,
    url_secret_parts,
)
from trainguard.dev.kafka import free_port
from trainguard.events.payloads import IncidentState

TOKEN = "xoxb-T0KEN-abcdef0123456789"
SLACK_URL = f"https://hooks.slack.com/services/T000/B000/{TOKEN}"


def notice(i: int = 0) -> Notice:
    return Notice(kind=NoticeKind.OPENED, incident_id=f"inc-{i}", job_id="job",
                  state=IncidentState.DETECTED, opened_at_us=1, at_us=1, transitions=1)


class FakeTime:
    def __init__(self) -> None:
        self.now = 1000.0
        self.slept: list[float] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.now += s


class ScriptedPoster:
    def __init__(self, *answers: Reply | PostFailed, at: FakeTime | None = None) -> None:
        self.answers = list(answers)
        self.seen: list[tuple[float, HttpRequest]] = []
        self.at = at

    async def post(self, request: HttpRequest, timeout_s: float) -> Reply | PostFailed:
        self.seen.append((self.at.now if self.at else 0.0, request))
        return self.answers.pop(0) if self.answers else Reply(200, b"ok")

    async def close(self) -> None:
        pass


def worker(poster: ScriptedPoster, t: FakeTime, *, backoff: Backoff | None = None,
           limits: tuple[Limit, ...] = (Limit(1, 1.0),),
           metrics: AlertMetrics | None = None) -> ChannelWorker:
    ch = SlackChannel("slack", Secret(SLACK_URL), limits=limits)
    red = Redactor(url_secret_parts(SLACK_URL))
    return ChannelWorker(ch, poster, redactor=red, backoff=backoff, metrics=metrics,
                         clock=t.clock, wall=t.clock, sleep=t.sleep, rng=random.Random(7))


def test_retries_with_jittered_exponential_backoff_until_delivered() -> None:
    t = FakeTime()
    poster = ScriptedPoster(Reply(500, b"oops"), PostFailed("cannot connect"),
                            Reply(503, b"busy"), Reply(200, b"ok"), at=t)
    m = AlertMetrics()
    w = worker(poster, t, backoff=Backoff(base_s=1.0, cap_s=3.0, max_attempts=5), metrics=m,
               limits=(Limit(100, 1.0),))
    out = asyncio.run(w.deliver(Message((notice(),))))
    assert out.delivered and out.attempts == 4
    assert len(t.slept) == 3
    for attempt, delay in enumerate(t.slept, start=1):
        assert 0 <= delay <= min(3.0, 1.0 * 2 ** (attempt - 1))
    assert m.sent.labels("slack", "opened")._value.get() == 1
    assert m.attempts.labels("slack", "retry")._value.get() == 3


def test_gives_up_after_max_attempts_and_refusals_are_not_retried() -> None:
    t = FakeTime()
    poster = ScriptedPoster(*[Reply(502, b"")] * 3, Reply(404, b"no_service"), at=t)
    m = AlertMetrics()
    w = worker(poster, t, backoff=Backoff(base_s=0.1, cap_s=1.0, max_attempts=3), metrics=m,
               limits=(Limit(100, 1.0),))
    first = asyncio.run(w.deliver(Message((notice(1),))))
    second = asyncio.run(w.deliver(Message((notice(2),))))
    assert (first.delivered, first.attempts) == (False, 3)
    assert (second.delivered, second.attempts) == (False, 1)
    assert "HTTP 404" in second.detail
    assert m.failed.labels("slack", "opened")._value.get() == 2


def test_retry_after_is_honoured() -> None:
    t = FakeTime()
    poster = ScriptedPoster(Reply(429, b"rate_limited", {"Retry-After": "7"}), at=t)
    w = worker(poster, t, limits=(Limit(100, 1.0),))
    assert asyncio.run(w.deliver(Message((notice(),)))).delivered
    assert t.slept == [7.0]


def test_backoff_is_bounded() -> None:
    b = Backoff(base_s=0.5, cap_s=4.0, max_attempts=6, max_retry_after_s=60)
    rng = random.Random(1)
    for attempt in range(1, 30):
        assert 0 <= b.delay(attempt, rng) <= 4.0
    assert b.delay(1, rng, retry_after_s=3600) == 60
    assert b.gives_up_after(6) and not b.gives_up_after(5)
    with pytest.raises(ValueError, match="max_attempts"):
        Backoff(max_attempts=0)
    with pytest.raises(ValueError, match="cap_s"):
        Backoff(base_s=2.0, cap_s=1.0)


def test_slack_gets_at_most_one_message_per_second() -> None:
    t = FakeTime()
    poster = ScriptedPoster(at=t)
    w = worker(poster, t)

    async def go() -> None:
        for i in range(5):
            await w.deliver(Message((notice(i),)))

    asyncio.run(go())
    times = [at for at, _ in poster.seen]
    assert len(times) == 5
    assert all(b - a >= 1.0 for a, b in itertools.pairwise(times))


def test_dingtalk_twenty_per_minute() -> None:
    t = FakeTime()
    poster = ScriptedPoster(*[Reply(200, b'{"errcode":0}')] * 45, at=t)
    ch = DingTalkChannel("ding", Secret("https://oapi.dingtalk.com/robot/send?access_token=tok"))
    w = ChannelWorker(ch, poster, redactor=Redactor(), clock=t.clock, wall=t.clock,
                      sleep=t.sleep)

    async def go() -> None:
        for i in range(45):
            await w.deliver(Message((notice(i),)))

    asyncio.run(go())
    times = [at for at, _ in poster.seen]
    for i in range(len(times) - 20):
        assert times[i + 20] - times[i] >= 60.0
    assert times[19] == times[0]  # a burst of 20 is allowed


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(0, 3, allow_nan=False), min_size=1, max_size=60),
       st.sampled_from([(Limit(5, 1.0), Limit(100, 60.0)), (Limit(1, 1.0),),
                        (Limit(20, 60.0),), (Limit(3, 0.5), Limit(4, 2.0))]))
def test_limiter_never_exceeds_any_window(gaps: list[float], limits: tuple[Limit, ...]) -> None:
    lim = RateLimiter(limits)
    now, sent = 0.0, []
    for gap in gaps:
        now += gap
        now += lim.wait(now)
        assert lim.wait(now) <= 1e-9
        lim.record(now)
        sent.append(now)
    for limit in limits:
        for i, start in enumerate(sent):
            inside = [s for s in sent[i:] if s < start + limit.per_s - 1e-9]
            assert len(inside) <= limit.count


def test_a_channel_that_raises_is_an_outcome_not_a_crash() -> None:
    class Broken:
        policy = SlackChannel("broken", Secret(SLACK_URL)).policy

        def build(self, message: Message, now_s: float) -> HttpRequest:
            raise RuntimeError(f"boom with {SLACK_URL}")

    t = FakeTime()
    w = ChannelWorker(Broken(), ScriptedPoster(), redactor=Redactor(url_secret_parts(SLACK_URL)),
                      clock=t.clock, sleep=t.sleep)
    out = asyncio.run(w.deliver(Message((notice(),))))
    assert not out.delivered and "boom" in out.detail and TOKEN not in out.detail


@pytest.fixture
def scrubbed_root(caplog: pytest.LogCaptureFixture) -> Iterator[Redactor]:
    red = Redactor(url_secret_parts(SLACK_URL))
    caplog.set_level(logging.DEBUG)
    install_redaction(red)
    try:
        yield red
    finally:
        for h in logging.getLogger().handlers:
            for f in [f for f in h.filters if isinstance(f, RedactingFilter)]:
                h.removeFilter(f)


def test_no_secret_in_logs_or_outcomes_when_the_endpoint_fails(
        caplog: pytest.LogCaptureFixture, scrubbed_root: Redactor) -> None:
    """Real HTTP attempts (refused connection, bad URL), every log line captured."""
    port = free_port()  # a port with nobody listening
    urls = [f"http://127.0.0.1:{port}/services/T000/B000/{TOKEN}",
            f"http://[::1/services/T000/B000/{TOKEN}"]
    poster = AiohttpPoster()
    red = scrubbed_root
    outcomes = []

    async def go() -> None:
        try:
            for url in urls:
                red.add(*url_secret_parts(url))
                ch = SlackChannel("slack", Secret(url))
                w = ChannelWorker(ch, poster, redactor=red, backoff=Backoff(
                    base_s=0.01, cap_s=0.02, max_attempts=2))
                outcomes.append(await w.deliver(Message((notice(),))))
        finally:
            await poster.close()

    asyncio.run(go())
    logging.getLogger("trainguard.test").error("leak attempt: %s", urls[0])
    assert [o.delivered for o in outcomes] == [False, False]
    assert "cannot connect" in outcomes[0].detail
    assert "gave up" in caplog.text and "leak attempt" in caplog.text
    for text in [caplog.text, *(o.detail for o in outcomes), repr(Secret(TOKEN))]:
        assert TOKEN not in text
        assert "T0KEN" not in text


def test_redactor_scrubs_url_encoded_forms_and_tracebacks() -> None:
    red = Redactor(["s3cr3t+value/x"])
    assert red.scrub("a s3cr3t%2Bvalue%2Fx b s3cr3t+value/x") == "a *** b ***"
    rec = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed %s", ("s3cr3t+value/x",),
                            None)
    try:
        raise ValueError("s3cr3t+value/x")
    except ValueError:
        import sys

        rec.exc_info = sys.exc_info()
    RedactingFilter(red).filter(rec)
    assert rec.getMessage() == "failed ***"
    assert rec.exc_text is not None and "s3cr3t" not in rec.exc_text and "***" in rec.exc_text


def test_refreshes_give_way_to_real_notices_in_a_merged_batch() -> None:
    from dataclasses import replace

    a, b = notice(1), notice(2)
    ra, rb = replace(a, refresh=True), replace(b, refresh=True)
    done = replace(a, kind=NoticeKind.RECOVERED)
    assert squash_refreshes([ra, rb, done]) == [rb, done]
    assert squash_refreshes([a, ra]) == [a]
    assert squash_refreshes([ra, rb, ra]) == [rb, ra]
    assert message_kind(Message((rb,))) == "refresh"
    assert message_kind(Message((rb, done))) == "digest"
    assert message_kind(Message((done,))) == "recovered"
