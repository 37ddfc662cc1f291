"""Per-call spans: where the wall time (and event-loop CPU) of one agent call goes.

A call's handler marks laps as it moves on (`lap("plan")` after planning, `lap("engine")`
after the engine answered, ...): each lap gets the time since the previous one, so the
spans of a call add up to the whole time the app held it, with nothing unattributed. The
laps are kept on a context variable set by `measured`, so the code that marks them takes
no extra argument, and a lap outside a measured call (a test driving the core directly)
costs nothing. `measured` closes the last span (`respond`: building the response and
handing it to the server) and observes every span into the histograms.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from contextvars import ContextVar

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


async def measured(
    metrics: GatewayMetrics, protocol: str, call: Callable[[], Awaitable[int]]
) -> None:
    """Run `call` (one model call, answered when it returns; it returns the status) with
    its spans measured, and observe them under `protocol` if it succeeded."""
    spans = CallSpans()
    token = _current.set(spans)
    try:
        status = await call()
    finally:
        _current.reset(token)
    spans.lap("respond")
    if status < 400:
        metrics.spans.observe(protocol, spans.wall, spans.cpu)
