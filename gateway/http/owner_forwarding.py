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

The shared port is not a proxy: it takes only origin-form request targets (`/path?query`;
anything that could name another authority — `http://host/...`, `@host/...`, `//host`, a
backslash — is a 400), builds the upstream URL from the owner's address and the path as
separate parts, and relays only a token whose secret matches the session's (else the 401
the owner would give, without contacting it).
"""

import asyncio
import hmac
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

import httpx
from prometheus_client import Counter

from gateway.calls.pipeline import Gateway
from gateway.errors import GatewayError, body_timed_out, body_too_large
from gateway.sessions.live import hash_token

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


#: An origin-form path: one `/`, then visible ASCII without a backslash (nothing that a
#: URL parser could read as an authority); the query: visible ASCII without a backslash.
_ORIGIN_PATH = re.compile(rb"/(?!/)[!-\[\]-~]*")
_QUERY = re.compile(rb"[!-\[\]-~]*")


def session_token(headers: list[tuple[bytes, bytes]]) -> str | None:
    """The session token in the API key (`Authorization: Bearer <id>.<secret>` or
    `x-api-key`), if it has that shape."""
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
    return token.decode("latin-1") if dot and session_id else None


def origin_form(scope: Scope) -> bytes | None:
    """The request target (`/path` or `/path?query`) if it is origin-form, else None."""
    path: bytes = scope.get("raw_path") or scope["path"].encode()
    query: bytes = scope.get("query_string", b"")
    if not _ORIGIN_PATH.fullmatch(path) or not _QUERY.fullmatch(query):
        return None
    return path + b"?" + query if query else path


def upstream_url(owner: httpx.URL, target: bytes) -> httpx.URL | None:
    """`owner`'s scheme, host and port with the request's path and query (an origin-form
    `target`); None if httpx refuses the path, or the result names another authority."""
    try:
        url = owner.copy_with(raw_path=target)
    except httpx.InvalidURL:
        return None
    same = (url.scheme, url.host, url.port, url.userinfo) == (
        owner.scheme, owner.host, owner.port, owner.userinfo
    )  # fmt: skip
    return url if same else None


def _shape_path(scope: Scope) -> str:
    """The path a refused target names after any authority: picks the error's protocol."""
    path: str = scope["path"]
    if path.startswith("/") and not path.startswith("//"):
        return path
    return "/" + path.split("://", 1)[-1].lstrip("/").partition("/")[2]


@dataclass(frozen=True)
class Owner:
    """Where a session owned by another process lives, and its token's hash."""

    url: httpx.URL
    token_sha256: str


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
        #: session id → its owner, for sessions owned elsewhere (never changes).
        self._owners: dict[str, Owner] = {}
        self.forwarded = Counter(
            "rollout_gateway_forwarded_calls",
            "Agent calls that reached this process on the shared port and were relayed to "
            "the process owning their session.",
            registry=gateway.metrics.registry,
        )

    def owner_elsewhere(self, session_id: str) -> Owner | None:
        """The owner if another process owns `session_id`; None to serve it here."""
        if session_id in self.gateway.sessions:
            return None
        owner = self._owners.get(session_id)
        if owner is not None:
            return owner
        store = self.gateway.store
        if not store.exists(session_id):
            return None
        try:
            meta = store.load_meta(session_id)
            url = meta.owner_url
            if url is None or url == self.gateway.options.public_url:
                return None
            owner = Owner(httpx.URL(url.rstrip("/")), meta.token_sha256)
        except (OSError, ValueError, httpx.InvalidURL):
            return None  # the local app reports it
        self._owners[session_id] = owner
        return owner

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        target = origin_form(scope)
        if target is None:
            err = GatewayError("invalid_request", "the request target must be a path ('/...')")
            await self._error(_shape_path(scope), err, scope, receive, send)
            return
        token = session_token(scope["headers"])
        owner = self.owner_elsewhere(token.partition(".")[0]) if token else None
        if owner is None or token is None:
            await self.app(scope, receive, send)
            return
        if not hmac.compare_digest(owner.token_sha256, hash_token(token)):
            err = GatewayError("authentication", "invalid session token")
            await self._error(scope["path"], err, scope, receive, send)
            return
        url = upstream_url(owner.url, target)
        if url is None:
            err = GatewayError("invalid_request", "the request target is not a valid path")
            await self._error(scope["path"], err, scope, receive, send)
            return
        await self._relay(url, scope, receive, send)

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

    async def _relay(self, url: httpx.URL, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope["path"]
        body = await self._read_body(receive)
        if isinstance(body, GatewayError):
            await self._error(path, body, scope, receive, send)
            return
        headers = [(k, v) for k, v in scope["headers"] if k not in _HOP_HEADERS]
        request = self.client.build_request(scope["method"], url, headers=headers, content=body)
        try:
            reply = await self.client.send(request, stream=True)
        except httpx.TransportError as exc:
            log.warning("cannot relay %s to owner %s: %s", path, url.netloc.decode(), exc)
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
