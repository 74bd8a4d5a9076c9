"""The vocabulary that crosses packages is typed in the contract: verdict kinds with their
class, and per-action command parameters and outcome data."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.strategies import events
from trainguard.actuators import policy
from trainguard.actuators.signing import canonical
from trainguard.events import ContractError, Subject, decode, encode, make_event
from trainguard.events import payloads as p
from trainguard.events.registry import BY_NAME
from trainguard.rules.base import Context, VerdictBook
from trainguard.rules.registry import EVALUATORS
from trainguard.rules.schema import RuleSpec

pytestmark = pytest.mark.unit


def emitted_kinds() -> set[p.VerdictKind]:
    """Every verdict kind some registered rule can open, as the rules declare them."""
    return {k for evaluator in EVALUATORS.values() for k in evaluator.kinds}


def test_every_kind_a_rule_can_emit_is_classified_by_the_policy() -> None:
    unhandled = {k.value: k.verdict_class.value for k in emitted_kinds()
                 if k.verdict_class not in policy.ON_OPEN}
    assert not unhandled, f"the policy does not classify: {unhandled}"


def test_every_rule_declares_what_it_emits_and_every_kind_has_a_rule() -> None:
    assert all(evaluator.kinds for evaluator in EVALUATORS.values())
    assert emitted_kinds() == set(p.VerdictKind)  # no kind nobody emits


def test_the_classes_the_policy_acts_on() -> None:
    assert p.kinds_of(p.VerdictClass.LADDER) == {p.VerdictKind.STRAGGLER}
    assert p.kinds_of(p.VerdictClass.FAILURE) == {
        p.VerdictKind.PROCESS_EXIT, p.VerdictKind.RANK_SILENT, p.VerdictKind.NODE_SILENT,
        p.VerdictKind.RANK_STUCK,
        p.VerdictKind.XID_DRAIN,
        p.VerdictKind.LINK_DOWN, p.VerdictKind.OOM_KILL}


def test_a_rule_opening_a_kind_it_did_not_declare_is_a_bug() -> None:
    spec = RuleSpec("r1", "straggler", True, p.Severity.WARNING, {})
    book = VerdictBook(Context("job-a", "v1", spec), frozenset({p.VerdictKind.STRAGGLER}))
    assert book.raise_("k", kind=p.VerdictKind.STRAGGLER, subject=Subject(rank=1),
                       severity=None, first_time=1, decided_time=2, evidence={})
    with pytest.raises(ValueError, match="xid_drain is not among"):
        book.raise_("k2", kind=p.VerdictKind.XID_DRAIN, subject=Subject(rank=1),
                    severity=None, first_time=1, decided_time=2, evidence={})


def test_an_unknown_verdict_kind_is_refused_by_the_contract() -> None:
    doc = _doc(p.Verdict(verdict_id="v1", rule="r", kind=p.VerdictKind.STRAGGLER,
                         state=p.VerdictState.OPEN, severity=p.Severity.INFO,
                         first_anomalous_time=1, decided_time=2))
    doc["payload"]["kind"] = "stragler"
    with pytest.raises(ContractError) as info:
        decode(orjson.dumps(doc))
    assert info.value.first.field == "payload.kind"


# --- command parameters and outcome data ---------------------------------------------------


def _cmd(action: p.CommandAction, params: object) -> p.Command:
    return p.Command(command_id="c1", idempotency_key="k1", action=action, tier=2, issued_at=1,
                     issued_by="t", params=params)


def _doc(payload: p.Payload) -> dict[str, Any]:
    ev = make_event(payload, event_id="ev000001", job_id="job-a", event_time=5, source="t",
                    subject=Subject(rank=1))
    doc: dict[str, Any] = orjson.loads(encode(ev))
    return doc


@pytest.mark.parametrize(("action", "params", "field"), [
    (p.CommandAction.MIGRATE, {"rank": 1}, "payload.params.migrate.ranks"),
    (p.CommandAction.MIGRATE, {"ranks": [True]}, "payload.params.migrate.ranks.0"),
    (p.CommandAction.RAISE_QUOTA, {"quota_pct": "lots"},
     "payload.params.raise_quota.quota_pct"),
    (p.CommandAction.RESUME, {"ranks": [1]}, "payload.params.resume.ranks"),
    (p.CommandAction.ESCALATE, {"rank": -1}, "payload.params.escalate.rank"),
    (p.CommandAction.RESUME, {"rank": "1"}, "payload.params.resume.rank"),
    (p.CommandAction.FENCE, {"action": "migrate", "ranks": [1]}, "payload.<root>"),
])
def test_params_are_checked_against_the_model_of_their_action(
        action: p.CommandAction, params: dict[str, object], field: str) -> None:
    doc = _doc(_cmd(p.CommandAction.ESCALATE, {}))
    payload = doc["payload"]
    assert isinstance(payload, dict)
    payload.update(action=action.value, params=params)
    with pytest.raises(ContractError) as info:
        decode(orjson.dumps(doc))
    assert info.value.first.field == field, str(info.value)


def test_params_of_another_action_are_refused_when_built() -> None:
    with pytest.raises(ValueError, match="MigrateParams is not for action resume"):
        _cmd(p.CommandAction.RESUME, p.MigrateParams(ranks=[1]))


def test_absent_params_and_data_are_their_models_defaults() -> None:
    doc = _doc(_cmd(p.CommandAction.ESCALATE, {}))
    payload = doc["payload"]
    assert isinstance(payload, dict)
    del payload["params"]
    cmd = decode(orjson.dumps(doc)).payload
    assert isinstance(cmd, p.Command) and cmd.params == p.EscalateParams()
    out = p.CommandOutcome(command_id="c", idempotency_key="k", action=p.CommandAction.RESUME,
                           status=p.OutcomeStatus.ACCEPTED)
    assert out.data == p.RestartData(action=p.CommandAction.RESUME) and out.retry is None


def test_the_wire_and_signed_shape_of_params_is_a_plain_object() -> None:
    cmd = _cmd(p.CommandAction.MIGRATE, p.MigrateParams(rank=2, ranks=[2, 3], reason="x"))
    body = orjson.loads(canonical("job-a", Subject(rank=2), cmd))["command"]
    assert body["params"] == {"rank": 2, "reason": "x", "ranks": [2, 3], "resume": True,
                              "from_unit": None, "from_units": [], "avoid_domains": [],
                              "covered_verdicts": []}  # no hidden action key
    wire = orjson.loads(encode(make_event(cmd, event_id="ev000002", job_id="job-a",
                                          event_time=1, source="t")))
    assert "action" not in wire["payload"]["params"]


def test_a_retryable_failure_reads_as_typed_data() -> None:
    doc = _doc(p.CommandOutcome(command_id="c", idempotency_key="k",
                                action=p.CommandAction.MIGRATE, status=p.OutcomeStatus.FAILED,
                                data=p.RestartData(action=p.CommandAction.MIGRATE,
                                                   retry=p.RetryCondition.STORAGE_UNREACHABLE)))
    assert doc["payload"]["data"] == {
        "retry": "storage_unreachable", "released": [], "ranks": [], "from_units": [],
        "to_units": [], "avoided_domains": []}
    out = decode(orjson.dumps(doc)).payload
    assert isinstance(out, p.CommandOutcome)
    assert out.retry is p.RetryCondition.STORAGE_UNREACHABLE


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_params_and_data_decode_as_the_model_of_their_action(data: st.DataObject) -> None:
    spec = data.draw(st.sampled_from([BY_NAME["command"], BY_NAME["command.outcome"]]))
    ev = decode(encode(data.draw(events(spec))))
    if isinstance(ev.payload, p.Command):
        assert type(ev.payload.params) is p.COMMAND_PARAMS[ev.payload.action]
    else:
        assert isinstance(ev.payload, p.CommandOutcome)
        assert type(ev.payload.data) is p.OUTCOME_DATA[ev.payload.action]
        assert ev.payload.data.action is ev.payload.action


def test_the_exit_evidence_the_policy_reads_is_typed_and_strict() -> None:
    ev = p.ExitEvidence(pid=42, exit_code=3, signal=None, binding_epoch=2)
    flat = {**ev.as_evidence(), "detected_by": "pidfd"}
    assert p.ExitEvidence.of(flat) == ev  # the rule's other fields are not the policy's
    assert p.ExitEvidence.of({**flat, "binding_epoch": -1}) == p.ExitEvidence()
    assert p.ExitEvidence.of({"pid": True, "exit_code": 3}) == p.ExitEvidence()  # not pid 1
    assert p.ExitEvidence.of({"pid": "42"}) == p.ExitEvidence()
    assert p.ExitEvidence.of({}) == p.ExitEvidence()
