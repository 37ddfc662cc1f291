"""Per-session limits: what one agent may take of its gateway process.

An agent is untrusted. Without limits one session could hold every engine slot (many calls
at once) or fill the data dir (huge requests, endless calls) and starve the sessions of
every other rollout. Each limit has a process default (`GatewayOptions.session_max_*`, the
`rollout gateway --session-max-…` flags) that a session's create may override
(`SessionConfig.limits`). A refusal is a `GatewayError` that names its limit and comes
before anything of the call is recorded, so the session's records stay as they were.
"""

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from gateway.errors import GatewayError
from gateway.options import GatewayOptions
from gateway.sessions.live import LiveSession
from schemas.session import SessionConfig

CONCURRENCY_RETRY_AFTER_S = 1.0
"""What a call over `max_concurrent_calls` is told to wait: about one short call."""

BODY_RETRY_AFTER_S = 1.0
"""What a body past the session's body budget is told to wait: a maximum-size body is
read and parsed in well under a second."""


@dataclass(frozen=True)
class Limits:
    """A session's limits, its own where its create set them, else the process's."""

    max_concurrent_calls: int
    max_stored_request_bytes: int
    max_stored_bytes: int
    max_body_bytes: int


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
        max_body_bytes=asked.max_body_bytes or options.session_max_body_bytes,
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


@contextmanager
def body_budget(session: LiveSession, limit: int) -> Iterator[Callable[[int], None]]:
    """Reserve room for one request body in the bytes the session's calls are reading and
    parsing at once (at most `limit`, the body cap: one maximum-size body, or several
    smaller ones), until the body is parsed. Yields `take(size)`: call it with the body's
    size as known so far (its Content-Length before reading anything, the bytes read so
    far for a chunked body); 429 with `Retry-After` when the session has no room.

    Refused at once, like a call past `max_concurrent_calls`: a body that waited would
    hold its connection, and one agent's bodies never wait on another's."""
    held = 0

    def take(size: int) -> None:
        nonlocal held
        if size <= held:
            return
        if session.body_bytes + size - held > limit:
            raise GatewayError(
                "rate_limited",
                f"session {session.meta.session_id} is already reading {session.body_bytes} "
                f"bytes of request bodies; with this one's {size} they would pass its limit "
                f"max_body_bytes={limit}; retry when one has been read",
                retry_after=BODY_RETRY_AFTER_S,
                limit="max_body_bytes",
            )
        session.body_bytes += size - held
        held = size

    try:
        yield take
    finally:
        session.body_bytes -= held


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
