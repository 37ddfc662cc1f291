"""The engine client's connection pool (`gateway.engine_pool`) over a real loopback HTTP
server: concurrent calls get their own connections, released connections are reused, a
connection the server closes is dropped, not reused, and a streamed body hands its
connection back only once it is closed."""

import asyncio

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from devstack.background_server import BackgroundServer
from gateway.engine_pool import EngineTransport, IdleStackPool


async def echo(request: Request) -> Response:
    await asyncio.sleep(0.05)  # keep calls overlapping
    return JSONResponse({"got": (await request.json())["n"]})


async def closing(request: Request) -> Response:
    return JSONResponse({"closing": True}, headers={"connection": "close"})


async def stream(request: Request) -> Response:
    async def parts():  # type: ignore[no-untyped-def]
        for i in range(3):
            yield f"part {i}\n".encode()

    return StreamingResponse(parts(), media_type="text/plain")


async def port(request: Request) -> Response:
    assert request.client is not None
    return JSONResponse({"port": request.client.port})


APP = Starlette(
    routes=[
        Route("/port", port, methods=["GET"]),
        Route("/echo", echo, methods=["POST"]),
        Route("/close", closing, methods=["GET"]),
        Route("/stream", stream, methods=["GET"]),
    ]
)


async def exercise(url: str) -> None:
    pool = IdleStackPool()
    async with httpx.AsyncClient(transport=EngineTransport(pool), base_url=url) as client:
        replies = await asyncio.gather(*(client.post("/echo", json={"n": n}) for n in range(20)))
        assert [r.json()["got"] for r in replies] == list(range(20))
        opened = pool.open_connections
        assert 1 <= opened <= 20
        # A second wave, one call at a time, reuses what the first opened.
        for n in range(10):
            assert (await client.post("/echo", json={"n": n})).json() == {"got": n}
        assert pool.open_connections == opened
        # The server closes this one after answering: it is dropped, the next call works.
        assert (await client.get("/close")).json() == {"closing": True}
        assert pool.open_connections == opened - 1
        assert (await client.post("/echo", json={"n": 7})).json() == {"got": 7}
        # A streamed body keeps its connection until it is closed.
        async with client.stream("GET", "/stream") as reply:
            busy = pool.open_connections
            assert [line async for line in reply.aiter_lines()] == [
                "part 0", "part 1", "part 2",
            ]  # fmt: skip
        assert pool.open_connections == busy
        assert (await client.post("/echo", json={"n": 1})).json() == {"got": 1}
        assert pool.open_connections == busy
    assert pool.open_connections == 0  # the client's close closes every connection


def test_pool_reuses_drops_and_releases_connections() -> None:
    with BackgroundServer(APP) as server:
        asyncio.run(exercise(server.url))


async def refused(url: str) -> None:
    async with httpx.AsyncClient(transport=EngineTransport()) as client:
        try:
            await client.get(url)
        except httpx.ConnectError:
            return
    raise AssertionError("a refused connection must raise httpx.ConnectError")


def test_a_refused_connection_is_httpx_connect_error() -> None:
    """The engine client retries exactly this exception type (connect-only retries)."""
    with BackgroundServer(APP) as server:
        url = server.url
    asyncio.run(refused(url))


async def expiring(url: str) -> None:
    pool = IdleStackPool(keepalive_expiry_s=0.05)
    async with httpx.AsyncClient(transport=EngineTransport(pool), base_url=url) as client:
        first = (await client.get("/port")).json()["port"]
        assert (await client.get("/port")).json()["port"] == first  # reused at once
        await asyncio.sleep(0.2)
        assert (await client.get("/port")).json()["port"] != first  # expired: a new one
        assert pool.open_connections == 1


def test_an_idle_connection_past_its_keepalive_is_not_reused() -> None:
    """Engines close idle connections after 5 s; the pool gives them up first (2 s), so a
    call is never sent on a connection the engine is closing."""
    with BackgroundServer(APP) as server:
        asyncio.run(expiring(server.url))
