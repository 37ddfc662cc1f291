"""Per-call spans: where the wall time (and event-loop CPU) of one agent call goes.

A call's handler marks laps as it moves on (`lap("plan")` after planning, `lap("engine")`
after the engine answered, ...): each lap gets the time since the previous one, so the
spans of a call add up to the whole time the app held it, with nothing unattributed. The
laps are kept on a context variable set by `SpanMiddleware`, so the code that marks them
takes no extra argument, and a lap outside a measured call (a test driving the core
directly) costs nothing. The middleware closes the last span (`respond`: building the
response and handing it to the server) and observes every span into the histograms.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from contextvars import ContextVar
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.observability.metrics import GatewayMetrics

SPANS = (
    "auth",
    "body_read",
    "body_parse",
    "plan",
    "engine_queue",
    "engine",
    "output_parse",
    "record",
    "sync",
    "respond",
)
"""Every span a call can have, in order. `body_read`: the body off the socket;
`body_parse`: JSON and protocol validation to the canonical request; `plan`: retry
digest, template and incremental tokenization; `engine_queue`: waiting for an engine slot;
`engine`: the engine call (request out, reply in and validated); `output_parse`: sampled
ids to reasoning, content and tool calls; `record`: commit to the held segment and the
append; `sync`: waiting for the group commit; `respond`: the reply in the caller's
protocol, until its last byte is handed to the server."""


class CallSpans:
    """The laps of one call: wall seconds and this thread's CPU seconds per span."""

    __slots__ = ("_cpu0", "_wall0", "cpu", "wall")

    def __init__(self) -> None:
        self.wall: dict[str, float] = {}
        self.cpu: dict[str, float] = {}
        self._wall0 = time.perf_counter()
        self._cpu0 = time.thread_time()

    def lap(self, span: str) -> None:
        wall, cpu = time.perf_counter(), time.thread_time()
        self.wall[span] = self.wall.get(span, 0.0) + wall - self._wall0
        self.cpu[span] = self.cpu.get(span, 0.0) + cpu - self._cpu0
        self._wall0, self._cpu0 = wall, cpu


_current: ContextVar[CallSpans | None] = ContextVar("rollout_call_spans", default=None)


def lap(span: str) -> None:
    """Close span `span` of the call being handled (no-op outside a measured call)."""
    spans = _current.get()
    if spans is not None:
        spans.lap(span)


class SpanMiddleware:
    """ASGI middleware around the agent app: measures the model calls that end in a
    success and observes their spans. `measured`: path → label of the calls to measure
    (the protocols' sampling routes, `gateway.protocols.registry.span_labels`)."""

    def __init__(self, app: ASGIApp, metrics: GatewayMetrics, measured: Mapping[str, str]) -> None:
        self.app = app
        self.metrics = metrics
        self.measured = dict(measured)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        protocol = self.measured.get(scope.get("path", "")) if scope["type"] == "http" else None
        if protocol is None:
            await self.app(scope, receive, send)
            return
        spans = CallSpans()
        status: dict[str, Any] = {}

        async def measured_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body"):
                spans.lap("respond")
                if status.get("code", 500) < 400:
                    self.metrics.observe_spans(protocol, spans.wall, spans.cpu)

        token = _current.set(spans)
        try:
            await self.app(scope, receive, measured_send)
        finally:
            _current.reset(token)
