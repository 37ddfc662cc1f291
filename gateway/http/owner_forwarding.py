"""One advertised address for N gateway processes: a call that lands on a process that
does not own its session is relayed to the owner.

Every process listens on the shared port (SO_REUSEPORT: the kernel spreads connections
over them) besides its own private agent port, and session base URLs name the shared
port. A session lives in one process (its held tokens, its lock, its retry answers), so
the process a connection reaches looks at the session id in the API key: its own (or
unknown, or malformed: the local app answers as usual) is served here; another process's
is relayed as bytes to that owner's private port (the `owner_url` in the session's meta on
the shared data dir), the reply — streams included — relayed back as it comes. The private
ports never relay, so a relayed call cannot bounce, and a call is recorded only by the
owner. An owner that cannot be reached (restarting) is a 503 with Retry-After in the
caller's protocol, which SDKs retry.
"""

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from typing import Any

import httpx
from prometheus_client import Counter

from gateway.calls.pipeline import Gateway
from gateway.errors import GatewayError, body_timed_out, body_too_large

log = logging.getLogger("rollout.gateway")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
ErrorBody = Callable[[str], Callable[[GatewayError], Any]]

#: Request headers that describe one hop, not the request (and `host`, set per hop).
_HOP_HEADERS = frozenset(
    {b"host", b"connection", b"keep-alive", b"transfer-encoding", b"te", b"upgrade",
     b"proxy-connection", b"content-length"}
)  # fmt: skip
OWNER_RETRY_AFTER_S = 1.0


def session_id_of(headers: list[tuple[bytes, bytes]]) -> str | None:
    """The session id in the API key (`Authorization: Bearer <id>.<secret>` or `x-api-key`)."""
    token: bytes | None = None
    for name, value in headers:
        if name == b"authorization" and value[:7].lower() == b"bearer ":
            token = value[7:].strip()
            break
        if name == b"x-api-key" and token is None:
            token = value.strip()
    if not token:
        return None
    session_id, dot, _ = token.partition(b".")
    return session_id.decode("latin-1") if dot and session_id else None


class OwnerForwarder:
    """ASGI app for the shared listener: `app` for this process's sessions, a relay to the
    owner's private listener for the others'."""

    def __init__(
        self,
        app: ASGIApp,
        gateway: Gateway,
        error_response_for: ErrorBody,
        max_body_bytes: int,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        self.app = app
        self.gateway = gateway
        self.error_response_for = error_response_for
        self.max_body_bytes = max_body_bytes
        self.client = client or httpx.AsyncClient(
            timeout=httpx.Timeout(None, connect=5.0),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=512),
        )
        #: session id → owner's agent URL, for sessions owned elsewhere (never changes).
        self._owners: dict[str, str] = {}
        self.forwarded = Counter(
            "rollout_gateway_forwarded_calls",
            "Agent calls that reached this process on the shared port and were relayed to "
            "the process owning their session.",
            registry=gateway.metrics.registry,
        )

    def owner_elsewhere(self, session_id: str) -> str | None:
        """The owner's URL if another process owns `session_id`; None to serve it here."""
        if session_id in self.gateway.sessions:
            return None
        owner = self._owners.get(session_id)
        if owner is not None:
            return owner
        store = self.gateway.store
        if not store.exists(session_id):
            return None
        try:
            owner = store.load_meta(session_id).owner_url
        except (OSError, ValueError):
            return None  # the local app reports it
        if owner is None or owner == self.gateway.options.public_url:
            return None
        self._owners[session_id] = owner.rstrip("/")
        return self._owners[session_id]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        session_id = session_id_of(scope["headers"])
        owner = self.owner_elsewhere(session_id) if session_id else None
        if owner is None:
            await self.app(scope, receive, send)
            return
        await self._relay(owner, scope, receive, send)

    async def _read_body(self, receive: Receive) -> bytes | GatewayError:
        """The request body, or the error to answer: past `max_body_bytes` (the owner would
        refuse it), or not whole within `body_timeout_s` (a trickling client)."""
        chunks: list[bytes] = []
        size = 0
        timeout = self.gateway.options.body_timeout_s
        try:
            async with asyncio.timeout(timeout):
                while True:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        return b"".join(chunks)
                    chunk = message.get("body", b"")
                    size += len(chunk)
                    if size > self.max_body_bytes:
                        return body_too_large(
                            f"body exceeds {self.max_body_bytes} bytes", self.max_body_bytes
                        )
                    chunks.append(chunk)
                    if not message.get("more_body", False):
                        return b"".join(chunks)
        except TimeoutError:
            return body_timed_out(timeout, size)

    async def _relay(self, owner: str, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope["path"]
        body = await self._read_body(receive)
        if isinstance(body, GatewayError):
            await self._error(path, body, scope, receive, send)
            return
        query = scope.get("query_string", b"")
        url = f"{owner}{scope.get('raw_path', path.encode()).decode('latin-1')}"
        if query and "?" not in url:
            url += "?" + query.decode("latin-1")
        headers = [(k, v) for k, v in scope["headers"] if k not in _HOP_HEADERS]
        request = self.client.build_request(scope["method"], url, headers=headers, content=body)
        try:
            reply = await self.client.send(request, stream=True)
        except httpx.TransportError as exc:
            log.warning("cannot relay %s to owner %s: %s", path, owner, exc)
            err = GatewayError(
                "engine_unavailable",
                "the gateway process that owns this session cannot be reached; retry",
                retry_after=OWNER_RETRY_AFTER_S,
            )
            await self._error(path, err, scope, receive, send)
            return
        self.forwarded.inc()
        try:
            out = [
                (k.lower(), v)
                for k, v in reply.headers.raw
                if k.lower() not in (b"connection", b"keep-alive", b"transfer-encoding")
            ]
            await send({"type": "http.response.start", "status": reply.status_code, "headers": out})
            async for chunk in _raw(reply):
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            await reply.aclose()

    async def _error(
        self, path: str, err: GatewayError, scope: Scope, receive: Receive, send: Send
    ) -> None:
        metrics = self.gateway.metrics
        metrics.errors.labels(str(err.status), err.kind).inc()
        if err.limit is not None:
            metrics.limit_refusals.labels(err.limit).inc()
        response = self.error_response_for(path)(err)
        await response(scope, receive, send)

    async def aclose(self) -> None:
        await self.client.aclose()


async def _raw(reply: httpx.Response) -> AsyncIterator[bytes]:
    """The owner's reply bytes exactly as sent (no decompression: headers pass through)."""
    async for chunk in reply.aiter_raw():
        if chunk:
            yield chunk
