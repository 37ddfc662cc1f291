"""The engine client's connection pool: constant work per call, however many calls are in
flight.

httpx's default pool (httpcore's `AsyncConnectionPool`) re-matches every queued request
against every connection whenever a request starts or a response is closed: work per call
that grows with the calls in flight. Under `bench/gateway_load.py` with 500 sessions a
gateway process spent a third of its CPU there (py-spy). Here each engine origin keeps a
stack of idle keep-alive connections: a call takes the most recently used one (or opens
one), and closing its response puts the connection back. The connections are httpcore's
and the transport is httpx's own, so the wire behaviour, timeouts, streaming and the
mapping of transport errors to `httpx` exceptions stay exactly as they were.
"""

from collections.abc import AsyncIterator

import httpcore
import httpx


class IdleStackPool:
    """An httpcore-compatible pool (`handle_async_request`, `aclose`) for HTTP/1.1 to a few
    origins. Concurrency is bounded by the caller (the gateway's engine slots)."""

    def __init__(self, max_idle_per_origin: int = 1024, keepalive_expiry_s: float = 2.0) -> None:
        """`keepalive_expiry_s` is well below the engines' own idle timeout (uvicorn's and
        vLLM's is 5 s), so we drop an idle connection before the engine does, even when
        this process's loop runs seconds late: a call sent on a connection the engine is
        closing fails, and cannot be retried safely."""
        self.max_idle_per_origin = max_idle_per_origin
        self.keepalive_expiry_s = keepalive_expiry_s
        #: (scheme, host, port) → idle connections, most recently released last.
        self._idle: dict[tuple[bytes, bytes, int], list[httpcore.AsyncHTTPConnection]] = {}
        self._open: set[httpcore.AsyncHTTPConnection] = set()

    def _new(self, origin: httpcore.Origin) -> httpcore.AsyncHTTPConnection:
        connection = httpcore.AsyncHTTPConnection(
            origin=origin, keepalive_expiry=self.keepalive_expiry_s
        )
        self._open.add(connection)
        return connection

    async def _idle_connection(self, origin: httpcore.Origin) -> httpcore.AsyncHTTPConnection:
        """The most recently released live connection to `origin`, else a new one."""
        stack = self._idle.get(_key(origin))
        while stack:
            connection = stack.pop()
            if connection.is_closed() or connection.has_expired():
                await self._drop(connection)
                continue
            return connection
        return self._new(origin)

    async def _drop(self, connection: httpcore.AsyncHTTPConnection) -> None:
        self._open.discard(connection)
        await connection.aclose()

    async def _release(
        self, origin: httpcore.Origin, connection: httpcore.AsyncHTTPConnection
    ) -> None:
        """After a response is closed: back on the stack if it can carry another request."""
        stack = self._idle.setdefault(_key(origin), [])
        if connection.is_idle() and len(stack) < self.max_idle_per_origin:
            stack.append(connection)
        else:
            await self._drop(connection)
        # The bottom of the stack is the longest idle: close it once expired, a little at
        # every release, so a burst's connections do not stay open after it.
        for _ in range(2):
            if len(stack) > 1 and (stack[0].is_closed() or stack[0].has_expired()):
                await self._drop(stack.pop(0))

    async def handle_async_request(self, request: httpcore.Request) -> httpcore.Response:
        origin = request.url.origin
        while True:
            connection = await self._idle_connection(origin)
            try:
                response = await connection.handle_async_request(request)
            except httpcore.ConnectionNotAvailable:
                await self._drop(connection)  # went stale since its release: take another
                continue
            except BaseException:
                await self._drop(connection)
                raise
            return httpcore.Response(
                status=response.status,
                headers=response.headers,
                content=_ReleasingStream(response, origin, connection, self),
                extensions=response.extensions,
            )

    @property
    def open_connections(self) -> int:
        """Connections opened and not yet dropped (idle or carrying a call)."""
        return len(self._open)

    async def aclose(self) -> None:
        connections, self._open = self._open, set()
        self._idle.clear()
        for connection in connections:
            await connection.aclose()

    # httpx enters and exits its transport's pool with the client
    async def __aenter__(self) -> "IdleStackPool":
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


def _key(origin: httpcore.Origin) -> tuple[bytes, bytes, int]:
    return origin.scheme, origin.host, origin.port


class _ReleasingStream:
    """A response body that hands its connection back to the pool when closed."""

    def __init__(
        self,
        response: httpcore.Response,
        origin: httpcore.Origin,
        connection: httpcore.AsyncHTTPConnection,
        pool: IdleStackPool,
    ) -> None:
        self._response = response
        self._origin = origin
        self._connection = connection
        self._pool = pool
        self._released = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for part in self._response.aiter_stream():
            yield part

    async def aclose(self) -> None:
        if self._released:
            return
        self._released = True
        try:
            await self._response.aclose()
        finally:
            await self._pool._release(self._origin, self._connection)


class EngineTransport(httpx.AsyncHTTPTransport):
    """httpx's transport (request/response mapping, error mapping) on an `IdleStackPool`."""

    def __init__(self, pool: IdleStackPool | None = None) -> None:
        super().__init__()
        self._pool = pool or IdleStackPool()  # type: ignore[assignment]  # same interface
