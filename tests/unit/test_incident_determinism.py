"""The live fold (reorder buffer + books) gives exactly the transitions a rebuild from the whole
log gives, whatever the arrival order within the lateness bound, with duplicated records."""

from __future__ import annotations

import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainguard.events.codec import encode
from trainguard.events.envelope import Event
from trainguard.events.payloads import IncidentTransition
from trainguard.incidents import IncidentSettings, LiveIncidents, rebuild, rebuild_incidents
from trainguard.incidents.aggregate import FOLDED_TYPES
from trainguard.incidents.synth import incident_log

SETTINGS = IncidentSettings(lateness_us=3_000_000)
LOG = [e for e in incident_log() if e.type in FOLDED_TYPES]
REFERENCE = [encode(t) for t in rebuild(LOG, SETTINGS)]


def arrivals(log: list[Event], seed: int, dup_share: float) -> list[Event]:
    """Each record delayed by less than the lateness bound; some sent twice."""
    rng = random.Random(seed)
    lateness = SETTINGS.lateness_us
    keyed = [(e.event_time + rng.randrange(lateness), i, e) for i, e in enumerate(log)]
    keyed += [(e.event_time + rng.randrange(lateness), len(log) + i, e)
              for i, e in enumerate(log) if rng.random() < dup_share]
    return in_arrival_order(keyed)


def in_arrival_order(keyed: list[tuple[int, int, Event]]) -> list[Event]:
    """(arrival time, tie-break, record) -> the records as they arrive."""
    return [e for _, _, e in sorted(keyed, key=lambda k: (k[0], k[1]))]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), dup_share=st.sampled_from([0.0, 0.05, 0.3]))
def test_live_equals_rebuild_under_jitter_and_duplicates(seed: int, dup_share: float) -> None:
    live = LiveIncidents(SETTINGS)
    out: list[Event] = []
    for ev in arrivals(LOG, seed, dup_share):
        out += live.feed(ev)
    out += live.flush()
    assert live.late == 0 or dup_share > 0  # only duplicates of released records come late
    assert sorted(encode(t) for t in out) == sorted(REFERENCE)
    # and in the order each incident went through them
    assert per_incident(out) == per_incident(rebuild(LOG, SETTINGS))


def per_incident(transitions: list[Event]) -> dict[str, list[bytes]]:
    out: dict[str, list[bytes]] = {}
    for t in transitions:
        assert isinstance(t.payload, IncidentTransition)
        out.setdefault(t.payload.incident_id, []).append(encode(t))
    return out


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_rebuild_from_a_shuffled_duplicated_log_is_identical(seed: int) -> None:
    rng = random.Random(seed)
    log = LOG + rng.sample(LOG, len(LOG) // 4)
    rng.shuffle(log)
    assert [encode(t) for t in rebuild(log, SETTINGS)] == REFERENCE


def test_a_duplicate_of_a_released_record_changes_nothing() -> None:
    live = LiveIncidents(SETTINGS)
    for ev in LOG:
        live.feed(ev)
    live.flush()
    first_verdict = next(e for e in LOG if e.type == "verdict")
    assert live.feed(first_verdict) == [] and live.catch_up() == []
    assert live.late == 0 and live.refolded == 0


def outage_arrivals(log: list[Event], seed: int) -> list[Event]:
    """A broker outage: the step reports arrive on time, every other record (verdicts,
    commands, outcomes...) up to a minute later than the lateness bound, in order."""
    rng = random.Random(seed)
    lag = rng.randrange(SETTINGS.lateness_us, 60_000_000)
    return in_arrival_order([(e.event_time + (0 if e.type == "step.report" else lag), i, e)
                             for i, e in enumerate(log)])


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), batch=st.sampled_from([1, 7, 50]))
def test_records_later_than_the_bound_are_folded_in_their_place(seed: int, batch: int) -> None:
    # the verdicts come behind step reports of later event times (the streams catching up
    # after an outage): the books still end as the rebuild makes them, and every transition
    # of the rebuild was emitted
    live = LiveIncidents(SETTINGS)
    out: list[Event] = []
    for i, ev in enumerate(outage_arrivals(LOG, seed)):
        out += live.feed(ev)
        if i % batch == batch - 1:  # the service catches up after each poll batch
            out += live.catch_up()
    out += live.flush()
    assert live.refolded > 0 and live.late == 0
    assert {encode(t) for t in rebuild(LOG, SETTINGS)} <= {encode(t) for t in out}
    rebuilt = rebuild_incidents(LOG, SETTINGS)
    for job, book in live.books.items():
        assert {i: (inc.state, inc.tier) for i, inc in book.incidents.items()} == {
            i: (inc.state, inc.tier) for i, inc in rebuilt[job].incidents.items()}


def test_a_record_older_than_the_kept_history_is_counted_not_folded() -> None:
    live = LiveIncidents(SETTINGS, history_max=10)
    for ev in LOG:
        live.feed(ev)
    live.flush()
    first_verdict = next(e for e in LOG if e.type == "verdict")
    late = first_verdict.model_copy(update={"event_id": "a-new-id"})
    assert live.feed(late) == [] and live.catch_up() == []
    assert live.late == 1
