"""A streamed agent call over HTTP: the protocol's events go out as the engine samples.

The call runs as its own task (`Gateway.complete` with a `StreamRelay`), so a client that
leaves cannot interrupt the recording of what was sampled; it only aborts the relay. The
response waits for the engine's first chunk before it sends its headers: a call that
fails before that (engine down, bad request) is a plain error with its status, which
agent SDKs retry; after it, the failure is the protocol's in-stream error event.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Callable, Sequence
from typing import Any

from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from gateway.calls.pipeline import Gateway
from gateway.calls.stream_relay import StreamAborted, StreamRelay
from gateway.canonical import CanonicalRequest, Reply, Tool
from gateway.errors import GatewayError
from gateway.parsers.base import ParseContext, StreamEvent, ToolCallDone
from gateway.parsers.stream import OutputStream
from gateway.protocols.sse import StreamHead, StreamWriter, head_of
from gateway.sessions.live import LiveSession

log = logging.getLogger("rollout.gateway")

WriterFactory = Callable[[StreamHead], StreamWriter]

_running: set[asyncio.Task[Reply]] = set()
"""Calls whose response may be gone: held here so they finish (and record) regardless."""


async def stream_reply(
    gateway: Gateway,
    session: LiveSession,
    request: CanonicalRequest,
    raw_request: dict[str, Any],
    digest: str,
    writer_for: WriterFactory,
) -> Response:
    """Run the call and answer with its live event stream (a replay for a retry answered
    from the record). Raises the call's `GatewayError` if it fails before any token."""
    relay = StreamRelay(gateway.incremental, gateway.parser, gateway.options.stream_abort_grace_s)
    call = asyncio.create_task(gateway.complete(session, request, raw_request, digest, relay))
    _running.add(call)
    call.add_done_callback(_running.discard)
    flowing = asyncio.ensure_future(relay.flowing.wait())
    try:
        await asyncio.wait({call, flowing}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        relay.abort()
        raise
    finally:
        flowing.cancel()
    if call.done() and (relay.head is None or not relay.flowing.is_set()):
        result = call.result()  # raises the call's error as a plain error response
        return RelayResponse(
            _replayed(gateway, writer_for(head_of(result)), result, request.tools), relay
        )
    return RelayResponse(_live(relay, call, writer_for), relay)


async def _replayed(
    gateway: Gateway, writer: StreamWriter, result: Reply, tools: Sequence[Tool]
) -> AsyncGenerator[bytes]:
    """A finished call (a retry's answer) streamed as its tokens would be, one at a time,
    so a retry reads like the stream it missed."""
    text = gateway.incremental.tokenizer.decode(result.output_ids)
    # The prompt is not at hand; the reading of it that yields this output is.
    opened = ParseContext.of(result.call_id, True, tools)
    if gateway.parser.parse(text, opened) != result.output:
        opened = ParseContext.of(result.call_id, False, tools)
    output = OutputStream(gateway.incremental.tokenizer, gateway.parser, opened)
    frames = writer.start()
    for token in result.output_ids:
        for event in output.feed([token]):
            frames += _frames(writer, event)
    for frame in frames + writer.finish(result):
        yield frame


def _frames(writer: StreamWriter, event: StreamEvent) -> list[bytes]:
    if isinstance(event, ToolCallDone):
        return writer.tool_call(event.call)
    if event.field == "reasoning":
        return writer.reasoning(event.text)
    return writer.content(event.text)


async def _live(
    relay: StreamRelay, call: asyncio.Task[Reply], writer_for: WriterFactory
) -> AsyncGenerator[bytes]:
    """The events of a call in flight, then its finish (or in-stream error)."""
    assert relay.head is not None  # flowing implies planned
    writer = writer_for(relay.head)
    for frame in writer.start():
        yield frame
    while True:
        next_event = asyncio.ensure_future(relay.events.get())
        await asyncio.wait({next_event, call}, return_when=asyncio.FIRST_COMPLETED)
        if not next_event.done():
            next_event.cancel()
            if relay.events.empty():
                break
            continue  # drain what the last chunk queued before the call ended
        for frame in _frames(writer, next_event.result()):
            yield frame
    try:
        result = call.result()
    except GatewayError as err:
        frames = writer.fail(err)
    except StreamAborted:
        return  # nobody is listening
    except Exception:
        log.exception("streamed call %s failed", relay.head.call_id)
        frames = writer.fail(GatewayError("internal", "internal gateway error (see gateway log)"))
    else:
        frames = writer.finish(result)
    for frame in frames:
        yield frame


class RelayResponse(StreamingResponse):
    """`text/event-stream` of frames; a client that disconnects aborts the relay."""

    def __init__(self, frames: AsyncGenerator[bytes], relay: StreamRelay) -> None:
        super().__init__(
            frames, media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
        )
        self.frames = frames
        self.relay = relay

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        watcher = asyncio.ensure_future(self._until_disconnect(receive))
        complete = False
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            async for frame in self.frames:
                await send({"type": "http.response.body", "body": frame, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            complete = True
        except OSError:
            pass  # the client is gone (uvicorn raises on send after a disconnect)
        finally:
            watcher.cancel()
            if not complete:
                self.relay.abort()
            await self.frames.aclose()

    async def _until_disconnect(self, receive: Receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        self.relay.abort()
