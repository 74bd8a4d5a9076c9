"""From checks to a conclusion. Pure. Never "recovered" on a green status alone: every
passing check must cite events, and anything the log cannot explain means "retest"."""

from __future__ import annotations

from collections.abc import Sequence

from trainguard.drills.evidence.model import Check, Conclusion, Status

EVIDENCE_KINDS = ("progress", "resources", "results")


def conclude(checks: Sequence[Check], expectations: Sequence[Check], *, escalated: bool,
             unrecoverable: bool) -> tuple[Conclusion, list[str]]:
    """The conclusion and the reasons for it.

    ``escalated``: the loop handed the job to a human (an ``escalate`` command or an incident
    that ended escalated). ``unrecoverable``: no valid checkpoint is left, or an incident
    ended unrecoverable."""
    evidence = [c for c in checks if c.kind in EVIDENCE_KINDS]
    missing = sorted(set(EVIDENCE_KINDS) - {c.kind for c in evidence})
    if missing:
        return Conclusion.RETEST, [f"no {k} evidence was computed" for k in missing]
    unexplained = [c for c in evidence if c.status is Status.UNEXPLAINED]
    if unexplained:
        return Conclusion.RETEST, [f"{c.kind}/{c.name} cannot be explained: {c.detail}"
                                   for c in unexplained]
    bare = [c for c in evidence if c.status is Status.PASS and not c.event_ids]
    if bare:
        return Conclusion.RETEST, [f"{c.kind}/{c.name} passed without citing an event"
                                   for c in bare]
    for kind in EVIDENCE_KINDS:
        if all(c.status is Status.NOT_APPLICABLE for c in evidence if c.kind == kind):
            return Conclusion.RETEST, [f"no {kind} check applied: nothing shows the {kind}"]
    progressed = next((c for c in evidence if c.name == "progressed_after_fault"), None)
    if progressed is None:
        return Conclusion.RETEST, ["nothing checked that the job progressed after the fault"]
    failed = [c for c in evidence if c.status is Status.FAIL]
    if progressed.status is not Status.PASS:
        why = [f"{c.kind}/{c.name}: {c.detail}" for c in failed]
        if unrecoverable:
            return Conclusion.UNRECOVERABLE, why or ["no valid checkpoint is left"]
        return Conclusion.NEEDS_MANUAL_RESTART, why or ["the job did not progress"]
    hard = [c for c in failed if c.kind in ("progress", "resources")]
    if hard:
        return Conclusion.NEEDS_MANUAL_RESTART, [
            f"{c.kind}/{c.name}: {c.detail}" for c in hard]
    soft = [c for c in failed if c.kind == "results"]
    if soft:
        return Conclusion.NEEDS_MANUAL_CONFIRMATION, [
            f"{c.kind}/{c.name}: {c.detail}" for c in soft]
    off = [c for c in expectations if c.status is Status.FAIL]
    if escalated or off:
        return Conclusion.NEEDS_MANUAL_CONFIRMATION, (
            ["the loop escalated to a human"] if escalated else []) + [
            f"expected {c.name}: {c.detail}" for c in off]
    return Conclusion.RECOVERED_AUTOMATICALLY, [
        "progress, resources and results evidence all pass, each citing events; the loop "
        "passed through every expected state without a human"]
