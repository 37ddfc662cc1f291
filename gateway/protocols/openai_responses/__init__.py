"""OpenAI Responses (Codex CLI): `request` (wire models → `CanonicalRequest`) and
`reply` (the `response` object, its event stream and the compaction reply)."""

from functools import partial

from gateway.protocols.base import SamplingRoute, WireProtocol
from gateway.protocols.openai_chat.reply import openai_error_response
from gateway.protocols.openai_responses import reply, request

PROTOCOL = WireProtocol(
    name="openai_responses",
    span_label="openai_responses",
    routes=(
        SamplingRoute(
            path=request.DEFAULT_PATH,
            parse=request.parse_responses_request,
            reply=lambda result, _req, seal: reply.responses_response(result, seal, stream=False),
            stream_writer=lambda _req, seal: partial(reply.ResponsesStreamWriter, seal=seal),
        ),
        # A compaction is answered whole, also when the request asks to stream.
        SamplingRoute(
            path=request.DEFAULT_PATH + "/compact",
            parse=request.parse_responses_request,
            reply=reply.compact_response,
        ),
    ),
    error_response=openai_error_response,
)
