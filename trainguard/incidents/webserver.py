"""The HTTP edge of the served incident pages: a thin aiohttp server in the incident service's
own event loop, and the reader that keeps the telemetry and drill events the timelines draw
beside the fold's own input.

A request is resolved in the loop, between two of the fold's batches (no lock: the list is
rendered there, a timeline's incident and events are copied there); a timeline is then built
and rendered in a worker thread while the fold goes on (a page of a 20k-event job takes about
0.1 s to build). A request during the start-up rebuild waits for it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from aiohttp import web

from trainguard.bus.protocol import Bus
from trainguard.events.envelope import Event
from trainguard.events.topics import TopicRole
from trainguard.incidents.context import EventContext
from trainguard.incidents.live import LiveIncidents
from trainguard.incidents.model import Incident
from trainguard.incidents.web import HTML, Page, render_timeline, resolve

log = logging.getLogger(__name__)
CONTEXT_ROLES = (TopicRole.TELEMETRY, TopicRole.DRILLS)  # not folded, drawn on the timeline


@dataclass
class LiveSource:
    """``web.IncidentSource`` over the service's fold and the events it keeps."""

    live: LiveIncidents
    context: EventContext

    def incidents(self) -> list[Incident]:
        return [inc for book in self.live.books.values() for inc in book.incidents.values()]

    def events_for(self, inc: Incident) -> Sequence[Event]:
        return self.context.for_incident(inc)


class WebError(RuntimeError):
    """The server cannot listen (address in use, no such address)."""


def app_for(source: LiveSource) -> web.Application:
    async def handle(request: web.Request) -> web.StreamResponse:
        try:
            got = resolve(request.method, request.path, source)  # in the loop: a consistent copy
            # built and rendered in a thread: the fold goes on meanwhile
            page = got if isinstance(got, Page) else await asyncio.to_thread(render_timeline, got)
        except Exception as exc:  # a bug renders as 500, the service carries on
            log.error("incidents web: %s %s raised %s: %s", request.method, request.path,
                      type(exc).__name__, exc)
            log.debug("incidents web: the traceback", exc_info=exc)
            page = Page(500, HTML, b"<!DOCTYPE html><h1>500: internal error</h1>\n")
        return response(page, request.method)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    return app


def response(page: Page, method: str) -> web.Response:
    resp = web.Response(status=page.status, body=page.body,
                        headers={"Content-Type": page.content_type, **dict(page.headers)})
    if method == "HEAD":  # the length GET would send, no body (aiohttp leaves it out)
        resp.headers["Content-Length"] = str(len(page.body))
    return resp


async def start(source: LiveSource, host: str, port: int) -> web.AppRunner:
    runner = web.AppRunner(app_for(source), access_log=None, handle_signals=False)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
    except OSError as exc:
        await runner.cleanup()
        raise WebError(f"--http-addr {host} --http-port {port}: cannot listen: "
                       f"{exc.strerror or exc}") from None
    log.info("incidents web: serving http://%s:%d/", host, port)
    return runner


async def follow_context(bus: Bus, context: EventContext, stop: asyncio.Event) -> None:
    """Telemetry and drill events into ``context`` until ``stop`` (no group, from the start:
    only in memory, bounded; invalid records are skipped, the streams dead-letter them)."""
    source = bus.consumer(CONTEXT_ROLES, group_id=None, name="incidents-web", dlq=None)
    try:
        await source.start()
        while not stop.is_set():
            for item in await source.poll(timeout_ms=500):
                context.add(item.event)
    except Exception as exc:  # the pages go on without these tracks; the fold is not touched
        log.error("incidents web: reading %s stopped (%s: %s); the timeline pages show no "
                  "new network, GPU or drill marks", ", ".join(CONTEXT_ROLES),
                  type(exc).__name__, exc)
    finally:
        await source.stop()

