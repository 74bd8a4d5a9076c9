"""The alerts' HTTP client honours the proxy variables (aiohttp ``trust_env``): a recording
proxy on loopback sees the plain-HTTP request (``HTTP_PROXY``) and the ``CONNECT`` of an HTTPS
one (``HTTPS_PROXY``), and ``NO_PROXY`` sends a request past it, straight to its target."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest

from trainguard.alerts.channels.base import HttpRequest
from trainguard.alerts.http import AiohttpPoster, PostFailed, Reply

OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"
REFUSE = b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"


@asynccontextmanager
async def recorder(answer: Callable[[bytes], bytes]) -> AsyncIterator[tuple[int, list[bytes]]]:
    """A loopback server that records each request's head and answers ``answer(head)``."""
    heads: list[bytes] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        heads.append(head)
        writer.write(answer(head))
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield port, heads
    finally:
        server.close()
        await server.wait_closed()


def post(url: str) -> Awaitable[Reply | PostFailed]:
    async def go() -> Reply | PostFailed:
        poster = AiohttpPoster()
        try:
            return await poster.post(HttpRequest(url=url, body=b"{}", shown=url), 5.0)
        finally:
            await poster.close()
    return go()


def clear_proxies(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)


def test_http_proxy_gets_the_plain_request(monkeypatch: pytest.MonkeyPatch) -> None:
    clear_proxies(monkeypatch)

    async def go() -> tuple[Reply | PostFailed, list[bytes]]:
        async with recorder(lambda _: OK) as (port, heads):
            monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{port}")
            return await post("http://alerts-target.invalid/hook"), heads

    reply, heads = asyncio.run(go())
    assert isinstance(reply, Reply) and reply.status == 200 and reply.body == b"ok"
    assert [h.split(b"\r\n", 1)[0] for h in heads] == [
        b"POST http://alerts-target.invalid/hook HTTP/1.1"]


def test_https_proxy_gets_the_connect(monkeypatch: pytest.MonkeyPatch) -> None:
    clear_proxies(monkeypatch)

    async def go() -> tuple[Reply | PostFailed, list[bytes]]:
        async with recorder(lambda _: REFUSE) as (port, heads):
            monkeypatch.setenv("HTTPS_PROXY", f"http://127.0.0.1:{port}")
            return await post("https://hooks.slack.invalid/services/T/B/x"), heads

    reply, heads = asyncio.run(go())
    assert isinstance(reply, PostFailed)  # the proxy refused the tunnel
    assert [h.split(b"\r\n", 1)[0] for h in heads] == [
        b"CONNECT hooks.slack.invalid:443 HTTP/1.1"]


def test_no_proxy_goes_straight_to_the_target(monkeypatch: pytest.MonkeyPatch) -> None:
    clear_proxies(monkeypatch)

    async def go() -> tuple[Reply | PostFailed, list[bytes], list[bytes]]:
        async with recorder(lambda _: REFUSE) as (proxy_port, proxied), \
                recorder(lambda _: OK) as (target_port, direct):
            monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{proxy_port}")
            monkeypatch.setenv("NO_PROXY", "localhost,127.0.0.1")
            reply = await post(f"http://127.0.0.1:{target_port}/hook")
            return reply, proxied, direct

    reply, proxied, direct = asyncio.run(go())
    assert isinstance(reply, Reply) and reply.status == 200
    assert proxied == []
    assert [h.split(b"\r\n", 1)[0] for h in direct] == [b"POST /hook HTTP/1.1"]
