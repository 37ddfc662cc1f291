"""`rollout codec-server`: decodes (and encodes) payloads for the Temporal UI and CLI.

Why: every payload in history is encrypted (`rollout_client.codec`), so the UI and
`temporal workflow show` show ciphertext. Pointed at this server (the UI's codec
endpoint setting, `temporal server start-dev --ui-codec-endpoint URL`, or
`temporal workflow show --codec-endpoint URL`), they show the plain payloads to
whoever can reach it. It speaks Temporal's remote-codec protocol: POST ``/decode`` and
``/encode`` with ``{"payloads": [...]}`` (proto JSON) in and out. It holds the key:
bind it to loopback (default) or put it behind your own authentication.
"""

from collections.abc import Sequence
from typing import Any

from google.protobuf import json_format
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from temporalio.api.common.v1 import Payloads

from rollout_client.codec import EncryptionCodec, PayloadKeyError


def codec_app(keys: Sequence[bytes], ui_origins: Sequence[str] = ()) -> Starlette:
    """The ASGI app; `ui_origins` are the browser origins (Temporal UI) allowed by CORS."""
    codec = EncryptionCodec(keys)

    async def convert(request: Request, decode: bool) -> Response:
        try:
            body = await request.json()
            payloads = json_format.ParseDict(body, Payloads()).payloads
        except (ValueError, json_format.ParseError) as exc:
            return JSONResponse({"error": f"body is not {{'payloads': [...]}}: {exc}"}, 400)
        try:
            out = await (codec.decode(payloads) if decode else codec.encode(payloads))
        except PayloadKeyError as exc:
            return JSONResponse({"error": str(exc)}, 422)
        doc: dict[str, Any] = json_format.MessageToDict(Payloads(payloads=out))
        return JSONResponse({"payloads": doc.get("payloads", [])})

    async def decode(request: Request) -> Response:
        return await convert(request, decode=True)

    async def encode(request: Request) -> Response:
        return await convert(request, decode=False)

    middleware = [
        Middleware(
            CORSMiddleware,
            allow_origins=list(ui_origins),
            allow_methods=["POST"],
            allow_headers=["content-type", "x-namespace", "authorization"],
            allow_credentials=True,
        )
    ]
    return Starlette(
        routes=[
            Route("/decode", decode, methods=["POST"]),
            Route("/encode", encode, methods=["POST"]),
        ],
        middleware=middleware,
    )
