"""The background server answers small requests without Nagle's delay."""

import socket

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from devstack.background_server import BackgroundServer


async def ping(request: Request) -> JSONResponse:
    return JSONResponse({"ok": True})


def test_keep_alive_connections_do_not_wait_for_the_delayed_ack() -> None:
    """A reply written in two pieces (headers, body) waited ~40 ms for the delayed ACK when
    the accepted sockets lacked TCP_NODELAY: every test request through it paid that. So
    each connection the server accepted must have it (a property, not a timing: how long a
    round trip takes says more about a busy machine than about Nagle)."""
    app = Starlette(routes=[Route("/ping", ping)])
    with BackgroundServer(app) as server, httpx.Client(base_url=server.url) as client:
        for _ in range(3):
            assert client.get("/ping").status_code == 200
        (uvicorn_server, _), *_ = server._listeners
        connections = list(uvicorn_server.server_state.connections)
        assert len(connections) == 1, connections  # one keep-alive connection served all
        for connection in connections:
            sock = connection.transport.get_extra_info("socket")
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY), sock
