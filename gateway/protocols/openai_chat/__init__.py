"""OpenAI Chat Completions: `request` (wire models → `CanonicalRequest`) and `reply`
(a `Reply` as a `chat.completion`, its chunk stream and OpenAI-shaped errors)."""

from gateway.protocols.base import SamplingRoute, WireProtocol
from gateway.protocols.openai_chat import reply, request

PROTOCOL = WireProtocol(
    name="openai_chat",
    span_label="openai_chat",
    routes=(
        SamplingRoute(
            path=request.DEFAULT_PATH,
            parse=request.parse_chat_request,
            reply=lambda result, _: reply.chat_completion_response(result, stream=False),
            stream_writer=lambda canonical: (
                lambda head: reply.ChatStreamWriter(head, canonical.include_usage)
            ),
        ),
    ),
    error_response=reply.openai_error_response,
)
