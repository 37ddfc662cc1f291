"""Anthropic Messages (Claude Code): `request` (wire models → `CanonicalRequest`, and
`count_tokens`) and `reply` (the `message` object, its event stream and Anthropic errors)."""

from functools import partial

from gateway.protocols.anthropic_messages import reply, request
from gateway.protocols.base import CountRoute, SamplingRoute, WireProtocol

PROTOCOL = WireProtocol(
    name="anthropic_messages",
    span_label="anthropic_messages",
    routes=(
        SamplingRoute(
            path=request.DEFAULT_PATH,
            parse=request.parse_messages_request,
            reply=lambda result, _req, seal: reply.messages_response(result, seal, stream=False),
            stream_writer=lambda _req, seal: partial(reply.MessagesStreamWriter, seal=seal),
        ),
    ),
    count_routes=(
        CountRoute(
            path=request.COUNT_TOKENS_PATH,
            parse=request.parse_count_tokens_request,
            reply=reply.count_tokens_response,
        ),
    ),
    error_response=reply.anthropic_error_response,
)
