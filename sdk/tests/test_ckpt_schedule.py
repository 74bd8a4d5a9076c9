"""The save-request schedule (torch-free): the step a request is served at, the store key
moved forward only when no save is pending, stale values from before the process ignored,
and a request found already behind a rank reported, never saved alone."""

from __future__ import annotations

import pytest

from trainguard_sdk.checkpoint.schedule import RequestMissed, SharedRequests, save_at


class FakeStore:
    """Enough of a c10d store: check / get / compare_set with c10d's semantics."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}

    def check(self, keys: list[str]) -> bool:
        return all(k in self.data for k in keys)

    def get(self, key: str) -> bytes:
        return self.data[key]

    def compare_set(self, key: str, expected_value: str, desired_value: str) -> bytes:
        current = self.data.get(key)
        if (current is None and expected_value == "") or current == expected_value.encode():
            self.data[key] = desired_value.encode()
            return self.data[key]
        return current if current is not None else expected_value.encode()


@pytest.mark.parametrize(("step", "poll", "expected"), [(7, 3, 12), (9, 3, 15), (1, 1, 3),
                                                        (0, 5, 10), (14, 5, 20)])
def test_save_at_is_a_polling_step_more_than_one_interval_ahead(step: int, poll: int,
                                                                expected: int) -> None:
    got = save_at(step, poll)
    assert got == expected and got % poll == 0 and got > step + poll - (step % poll == 0)
    with pytest.raises(ValueError, match="poll_every"):
        save_at(step, 0)


def _two(store: FakeStore, poll: int = 3) -> tuple[SharedRequests, SharedRequests]:
    return SharedRequests(store, "j", poll), SharedRequests(store, "j", poll)


def test_every_rank_learns_the_step_by_its_polls() -> None:
    store = FakeStore()
    a, b = _two(store)
    assert b.poll(3) is None
    assert a.propose(7) == 12  # rank a got the request after step 7
    assert b.poll(9) == 12 and a.poll(9) == 12
    b.taken(12)
    assert b.pending is None and b.poll(15) is None  # the same value again: nothing new


def test_a_pending_save_serves_a_second_request() -> None:
    store = FakeStore()
    a, b = _two(store)
    a.propose(7)
    assert b.propose(8) == 12  # pending at 12, ahead of 8: not moved
    a.taken(12)
    assert a.propose(13) == 18  # behind us: moved forward


def test_a_value_from_before_this_process_is_ignored_and_a_missed_one_raises() -> None:
    store = FakeStore()
    store.data["trainguard/ckpt/save_at/j"] = b"40"  # a previous run's request
    a, b = _two(store)
    assert a.poll(51) is None  # first poll: behind it, stale for every rank alike
    store.data["trainguard/ckpt/save_at/j"] = b"54"
    with pytest.raises(RequestMissed, match="step 54 was seen only at step 57"):
        a.poll(57)
    store.data["trainguard/ckpt/save_at/j"] = b"x"
    with pytest.raises(ValueError, match="an integer step"):
        b.poll(60)
