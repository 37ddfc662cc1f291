"""Retries are not new turns: a request an agent SDK sends again gets the answer it missed.

Agent SDKs (openai and anthropic, Python and TypeScript) retry a request that timed out or
got a 5xx, with the same body and `x-stainless-retry-count: N` (0 on the first attempt).
Sampling such a retry again would record a second answer to one turn and fork the segment;
instead the session answers it with the call it already recorded for that body (the call
still in flight, when the client gave up on it before it finished).

Only a request that says it is a retry (count >= 1) is answered this way. An identical body
without that header is sampled again: an agent may re-ask on purpose (resampling a reply it
rejected, best-of-n), and replaying the earlier answer would silently change what the policy
is seen to do; a missed retry of a client that sends no header costs only an extra recorded
sample on its own segment, which is still a true sample.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field

from gateway.canonical import Reply

RETRY_HEADER = "x-stainless-retry-count"


def request_digest(path: str, body: bytes) -> str:
    """Digest of a request body's bytes, as read, on a path.

    An SDK's retry resends the bytes of its first attempt (it serialises the same
    request object again, and JSON serialisers are deterministic), so the bytes are what
    is compared: no re-serialisation of the parsed body, whose cost grew with the
    resent history. A body that says the same in other bytes (keys reordered, other
    spacing) is another request and is sampled again, which costs one extra true
    sample, as any missed retry (see the module docstring).
    """
    digest = hashlib.sha256(path.encode())
    digest.update(b"\n")
    digest.update(body)
    return digest.hexdigest()


def is_retry(headers: Mapping[str, str]) -> bool:
    """Does the client say this request is a retry (`x-stainless-retry-count` >= 1)?"""
    for name, value in headers.items():
        if name.lower() == RETRY_HEADER:
            return value.strip().isdigit() and int(value) >= 1
    return False


@dataclass
class InFlight:
    """A call answering a digest, while it runs."""

    answer: asyncio.Future[Reply | None]
    """Set to the call's result when it finishes (None: it ended without one)."""
    awaited: asyncio.Event = field(default_factory=asyncio.Event)
    """Set once a retry waits for this answer: a streamed call whose own client left
    then samples to the end (`StreamRelay`), as the retry's client still wants it."""


class RetryReplies:
    """A session's answered request bodies (digest → call id) and those being answered,
    and where each answered call's record starts in the records file (call id → offset):
    a retry reads back that record alone (and the few its prompt refers to), never the
    whole file. Both indexes hold a few dozen bytes per call.

    Changed from the gateway's event loop only (`offset_of` may be read from a thread).
    """

    def __init__(
        self, answered: Mapping[str, str] | None = None, offsets: Mapping[str, int] | None = None
    ) -> None:
        self._answered: dict[str, str] = dict(answered or {})
        self._offsets: dict[str, int] = dict(offsets or {})
        self._inflight: dict[str, InFlight] = {}

    def recorded(self, digest: str, call_id: str, offset: int | None) -> None:
        """The call answering `digest` is on record (written; the latest such call wins),
        its line starting at `offset`."""
        self._answered[digest] = call_id
        if offset is not None:
            self._offsets[call_id] = offset

    def offset_of(self, call_id: str) -> int | None:
        """Where the record of an ok call starts in the records file (None: unknown)."""
        return self._offsets.get(call_id)

    @contextmanager
    def replying(self, digest: str) -> Iterator[InFlight]:
        """While a call for `digest` runs, retries wait for it: set the yielded answer's
        result; if the call ends without one, waiters get None."""
        inflight = InFlight(asyncio.get_running_loop().create_future())
        self._inflight[digest] = inflight
        try:
            yield inflight
        finally:
            if not inflight.answer.done():
                inflight.answer.set_result(None)
            if self._inflight.get(digest) is inflight:
                del self._inflight[digest]

    async def reply_for(self, digest: str) -> Reply | str | None:
        """The answer to a retry of `digest`: the in-flight call's result once it finishes,
        else the id of the recorded call answering it (None: never answered, sample it)."""
        inflight = self._inflight.get(digest)
        if inflight is not None:
            inflight.awaited.set()
            await asyncio.wait({inflight.answer})  # a retry that gives up does not cancel it
            result = inflight.answer.result()
            if result is not None:
                return result
        return self._answered.get(digest)
