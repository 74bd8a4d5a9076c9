"""Errors raised at the edge when a record does not satisfy the event contract."""

from __future__ import annotations

from dataclasses import dataclass

_MAX_VALUE_REPR = 200


def short_repr(value: object) -> str:
    text = repr(value)
    if len(text) > _MAX_VALUE_REPR:
        return text[: _MAX_VALUE_REPR - 3] + "..."
    return text


@dataclass(frozen=True)
class FieldError:
    """One problem with one field: its dotted path, the offending value and why."""

    field: str
    value: object
    reason: str

    def __str__(self) -> str:
        return f"{self.field}: {self.reason} (got {short_repr(self.value)})"


class ContractError(ValueError):
    """A record that is not a valid event. Names every bad field and its value."""

    def __init__(self, errors: list[FieldError]) -> None:
        if not errors:
            raise ValueError("ContractError needs at least one FieldError")
        self.errors = errors
        super().__init__("; ".join(str(e) for e in errors))

    @property
    def first(self) -> FieldError:
        return self.errors[0]
