"""The background server answers small requests without Nagle's delay."""

import statistics
import time

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from devstack.background_server import BackgroundServer


async def ping(request: Request) -> JSONResponse:
    return JSONResponse({"ok": True})


def test_keep_alive_round_trips_take_milliseconds_not_the_delayed_ack() -> None:
    """A reply written in two pieces (headers, body) waited ~40 ms for the delayed ACK when
    the accepted sockets lacked TCP_NODELAY: every test request through it paid that."""
    app = Starlette(routes=[Route("/ping", ping)])
    with BackgroundServer(app) as server, httpx.Client(base_url=server.url) as client:
        client.get("/ping")
        times = []
        for _ in range(20):
            start = time.perf_counter()
            assert client.get("/ping").status_code == 200
            times.append(time.perf_counter() - start)
    assert statistics.median(times) < 0.02, times
