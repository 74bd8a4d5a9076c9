"""The actuator's ledger of idempotency keys and the job spec it runs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from trainguard.actuators.jobspec import JobSpecError, ddp_job_doc, parse_job_spec
from trainguard.actuators.ledger import Ledger
from trainguard.events.payloads import CommandAction, CommandOutcome, OutcomeStatus


def test_keys_survive_a_restart_and_a_torn_line(tmp_path: Path) -> None:
    path = tmp_path / "ledger.jsonl"
    led = Ledger(path)
    led.record("k1", "c1", "started")
    led.record("k1", "c1", "done")
    led.record("k2", "c2", "started")
    with path.open("ab") as fh:
        fh.write(b'{"key": "k3", "comm')  # the crash tore the last write
    again = Ledger(path)
    assert again.seen("k1") is not None and again.seen("k1").status == "done"  # type: ignore[union-attr]
    assert again.seen("k2") is not None and again.seen("k2").status == "started"  # type: ignore[union-attr]
    assert again.seen("k3") is None


def test_outcomes_from_the_log_fill_in_and_final_wins(tmp_path: Path) -> None:
    led = Ledger(None)
    led.note_outcome(CommandOutcome(command_id="c", idempotency_key="k",
                                    action=CommandAction.MIGRATE,
                                    status=OutcomeStatus.ACCEPTED))
    assert led.seen("k").status == "started"  # type: ignore[union-attr]
    led.note_outcome(CommandOutcome(command_id="c", idempotency_key="k",
                                    action=CommandAction.MIGRATE, status=OutcomeStatus.DONE))
    led.note_outcome(CommandOutcome(command_id="c", idempotency_key="k",
                                    action=CommandAction.MIGRATE,
                                    status=OutcomeStatus.ACCEPTED))
    assert led.seen("k").status == "done"  # type: ignore[union-attr]


def test_a_refusal_never_uses_up_a_key(tmp_path: Path) -> None:
    """A forged command refused under a real command's key (an older actuator wrote such an
    outcome, or a ledger line), read back at start, must not block the real command."""
    path = tmp_path / "ledger.jsonl"
    path.write_bytes(b'{"key": "k-old", "command_id": "c0", "status": "refused"}\n')
    led = Ledger(path)
    led.note_outcome(CommandOutcome(command_id="c", idempotency_key="k",
                                    action=CommandAction.RAISE_QUOTA,
                                    status=OutcomeStatus.REFUSED, detail="unsigned command"))
    led.record("k2", "c2", "refused")
    assert led.seen("k") is None and led.seen("k-old") is None and led.seen("k2") is None
    assert Ledger(path).seen("k2") is None
    led.record("k", "c", "started")
    assert led.seen("k") is not None


SPEC = {"job_id": "j", "world_size": 2, "ckpt_dir": "/data/ckpt",
        "command": ["python", "-m", "w", "--rank", "{rank}", "--port", "{port}"],
        "units": [{"name": "u0", "cpus": [0], "rank": 0},
                  {"name": "u1", "cpus": [1], "rank": 1, "labels": {"rack": "r1"}},
                  {"name": "s", "cpus": [1], "labels": {"reserved_for": "j"}}]}


def test_job_spec_placeholders_and_units() -> None:
    spec = parse_job_spec(SPEC)
    assert spec.argv(1, 3, 555, "u1") == ["python", "-m", "w", "--rank", "1", "--port", "555"]
    assert spec.unit("s").labels == {"reserved_for": "j"}


def test_master_addr_is_rank_0s_units_address_at_each_launch() -> None:
    units = [{"name": n, "rank": r, "address": f"10.0.0.{i + 1}"}
             for i, (n, r) in enumerate([("u0", 0), ("u1", 1), ("s", None)])]
    spec = parse_job_spec({**SPEC, "units": units,
                           "command": ["w", "--master-addr", "{master_addr}", "--rank", "{rank}"]})
    assert spec.master_addr({0: "u0", 1: "u1"}) == "10.0.0.1"
    moved = spec.master_addr({0: "s", 1: "u1"})  # rank 0 migrated to the spare
    assert moved == "10.0.0.3"
    assert spec.argv(1, 2, 555, "u1", moved) == ["w", "--master-addr", "10.0.0.3", "--rank", "1"]
    with pytest.raises(JobSpecError, match="rank 0's unit has no 'address'"):
        spec.argv(1, 2, 555, "u1")
    plain = parse_job_spec(SPEC)  # no {master_addr}: no address needed, none used
    assert plain.master_addr({0: "u0"}) is None
    assert plain.argv(0, 1, 7, "u0") == ["python", "-m", "w", "--rank", "0", "--port", "7"]


@pytest.mark.parametrize(("change", "field"), [
    ({"command": ["w", "{master_addr}"]}, "field 'units': {master_addr} in 'command' needs an "
                                          "'address' on every unit (none on 'u0')"),
    ({"units": [{"name": "u0", "rank": 0, "address": "a b"}, {"name": "u1", "rank": 1}]},
     "field 'units[0].address': a host name or IP address (got 'a b')"),
    ({"world_size": 3}, "'units': ranks 0..2"),
    ({"command": []}, "'command'"),
    ({"grace_s": -1}, "'grace_s'"),
    ({"extra": 1}, "'extra': unknown"),
    ({"units": [{"name": "u0", "cpus": ["x"], "rank": 0}]}, "field 'units[0].cpus'"),
])
def test_bad_job_spec_names_the_field(change: dict[str, object], field: str) -> None:
    with pytest.raises(JobSpecError, match=re.escape(field)):
        parse_job_spec({**SPEC, **change})


def test_the_ddp_job_doc_is_a_valid_spec_with_a_reserved_spare() -> None:
    doc = ddp_job_doc("demo-job", world_size=4, spares=1, ckpt_dir=Path("/data/ckpt"),
                      node="n1", agent_socket=Path("/run/agent.sock"),
                      progress_dir=Path("/var/log/tg"))
    spec = parse_job_spec(doc)
    assert [u.rank for u in spec.units] == [0, 1, 2, 3, None]
    assert spec.unit("spare").labels["reserved_for"] == "demo-job"
    argv = spec.argv(3, 2, 4242, "spare")
    assert argv[:3] == ["python", "-m", "trainguard.workload.ddp"]
    assert "/var/log/tg/progress-3.jsonl" in argv and "4242" in argv
    assert spec.preload[0] == "torch" and spec.env["TRAINGUARD_AGENT_SOCKET"] == "/run/agent.sock"
    with pytest.raises(JobSpecError, match="'preload': needs a command of the form"):
        parse_job_spec({**doc, "command": ["/usr/bin/env", "x"]})
