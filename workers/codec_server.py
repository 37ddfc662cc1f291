"""`rollout codec-server`: decodes (and encodes) payloads for the Temporal UI and CLI.

Why: every payload in history is encrypted (`rollout_client.codec`), so the UI and
`temporal workflow show` show ciphertext. Pointed at this server (the UI's codec
endpoint setting, `temporal server start-dev --ui-codec-endpoint URL`, or
`temporal workflow show --codec-endpoint URL`), they show the plain payloads. It speaks
Temporal's remote-codec protocol: POST ``/decode`` and ``/encode`` with
``{"payloads": [...]}`` (proto JSON) in and out.

It holds the key, so every request must prove it may use it, and a web page must not be
able to use it on a visitor's behalf:

- **Token.** ``Authorization: Bearer <token>`` (the CLI's ``--codec-auth``), or the
  cookie a browser gets from this server's ``/login`` page (the UI's "include
  cross-origin credentials" setting sends it along). Without a token the server only
  starts with an explicit insecure flag, and then only on loopback.
- **Host.** The ``Host`` header must name one of the allowed hosts, so a page whose own
  name was rebound to this address (DNS rebinding) is refused.
- **Origin.** A browser request from a page must come from an allowed UI origin (or
  this server's own `/login` page): a cross-site form or fetch cannot use the cookie.
"""

from __future__ import annotations

import hashlib
import hmac
import html
from collections.abc import Sequence
from typing import Any
from urllib.parse import parse_qs, urlsplit

from google.protobuf import json_format
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send
from temporalio.api.common.v1 import Payloads

from rollout_client.codec import EncryptionCodec, PayloadKeyError

#: The cookie the `/login` page sets; its value is derived from the token, never the token.
COOKIE = "rollout_codec"
#: Host names every loopback server answers to (any port).
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
_LOGIN_PAGE = """<!doctype html><title>rollout codec server</title>
<form method="post" action="login">
<p>Codec server token: <input type="password" name="token" autofocus>
<button>Sign in</button></p></form><p>{note}</p>"""


def host_name(value: str) -> str:
    """The host of a `Host` header or URL netloc, without port or IPv6 brackets."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1 : value.find("]")] if "]" in value else value
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


def _cookie_value(token: str) -> str:
    return hmac.new(token.encode(), b"codec-cookie", hashlib.sha256).hexdigest()


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status)


class _Guard:
    """ASGI middleware, outermost: Host, then Origin, then the token (preflight requests
    carry no credentials; CORS answers them inside once Host and Origin passed)."""

    def __init__(
        self,
        app: ASGIApp,
        token: str | None,
        allowed_hosts: Sequence[str],
        ui_origins: Sequence[str],
    ) -> None:
        self.app = app
        self.token = token
        self.hosts = {host_name(h) for h in allowed_hosts}
        self.origins = {o.rstrip("/").lower() for o in ui_origins}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        refusal = self._refusal(request)
        if refusal is not None:
            await refusal(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _refusal(self, request: Request) -> Response | None:
        host = request.headers.get("host", "")
        if host_name(host) not in self.hosts:
            return _error(421, f"Host {host!r} is not served here (allowed: {sorted(self.hosts)})")
        origin = request.headers.get("origin")
        if origin is not None and not self._origin_ok(origin.rstrip("/").lower(), host):
            return _error(403, f"Origin {origin!r} may not use this codec server")
        if request.method == "OPTIONS" or request.url.path == "/login" or self.token is None:
            return None
        if not self._authenticated(request):
            return _error(401, "missing or wrong codec server token (Authorization: Bearer …)")
        return None

    def _origin_ok(self, origin: str, host: str) -> bool:
        """An allowed UI origin, or this server's own page (same host and port)."""
        return origin in self.origins or urlsplit(origin).netloc == host.strip().lower()

    def _authenticated(self, request: Request) -> bool:
        assert self.token is not None
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(given.strip(), self.token):
            return True
        cookie = request.cookies.get(COOKIE, "")
        return hmac.compare_digest(cookie, _cookie_value(self.token))


def codec_app(
    keys: Sequence[bytes],
    ui_origins: Sequence[str] = (),
    *,
    token: str | None,
    allowed_hosts: Sequence[str] = LOOPBACK_HOSTS,
) -> Starlette:
    """The ASGI app. `ui_origins` are the browser origins (Temporal UI) allowed by CORS;
    `token` None serves without authentication (the CLI allows that only on loopback)."""
    codec = EncryptionCodec(keys)

    async def convert(request: Request, decode: bool) -> Response:
        try:
            body = await request.json()
            payloads = json_format.ParseDict(body, Payloads()).payloads
        except (ValueError, json_format.ParseError) as exc:
            return _error(400, f"body is not {{'payloads': [...]}}: {exc}")
        try:
            out = await (codec.decode(payloads) if decode else codec.encode(payloads))
        except PayloadKeyError as exc:
            return _error(422, str(exc))
        doc: dict[str, Any] = json_format.MessageToDict(Payloads(payloads=out))
        return JSONResponse({"payloads": doc.get("payloads", [])})

    async def decode(request: Request) -> Response:
        return await convert(request, decode=True)

    async def encode(request: Request) -> Response:
        return await convert(request, decode=False)

    async def login(request: Request) -> Response:
        """A browser signs in once: the cookie then rides along the UI's codec calls."""
        if token is None:
            return HTMLResponse(_LOGIN_PAGE.format(note="This server needs no token."))
        if request.method == "GET":
            return HTMLResponse(_LOGIN_PAGE.format(note=""))
        form = parse_qs((await request.body()).decode(errors="replace"))
        given = (form.get("token") or [""])[0].strip()
        if not hmac.compare_digest(given, token):
            return HTMLResponse(_LOGIN_PAGE.format(note="Wrong token."), 401)
        note = html.escape("Signed in: this browser's Temporal UI can now decode payloads.")
        page = HTMLResponse(_LOGIN_PAGE.format(note=note))
        secure = request.url.scheme == "https"
        page.set_cookie(
            COOKIE,
            _cookie_value(token),
            httponly=True,
            secure=secure,
            samesite="none" if secure else "strict",
        )
        return page

    middleware = [
        Middleware(_Guard, token=token, allowed_hosts=allowed_hosts, ui_origins=ui_origins),
        Middleware(
            CORSMiddleware,
            allow_origins=list(ui_origins),
            allow_methods=["POST"],
            allow_headers=["content-type", "x-namespace", "authorization"],
            allow_credentials=True,
        ),
    ]
    return Starlette(
        routes=[
            Route("/decode", decode, methods=["POST"]),
            Route("/encode", encode, methods=["POST"]),
            Route("/login", login, methods=["GET", "POST"]),
        ],
        middleware=middleware,
    )
