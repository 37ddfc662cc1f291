"""The Gateway's HTTP surface: control API (admin token) and agent API (session token).

Every error leaves in the caller's protocol shape with a meaningful status; nothing an
agent can send yields a bare 500, and a failed request never touches recorded calls.
"""

import hmac
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from gateway import openai_chat
from gateway.core import Gateway
from gateway.errors import GatewayError, openai_error_body
from schemas.session import SessionConfig

log = logging.getLogger("rollout.gateway")

ErrorRenderer = Callable[[GatewayError], dict[str, Any]]
Handler = Callable[[Request], Awaitable[Response]]


def _validation_message(exc: ValidationError) -> tuple[str, str | None]:
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first.get("loc", ()))
    return (f"{where}: {first.get('msg')}" if where else str(first.get("msg"))), where or None


def _bearer(request: Request) -> str | None:
    auth = request.headers.get("authorization", "")
    if auth.lower().startswith("bearer "):
        return auth[7:].strip()
    return request.headers.get("x-api-key")


class GatewayApp:
    """Builds the Starlette app around one `Gateway` core."""

    def __init__(
        self, gateway: Gateway, admin_token: str | None, max_body_bytes: int = 32 * 2**20
    ) -> None:
        self.gateway = gateway
        self.admin_token = admin_token
        self.max_body_bytes = max_body_bytes

    # ------------------------------------------------------------------ plumbing
    async def _read_json(self, request: Request) -> dict[str, Any]:
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body_bytes:
            raise GatewayError(
                "too_large", f"body is {declared} bytes; the limit is {self.max_body_bytes}"
            )
        chunks: list[bytes] = []
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > self.max_body_bytes:
                raise GatewayError("too_large", f"body exceeds {self.max_body_bytes} bytes")
            chunks.append(chunk)
        try:
            body = json.loads(b"".join(chunks) or b"null")
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise GatewayError("invalid_request", f"body is not valid JSON: {exc}") from exc
        if not isinstance(body, dict):
            raise GatewayError("invalid_request", "body must be a JSON object")
        return body

    def _guard(self, handler: Handler, render: ErrorRenderer) -> Handler:
        async def guarded(request: Request) -> Response:
            try:
                return await handler(request)
            except GatewayError as err:
                err_out = err
            except ValidationError as exc:
                message, param = _validation_message(exc)
                err_out = GatewayError("invalid_request", message, param=param)
            except Exception:  # the last line of defence: never a bare 500 page
                log.exception("unhandled error on %s %s", request.method, request.url.path)
                err_out = GatewayError("internal", "internal gateway error (see gateway log)")
            self.gateway.metrics.errors.labels(str(err_out.status), err_out.kind).inc()
            return JSONResponse(render(err_out), err_out.status, headers=err_out.headers())

        return guarded

    def _require_admin(self, request: Request) -> None:
        if self.admin_token is None:
            return  # --insecure-dev on loopback
        given = _bearer(request) or ""
        if not hmac.compare_digest(given.encode(), self.admin_token.encode()):
            raise GatewayError("authentication", "admin token required for the control API")

    # ------------------------------------------------------------------ control API
    async def create_session(self, request: Request) -> Response:
        self._require_admin(request)
        config = SessionConfig.model_validate(await self._read_json(request))
        created = self.gateway.create_session(config)
        return JSONResponse(created.model_dump(), status_code=201)

    async def get_trajectory(self, request: Request) -> Response:
        self._require_admin(request)
        trajectory = self.gateway.trajectory(request.path_params["session_id"])
        return Response(trajectory.model_dump_json(), media_type="application/json")

    async def delete_session(self, request: Request) -> Response:
        self._require_admin(request)
        session_id = request.path_params["session_id"]
        self.gateway.close_session(session_id)
        return JSONResponse({"session_id": session_id, "closed": True})

    async def health(self, request: Request) -> Response:
        return JSONResponse({"status": "ok", "sessions": len(self.gateway.sessions)})

    async def metrics(self, request: Request) -> Response:
        return Response(
            generate_latest(self.gateway.metrics.registry), media_type=CONTENT_TYPE_LATEST
        )

    # ------------------------------------------------------------------ agent API
    async def chat_completions(self, request: Request) -> Response:
        session = self.gateway.authenticate(_bearer(request))
        body = await self._read_json(request)
        canonical = openai_chat.parse_chat_request(body, dict(request.headers), request.url.path)
        result = await self.gateway.complete(session, canonical, body)
        if canonical.stream:
            return StreamingResponse(
                openai_chat.chat_completion_sse(result, include_usage=canonical.include_usage),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache"},
            )
        return JSONResponse(openai_chat.chat_completion_body(result))

    async def models(self, request: Request) -> Response:
        self.gateway.authenticate(_bearer(request))
        opts = self.gateway.options
        return JSONResponse(
            {
                "object": "list",
                "data": [
                    {
                        "id": opts.model_name,
                        "object": "model",
                        "created": 0,
                        "owned_by": "agentic-rollout",
                        "max_model_len": opts.context_window,
                    }
                ],
            }
        )

    def build(self) -> Starlette:
        control = openai_error_body
        agent = openai_error_body
        routes = [
            Route("/sessions", self._guard(self.create_session, control), methods=["POST"]),
            Route(
                "/sessions/{session_id}/trajectory",
                self._guard(self.get_trajectory, control),
                methods=["GET"],
            ),
            Route(
                "/sessions/{session_id}",
                self._guard(self.delete_session, control),
                methods=["DELETE"],
            ),
            Route("/health", self.health, methods=["GET"]),
            Route("/metrics", self.metrics, methods=["GET"]),
            Route(
                "/v1/chat/completions", self._guard(self.chat_completions, agent), methods=["POST"]
            ),
            Route("/v1/models", self._guard(self.models, agent), methods=["GET"]),
        ]
        return Starlette(routes=routes)
