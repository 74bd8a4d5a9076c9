"""A local HTTP receiver that records what it got: the chat side of tests and the demo.

Routes by path prefix. Each route can check the request the way the vendor would (Feishu and
DingTalk signatures, trainguard's HMAC, the token in the URL) and answers like the vendor:
success, or the vendor's error when the check fails. Plain ``http.server`` on 127.0.0.1 in a
background thread, so it serves whatever event loop the sender runs in.
"""

from __future__ import annotations

import hmac
import json
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from trainguard.alerts.signing import dingtalk_sign, feishu_sign, webhook_sign
from trainguard.dev.http_server import BackgroundHTTPServer

MAX_SKEW_S = 3600.0  # Feishu and DingTalk refuse signatures more than an hour off


@dataclass(frozen=True)
class Received:
    route: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: bytes
    received_at: float
    verified: bool | None = None
    problem: str | None = None

    def json(self) -> Any:
        return json.loads(self.body)

    def text(self) -> str:
        return self.body.decode(errors="replace")


Check = Callable[[Received], str | None]  # the problem, or None when the request is good


@dataclass
class Route:
    name: str
    prefix: str
    check: Check | None = None
    status: int = 200
    reply: bytes = b'{"code": 0, "msg": "success", "errcode": 0, "errmsg": "ok"}'
    refusal: bytes = b'{"code": 19021, "errcode": 310000, "msg": "sign match fail"}'
    fail_first: int = 0  # answer HTTP 500 to this many requests first
    served: int = field(default=0, init=False)


def feishu_check(secret: str, max_skew_s: float = MAX_SKEW_S) -> Check:
    def check(r: Received) -> str | None:
        doc = r.json()
        ts, sign = doc.get("timestamp"), doc.get("sign")
        if not isinstance(ts, str) or not isinstance(sign, str):
            return "no timestamp/sign in the body"
        if abs(time.time() - int(ts)) > max_skew_s:
            return "timestamp too far from now"
        want = feishu_sign(int(ts), secret)
        return None if hmac.compare_digest(want, sign) else "sign mismatch"
    return check


def dingtalk_check(secret: str, token: str, max_skew_s: float = MAX_SKEW_S) -> Check:
    def check(r: Received) -> str | None:
        if r.query.get("access_token") != token:
            return "wrong access_token"
        ts, sign = r.query.get("timestamp"), r.query.get("sign")
        if ts is None or sign is None:
            return "no timestamp/sign in the query"
        if abs(time.time() * 1000 - int(ts)) > max_skew_s * 1000:
            return "timestamp too far from now"
        want = dingtalk_sign(int(ts), secret)
        return None if hmac.compare_digest(want, sign) else "sign mismatch"
    return check


def hmac_check(secret: str, max_skew_s: float = 300.0) -> Check:
    def check(r: Received) -> str | None:
        ts = r.headers.get("x-trainguard-timestamp")
        sig = r.headers.get("x-trainguard-signature")
        if ts is None or sig is None:
            return "no X-Trainguard-Timestamp/Signature"
        if abs(time.time() - int(ts)) > max_skew_s:
            return "timestamp too far from now"
        want = webhook_sign(int(ts), r.body, secret)
        return None if hmac.compare_digest(want, sig) else "bad HMAC"
    return check


def path_token_check(token: str) -> Check:
    """Slack-style: the token is the last path segment."""
    def check(r: Received) -> str | None:
        return None if r.path.rstrip("/").rsplit("/", 1)[-1] == token else "wrong token"
    return check


def query_token_check(param: str, token: str) -> Check:
    """WeCom-style: the token is a query parameter (``key``)."""
    def check(r: Received) -> str | None:
        return None if r.query.get(param) == token else f"wrong {param}"
    return check


class WebhookReceiver:
    def __init__(self, routes: Sequence[Route], host: str = "127.0.0.1", port: int = 0,
                 record_to: Path | None = None) -> None:
        self.routes = sorted(routes, key=lambda r: len(r.prefix), reverse=True)
        self.record_to = record_to
        self._records: list[Received] = []
        self._lock = threading.Condition()
        self._server = BackgroundHTTPServer(self._handler_class(), host, port, name="webhook-rx")

    @property
    def base_url(self) -> str:
        return self._server.base_url

    def url(self, path: str) -> str:
        return self.base_url + path

    def start(self) -> WebhookReceiver:
        self._server.start()
        return self

    def stop(self) -> None:
        self._server.stop()

    def __enter__(self) -> WebhookReceiver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def records(self, route: str | None = None) -> list[Received]:
        with self._lock:
            return [r for r in self._records if route is None or r.route == route]

    def wait_for(self, done: Callable[[list[Received]], bool], timeout_s: float) -> bool:
        """Block until ``done(records)`` holds; False on timeout."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while not done(list(self._records)):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._lock.wait(min(left, 0.2))
            return True

    def _record(self, rec: Received) -> None:
        with self._lock:
            self._records.append(rec)
            if self.record_to is not None:
                doc = asdict(rec)
                doc["body"] = rec.text()
                with open(self.record_to, "a") as fh:
                    fh.write(json.dumps(doc) + "\n")
            self._lock.notify_all()

    def _route(self, path: str) -> Route | None:
        return next((r for r in self.routes if path.startswith(r.prefix)), None)

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length)
                split = urlsplit(self.path)
                route = receiver._route(split.path)
                rec = Received(route=route.name if route else "", path=split.path,
                               query=dict(parse_qsl(split.query)),
                               headers={k.lower(): v for k, v in self.headers.items()},
                               body=body, received_at=time.time())
                if route is None:
                    receiver._record(rec)
                    self._answer(404, b'{"error": "no such route"}')
                    return
                route.served += 1
                if route.served <= route.fail_first:
                    receiver._record(rec)
                    self._answer(500, b'{"error": "induced failure"}')
                    return
                problem = None
                if route.check is not None:
                    try:
                        problem = route.check(rec)
                    except (ValueError, KeyError, TypeError, AttributeError) as err:
                        problem = f"unreadable request: {type(err).__name__}"
                rec = Received(**{**rec.__dict__, "verified": (
                    None if route.check is None else problem is None), "problem": problem})
                receiver._record(rec)
                if problem is None:
                    self._answer(route.status, route.reply)
                else:
                    self._answer(200, route.refusal)

            def _answer(self, status: int, body: bytes) -> None:
                self.send_response(status)
                ctype = "application/json" if body[:1] in (b"{", b"[") else "text/plain"
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass  # tests read the records, not stderr

        return Handler
