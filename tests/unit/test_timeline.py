"""The timeline of a kill -> migrate -> resume answers the four questions from the events, and
every format carries the tracks and the answers."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson
import pytest

from trainguard.events.envelope import Event
from trainguard.events.payloads import (
    CheckpointAction,
    CheckpointEvent,
    PoolUnit,
    ProcessExit,
    StepReport,
    UnitState,
    Verdict,
)
from trainguard.incidents import rebuild_incidents
from trainguard.incidents.synth import Scenario, incident_log
from trainguard.text import escape
from trainguard.timeline import QUESTIONS, TRACKS, Timeline, build_timeline, render

LOG = incident_log()
SC = Scenario()


def timelines(log: list[Event]) -> list[Timeline]:
    return [build_timeline(i, log) for i in rebuild_incidents(log)["job-a"].incidents.values()]


def only(log: list[Event], cls: type, pred: Callable[[Any], bool] | None = None) -> Event:
    hits = [e for e in log if isinstance(e.payload, cls) and (pred is None or pred(e.payload))]
    assert len(hits) >= 1
    return min(hits, key=lambda e: (e.event_time, e.event_id))


def test_the_four_answers_of_the_kill() -> None:
    _, kill = timelines(LOG)
    a = {x.key: x for x in kill.answers}
    assert [x.key for x in kill.answers] == [k for k, _ in QUESTIONS]
    verdict = only(LOG, Verdict, lambda p: p.kind == "process_exit")
    exit_ = only(LOG, ProcessExit)
    fenced = only(LOG, PoolUnit, lambda p: p.state is UnitState.FENCED)
    bound = only(LOG, PoolUnit, lambda p: p.state is UnitState.BOUND)
    loaded = only(LOG, CheckpointEvent, lambda p: p.action is CheckpointAction.LOADED)
    first = min((e for e in LOG if isinstance(e.payload, StepReport)
                 and e.event_time > loaded.event_time), key=lambda e: (e.event_time, e.event_id))
    assert a["unavailable"].time == verdict.event_time
    assert "process_exit" in a["unavailable"].text and "rank 3" in a["unavailable"].text
    assert a["stopped"].time == exit_.event_time
    assert a["stopped"].event_ids == [exit_.event_id, fenced.event_id]
    assert "released cgroup, port 29503" in a["stopped"].text
    assert a["ready"].time == bound.event_time and "epoch 1" in a["ready"].text
    assert a["continued"].event_ids == [loaded.event_id, first.event_id]
    assert f"step {SC.last_checkpoint}, samples {(SC.last_checkpoint + 1) * 32}" in \
        a["continued"].text
    assert f"first step after: step {SC.last_checkpoint + 1}" in a["continued"].text
    assert "continuous: no jump, no rerun" in a["continued"].text
    assert all(x.answered for x in kill.answers)


def test_a_resume_that_skips_steps_is_called_a_jump() -> None:
    def shift(e: Event) -> Event:
        p = e.payload
        if isinstance(p, StepReport) and e.event_time > SC.kill_time:
            return e.model_copy(update={"payload": p.model_copy(update={"step": p.step + 5})})
        return e
    _, kill = timelines([shift(e) for e in LOG])
    text = next(a.text for a in kill.answers if a.key == "continued")
    assert "JUMP: 5 step(s) skipped" in text


def test_tier_one_answers_say_not_applicable() -> None:
    straggler, _ = timelines(LOG)
    a = {x.key: x for x in straggler.answers}
    assert not a["unavailable"].answered and "degraded only" in a["unavailable"].text
    assert a["stopped"].text.startswith("not applicable")
    assert a["continued"].text == "not applicable: the job did not restart"


def test_every_track_shows_the_kill() -> None:
    _, kill = timelines(LOG)
    for track in TRACKS:
        assert kill.track(track), track
    labels = {t: " | ".join(m.label for m in kill.track(t)) for t in TRACKS}
    assert "rank 3 epoch 1: steps 101-" in labels["task"]
    assert "checkpoint loaded step 100" in labels["task"]
    assert "RTT 2.40 ms" in labels["network"]
    assert "node-a gpu 3 idle" in labels["gpu"]
    assert "unit node-a/cpu12-15 fenced" in labels["resources"]
    assert "tier 2 migrate: done" in labels["actions"] and "drill worker-exit" in labels["actions"]
    assert "-> recovered" in labels["detection"]
    assert kill.start < kill.opened_at < kill.end


@pytest.mark.parametrize("fmt", ["text", "md", "html", "json"])
def test_every_format_carries_the_answers_and_tracks(fmt: str) -> None:
    _, kill = timelines(LOG)
    out = render(kill, fmt)
    for a in kill.answers:
        shown = {"html": escape.html, "md": escape.markdown}.get(fmt, str)
        assert shown(a.text) in out
    assert kill.incident_id in out
    if fmt == "json":
        doc = orjson.loads(out)
        assert [t["track"] for t in doc["tracks"]] == list(TRACKS)
        assert [a["key"] for a in doc["answers"]] == [k for k, _ in QUESTIONS]


def test_the_html_page_is_self_contained() -> None:
    _, kill = timelines(LOG)
    page = render(kill, "html")
    assert "<svg" in page and "<style>" in page
    for ref in ("src=", "href=", "<script", "<link", "@import", "url("):
        assert ref not in page
    assert page.count('class="track"') == len(TRACKS)


def test_unknown_format_names_the_field() -> None:
    _, kill = timelines(LOG)
    with pytest.raises(ValueError, match="format: must be one of"):
        render(kill, "pdf")


def test_an_incident_still_open_says_what_is_not_there_yet() -> None:
    log = [e for e in LOG if e.event_time <= SC.kill_time + 1_000_000]
    _, kill = timelines(log)
    assert kill.state == "mitigating" and kill.closed_at is None
    a = {x.key: x for x in kill.answers}
    assert a["unavailable"].answered and a["stopped"].answered
    assert a["ready"].text == "not yet: no new binding seen"
    assert a["continued"].text == "not yet: no checkpoint load seen"
    assert "(still open)" in render(kill, "text")


def test_peers_exiting_in_the_same_instant_do_not_take_the_location() -> None:
    # rank 3 killed; its three peers exit (code 3) at the same event time; the verdicts open
    # in event-id order, rank 1's first. The migrate names rank 3: so do the incident and
    # its answers.
    sc = Scenario(job="job-b", restart_all=True, peer_exits=True)
    log = incident_log(sc)
    exits = sorted((e for e in log if isinstance(e.payload, Verdict)
                    and e.payload.kind == "process_exit"), key=lambda e: (e.event_time, e.event_id))
    assert exits[0].subject.rank != sc.kill_rank  # else this test shows nothing
    incs = [i for i in rebuild_incidents(log)["job-b"].incidents.values() if i.heavy_commands()]
    assert len(incs) == 1 and incs[0].subject.rank == sc.kill_rank
    a = {x.key: x for x in build_timeline(incs[0], log).answers}
    assert f"rank {sc.kill_rank}" in a["unavailable"].text
    first = a["stopped"].text.split("; ")[0]
    assert f"rank {sc.kill_rank} pid" in first and "signal 9" in first
