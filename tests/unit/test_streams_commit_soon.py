"""``streams/sends.py``'s ``CommitSoon``: the urgent lane's prompt commit runs after faust has
acknowledged the batch, and a storm of requests is served by a bounded number of commits."""

from __future__ import annotations

import asyncio

import pytest

from trainguard.streams.sends import CommitSoon

pytestmark = pytest.mark.unit


def test_each_commit_sees_the_batch_it_was_requested_for_acknowledged() -> None:
    acked: list[int] = []
    seen: list[list[int]] = []

    async def commit() -> bool:
        seen.append(list(acked))
        return True

    async def agent() -> None:
        soon = CommitSoon(commit)
        for batch in (1, 2, 3):
            soon.request()  # the end of the agent's body
            acked.append(batch)  # faust acknowledges when the agent asks for the next batch
            await asyncio.sleep(0.01)  # waiting for the next batch
    asyncio.run(agent())
    assert seen == [[1], [1, 2], [1, 2, 3]]


def test_a_storm_of_requests_costs_one_commit_in_flight_and_one_after() -> None:
    calls = 0

    async def go() -> int:
        gate = asyncio.Event()

        async def commit() -> bool:
            nonlocal calls
            calls += 1
            await gate.wait()
            return True

        soon = CommitSoon(commit)
        soon.request()
        await asyncio.sleep(0.01)  # the first commit is in flight
        for _ in range(50):
            soon.request()
        gate.set()
        await asyncio.sleep(0.01)
        soon.request()  # after the storm: a commit of its own
        await asyncio.sleep(0.01)
        return soon.commits

    assert asyncio.run(go()) == 3 and calls == 3


def test_a_failed_commit_is_logged_and_the_next_request_commits(
        caplog: pytest.LogCaptureFixture) -> None:
    outcomes = [RuntimeError("rebalancing"), None]

    async def commit() -> None:
        err = outcomes.pop(0)
        if err is not None:
            raise err

    async def go() -> int:
        soon = CommitSoon(commit)
        soon.request()
        await asyncio.sleep(0.01)
        soon.request()
        await asyncio.sleep(0.01)
        return soon.commits

    assert asyncio.run(go()) == 2 and outcomes == []
    assert "prompt commit failed: RuntimeError: rebalancing" in caplog.text
