"""Deadlines on reading a request, at the connection: a client that trickles its headers
or its body (slowloris) is cut after a bounded time.

uvicorn puts no deadline on a request head: its keep-alive timer runs only between
requests and any byte received cancels it, so a client sending one header byte every few
seconds holds a connection (and a file descriptor) for good. Neither does it bound a body
the app does not read, as after an early error reply. This protocol (uvicorn's httptools
one, whose C parser takes less CPU per request than h11) adds two timers:

- head: from the connection's start, or from the first byte of a request after a
  keep-alive pause, the whole request head must arrive within `header_timeout_s`;
- body: from the head, the whole body within `body_timeout_s` plus `BODY_GRACE_S`. The app
  reading the body answers first, with a 408 in the caller's protocol
  (`errors.body_timed_out`); this timer only ends a body nobody reads.

A cut closes the connection without a reply (HTTP has no place for one before a request
head) and is counted by the limit's name.

Three more things keep a request what it was under h11: a head past `MAX_HEAD_BYTES` is
refused (431); a request target that is not a plain path (absolute-form, a fragment)
reaches the app as sent, where httptools would drop the authority or the fragment, so the
app's target checks refuse it by name; and a request the parser rejects is answered with
a JSON error in OpenAI's shape (the path, which picks a protocol, is not known yet), not
uvicorn's plain text.
"""

import asyncio
from collections.abc import Callable
from typing import Any, Literal
from urllib.parse import unquote

from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from gateway.errors import GatewayError
from gateway.protocols.registry import DEFAULT_ERROR_RESPONSE

BODY_GRACE_S = 5.0
"""How much longer than the app's body deadline the connection's own one waits."""

MAX_HEAD_BYTES = 16 * 1024
"""The longest request head (request line and headers) taken, as uvicorn's h11 protocol
took: httptools itself holds a head of any size in memory."""

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

    class DeadlineHttpToolsProtocol(HttpToolsProtocol):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            # Where the parser is in the client's current request: before its first byte
            # (a new connection awaits one under the head deadline), in its head, in its
            # body, or past its end (the app's and uvicorn's keep-alive timer's time).
            self._reading: Phase | None = "header_timeout_s"
            self._phase: Phase | None = None
            self._timer: asyncio.TimerHandle | None = None
            self._head_bytes = 0  # of the head being read

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._set(self._reading)

        def data_received(self, data: bytes) -> None:
            in_head = self._reading == "header_timeout_s"
            super().data_received(data)
            if self._reading == "header_timeout_s" and not self.transport.is_closing():
                # every byte fed while a head is still incomplete is part of it
                self._head_bytes = (self._head_bytes if in_head else 0) + len(data)
                if self._head_bytes > MAX_HEAD_BYTES:
                    why = f"the request head exceeds {MAX_HEAD_BYTES} bytes"
                    self._refuse(GatewayError("too_large", why, status=431))
            self._set(self._reading)

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._reading = "header_timeout_s"

        def on_headers_complete(self) -> None:
            super().on_headers_complete()
            target: bytes = self.url
            if b"#" in target or not target.startswith(b"/"):
                raw_path = target.partition(b"?")[0]
                self.scope["raw_path"] = raw_path
                self.scope["path"] = unquote(raw_path.decode("latin-1"))
            self._reading = "body_timeout_s"

        def on_message_complete(self) -> None:
            super().on_message_complete()
            self._reading = None

        def send_400_response(self, msg: str) -> None:
            self._refuse(
                GatewayError(
                    "invalid_request",
                    "not a valid HTTP/1.1 request: its request line (method, request "
                    "target, version) or a header is malformed",
                )
            )

        def _refuse(self, err: GatewayError) -> None:
            """Answer `err` in JSON before any app saw the request, and close."""
            reply = DEFAULT_ERROR_RESPONSE(err)
            head = [STATUS_LINE[err.status]]
            head += [name + b": " + value + b"\r\n" for name, value in reply.raw_headers]
            self.transport.write(b"".join([*head, b"connection: close\r\n\r\n", reply.body]))
            self.transport.close()

        def connection_lost(self, exc: Exception | None) -> None:
            self._set(None)
            super().connection_lost(exc)

        def _set(self, phase: Phase | None) -> None:
            """Run the deadline of `phase` (none: no deadline), kept while it stays."""
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

    return DeadlineHttpToolsProtocol
