"""The suite's HTTP clients let an idle connection go before the server closes it, so that no request is ever sent
on a socket the server is closing (a lost request the box is not to blame for)."""

import socket
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from sparkgate.httpclient import KEEPALIVE_S, SERVER_KEEPALIVE_S, limits


def test_the_servers_keepalive_is_vllms_own():
    """The server-side figure the rule is built on MUST be the default of the vLLM installed here."""
    import vllm.envs

    assert vllm.envs.VLLM_HTTP_TIMEOUT_KEEP_ALIVE == SERVER_KEEPALIVE_S
    assert KEEPALIVE_S < SERVER_KEEPALIVE_S


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    """A real uvicorn server that closes idle connections as vLLM's does, answering with the client's port (which
    names the connection a request came on)."""
    async def port(request: Request) -> PlainTextResponse:
        return PlainTextResponse(str(request.client.port))

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))  # bound here and handed over: no other process can take the port in between
    config = uvicorn.Config(Starlette(routes=[Route("/", port)]), timeout_keep_alive=SERVER_KEEPALIVE_S,
                            log_level="warning")
    srv = uvicorn.Server(config)
    thread = threading.Thread(target=srv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not srv.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    srv.should_exit = True
    thread.join(10)
    sock.close()


def ports_after_idle(url: str, client_limits: httpx.Limits, idle_s: float) -> tuple[str, str]:
    with httpx.Client(base_url=url, limits=client_limits) as client:
        first = client.get("/").text
        time.sleep(idle_s)
        return first, client.get("/").text


def test_a_connection_idle_past_the_clients_keepalive_is_opened_anew(server):
    """After an idle between the client's keep-alive and the server's, the next request MUST go on a new connection
    (httpx's default would send it on the one the server is about to close, as the second pair shows)."""
    idle = (KEEPALIVE_S + SERVER_KEEPALIVE_S) / 2
    first, second = ports_after_idle(server, limits(), idle)
    assert first != second
    first, second = ports_after_idle(server, httpx.Limits(), idle)
    assert first == second  # the race this rule removes: reused 3.5 s into the server's 5 s
