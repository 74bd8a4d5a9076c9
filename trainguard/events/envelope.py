"""The envelope every event travels in. See docs/events.md for the whole contract."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, SerializeAsAny

from trainguard.events.payloads import Payload, TimeUs

JobId = Annotated[
    str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]*$")
]


class Subject(BaseModel):
    """What the event is about, as far as it applies. Every part is optional."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    node: Annotated[str, Field(min_length=1, max_length=256)] | None = None
    gpu: Annotated[int, Field(ge=0)] | None = None
    rank: Annotated[int, Field(ge=0)] | None = None
    link: Annotated[str, Field(min_length=1, max_length=256)] | None = None
    unit: Annotated[str, Field(min_length=1, max_length=256)] | None = None


class Header(BaseModel):
    """The envelope without its payload: what is checked before the payload is looked at."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    event_id: Annotated[str, Field(min_length=8, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")]
    type: Annotated[str, Field(min_length=1, max_length=64)]
    schema_version: Annotated[int, Field(ge=1)]
    job_id: JobId
    subject: Subject = Subject()
    event_time: TimeUs
    ingest_time: TimeUs | None = None
    source: Annotated[str, Field(min_length=1, max_length=256)]


class Event(Header):
    """A whole event: header plus the typed payload of its ``type``."""

    payload: SerializeAsAny[Payload]
