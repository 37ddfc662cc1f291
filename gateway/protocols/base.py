"""What a wire protocol declares to the Gateway: its routes, its error shape, its span label.

A protocol is one folder under `gateway/protocols/` whose package builds a `WireProtocol`
from its `request` and `reply` modules, plus one line in `registry.PROTOCOLS`. The HTTP
app serves every declared route with one generic handler, the spans measure every
sampling route under the protocol's label, and an error on a path a protocol owns
leaves in that protocol's shape: nothing else in the Gateway names a protocol.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from starlette.responses import Response

from gateway.canonical import CanonicalRequest, Reply
from gateway.errors import GatewayError
from gateway.protocols.history import HistoryCache
from gateway.protocols.opaque_token import TokenSeal
from gateway.protocols.sse import StreamHead, StreamWriter

ParseRequest = Callable[
    [dict[str, Any], Mapping[str, str], str, HistoryCache | None, TokenSeal], CanonicalRequest
]
"""(body, headers, path, the session's history cache, the session's token seal) →
`CanonicalRequest`. The seal checks opaque tokens the agent echoes (`opaque_token`)."""

WriterFactory = Callable[[StreamHead], StreamWriter]
"""Builds a call's event-stream writer once the stream's head (ids, model) is known."""

ErrorResponder = Callable[[GatewayError], Response]


@dataclass(frozen=True)
class SamplingRoute:
    """A path whose calls sample: the body parsed to a canonical request, the result
    rendered whole (`reply`) or, when the request asks to stream and `stream_writer`
    gives a writer, as the protocol's live event stream. Both get the session's token
    seal, with which the reply mints its opaque tokens."""

    path: str
    parse: ParseRequest
    reply: Callable[[Reply, CanonicalRequest, TokenSeal], Response]
    stream_writer: Callable[[CanonicalRequest, TokenSeal], WriterFactory] | None = None


@dataclass(frozen=True)
class CountRoute:
    """A path that counts a prompt's tokens under our template, sampling nothing."""

    path: str
    parse: Callable[[dict[str, Any], Mapping[str, str], str, TokenSeal], CanonicalRequest]
    reply: Callable[[int], Response]


@dataclass(frozen=True)
class WireProtocol:
    """One client protocol. `name` is what its parser puts in `CanonicalRequest.protocol`
    (and what recorded calls and metrics carry); `span_label` labels its calls' spans."""

    name: str
    span_label: str
    routes: tuple[SamplingRoute, ...]
    error_response: ErrorResponder
    count_routes: tuple[CountRoute, ...] = ()

    def owns(self, path: str) -> bool:
        """A path of this protocol, or one below it (`/v1/messages/...`)."""
        paths = [r.path for r in self.routes] + [r.path for r in self.count_routes]
        return any(path == p or path.startswith(p + "/") for p in paths)
