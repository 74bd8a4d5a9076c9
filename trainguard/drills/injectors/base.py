"""The Protocol every injector follows (and the one a triggered fault adds), and the value
it returns when it acts."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from trainguard.events.clock import now_us
from trainguard.events.payloads import FlatMap


class InjectionError(RuntimeError):
    """The fault could not be injected (or undone); the message says what and why."""


@dataclass(frozen=True)
class Acted:
    """What an injector did: when it acted (µs, read right after the act) and how."""

    at_us: int
    params: FlatMap = field(default_factory=dict)

    @staticmethod
    def now(**params: str | int | float | bool | None) -> Acted:
        return Acted(now_us(), dict(params))


class Injector(Protocol):
    """``inject`` acts once; ``undo`` is the scenario's rollback: safe to call when ``inject``
    never ran or already undone (it then says so in its params)."""

    def inject(self) -> Acted: ...

    def undo(self) -> Acted: ...


@runtime_checkable
class FollowsTrigger(Protocol):
    """A fault that a trigger makes the loop read (``scenario.TRIGGERED_KINDS``) and that must
    still hold once the trigger fired: ``after_trigger`` acts again as needed, each act an
    ``Acted``."""

    def after_trigger(self) -> list[Acted]: ...
