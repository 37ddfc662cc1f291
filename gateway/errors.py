"""Gateway errors: one exception type, rendered in each caller's own protocol shape.

Every failure the agent can see is a `GatewayError` with a machine `kind`; the HTTP status
and each protocol's error `type` come from tables keyed by that kind, so adding a protocol
(e.g. Anthropic Messages) is one more table column plus one body function.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

ErrorKind = Literal[
    "invalid_request",
    "authentication",
    "not_found",
    "method_not_allowed",
    "conflict",
    "idempotency_mismatch",
    "too_large",
    "unsupported_media_type",
    "overloaded",
    "engine_unavailable",
    "engine_timeout",
    "engine_bad_reply",
    "storage_unavailable",
    "corrupt_record",
    "internal",
]


@dataclass(frozen=True)
class KindSpec:
    """Per-kind defaults: HTTP status and the OpenAI error `type` string."""

    status: int
    openai_type: str


KINDS: dict[str, KindSpec] = {
    "invalid_request": KindSpec(400, "invalid_request_error"),
    "authentication": KindSpec(401, "authentication_error"),
    "not_found": KindSpec(404, "not_found_error"),
    "method_not_allowed": KindSpec(405, "invalid_request_error"),
    "conflict": KindSpec(409, "conflict_error"),
    "idempotency_mismatch": KindSpec(409, "conflict_error"),
    "too_large": KindSpec(413, "invalid_request_error"),
    "unsupported_media_type": KindSpec(415, "invalid_request_error"),
    "overloaded": KindSpec(503, "server_error"),
    "engine_unavailable": KindSpec(503, "server_error"),
    "engine_timeout": KindSpec(504, "server_error"),
    "engine_bad_reply": KindSpec(502, "server_error"),
    "storage_unavailable": KindSpec(503, "server_error"),
    "corrupt_record": KindSpec(500, "server_error"),
    "internal": KindSpec(500, "server_error"),
}
"""Kind → defaults. `overloaded` may be raised as 429 or 503 (explicit `status`).
`conflict` is a state that may pass (closed, served elsewhere); `idempotency_mismatch` (a
key reused with another config) never does, so callers retry only the former."""


class GatewayError(Exception):
    """A failure with a meaningful status, safe to show to the agent.

    `retry_after` (seconds) becomes a `Retry-After` header so well-behaved clients back off
    instead of hammering an overloaded engine. `allow` (methods) becomes an `Allow` header,
    which a 405 must carry.
    """

    def __init__(
        self,
        kind: ErrorKind,
        message: str,
        *,
        status: int | None = None,
        param: str | None = None,
        retry_after: float | None = None,
        allow: str | None = None,
    ) -> None:
        if kind not in KINDS:
            raise ValueError(f"unknown error kind {kind!r}")
        super().__init__(message)
        self.kind: ErrorKind = kind
        self.message = message
        self.status = status if status is not None else KINDS[kind].status
        self.param = param
        self.retry_after = retry_after
        self.allow = allow

    def headers(self) -> dict[str, str]:
        """HTTP headers to send with the error response (Retry-After in whole seconds)."""
        out: dict[str, str] = {}
        if self.retry_after is not None:
            out["Retry-After"] = str(max(0, math.ceil(self.retry_after)))
        if self.allow is not None:
            out["Allow"] = self.allow
        return out

    def __repr__(self) -> str:
        return f"GatewayError({self.status} {self.kind}: {self.message!r}, param={self.param!r})"


def openai_error_body(err: GatewayError) -> dict[str, Any]:
    """OpenAI's error JSON: `{"error": {"message", "type", "param", "code"}}`.

    `code` carries our machine kind so callers can branch without parsing messages.
    """
    return {
        "error": {
            "message": err.message,
            "type": KINDS[err.kind].openai_type,
            "param": err.param,
            "code": err.kind,
        }
    }
