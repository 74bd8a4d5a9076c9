"""An incident's timeline: marks on one time axis, grouped into tracks and lanes, and the
answers to the four questions. Plain data, JSON-ready through ``to_dict``."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from trainguard.events.payloads import VerdictKind

# Track order on the page and in the text, top to bottom.
TRACKS: tuple[str, ...] = ("task", "network", "gpu", "resources", "actions", "detection")
TRACK_TITLES = {"task": "Task (ranks, steps, checkpoints)",
                "network": "Network (links, RTT, errors)",
                "gpu": "GPU",
                "resources": "Resources (pool bindings, fencing)",
                "actions": "Actions (commands, drills)",
                "detection": "Detection (verdicts, incident)"}

QUESTIONS: tuple[tuple[str, str], ...] = (
    ("unavailable", "When was the original worker declared unavailable?"),
    ("stopped", "When did the old replica stop?"),
    ("ready", "When were the new resources ready?"),
    ("continued", "From which checkpoint and data position did the job continue?"),
)


@dataclass(frozen=True)
class Mark:
    track: str
    lane: str
    time: int
    label: str
    end: int | None = None  # a span when set
    detail: str = ""
    event_id: str | None = None
    level: str = "info"  # info | warn | bad | good: the colour of the mark


@dataclass(frozen=True)
class Answer:
    key: str
    question: str
    answered: bool
    time: int | None
    text: str
    event_ids: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Step:
    """One incident transition, as the timeline shows it."""

    time: int
    seq: int
    from_state: str | None
    to_state: str
    tier: int | None
    reason: str
    event_id: str


@dataclass(frozen=True)
class Timeline:
    incident_id: str
    job_id: str
    subject: str
    state: str
    tier: int | None
    opened_at: int
    closed_at: int | None
    start: int
    end: int
    answers: list[Answer]
    transitions: list[Step]
    marks: list[Mark]
    verdict_kinds: list[VerdictKind] = field(default_factory=list)

    def track(self, name: str) -> list[Mark]:
        return [m for m in self.marks if m.track == name]

    def lanes(self, track: str) -> list[str]:
        seen: dict[str, None] = {}
        for m in self.track(track):
            seen.setdefault(m.lane, None)
        return list(seen)

    def to_dict(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["tracks"] = [{"track": t, "title": TRACK_TITLES[t], "lanes": self.lanes(t)}
                         for t in TRACKS]
        return doc
