"""Link state between collects -> LINK_DOWN / LINK_UP events."""

from __future__ import annotations

from trainguard.collectors.net.links import LinkState, is_up, link_events
from trainguard.events.payloads import NodeHealthKind as K

UP = LinkState("up", True, 4)


def kinds(old: LinkState | None, new: LinkState) -> list[tuple[K, int | None]]:
    return [(e.kind, e.code) for e in link_events("eth0", old, new)]


def test_first_read_says_nothing() -> None:
    assert kinds(None, LinkState("down", None, 9)) == []


def test_steady_says_nothing() -> None:
    assert kinds(UP, UP) == []


def test_down_and_up() -> None:
    down = LinkState("down", None, 5)
    assert kinds(UP, down) == [(K.LINK_DOWN, 1)]
    assert kinds(down, LinkState("up", True, 6)) == [(K.LINK_UP, 1)]


def test_carrier_loss_before_operstate_moves_is_down() -> None:
    # linkwatch lags: carrier 0 while operstate still says up.
    assert kinds(UP, LinkState("up", False, 5)) == [(K.LINK_DOWN, 1)]


def test_flaps_between_collects_give_a_down_up_pair_with_the_count() -> None:
    evs = link_events("eth0", UP, LinkState("up", True, 10))
    assert [(e.kind, e.code) for e in evs] == [(K.LINK_DOWN, 6), (K.LINK_UP, 6)]
    assert all(e.device == "eth0" and "carrier_changes 4->10" in e.message for e in evs)


def test_flapped_and_down_now() -> None:
    down = LinkState("down", None, 5)
    assert kinds(down, LinkState("down", None, 8)) == [(K.LINK_DOWN, 3)]


def test_unknown_operstate_follows_carrier() -> None:
    assert is_up(LinkState("unknown", True, None)) is True
    assert is_up(LinkState("unknown", None, None)) is None
    assert kinds(LinkState("unknown", True, None), LinkState("unknown", False, None)) == [
        (K.LINK_DOWN, None)]
