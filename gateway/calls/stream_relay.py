"""Between one streamed call's engine stream and its HTTP response.

The core runs the call as always (plan, engine, parse, record) and tells the relay when
the call is planned and each time the engine sends tokens; the relay splits them into
stream events (`parsers.stream`) and queues them for the response (`streaming`).

A client that leaves aborts the relay, but the engine keeps sampling for a grace period
(`GatewayOptions.stream_abort_grace_s`): most clients that leave are agent SDKs whose
timeout fired, and they resend the request within a second. Such a retry waits for this
call's answer (`retries`), so once one arrives the call samples to the end and is
recorded as usual. With no retry by the end of the grace, the engine request is cancelled
(vLLM stops generating) and the core records the call as cancelled with the tokens
sampled so far. A call the engine finishes within the grace is recorded as sampled.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from typing import Any

from gateway.capture.recording import PlannedCall
from gateway.engines.base import EngineCompletion
from gateway.parsers.base import OutputParser, ParseContext, StreamEvent
from gateway.parsers.stream import OutputStream
from gateway.prompt.incremental import IncrementalTokenizer
from gateway.protocols.sse import StreamHead


class StreamAborted(Exception):
    """The client closed the stream before the engine finished; the request was cancelled."""

    def __init__(self, output_ids: list[int], output_logprobs: list[float]) -> None:
        super().__init__(f"client closed the stream after {len(output_ids)} sampled tokens")
        self.output_ids = output_ids
        self.output_logprobs = output_logprobs


class StreamRelay:
    """One streamed call's live state. Used from the gateway's event loop only."""

    def __init__(
        self, incremental: IncrementalTokenizer, parser: OutputParser, abort_grace_s: float
    ) -> None:
        self.incremental = incremental
        self.parser = parser
        self.abort_grace_s = abort_grace_s
        self.wanted_by_retry = asyncio.Event()
        """Set (by the core) once a retry of this request waits for its answer."""
        self.head: StreamHead | None = None
        self.output_ids: list[int] = []
        self.output_logprobs: list[float] = []
        self.events: asyncio.Queue[StreamEvent] = asyncio.Queue()
        self.flowing = asyncio.Event()
        """Set on the engine's first chunk: from then on, failures go out in-stream."""
        self._aborted = asyncio.Event()
        self._output: OutputStream | None = None

    def started(self, planned: PlannedCall, model: str) -> None:
        """The call is planned: the stream's head is known, sampling starts."""
        prompt_ids = planned.plan.prompt_ids
        self.head = StreamHead(
            call_id=planned.call_id,
            model=model,
            created=int(planned.started_at.timestamp()),
            prompt_tokens=len(prompt_ids),
            cached_prompt_tokens=len(prompt_ids) - planned.plan.new_token_count,
        )
        opened = self.incremental.prompt_opens_reasoning(prompt_ids)
        ctx = ParseContext.of(planned.call_id, opened, planned.request.tools)
        self._output = OutputStream(self.incremental.tokenizer, self.parser, ctx)

    def on_tokens(self, ids: list[int], logprobs: list[float]) -> None:
        """One engine chunk (its sampled ids and their logprobs)."""
        self.output_ids.extend(ids)
        self.output_logprobs.extend(logprobs)
        if self._output is not None:
            for event in self._output.feed(ids):
                self.events.put_nowait(event)
        self.flowing.set()

    def abort(self) -> None:
        """The client is gone: cancel the engine request if it is still running."""
        self._aborted.set()

    @property
    def aborted(self) -> bool:
        return self._aborted.is_set()

    async def run(self, engine_call: Coroutine[Any, Any, EngineCompletion]) -> EngineCompletion:
        """Await the engine call unless the client aborts and nobody wants the answer
        (then `StreamAborted`)."""
        call = asyncio.ensure_future(engine_call)
        try:
            await _first_of(call, self._aborted.wait())
            if not call.done():
                await _first_of(call, self.wanted_by_retry.wait(), timeout=self.abort_grace_s)
            if not call.done() and self.wanted_by_retry.is_set():
                await asyncio.wait({call})
        finally:
            if not call.done():
                call.cancel()  # closes the engine connection: vLLM aborts the request
                with contextlib.suppress(asyncio.CancelledError):
                    await call
        if call.cancelled():
            raise StreamAborted(list(self.output_ids), list(self.output_logprobs))
        return call.result()


async def _first_of(
    call: asyncio.Future[EngineCompletion],
    signal: Coroutine[Any, Any, Any],
    timeout: float | None = None,
) -> None:
    """Wait until `call` is done, `signal` returns or `timeout` passes, whichever first."""
    waiting = asyncio.ensure_future(signal)
    try:
        await asyncio.wait({call, waiting}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiting.cancel()
