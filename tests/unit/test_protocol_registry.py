"""The protocol registry: each protocol declares its routes, error shape and span label,
and the app, the error shape of a path and the spans read them from there."""

import json

from gateway.errors import KINDS, GatewayError
from gateway.protocols import registry
from gateway.protocols.openai_chat.reply import OPENAI_ERROR_TYPES


def test_every_protocol_is_served_on_its_own_paths() -> None:
    names = [p.name for p in registry.PROTOCOLS]
    assert names == ["openai_chat", "openai_responses", "anthropic_messages"]
    paths = {r.path: p.name for p in registry.PROTOCOLS for r in (*p.routes, *p.count_routes)}
    assert paths == {
        "/v1/chat/completions": "openai_chat",
        "/v1/responses": "openai_responses",
        "/v1/responses/compact": "openai_responses",
        "/v1/messages": "anthropic_messages",
        "/v1/messages/count_tokens": "anthropic_messages",
    }


def test_spans_measure_the_sampling_routes_only() -> None:
    labels = registry.span_labels()
    assert labels["/v1/messages"] == "anthropic_messages"
    assert labels["/v1/responses/compact"] == "openai_responses"
    assert "/v1/messages/count_tokens" not in labels
    assert "/v1/models" not in labels


def _error_type(path: str) -> str:
    response = registry.error_response_for(path)(GatewayError("not_found", "no"))
    body = json.loads(bytes(response.body))
    return body.get("type", "openai")


def test_an_error_leaves_in_the_shape_of_the_protocol_that_owns_the_path() -> None:
    assert _error_type("/v1/messages") == "error"
    assert _error_type("/v1/messages/count_tokens") == "error"
    assert _error_type("/v1/messages/unknown") == "error"
    assert _error_type("/v1/messagesx") == "openai"
    assert _error_type("/v1/chat/completions") == "openai"
    assert _error_type("/sessions") == "openai"


def test_the_openai_error_table_covers_every_kind() -> None:
    assert set(OPENAI_ERROR_TYPES) == set(KINDS)
