"""Deadlines on reading a request, at the connection: a client that trickles its headers
or its body (slowloris) is cut after a bounded time.

uvicorn puts no deadline on a request head: its keep-alive timer runs only between
requests and any byte received cancels it, so a client sending one header byte every few
seconds holds a connection (and a file descriptor) for good. Neither does it bound a body
the app does not read, as after an early error reply. This h11 protocol adds two timers:

- head: from the connection's start, or from the first byte of a request after a
  keep-alive pause, the whole request head must arrive within `header_timeout_s`;
- body: from the head, the whole body within `body_timeout_s` plus `BODY_GRACE_S`. The app
  reading the body answers first, with a 408 in the caller's protocol
  (`errors.body_timed_out`); this timer only ends a body nobody reads.

A cut closes the connection without a reply (HTTP has no place for one before a request
head) and is counted by the limit's name.
"""

import asyncio
from collections.abc import Callable
from typing import Any, Literal

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

BODY_GRACE_S = 5.0
"""How much longer than the app's body deadline the connection's own one waits."""

Phase = Literal["header_timeout_s", "body_timeout_s"]


def deadline_protocol(
    header_timeout_s: float,
    body_timeout_s: float,
    on_cut: Callable[[Phase], None],
    body_grace_s: float = BODY_GRACE_S,
) -> type[asyncio.Protocol]:
    """The uvicorn `http` protocol class with these deadlines; `on_cut(limit name)` is
    called for each connection cut."""
    timeouts: dict[Phase, float] = {
        "header_timeout_s": header_timeout_s,
        "body_timeout_s": body_timeout_s + body_grace_s,
    }

    class DeadlineH11Protocol(H11Protocol):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._fresh = True  # no request head seen yet on this connection
            self._phase: Phase | None = None
            self._timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._follow()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            self._follow()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._follow()

        def connection_lost(self, exc: Exception | None) -> None:
            self._set(None)
            super().connection_lost(exc)

        def _follow(self) -> None:
            """The deadline the client's side of the connection is under now."""
            state = self.conn.their_state
            phase: Phase | None = None
            if state is h11.IDLE:
                # A head is awaited: timed on a new connection and once its first bytes
                # came; a keep-alive pause before them is uvicorn's keep-alive timer's.
                if self._fresh or self.conn.trailing_data[0]:
                    phase = "header_timeout_s"
            else:
                self._fresh = False
                if state is h11.SEND_BODY:
                    phase = "body_timeout_s"
            self._set(phase)

        def _set(self, phase: Phase | None) -> None:
            if phase == self._phase:
                return
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            self._phase = phase
            if phase is not None and not self.transport.is_closing():
                self._timer = self.loop.call_later(timeouts[phase], self._cut, phase)

        def _cut(self, phase: Phase) -> None:
            self._timer = None
            if not self.transport.is_closing():
                on_cut(phase)
                self.transport.close()

    return DeadlineH11Protocol
