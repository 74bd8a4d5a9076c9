"""Signed commands: a valid HMAC from the key holder, fresh; anything else is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainguard.actuators.signing import SigningKeyError, check, load_key, sign, verify
from trainguard.events.codec import decode, encode, make_event
from trainguard.events.envelope import Event, Subject
from trainguard.events.payloads import Command, CommandAction, MigrateParams, ResumeParams

KEY = b"k" * 32
T = 1_700_000_000_000_000


def command_event(cmd: Command, job: str = "job-a", rank: int | None = 3) -> Event:
    return make_event(cmd, event_id="cmd-0001", job_id=job, event_time=cmd.issued_at,
                      source="test", subject=Subject(rank=rank))


def signed(**params: str | int | None) -> Command:
    cmd = Command(command_id="c1", idempotency_key="k1", action=CommandAction.MIGRATE, tier=2,
                  issued_at=T, issued_by="decide", params={"rank": 3, "ranks": [3], **params})
    return sign(KEY, "job-a", Subject(rank=3), cmd)


def test_a_signed_command_verifies_after_the_wire() -> None:
    ev = decode(encode(command_event(signed())))
    assert verify(KEY, ev) is None
    assert check(KEY, ev, T + 1_000_000, max_age_s=60) is None


@pytest.mark.parametrize("change", [
    {"action": CommandAction.RESUME, "params": ResumeParams(rank=3)}, {"tier": 3},
    {"params": MigrateParams(rank=1, ranks=[1])},
    {"issued_at": T + 1}, {"idempotency_key": "k2"}])
def test_any_altered_field_breaks_the_signature(change: dict[str, object]) -> None:
    forged = signed().model_copy(update=change)
    assert "does not verify" in str(verify(KEY, command_event(forged)))


def test_a_signature_cannot_move_to_another_job_or_rank() -> None:
    cmd = signed()
    assert verify(KEY, command_event(cmd, job="job-b")) is not None
    assert verify(KEY, command_event(cmd, rank=1)) is not None


def test_wrong_key_unsigned_and_unknown_scheme_are_refused() -> None:
    assert "does not verify" in str(verify(b"x" * 32, command_event(signed())))
    bare = signed().model_copy(update={"signature": None})
    assert verify(KEY, command_event(bare)) == "unsigned command"
    odd = signed().model_copy(update={"signature": "rsa:00"})
    assert "unknown scheme" in str(verify(KEY, command_event(odd)))


def test_stale_and_future_commands_are_refused() -> None:
    ev = command_event(signed())
    assert "stale: issued 61.0 s ago" in str(check(KEY, ev, T + 61_000_000, max_age_s=60))
    assert "in the future" in str(check(KEY, ev, T - 10_000_000, max_age_s=60))


def test_key_from_file_or_env_never_short(tmp_path: Path) -> None:
    f = tmp_path / "key"
    f.write_text("s" * 20 + "\n")
    assert load_key({}, key_file=f) == b"s" * 20
    assert load_key({"TRAINGUARD_COMMAND_KEY_FILE": str(f)}) == b"s" * 20
    assert load_key({"TRAINGUARD_COMMAND_KEY": "e" * 16}) == b"e" * 16
    with pytest.raises(SigningKeyError, match="TRAINGUARD_COMMAND_KEY_FILE"):
        load_key({})
    with pytest.raises(SigningKeyError, match="at least 16 bytes"):
        load_key({"TRAINGUARD_COMMAND_KEY": "short"})
    with pytest.raises(SigningKeyError, match="cannot read"):
        load_key({}, key_file=tmp_path / "missing")
