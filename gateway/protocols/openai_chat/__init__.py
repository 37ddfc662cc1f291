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
            # Chat Completions carries no opaque tokens: the seal is not needed.
            parse=lambda body, headers, path, history, _seal: request.parse_chat_request(
                body, headers, path, history
            ),
            reply=lambda result, _req, _seal: reply.chat_completion_response(result, stream=False),
            stream_writer=lambda canonical, _seal: (
                lambda head: reply.ChatStreamWriter(head, canonical.include_usage)
            ),
        ),
    ),
    error_response=reply.openai_error_response,
)
