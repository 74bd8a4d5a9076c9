"""faust's web view of the streams worker listens on loopback unless told otherwise."""

from __future__ import annotations

import asyncio
import socket

import pytest

from trainguard.bus.config import KafkaConfig
from trainguard.cli.main import build_parser
from trainguard.rules import engine_factory, load_default_rules
from trainguard.streams.app import build_app


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _listening_on(web_addr: str | None = None) -> set[str]:
    cfg = KafkaConfig(bootstrap="127.0.0.1:1", topic_prefix="tweb")
    engines = engine_factory(load_default_rules())
    app = (build_app(cfg, engines, partitions=1, web_port=_free_port()) if web_addr is None
           else build_app(cfg, engines, partitions=1, web_port=_free_port(), web_addr=web_addr))

    async def serve() -> set[str]:
        web = app.web
        await web.start_server()
        try:
            return {str(addr[0]) for addr in web._runner.addresses}
        finally:
            await web.stop_server()

    return asyncio.run(serve())


def test_the_web_view_binds_loopback_by_default() -> None:
    assert _listening_on() == {"127.0.0.1"}


def test_the_web_view_binds_what_it_is_told() -> None:
    assert _listening_on(web_addr="0.0.0.0") == {"0.0.0.0"}


def test_the_cli_flag_and_env_choose_the_address(monkeypatch: pytest.MonkeyPatch) -> None:
    assert build_parser().parse_args(["streams"]).http_addr == "127.0.0.1"
    monkeypatch.setenv("TRAINGUARD_STREAMS_WEB_ADDR", "::1")
    assert build_parser().parse_args(["streams"]).http_addr == "::1"
    assert build_parser().parse_args(["streams", "--http-addr", "10.0.0.5"]).http_addr == "10.0.0.5"
