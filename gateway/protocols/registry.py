"""The wire protocols the Gateway serves: adding one is its folder plus a line here.

Everything that depends on the protocol of a path — the agent routes, the error shape of
a path, the span label of a call — is read from `PROTOCOLS`.
"""

from gateway.protocols import anthropic_messages, openai_chat, openai_responses
from gateway.protocols.base import ErrorResponder, WireProtocol

PROTOCOLS: tuple[WireProtocol, ...] = (
    openai_chat.PROTOCOL,
    openai_responses.PROTOCOL,
    anthropic_messages.PROTOCOL,
)

DEFAULT_ERROR_RESPONSE: ErrorResponder = openai_chat.PROTOCOL.error_response
"""The shape of errors on paths no protocol owns: the control API, unknown paths and
`/v1/models` answer as OpenAI does."""


def error_response_for(path: str) -> ErrorResponder:
    """The error shape of the protocol that owns `path` (OpenAI's for any other)."""
    for protocol in PROTOCOLS:
        if protocol.owns(path):
            return protocol.error_response
    return DEFAULT_ERROR_RESPONSE


def span_labels() -> dict[str, str]:
    """Path → span label of every route that samples (the calls the spans measure)."""
    return {route.path: p.span_label for p in PROTOCOLS for route in p.routes}


def _check_unique() -> None:
    names = [p.name for p in PROTOCOLS]
    paths = [r.path for p in PROTOCOLS for r in (*p.routes, *p.count_routes)]
    if len(set(names)) != len(names) or len(set(paths)) != len(paths):
        raise RuntimeError(f"protocols declare a name or path twice: {names}, {paths}")


_check_unique()
