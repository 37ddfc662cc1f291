"""Malformed input to the real Gateway over HTTP: each gets the exact 4xx status in the
caller's protocol error shape (OpenAI's for Chat Completions, Responses and the control API,
Anthropic's for Messages), never a 500, and no recorded call changes.

The Gateway runs in-process on loopback in front of the scripted engine (see
`tests/fixtures/fuzz_target.py`); the fuzz test at the end sends a few hundred
generated malformed requests per protocol (`bench.fuzz_agent_api` sends 10,000).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, Phase, given, settings

from gateway.json_text import MAX_JSON_DEPTH
from gateway.prompt.chat_template import RESERVED_TEMPLATE_VARIABLES
from stress.malformed_requests import (
    PROTOCOLS,
    FuzzRequest,
    Protocol,
    error_shape_problem,
    fuzz_request,
)
from tests.fixtures.fuzz_target import FuzzTarget, fuzz_target

MAX_BODY = 2**20

CHAT = PROTOCOLS["chat_completions"]
RESPONSES = PROTOCOLS["responses"]
MESSAGES = PROTOCOLS["anthropic_messages"]
CONTROL = PROTOCOLS["control"]

# (protocol, path): every endpoint that takes a JSON body.
BODY_ENDPOINTS = [
    pytest.param(CHAT, "/v1/chat/completions", id="chat"),
    pytest.param(RESPONSES, "/v1/responses", id="responses"),
    pytest.param(RESPONSES, "/v1/responses/compact", id="responses-compact"),
    pytest.param(MESSAGES, "/v1/messages", id="messages"),
    pytest.param(MESSAGES, "/v1/messages/count_tokens", id="count-tokens"),
    pytest.param(CONTROL, "/sessions", id="control"),
]
AGENT_ENDPOINTS = BODY_ENDPOINTS[:-1]

# The text that reaches the tokenizer, per protocol: (body with `text` put there, its path).
TEXT_AT = {
    "chat_completions": (
        lambda t: {**CHAT.body, "messages": [{"role": "user", "content": t}]},
        "messages[0].content",
    ),
    "responses": (lambda t: {**RESPONSES.body, "input": t}, "input"),
    "anthropic_messages": (
        lambda t: {**MESSAGES.body, "messages": [{"role": "user", "content": t}]},
        "messages[0].content",
    ),
}


@pytest.fixture(scope="module")
def target(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[FuzzTarget]:
    with fuzz_target(
        tiny_model_dir, tmp_path_factory.mktemp("gw"), max_body_bytes=MAX_BODY
    ) as running:
        yield running


@pytest.fixture
def unchanged(target: FuzzTarget) -> Iterator[None]:
    """No recorded call of any session changes while a test sends bad input (the fuzzed
    session's count of limit refusals may grow: that is its record of them)."""
    fuzz_id = target.fuzz_token.split(".", 1)[0]

    def recorded() -> tuple[object, object]:
        fuzzed = {**target.gateway.trajectory(fuzz_id), "limit_refusals": {}}
        return target.witness_trajectory(), fuzzed

    before = recorded()
    yield
    assert recorded() == before


def post(
    target: FuzzTarget,
    protocol: Protocol,
    path: str,
    content: bytes | str,
    content_type: str | None = "application/json",
) -> httpx.Response:
    headers = {"Content-Type": content_type} if content_type is not None else {}
    token = target.gateway.admin_token if protocol.control else target.fuzz_token
    headers["Authorization"] = f"Bearer {token}"
    if isinstance(content, str):
        content = content.encode("utf-8", "surrogatepass")
    return target.client(protocol).post(path, content=content, headers=headers)


def assert_error(
    reply: httpx.Response, protocol: Protocol, status: int, kind: str, param: Any = ...
) -> str:
    """The exact status and the protocol's error shape; returns the message.

    `kind` is our machine kind (OpenAI `code`); the error `type` follows from it. `param`
    is checked for OpenAI-shaped errors when given."""
    assert reply.status_code == status, reply.text
    assert reply.headers["content-type"] == "application/json"
    assert error_shape_problem(protocol.shape, reply) is None
    body = reply.json()
    if protocol.shape == "openai":
        openai_type = {
            "not_found": "not_found_error",
        }.get(kind, "invalid_request_error")
        assert body["error"]["code"] == kind
        assert body["error"]["type"] == openai_type
        if param is not ...:
            assert body["error"]["param"] == param
        return str(body["error"]["message"])
    anthropic_type = {
        "not_found": "not_found_error",
        "too_large": "request_too_large",
    }.get(kind, "invalid_request_error")
    assert body["error"]["type"] == anthropic_type
    return str(body["error"]["message"])


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


# --- deep nesting ------------------------------------------------------------------------


@pytest.mark.parametrize(("protocol", "path"), BODY_ENDPOINTS)
def test_json_nested_past_the_parser_limit_is_400(
    target: FuzzTarget, protocol: Protocol, path: str, unchanged: None
) -> None:
    """100,000 levels: the JSON parser's RecursionError was a 500."""
    text = json.dumps(protocol.body)[:-1] + ', "x_nested": ' + nested(100_000) + "}"
    message = assert_error(
        post(target, protocol, path, text), protocol, 400, "invalid_request", None
    )
    assert message == f"Request body: arrays and objects nest deeper than {MAX_JSON_DEPTH} levels"


@pytest.mark.parametrize(("protocol", "path"), AGENT_ENDPOINTS)
def test_json_nested_past_the_gateway_limit_is_400(
    target: FuzzTarget, protocol: Protocol, path: str, unchanged: None
) -> None:
    """300 levels parse, but recording such a body failed (a 500 after the engine call)."""
    text = json.dumps(protocol.body)[:-1] + ', "x_nested": ' + nested(300) + "}"
    param = "x_nested" + "[0]" * (MAX_JSON_DEPTH - 1)
    message = assert_error(
        post(target, protocol, path, text), protocol, 400, "invalid_request", param
    )
    assert message == (
        f"Invalid request: {param}: arrays and objects nest deeper than {MAX_JSON_DEPTH} levels"
    )


def test_nesting_at_the_limit_is_accepted(target: FuzzTarget) -> None:
    body = {**CHAT.body, "x_nested": json.loads(nested(MAX_JSON_DEPTH - 1))}
    assert post(target, CHAT, "/v1/chat/completions", json.dumps(body)).status_code == 200


# --- reserved chat_template_kwargs ---------------------------------------------------------


@pytest.mark.parametrize("key", sorted(RESERVED_TEMPLATE_VARIABLES))
@pytest.mark.parametrize(
    ("protocol", "path"),
    [
        pytest.param(CHAT, "/v1/chat/completions", id="chat"),
        pytest.param(RESPONSES, "/v1/responses", id="responses"),
    ],
)
def test_reserved_chat_template_kwargs_are_400(
    target: FuzzTarget, protocol: Protocol, path: str, key: str, unchanged: None
) -> None:
    """`messages`, `tools`, `add_generation_prompt` were a TypeError (500); `bos_token` and
    the others silently replaced what the renderer sets."""
    body = {**protocol.body, "chat_template_kwargs": {"enable_thinking": False, key: True}}
    message = assert_error(
        post(target, protocol, path, json.dumps(body)),
        protocol,
        400,
        "invalid_request",
        f"chat_template_kwargs.{key}",
    )
    assert "set by the gateway" in message


# --- integers past 64 bits -----------------------------------------------------------------


@pytest.mark.parametrize(("protocol", "path"), BODY_ENDPOINTS)
@pytest.mark.parametrize("value", [2**64, -(2**63) - 1], ids=["over-uint64", "under-int64"])
def test_integer_past_64_bits_is_400(
    target: FuzzTarget, protocol: Protocol, path: str, value: int, unchanged: None
) -> None:
    """Found by the chaos fuzzer: in a tool's parameters it crashed the prompt-size check
    (orjson cannot encode it: 500); anywhere else it would crash the record writer."""
    text = json.dumps({**protocol.body, "metadata": {"n": value}})
    message = assert_error(
        post(target, protocol, path, text), protocol, 400, "invalid_request", "metadata.n"
    )
    assert "does not fit in 64 bits" in message


@pytest.mark.parametrize(("protocol", "path"), AGENT_ENDPOINTS)
def test_64_bit_integers_and_long_digit_strings_are_accepted(
    target: FuzzTarget, protocol: Protocol, path: str
) -> None:
    """The bounds themselves, and 20 digits inside a string, are not refused."""
    extra = {"metadata": {"max": 2**64 - 1, "min": -(2**63), "text": "1" * 20}}
    reply = post(target, protocol, path, json.dumps({**protocol.body, **extra}))
    assert reply.status_code < 500 and "64 bits" not in reply.text, reply.text


# --- lone surrogates ---------------------------------------------------------------------


@pytest.mark.parametrize(("protocol", "path"), AGENT_ENDPOINTS)
@pytest.mark.parametrize("escaped", [True, False], ids=["escaped", "raw-bytes"])
def test_lone_surrogate_in_text_is_400(
    target: FuzzTarget, protocol: Protocol, path: str, escaped: bool, unchanged: None
) -> None:
    """As a `\\ud800` escape it reached the tokenizer (TypeError, 500); as raw bytes (not
    UTF-8) the JSON parser let it through the same way."""
    make, at = TEXT_AT[protocol.name]
    text = json.dumps(make("fix the \ud800 bug"), ensure_ascii=escaped)
    message = assert_error(post(target, protocol, path, text), protocol, 400, "invalid_request", at)
    assert "lone UTF-16 surrogate" in message


@pytest.mark.parametrize(("protocol", "path"), BODY_ENDPOINTS)
@pytest.mark.parametrize(
    ("extra", "param"),
    [
        pytest.param({"metadata": {"note": "u\udc00"}}, "metadata.note", id="value"),
        pytest.param({"metadata": {"k\ud83d": 1}}, "metadata", id="key"),
    ],
)
def test_lone_surrogate_anywhere_in_the_body_is_400(
    target: FuzzTarget,
    protocol: Protocol,
    path: str,
    extra: dict[str, Any],
    param: str,
    unchanged: None,
) -> None:
    """In a field that is only recorded, it failed when the call was written (a 500 after
    the engine answered, and a trajectory that no longer loaded)."""
    text = json.dumps({**protocol.body, **extra})
    assert_error(post(target, protocol, path, text), protocol, 400, "invalid_request", param)


@pytest.mark.parametrize(("protocol", "path"), AGENT_ENDPOINTS)
def test_lone_surrogate_in_an_ignored_field_is_400(
    target: FuzzTarget, protocol: Protocol, path: str, unchanged: None
) -> None:
    """The issue's case: `user` is ignored by the adapters but recorded with the call."""
    text = json.dumps({**protocol.body, "user": "u\udc00"})
    assert_error(post(target, protocol, path, text), protocol, 400, "invalid_request", "user")


def test_surrogate_pairs_are_text(target: FuzzTarget) -> None:
    make, _ = TEXT_AT["chat_completions"]
    text = json.dumps(make("ship it \U0001f680"), ensure_ascii=True)  # "\ud83d\ude80"
    assert post(target, CHAT, "/v1/chat/completions", text).status_code == 200


# --- part types that are not strings --------------------------------------------------------


@pytest.mark.parametrize(
    ("protocol", "param"),
    [
        pytest.param(CHAT, "messages[0].content", id="chat"),
        pytest.param(RESPONSES, "input[0].content[0]", id="responses"),
        pytest.param(MESSAGES, "messages[0].content[0].type", id="messages"),
    ],
)
def test_unhashable_part_type_is_400(
    target: FuzzTarget, protocol: Protocol, param: str, unchanged: None
) -> None:
    """A list as a part's `type` was looked up in a set: TypeError, 500 (found by the fuzz)."""
    make, _ = TEXT_AT[protocol.name]
    body = make([{"type": ["text"], "text": "hi"}])
    if protocol is RESPONSES:
        body = {**body, "input": [{"role": "user", "content": body["input"]}]}
    reply = post(target, protocol, protocol.paths[0], json.dumps(body))
    assert_error(reply, protocol, 400, "invalid_request", param)


# --- JSON inside strings: tool-call arguments, opaque tokens --------------------------------

ESCAPED_SURROGATE_ARGS = '{"command": "\\ud800"}'
"""Arguments text (plain ASCII) whose JSON decodes to a lone surrogate."""


def echoed_tool_call(protocol: Protocol, arguments: str) -> dict[str, Any]:
    """A request whose history holds an assistant tool call with these arguments."""
    if protocol is CHAT:
        call = {
            "id": "c1",
            "type": "function",
            "function": {"name": "bash", "arguments": arguments},
        }
        history = [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": "done"},
        ]
        return {**CHAT.body, "messages": history}
    items = [
        {"role": "user", "content": "hi"},
        {"type": "function_call", "call_id": "c1", "name": "bash", "arguments": arguments},
        {"type": "function_call_output", "call_id": "c1", "output": "done"},
    ]
    return {**RESPONSES.body, "input": items}


@pytest.mark.parametrize("protocol", [CHAT, RESPONSES], ids=["chat", "responses"])
@pytest.mark.parametrize(
    "arguments",
    [ESCAPED_SURROGATE_ARGS, nested(3000)],
    ids=["surrogate-escape", "deep"],
)
def test_echoed_tool_call_arguments_that_do_not_decode_render_as_text(
    target: FuzzTarget, protocol: Protocol, arguments: str
) -> None:
    """Arguments are text the model wrote; JSON that cannot be held (a lone surrogate, too
    deep) is rendered as that text. It reached the tokenizer decoded (TypeError) or blew the
    recursion limit: 500s."""
    body = echoed_tool_call(protocol, arguments)
    reply = post(target, protocol, protocol.paths[0], json.dumps(body))
    assert reply.status_code == 200, reply.text


def forged_token(kind: str, text: str) -> str:
    """A token in our format that we did not issue, carrying an escaped lone surrogate."""
    raw = '{"k": "%s", "c": "x", "t": "%s"}' % (kind, text)  # noqa: UP031
    return "rollout2." + base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=") + ".mac"


def test_forged_compaction_token_is_400(target: FuzzTarget, unchanged: None) -> None:
    """Its text decoded to a lone surrogate and reached the tokenizer (500); now its seal
    does not check, so it is refused before it is read."""
    item = {"type": "compaction", "encrypted_content": forged_token("compaction", "\\ud800")}
    body = {**RESPONSES.body, "input": [item, {"role": "user", "content": "go on"}]}
    reply = post(target, RESPONSES, "/v1/responses", json.dumps(body))
    assert_error(reply, RESPONSES, 400, "invalid_request", "input[0].encrypted_content")


def test_forged_thinking_signature_is_400(target: FuzzTarget, unchanged: None) -> None:
    """A signature in our format that this session did not issue is refused (was a 500,
    as above, then ignored)."""
    thinking = {
        "type": "thinking",
        "thinking": "",
        "signature": forged_token("thinking", "\\ud800"),
    }
    history = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": [thinking, {"type": "text", "text": "Hello."}]},
        {"role": "user", "content": "go on"},
    ]
    reply = post(
        target, MESSAGES, "/v1/messages", json.dumps({**MESSAGES.body, "messages": history})
    )
    assert_error(reply, MESSAGES, 400, "invalid_request", "messages[1].content[0].signature")


@pytest.mark.parametrize(
    ("protocol", "path", "marker"),
    [
        pytest.param(CHAT, "/v1/chat/completions", "emit-dict-arguments", id="chat-dict"),
        pytest.param(RESPONSES, "/v1/responses", "emit-dict-arguments", id="responses-dict"),
        pytest.param(MESSAGES, "/v1/messages", "emit-dict-arguments", id="messages-dict"),
        # Only Anthropic decodes string arguments into the reply (`tool_use.input`).
        pytest.param(MESSAGES, "/v1/messages", "emit-string-arguments", id="messages-string"),
    ],
)
def test_sampled_tool_call_with_a_surrogate_escape_is_answered(
    target: FuzzTarget, protocol: Protocol, path: str, marker: str
) -> None:
    """The model wrote a `\\ud800` escape in a tool call. Decoded into the reply it could not
    be encoded (a 500 after the engine answered): now a call whose arguments object holds
    one is returned as text, and one whose arguments are a JSON string keeps that string."""
    make, _ = TEXT_AT[protocol.name]
    limit = "max_output_tokens" if protocol is RESPONSES else "max_tokens"
    reply = post(target, protocol, path, json.dumps({**make(marker), limit: 200}))
    assert reply.status_code == 200, reply.text
    assert "\\ud800" in reply.text


# --- content types -----------------------------------------------------------------------


@pytest.mark.parametrize(("protocol", "path"), BODY_ENDPOINTS)
@pytest.mark.parametrize(
    "content_type",
    ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=b", None],
)
def test_non_json_content_type_is_415(
    target: FuzzTarget, protocol: Protocol, path: str, content_type: str | None, unchanged: None
) -> None:
    """The body is valid JSON, and was accepted whatever the declared type."""
    reply = post(target, protocol, path, json.dumps(protocol.body), content_type)
    message = assert_error(reply, protocol, 415, "unsupported_media_type", None)
    assert "application/json" in message


@pytest.mark.parametrize(
    "content_type",
    ["application/json; charset=utf-8", "Application/JSON", "application/vnd.x+json"],
)
def test_json_content_types_are_accepted(target: FuzzTarget, content_type: str) -> None:
    reply = post(target, CHAT, "/v1/chat/completions", json.dumps(CHAT.body), content_type)
    assert reply.status_code == 200, reply.text


# --- unknown paths and methods -------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path", "protocol"),
    [
        ("GET", "/v1/chat/completion", CHAT),
        ("POST", "/v1/embeddings", CHAT),
        ("GET", "/v1/responses/resp_123", RESPONSES),
        ("POST", "/v1/messages/batches", MESSAGES),
        ("GET", "/v1/messages/msg_1", MESSAGES),
        ("GET", "/sessions/s1/calls", CONTROL),
        ("GET", "/", CONTROL),
    ],
)
def test_unknown_path_is_a_json_404(
    target: FuzzTarget, method: str, path: str, protocol: Protocol
) -> None:
    """Was Starlette's plain-text "Not Found"."""
    reply = target.client(protocol).request(
        method, path, headers={"Content-Type": "application/json"}
    )
    message = assert_error(reply, protocol, 404, "not_found", None)
    assert path in message


@pytest.mark.parametrize(
    ("method", "path", "protocol", "allowed"),
    [
        ("GET", "/v1/chat/completions", CHAT, {"POST"}),
        ("PUT", "/v1/responses", RESPONSES, {"POST"}),
        ("DELETE", "/v1/responses/compact", RESPONSES, {"POST"}),
        ("POST", "/v1/models", CHAT, {"GET", "HEAD"}),
        ("GET", "/v1/messages", MESSAGES, {"POST"}),
        ("PATCH", "/v1/messages/count_tokens", MESSAGES, {"POST"}),
        ("PUT", "/sessions", CONTROL, {"GET", "HEAD", "POST"}),
        ("PUT", "/sessions/s1", CONTROL, {"GET", "HEAD", "DELETE"}),
        ("POST", "/sessions/s1/trajectory", CONTROL, {"GET", "HEAD"}),
        ("POST", "/health", CONTROL, {"GET", "HEAD"}),
    ],
)
def test_wrong_method_is_a_json_405_with_allow(
    target: FuzzTarget, method: str, path: str, protocol: Protocol, allowed: set[str]
) -> None:
    """Was Starlette's plain-text "Method Not Allowed"; `Allow` lists every method."""
    reply = target.client(protocol).request(
        method, path, headers={"Content-Type": "application/json"}
    )
    message = assert_error(reply, protocol, 405, "method_not_allowed", None)
    assert set(reply.headers["allow"].split(", ")) == allowed
    assert method in message


# --- body size ---------------------------------------------------------------------------


@pytest.mark.parametrize(("protocol", "path"), BODY_ENDPOINTS)
@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_oversized_body_is_413(
    target: FuzzTarget, protocol: Protocol, path: str, chunked: bool, unchanged: None
) -> None:
    """Declared too large, or found too large while streaming in (no Content-Length)."""
    data = json.dumps({**protocol.body, "pad": "x" * MAX_BODY}).encode()
    token = target.gateway.admin_token if protocol.control else target.fuzz_token
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {token}"}
    content: Any = iter([data[:1000], data[1000:]]) if chunked else data
    reply = target.client(protocol).post(path, content=content, headers=headers)
    assert ("content-length" in reply.request.headers) is not chunked
    assert_error(reply, protocol, 413, "too_large", None)


# --- fuzz ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(PROTOCOLS))
def test_fuzzed_requests_never_get_a_5xx(target: FuzzTarget, name: str) -> None:
    """A few hundred generated malformed requests per protocol: every reply is below 500,
    every error is in the protocol's shape, and the witness session's recorded calls stay
    exactly as they were."""
    protocol = PROTOCOLS[name]
    before = target.witness_trajectory()
    seen: list[int] = []

    @settings(
        max_examples=300,
        derandomize=True,
        database=None,
        deadline=None,
        phases=[Phase.generate, Phase.shrink],
        suppress_health_check=list(HealthCheck),
    )
    @given(request=fuzz_request(protocol))
    def one(request: FuzzRequest) -> None:
        reply = target.send(protocol, request)
        seen.append(reply.status_code)
        assert reply.status_code < 500, (request, reply.text)
        if reply.status_code >= 400 and request.method != "HEAD":
            assert error_shape_problem(protocol.shape, reply) is None, (request, reply.text)

    one()
    assert len(seen) >= 300
    assert any(200 <= status < 300 for status in seen), "every request was refused"
    assert target.witness_trajectory() == before
