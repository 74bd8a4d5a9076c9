"""The served incident pages: routing (read-only, ids validated, unknown ids 404), the list and
the timeline page rendered from the live fold, the same HTML as the file, user text escaped;
and the whole service on the in-memory bus answering over real HTTP while it folds."""

from __future__ import annotations

import asyncio
import copy
import re
import socket
from collections.abc import Sequence
from dataclasses import dataclass, replace
from html.parser import HTMLParser

import aiohttp
import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from trainguard.bus.memory import MemoryBus
from trainguard.events.envelope import Event
from trainguard.events.payloads import IncidentState
from trainguard.events.topics import TopicRole
from trainguard.incidents import IncidentSettings, LiveIncidents, rebuild_incidents
from trainguard.incidents.context import EventContext
from trainguard.incidents.model import Incident
from trainguard.incidents.service import serve
from trainguard.incidents.synth import incident_log
from trainguard.incidents.web import (
    PREFIX,
    Row,
    TimelineRequest,
    incident_path,
    render_index,
    resolve,
    root_href,
    route,
    rows,
    valid_id,
)
from trainguard.incidents.webserver import LiveSource, follow_context, start
from trainguard.timeline import build_timeline, render

pytestmark = pytest.mark.unit
LOG = incident_log()
BOOK = rebuild_incidents(LOG)["job-a"]
TIER1, KILL = list(BOOK.incidents.values())


@dataclass
class Fixed:
    """An ``IncidentSource`` over a rebuilt log."""

    incs: list[Incident]
    events: list[Event]

    def incidents(self) -> list[Incident]:
        return self.incs

    def events_for(self, inc: Incident) -> Sequence[Event]:
        return self.events


SOURCE = Fixed([TIER1, KILL], LOG)


def text(path: str, method: str = "GET") -> tuple[int, str]:
    page = route(method, path, SOURCE)
    return page.status, page.body.decode()


def test_the_list_shows_every_incident_newest_first_with_links() -> None:
    status, body = text("/")
    assert status == 200
    ids = re.findall(r'data-incident="([0-9a-f]{32})"', body)
    assert ids == [KILL.incident_id, TIER1.incident_id]
    for inc in (KILL, TIER1):
        assert f'href="incidents/{inc.incident_id}"' in body  # relative: works under a prefix
        assert f'data-state="{inc.state}"' in body
    assert "process_exit" in body and "straggler" in body
    assert "2 incident(s), 0 open" in body
    assert '<meta http-equiv="refresh"' in body


def test_the_incident_page_is_the_files_html_plus_a_way_back() -> None:
    status, body = text(incident_path(KILL.incident_id))
    assert status == 200
    file_html = render(build_timeline(KILL, LOG), "html")
    nav = [line for line in body.splitlines() if line not in file_html.splitlines()]
    assert len(nav) == 1 and nav[0].startswith('<nav id="nav"><a href="../">all incidents</a>')
    assert body.replace(nav[0] + "\n", "") == file_html
    assert "http-equiv" not in body  # recovered: nothing left to reload for
    assert "rank 3 pid 4103 exited (signal 9, seen via pidfd)" in body


def test_an_open_incident_page_reloads_itself() -> None:
    open_inc = replace(KILL, state=IncidentState.MITIGATING, closed_at=None)
    page = route("GET", incident_path(KILL.incident_id), Fixed([open_inc], LOG))
    assert '<meta http-equiv="refresh" content="10">' in page.body.decode()


def test_a_timeline_request_is_a_copy_the_fold_can_go_on_from() -> None:
    """The edge resolves in the fold's loop and renders in a thread: what it renders must not
    change under it."""
    inc = copy.deepcopy(KILL)
    events = list(LOG)
    req = resolve("GET", incident_path(inc.incident_id), Fixed([inc], events))
    assert isinstance(req, TimelineRequest)
    inc.state = IncidentState.ESCALATED
    inc.transitions.clear()
    next(iter(inc.commands.values())).outcomes.clear()
    events.clear()
    assert req.incident.state is IncidentState.RECOVERED and len(req.incident.transitions) == 5
    assert all(c.outcomes for c in req.incident.commands.values()) and len(req.events) == len(LOG)


def test_json_views_and_health() -> None:
    status, body = text(incident_path(KILL.incident_id) + ".json")
    assert status == 200 and orjson.loads(body)["incident_id"] == KILL.incident_id
    listing = orjson.loads(route("GET", "/incidents.json", SOURCE).body)
    assert [r["href"] for r in listing] == [f"/incidents/{KILL.incident_id}",
                                           f"/incidents/{TIER1.incident_id}"]
    assert listing[0]["state"] == "recovered" and listing[0]["open"] is False
    health = orjson.loads(route("GET", "/healthz", SOURCE).body)
    assert health == {"status": "ok", "incidents": 2, "open": 0}


def test_unknown_ids_and_other_paths_are_404() -> None:
    assert text(incident_path("0" * 32))[0] == 404
    assert text(incident_path(KILL.incident_id.upper()))[0] == 404
    assert text(incident_path(KILL.incident_id[:12]))[0] == 404
    for path in ("/incidents/", "/incidents", "/incidents/../etc/passwd", "/favicon.ico",
                 f"/incidents/{KILL.incident_id}/x", f"//incidents/{KILL.incident_id}"):
        status, body = text(path)
        assert status == 404 and "all incidents" in body, path


def test_only_get_and_head() -> None:
    for method in ("POST", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE", "CONNECT"):
        page = route(method, "/", SOURCE)
        assert page.status == 405 and ("Allow", "GET, HEAD") in page.headers
    assert route("HEAD", "/", SOURCE) == route("GET", "/", SOURCE)


@given(st.text(max_size=80))
def test_a_name_is_an_id_only_when_it_is_32_hex_digits(name: str) -> None:
    assert valid_id(name) == (re.fullmatch(r"[0-9a-f]{32}", name) is not None)
    page = route("GET", PREFIX + name, SOURCE)
    known = name in (KILL.incident_id, TIER1.incident_id)
    assert page.status == (200 if known else 404)
    if not known:  # what was asked for is shown escaped, never as markup
        assert_markup_is_ours(page.body.decode(), {"html", "head", "meta", "title", "style",
                                                   "body", "h1", "p", "a"})


@given(st.lists(st.sampled_from(["a", "..", "incidents", ""]), max_size=6))
def test_root_href_climbs_back_to_the_root(parts: list[str]) -> None:
    path = "/" + "/".join(parts)
    href = root_href(path)
    assert href == "./" or set(href.split("/")) == {"..", ""}
    assert href.count("..") == path.count("/") - 1


class Cells(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: set[str] = set()
        self.cells: list[str] = []
        self.attrs: list[str] = []
        self._in_td = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.add(tag)
        self.attrs += [v or "" for _, v in attrs]
        if tag == "td":
            self._in_td, self.cells = True, [*self.cells, ""]

    def handle_endtag(self, tag: str) -> None:
        if tag == "td":
            self._in_td = False

    def handle_data(self, data: str) -> None:
        if self._in_td:
            self.cells[-1] += data


def assert_markup_is_ours(body: str, allowed: set[str]) -> Cells:
    parser = Cells()
    parser.feed(body)
    assert parser.tags <= allowed, parser.tags - allowed
    return parser


USER = st.text(st.characters(codec="utf-8"), min_size=1, max_size=40)


@given(job=USER, where=USER, kinds=USER, state=USER)
def test_user_text_in_the_list_is_text_never_markup(job: str, where: str, kinds: str,
                                                    state: str) -> None:
    from trainguard.text.escape import plain

    r = Row(incident_id="a" * 32, job_id=job, where=where, kinds=kinds, severity="critical",
            state=state, tier=None, open=True, first_time=0, opened_at=0, last_time=0)
    parser = assert_markup_is_ours(render_index([r]), {
        "html", "head", "meta", "title", "style", "body", "h1", "p", "a", "table", "tr", "th",
        "td"})
    for value in (job, where, kinds, state):
        assert plain(value) in parser.cells  # the visible text: exactly the value, in a cell
    assert f"incidents/{'a' * 32}" in parser.attrs


def test_the_live_fold_and_its_context_serve_what_the_rebuild_shows() -> None:
    live = LiveIncidents(IncidentSettings())
    context = EventContext()
    for ev in LOG:
        context.add(ev)
        live.feed(ev)
    live.flush()
    source = LiveSource(live, context)
    assert [r.incident_id for r in rows(source.incidents())] == [KILL.incident_id,
                                                                 TIER1.incident_id]
    served = route("GET", incident_path(KILL.incident_id), source).body.decode()
    assert served == route("GET", incident_path(KILL.incident_id), SOURCE).body.decode()


def test_the_context_is_bounded_and_deduplicated() -> None:
    steps = [e for e in LOG if e.type == "step.report"][:10]
    ctx = EventContext(per_job=4, per_node=2)
    for ev in steps + steps[-2:]:
        ctx.add(ev)
    assert ctx.job_events("job-a") == steps[-4:] and ctx.dropped == 6
    node_events = [e for e in LOG if e.type == "telemetry.node"][:5]
    for ev in node_events:
        ctx.add(ev)
    nodes = {e.subject.node for e in node_events}
    assert len(nodes) == 2 and len(ctx) == 4 + 2 * len(nodes)  # the newest 2 of each node
    with pytest.raises(ValueError, match="per_job"):
        EventContext(per_job=0)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def test_the_service_answers_over_http_while_it_folds() -> None:
    """The service on the in-memory bus with the aiohttp edge on a real loopback port: the
    page of the kill incident appears, HEAD has GET's length and no body, POST is 405, and
    the telemetry read beside the fold reaches the GPU and network tracks."""
    bus = MemoryBus()

    async def go() -> None:
        prod = bus.producer()
        await prod.start()
        for e in LOG:
            await prod.send(e)
        live, context, stop = LiveIncidents(IncidentSettings()), EventContext(), asyncio.Event()
        port = free_port()
        runner = await start(LiveSource(live, context), "127.0.0.1", port)
        feed = asyncio.create_task(follow_context(bus, context, stop))
        task = asyncio.create_task(serve(bus, idle_flush_s=0.2, stop=stop, live=live,
                                         observe=context.add))
        base = f"http://127.0.0.1:{port}"
        url = base + incident_path(KILL.incident_id)
        try:
            async with aiohttp.ClientSession() as http:
                loop = asyncio.get_running_loop()
                deadline = loop.time() + 20
                status = 0
                while status != 200 and loop.time() < deadline:
                    async with http.get(url) as resp:
                        status = resp.status
                        body = await resp.text()
                    await asyncio.sleep(0.05)
                assert status == 200, body
                while "exited (signal 9" not in body or "RTT median" not in body:
                    assert loop.time() < deadline, body
                    await asyncio.sleep(0.05)
                    async with http.get(url) as resp:
                        body = await resp.text()
                assert resp.headers["Cache-Control"] == "no-store"
                async with http.head(url) as resp:
                    assert resp.status == 200 and await resp.read() == b""
                    assert int(resp.headers["Content-Length"]) == len(body.encode())
                async with http.post(url) as resp:
                    assert resp.status == 405 and resp.headers["Allow"] == "GET, HEAD"
                async with http.get(base + "/incidents/..%2F..%2Fetc%2Fpasswd") as resp:
                    assert resp.status == 404
                async with http.get(base + "/") as resp:
                    assert KILL.incident_id in await resp.text()
        finally:
            stop.set()
            await task
            await feed
            await runner.cleanup()
        assert any(e.type == "telemetry.node" for e in context.for_incident(KILL))
        assert all(e.type != "telemetry.node" for e in bus.events(TopicRole.TASK))

    asyncio.run(asyncio.wait_for(go(), 60))


def test_a_port_that_cannot_be_used_is_one_line_and_exit_2(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from tests import keys
    from trainguard.cli.main import main

    for name, value in keys.env().items():
        monkeypatch.setenv(name, value)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        for argv, want in (([f"--http-port={port}"], f"--http-port {port}: cannot listen"),
                           (["--http-port=70000"], "--http-port 70000: must be 0"),
                           ([f"--http-port={port}", "--http-addr=192.0.2.1"], "cannot listen")):
            code = main(["incident", "serve", "--bootstrap", "127.0.0.1:1", *argv])
            lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()
                     and not re.match(r"^\d{4}-\d\d-\d\d ", ln)]
            assert code == 2 and len(lines) == 1 and want in lines[0], lines
            assert "Traceback" not in lines[0]
