"""Gateway errors: one exception type, rendered in each caller's own protocol shape.

Every failure the agent can see is a `GatewayError` with a machine `kind`; the HTTP status
comes from the table here, keyed by that kind. Each protocol renders it in its own shape
with its own kind → error `type` table (`gateway.protocols.<name>.reply`), so adding a
protocol touches nothing here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

ErrorKind = Literal[
    "invalid_request",
    "authentication",
    "forbidden",
    "not_found",
    "method_not_allowed",
    "conflict",
    "idempotency_mismatch",
    "too_large",
    "unsupported_media_type",
    "request_timeout",
    "rate_limited",
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
    """Per-kind defaults: the HTTP status."""

    status: int


KINDS: dict[str, KindSpec] = {
    "invalid_request": KindSpec(400),
    "authentication": KindSpec(401),
    "forbidden": KindSpec(403),
    "not_found": KindSpec(404),
    "method_not_allowed": KindSpec(405),
    "conflict": KindSpec(409),
    "idempotency_mismatch": KindSpec(409),
    "too_large": KindSpec(413),
    "unsupported_media_type": KindSpec(415),
    "request_timeout": KindSpec(408),
    "rate_limited": KindSpec(429),
    "overloaded": KindSpec(503),
    "engine_unavailable": KindSpec(503),
    "engine_timeout": KindSpec(504),
    "engine_bad_reply": KindSpec(502),
    "storage_unavailable": KindSpec(503),
    "corrupt_record": KindSpec(500),
    "internal": KindSpec(500),
}
"""Kind → defaults. `overloaded` may be raised as 429 or 503 (explicit `status`).
`conflict` is a state that may pass (closed, served elsewhere); `idempotency_mismatch` (a
key reused with another config) never does, so callers retry only the former.
`rate_limited` is a session's own limit (its calls in flight), `overloaded` the gateway's."""


LIMIT_HEADER = "X-Rollout-Limit"
"""Response header naming the limit that refused a request (its flag's and field's name)."""


class GatewayError(Exception):
    """A failure with a meaningful status, safe to show to the agent.

    `retry_after` (seconds) becomes a `Retry-After` header so well-behaved clients back off
    instead of hammering an overloaded engine. `allow` (methods) becomes an `Allow` header,
    which a 405 must carry. `limit` names the configured limit that refused the request
    (`X-Rollout-Limit`, and the refusal metric); `close` ends the connection after the
    reply (a body that will not be read to its end).
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
        limit: str | None = None,
        close: bool = False,
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
        self.limit = limit
        self.close = close

    def headers(self) -> dict[str, str]:
        """HTTP headers to send with the error response (Retry-After in whole seconds)."""
        out: dict[str, str] = {}
        if self.retry_after is not None:
            out["Retry-After"] = str(max(0, math.ceil(self.retry_after)))
        if self.allow is not None:
            out["Allow"] = self.allow
        if self.limit is not None:
            out[LIMIT_HEADER] = self.limit
        if self.close:
            out["Connection"] = "close"
        return out

    def __reduce__(self) -> tuple[object, ...]:
        """Pickled whole (a worker process raises it: `http.body_parse`)."""
        kw = {k: getattr(self, k) for k in ("status", "param", "retry_after", "allow", "limit")}
        return (_rebuilt, (self.kind, self.message, {**kw, "close": self.close}))

    def __repr__(self) -> str:
        return f"GatewayError({self.status} {self.kind}: {self.message!r}, param={self.param!r})"


def _rebuilt(kind: ErrorKind, message: str, kw: dict[str, object]) -> GatewayError:
    return GatewayError(kind, message, **kw)  # type: ignore[arg-type]


def body_too_large(what: str, limit: int) -> GatewayError:
    """413 for a request body past `max_body_bytes` (the rest of it is discarded as it
    comes, never kept)."""
    return GatewayError(
        "too_large", f"{what}; its limit is max_body_bytes={limit}", limit="max_body_bytes"
    )


def body_timed_out(timeout_s: float, read: int) -> GatewayError:
    """408 for a body that did not arrive whole within `body_timeout_s` of its headers; the
    connection is closed after it, so a trickling client holds nothing longer."""
    return GatewayError(
        "request_timeout",
        f"the body did not arrive within body_timeout_s={timeout_s:g} ({read} bytes read); "
        "send it whole, at once",
        limit="body_timeout_s",
        close=True,
    )
