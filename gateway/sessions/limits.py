"""Per-session limits: what one agent may take of its gateway process.

An agent is untrusted. Without limits one session could hold every engine slot (many calls
at once) or fill the data dir (huge requests, endless calls) and starve the sessions of
every other rollout. Each limit has a process default (`GatewayOptions.session_max_*`, the
`rollout gateway --session-max-…` flags) that a session's create may override
(`SessionConfig.limits`). A refusal is a `GatewayError` that names its limit and comes
before anything of the call is recorded, so the session's records stay as they were.
"""

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from gateway.errors import GatewayError
from gateway.options import GatewayOptions
from gateway.sessions.live import LiveSession
from schemas.session import SessionConfig

CONCURRENCY_RETRY_AFTER_S = 1.0
"""What a call over `max_concurrent_calls` is told to wait: about one short call."""


@dataclass(frozen=True)
class Limits:
    """A session's limits, its own where its create set them, else the process's."""

    max_concurrent_calls: int
    max_stored_request_bytes: int
    max_stored_bytes: int


def limits_of(config: SessionConfig, options: GatewayOptions) -> Limits:
    asked = config.limits
    return Limits(
        max_concurrent_calls=asked.max_concurrent_calls or options.session_max_concurrent_calls,
        max_stored_request_bytes=(
            asked.max_stored_request_bytes
            if asked.max_stored_request_bytes is not None
            else options.session_max_stored_request_bytes
        ),
        max_stored_bytes=asked.max_stored_bytes or options.session_max_stored_bytes,
    )


@contextmanager
def call_slot(session: LiveSession, limits: Limits) -> Iterator[None]:
    """Hold one of the session's call slots for a call's whole life (a streamed call's
    included, after its client left); 429 with `Retry-After` when none is free.

    Refused at once rather than queued: a waiting call would hold its connection and body,
    the very things the limit bounds, and agent SDKs already back off on a 429."""
    limit = limits.max_concurrent_calls
    if session.inflight >= limit:
        raise GatewayError(
            "rate_limited",
            f"session {session.meta.session_id} already has {session.inflight} calls in "
            f"flight, its limit max_concurrent_calls={limit}; retry when one has finished",
            retry_after=CONCURRENCY_RETRY_AFTER_S,
            limit="max_concurrent_calls",
        )
    session.inflight += 1
    try:
        yield
    finally:
        session.inflight -= 1


def check_room(session_id: str, stored: int, adding: int, limits: Limits) -> None:
    """413 when `adding` bytes of request on top of the `stored` bytes of the session's
    records would pass `max_stored_bytes`. Checked before the engine runs, so what is
    sampled is always kept: the records may pass the limit by the calls then in flight."""
    limit = limits.max_stored_bytes
    if stored + adding > limit:
        raise GatewayError(
            "too_large",
            f"session {session_id} has {stored} bytes of records and this request would add "
            f"{adding}, past its limit max_stored_bytes={limit}; its records are kept, "
            "no further call fits",
            limit="max_stored_bytes",
        )
