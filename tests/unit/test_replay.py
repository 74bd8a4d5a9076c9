"""Replay reproduces the recording exactly with the recorded rules and names every
difference; with other rules it lists the incidents that would appear, vanish or change."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainguard.cli.main import main
from trainguard.events.codec import make_event
from trainguard.events.envelope import Event, Subject
from trainguard.events.ids import derived_id
from trainguard.events.payloads import (
    IncidentTransition,
    Severity,
    StepReport,
    Verdict,
    VerdictState,
)
from trainguard.incidents import rebuild
from trainguard.incidents.source import LogFileError, read_log_file, write_log
from trainguard.incidents.synth import (
    T0,
    Scenario,
    decisions,
    incident_log,
    live_verdicts,
    observations,
)
from trainguard.replay import Window, parse_when, replay_log
from trainguard.replay.report import render_report, report_doc
from trainguard.replay.window import WindowError
from trainguard.rules import RuleSet, load_default_rules, parse_rules

BASE = incident_log()
RECORDED = BASE + rebuild(BASE)  # the log as the incident service leaves it
RULES = load_default_rules()
DEFAULT_YAML = (Path(__file__).resolve().parents[2] / "rules/default.yaml").read_text()


def strict_rules() -> RuleSet:
    """A stricter straggler threshold: the 1.6x throttled rank no longer counts."""
    return parse_rules(strict_yaml(), "strict.yaml")


def strict_yaml() -> str:
    return DEFAULT_YAML.replace("effect_levels: [1.1, 1.3, 1.6, 2.0]", "effect_levels: [1.8]") \
        .replace("threshold_ratio: 1.15", "threshold_ratio: 1.8")


def test_the_recorded_rules_reproduce_the_recording_exactly() -> None:
    r = replay_log(RECORDED, RULES)
    assert r.exact and not r.what_if and r.incidents_recorded
    assert r.verdicts.same == 4 and len(r.incidents.same) == 2
    assert "REPRODUCED EXACTLY: 4 verdicts and 2 incidents (9 transitions)" in render_report(r)


def test_a_tampered_transition_is_listed() -> None:
    def tamper(e: Event) -> Event:
        p = e.payload
        if isinstance(p, IncidentTransition) and p.to_state.value == "recovered" and p.tier == 3:
            return e.model_copy(update={"payload": p.model_copy(update={"reason": "by magic"})})
        return e
    r = replay_log([tamper(e) for e in RECORDED], RULES)
    assert not r.exact and not r.what_if
    (change,) = r.incidents.change
    assert change.differences[0].startswith("seq 4: recorded -> recovered(3)")
    assert "by magic" in change.differences[0]
    assert "DIFFERENCES with the recorded rules" in render_report(r)


def test_a_lost_verdict_is_listed() -> None:
    gone = next(e for e in RECORDED if isinstance(e.payload, Verdict)
                and e.payload.state is VerdictState.RESOLVED)
    r = replay_log([e for e in RECORDED if e is not gone], RULES)
    assert [e.event_id for e in r.verdicts.extra] == [gone.event_id]
    assert "new:" in render_report(r)


def test_what_if_stricter_rules_make_the_straggler_incident_vanish() -> None:
    r = replay_log(RECORDED, strict_rules())
    assert r.what_if
    assert [s.opened_by for s in r.incidents.vanish] == ["warning straggler verdict opened"]
    assert len(r.incidents.same) == 1 and not r.incidents.appear
    assert r.verdicts.same == 2 and len(r.verdicts.missing) == 2  # the straggler's open/resolve
    text = render_report(r)
    assert "WHAT-IF" in text and "1 would vanish" in text


def test_the_window_limits_the_comparison() -> None:
    first = min(e.event_time for e in RECORDED)
    last = max(e.event_time for e in RECORDED)
    w = Window.parse("+20s", "end-2s", first=first, last=last)
    r = replay_log(RECORDED, strict_rules(), w)
    assert not r.incidents.vanish and r.verdicts.same == 2  # the straggler is before +20 s


@pytest.mark.parametrize(("text", "expected"), [
    ("2026-01-01T00:00:05Z", T0 + 5_000_000),
    ("2026-01-01T00:00:05.5+00:00", T0 + 5_500_000),
    (str(T0 + 7), T0 + 7),
    ("+30s", T0 + 30_000_000), ("start+1.5m", T0 + 90_000_000),
    ("-2s", T0 + 98_000_000), ("end-500ms", T0 + 99_500_000), ("end+1h", T0 + 3_700_000_000),
])
def test_times_and_offsets(text: str, expected: int) -> None:
    assert parse_when(text, field="--since", first=T0, last=T0 + 100_000_000) == expected


def test_bad_times_name_the_option() -> None:
    with pytest.raises(WindowError, match="--until: not an ISO time"):
        parse_when("yesterday", field="--until", first=0, last=1)
    with pytest.raises(WindowError, match="--until: before --since"):
        Window(start=5, end=4)


def test_export_round_trip_and_bad_lines(tmp_path: Path) -> None:
    f = tmp_path / "log.jsonl"
    with f.open("wb") as fh:
        assert write_log(RECORDED + RECORDED[:10], fh) == len(RECORDED)  # deduplicated
    back = read_log_file(f)
    assert {e.event_id for e in back} == {e.event_id for e in RECORDED}
    f.write_bytes(f.read_bytes() + b'{"event_id": "x"}\n')
    with pytest.raises(LogFileError, match=rf"log.jsonl:{len(RECORDED) + 1}: .*event_id"):
        read_log_file(f)


def test_cli_replay_list_show_and_export(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                        ) -> None:
    log = tmp_path / "log.jsonl"
    with log.open("wb") as fh:
        write_log(RECORDED, fh)
    assert main(["replay", "--log", str(log)]) == 0
    assert "REPRODUCED EXACTLY" in capsys.readouterr().out
    strict = tmp_path / "strict.yaml"
    strict.write_text(strict_yaml())
    assert main(["replay", "--log", str(log), "--rules", str(strict)]) == 0
    assert "vanish:  " in capsys.readouterr().out
    assert main(["incident", "list", "--log", str(log)]) == 0
    listing = capsys.readouterr().out
    assert listing.count("[recorded]") == 2 and "2 incident(s)" in listing
    kill_id = listing.splitlines()[1].split()[0]
    out = tmp_path / "kill.html"
    assert main(["incident", "show", kill_id, "--log", str(log), "--format", "html",
                 "--out", str(out)]) == 0
    assert "When did the old replica stop?" in out.read_text()
    part = tmp_path / "part.jsonl"
    assert main(["replay", "export", "--log", str(log), "--since", "+20s", "--out",
                 str(part)]) == 0
    assert all(e.event_time >= T0 + 20_000_000 for e in read_log_file(part))
    assert main(["incident", "show", "nope", "--log", str(log)]) == 2
    assert "ID: no incident 'nope'" in capsys.readouterr().err


def test_prompt_lane_retractions_are_left_out_and_said_so() -> None:
    """A verdict the live worker emitted early and retracted depends on arrival order: replay
    cannot (and need not) reproduce it, nor the incident it opened."""
    t = T0 + 50_000_000
    early = Verdict(verdict_id="early-1", rule="process-exit", kind="process_exit",
                    state=VerdictState.OPEN, severity=Severity.CRITICAL, first_anomalous_time=t,
                    decided_time=t, rules_version=RULES.version)
    back = early.model_copy(update={"state": VerdictState.RESOLVED,
                                    "evidence": {"retracted": True, "reason": "stale replica"}})
    extra = [make_event(p, event_id=derived_id("r", p.state.value), job_id="job-a",
                        event_time=t, source="rules", subject=Subject(node="node-a", rank=1))
             for p in (early, back)]
    extra += rebuild(extra)  # the live incident service opened (and closed) an incident on it
    r = replay_log(RECORDED + extra, RULES)
    assert r.exact and r.retracted == 1
    assert "left out: 1 verdict(s) the live prompt lane retracted" in render_report(r)


def test_what_if_lists_incidents_that_would_change_and_appear() -> None:
    """An earlier decision (the sequential test's alpha 1e-3 instead of 1e-6) changes the
    straggler incident's times; a looser lowest effect level (1.1) also flags a rank 14% slow
    that the recording let pass."""
    sc = Scenario()

    def mildly_slow(e: Event) -> Event:
        p = e.payload
        if isinstance(p, StepReport) and p.rank == 1 and 75 <= p.step < 110 and \
                e.event_time < sc.kill_time:
            return e.model_copy(update={"payload": p.model_copy(
                update={"compute_ms": p.compute_ms * 1.14})})
        return e
    obs = [mildly_slow(e) for e in observations(sc)]
    verdicts = live_verdicts(obs, RULES, sc.job)
    base = obs + verdicts + decisions(sc, verdicts)
    recorded = base + rebuild(base)
    assert replay_log(recorded, RULES).exact  # the recording itself reproduces

    earlier = parse_rules(DEFAULT_YAML.replace("alpha: 1.0e-6", "alpha: 1.0e-3"), "a3.yaml")
    r = replay_log(recorded, earlier)
    (change,) = r.incidents.change
    assert change.recorded.subject == "node node-a, rank 2"
    assert change.differences[0].startswith("seq 0: recorded -> detected at")

    looser = parse_rules(DEFAULT_YAML.replace("min_effect: 1.15", "min_effect: 1.05"),
                         "loose.yaml")
    r = replay_log(recorded, looser)
    assert [s.subject for s in r.incidents.appear] == ["node node-a, rank 1"]
    assert "1 would appear" in render_report(r)


def test_exit_codes_and_json_verdicts_in_full() -> None:
    assert replay_log(RECORDED, RULES).exit_code == 0
    assert replay_log(RECORDED, strict_rules()).exit_code == 0  # what-if
    gone = next(e for e in RECORDED if isinstance(e.payload, Verdict)
                and e.payload.state is VerdictState.RESOLVED)
    r = replay_log([e for e in RECORDED if e is not gone], RULES)
    assert (r.mode, r.exit_code) == ("reproduce", 1)
    doc = report_doc(r)
    (new,) = doc["verdicts"]["new"]
    p = gone.payload
    assert isinstance(p, Verdict)
    assert new["event_id"] == gone.event_id
    assert (new["kind"], new["state"], new["severity"]) == (p.kind, "resolved",
                                                            p.severity.value)
    assert new["subject"] == gone.subject.model_dump(exclude_none=True)
    assert new["evidence"] == dict(p.evidence)


def test_a_log_without_verdicts_is_a_what_if_that_lists_everything_found() -> None:
    inputs = [e for e in RECORDED
              if not isinstance(e.payload, Verdict | IncidentTransition)]
    r = replay_log(inputs, RULES)
    assert (r.mode, r.what_if, r.verdicts_recorded, r.exit_code) == (
        "what_if_unrecorded", True, False, 0)
    doc = report_doc(r)
    assert doc["mode"] == "what_if_unrecorded" and doc["exit_code"] == 0
    assert len(doc["verdicts"]["new"]) == 4 and not doc["verdicts"]["gone"]
    assert {v["kind"] for v in doc["verdicts"]["new"]} == {"straggler", "process_exit"}
    assert all(v["evidence"] for v in doc["verdicts"]["new"])
    assert len(doc["incidents"]["appear"]) == 2
    text = render_report(r)
    assert "WHAT-IF: the log records no verdicts" in text and "REPRODUCED" not in text
    # a log no rule reads anything from is a what-if that finds nothing, not a reproduction
    empty = replay_log([e for e in inputs if e.type == "checkpoint"], RULES)
    assert empty.mode == "what_if_unrecorded" and empty.exit_code == 0
    assert "REPRODUCED" not in render_report(empty)
