"""The HTTP edge: post a request, get an outcome value back (never an exception)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Protocol

import aiohttp

from trainguard.alerts.channels.base import HttpRequest


@dataclass(frozen=True)
class Reply:
    status: int
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class PostFailed:
    """No answer: refused connection, timeout, bad URL. ``detail`` names no URL."""

    detail: str


class Poster(Protocol):
    async def post(self, request: HttpRequest, timeout_s: float) -> Reply | PostFailed: ...

    async def close(self) -> None: ...


class AiohttpPoster:
    """One aiohttp session for all channels; bodies read up to 64 KiB. ``trust_env``: the
    proxy variables (``HTTPS_PROXY``, ``HTTP_PROXY``, ``NO_PROXY``, lower case too) and
    ``~/.netrc`` are honoured, as curl does."""

    MAX_BODY = 65_536

    def __init__(self) -> None:
        self._session: aiohttp.ClientSession | None = None

    async def post(self, request: HttpRequest, timeout_s: float) -> Reply | PostFailed:
        if self._session is None:
            self._session = aiohttp.ClientSession(trust_env=True)
        try:
            async with self._session.post(
                request.url, data=request.body, headers=request.headers,
                timeout=aiohttp.ClientTimeout(total=timeout_s), allow_redirects=False,
            ) as resp:
                body = await resp.content.read(self.MAX_BODY)
                return Reply(resp.status, body, dict(resp.headers))
        except TimeoutError:
            return PostFailed(f"no answer within {timeout_s:g} s")
        except aiohttp.InvalidURL:
            return PostFailed("invalid URL")
        except aiohttp.ClientConnectorError as err:
            return PostFailed(f"cannot connect: {err.os_error.strerror or type(err).__name__}")
        except (aiohttp.ClientError, OSError, ValueError) as err:
            # aiohttp's messages can quote the URL: the name of the error only
            return PostFailed(f"{type(err).__name__}")

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
            await asyncio.sleep(0)
