"""An incident book as JSON and back (the live fold's snapshot, ``live.py``): plain values,
events with the codec's ``encode``/``decode``, nothing pickled. ``book_from_doc(book_to_doc(b))``
folds on exactly as ``b`` would; a document that does not fit raises ``SnapshotError`` naming
the field."""

from __future__ import annotations

from typing import Any

from pydantic import TypeAdapter, ValidationError

from trainguard.events.codec import decode, encode
from trainguard.events.envelope import Event, Subject
from trainguard.events.errors import ContractError
from trainguard.events.payloads import COMMAND_PARAMS, CommandAction, IncidentState
from trainguard.incidents.aggregate import IncidentBook
from trainguard.incidents.model import (
    BindingRef,
    CommandRef,
    FenceRef,
    Incident,
    LoadRef,
    OutcomeRef,
    StepRef,
    VerdictRef,
)
from trainguard.incidents.settings import IncidentSettings

_VERDICT = TypeAdapter(VerdictRef)
_OUTCOME = TypeAdapter(OutcomeRef)
_BINDING = TypeAdapter(BindingRef)
_FENCE = TypeAdapter(FenceRef)
_LOAD = TypeAdapter(LoadRef)
_STEP = TypeAdapter(StepRef)


class SnapshotError(ValueError):
    """A snapshot document that cannot be the state it claims to be."""


def event_to_doc(event: Event) -> str:
    return encode(event).decode()


def event_from_doc(doc: Any) -> Event:
    if not isinstance(doc, str):
        raise SnapshotError(f"event: a JSON string of an encoded event (got {type(doc).__name__})")
    try:
        return decode(doc.encode())
    except ContractError as exc:
        raise SnapshotError(f"event: {exc}") from None


def book_to_doc(book: IncidentBook) -> dict[str, Any]:
    return {"job_id": book.job_id,
            "incidents": [_incident_to_doc(i) for i in book.incidents.values()],
            "seen": sorted(book._seen),
            "ended": None if book.ended is None else event_to_doc(book.ended)}


def book_from_doc(doc: dict[str, Any], settings: IncidentSettings) -> IncidentBook:
    try:
        book = IncidentBook(str(doc["job_id"]), settings)
        for idoc in doc["incidents"]:
            inc = _incident_from_doc(idoc)
            book.incidents[inc.incident_id] = inc
            for vid in inc.verdicts:
                book._by_verdict[vid] = inc.incident_id
            for cid in inc.commands:
                book._by_command[cid] = inc.incident_id
        book._seen = {str(i) for i in doc["seen"]}
        ended = doc.get("ended")  # absent: a snapshot written before the field
        book.ended = None if ended is None else event_from_doc(ended)
    except (KeyError, TypeError, ValueError, ValidationError) as exc:
        if isinstance(exc, SnapshotError):
            raise
        raise SnapshotError(f"book {doc.get('job_id') if isinstance(doc, dict) else '?'}: "
                            f"{type(exc).__name__}: {exc}") from None
    return book


def _incident_to_doc(inc: Incident) -> dict[str, Any]:
    return {
        "incident_id": inc.incident_id,
        "job_id": inc.job_id,
        "subject": inc.subject.model_dump(mode="json"),
        "opened_at": inc.opened_at,
        "state": None if inc.state is None else inc.state.value,
        "tier": inc.tier,
        "verdicts": [_VERDICT.dump_python(v, mode="json") for v in inc.verdicts.values()],
        "commands": [_command_to_doc(c) for c in inc.commands.values()],
        "bindings": [_BINDING.dump_python(b, mode="json") for b in inc.bindings],
        "fences": [_FENCE.dump_python(f, mode="json") for f in inc.fences],
        "loads": [_LOAD.dump_python(x, mode="json") for x in inc.loads],
        "progress": [[rank, epoch, _STEP.dump_python(s, mode="json")]
                     for (rank, epoch), s in inc.progress.items()],
        "after_load": None if inc.after_load is None else _STEP.dump_python(inc.after_load,
                                                                            mode="json"),
        "transitions": [event_to_doc(t) for t in inc.transitions],
        "closed_at": inc.closed_at,
        "last_time": inc.last_time,
    }


def _incident_from_doc(d: dict[str, Any]) -> Incident:
    verdicts = [_VERDICT.validate_python(v) for v in d["verdicts"]]
    commands = [_command_from_doc(c) for c in d["commands"]]
    return Incident(
        incident_id=str(d["incident_id"]),
        job_id=str(d["job_id"]),
        subject=Subject.model_validate(d["subject"]),
        opened_at=int(d["opened_at"]),
        state=None if d["state"] is None else IncidentState(d["state"]),
        tier=None if d["tier"] is None else int(d["tier"]),
        verdicts={v.verdict_id: v for v in verdicts},
        commands={c.command_id: c for c in commands},
        bindings=[_BINDING.validate_python(b) for b in d["bindings"]],
        fences=[_FENCE.validate_python(f) for f in d["fences"]],
        loads=[_LOAD.validate_python(x) for x in d["loads"]],
        progress={(int(r), int(e)): _STEP.validate_python(s) for r, e, s in d["progress"]},
        after_load=None if d["after_load"] is None else _STEP.validate_python(d["after_load"]),
        transitions=[event_from_doc(t) for t in d["transitions"]],
        closed_at=None if d["closed_at"] is None else int(d["closed_at"]),
        last_time=int(d["last_time"]),
    )


def _command_to_doc(c: CommandRef) -> dict[str, Any]:
    return {"command_id": c.command_id, "action": c.action.value, "tier": c.tier,
            "issued_time": c.issued_time, "event_id": c.event_id,
            "subject": c.subject.model_dump(mode="json"),
            # the params model is the action's own (its ``action`` key is never written)
            "params_action": getattr(c.params, "action", CommandAction.ESCALATE).value,
            "params": c.params.model_dump(mode="json"),
            "outcomes": [_OUTCOME.dump_python(o, mode="json") for o in c.outcomes]}


def _command_from_doc(d: dict[str, Any]) -> CommandRef:
    model = COMMAND_PARAMS[CommandAction(d["params_action"])]
    return CommandRef(command_id=str(d["command_id"]), action=CommandAction(d["action"]),
                      tier=int(d["tier"]), issued_time=int(d["issued_time"]),
                      event_id=str(d["event_id"]), subject=Subject.model_validate(d["subject"]),
                      params=model.model_validate(d["params"]),  # type: ignore[arg-type]
                      outcomes=[_OUTCOME.validate_python(o) for o in d["outcomes"]])
