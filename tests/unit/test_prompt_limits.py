"""What the prompt caps count, and the 413 that names the limit."""

import pytest

from gateway.calls.prompt_limits import (
    check_history_items,
    check_prompt_size,
    history_items,
    prompt_size,
)
from gateway.canonical import CanonicalRequest, Message, Tool, ToolCall
from gateway.errors import GatewayError


def request(messages: list[Message], tools: list[Tool] | None = None) -> CanonicalRequest:
    return CanonicalRequest(
        protocol="openai_chat",
        path="/v1/chat/completions",
        model="m",
        messages=messages,
        tools=tools or [],
    )


def test_every_text_the_template_renders_is_counted() -> None:
    call = ToolCall(id="c1", name="run", arguments='{"cmd": "ls"}')
    messages = [
        Message(role="user", content="abcd"),
        Message(role="assistant", content=None, reasoning="xy", tool_calls=[call]),
        Message(role="tool", content="out", tool_call_id="c1"),
    ]
    tool = Tool(name="run", description="Run it.", parameters={"type": "object"})
    size = prompt_size(request(messages, [tool]))
    assert size.messages == 3
    parameters = len('{"type":"object"}')
    assert size.chars == 4 + 2 + len("run") + len(call.arguments) + 3 + 3 + 7 + parameters


def test_a_prompt_over_a_cap_is_refused_naming_the_limit() -> None:
    size = prompt_size(request([Message(role="user", content="x" * 10)] * 3))
    check_prompt_size(size, max_messages=3, max_chars=30)  # at the caps
    check_prompt_size(size, max_messages=0, max_chars=0)  # no caps
    with pytest.raises(GatewayError, match="3 messages; the limit is 2") as many:
        check_prompt_size(size, max_messages=2, max_chars=0)
    with pytest.raises(GatewayError, match="30 characters; the limit is 29") as long:
        check_prompt_size(size, max_messages=0, max_chars=29)
    assert many.value.status == long.value.status == 413
    assert many.value.param == long.value.param == "messages"


def test_a_raw_history_is_measured_before_it_is_parsed() -> None:
    assert history_items({"messages": [{}, {}]}) == 2
    assert history_items({"input": [{}, {}, {}]}) == 3
    assert history_items({"input": "just text"}) == 0
    check_history_items(3, 3)
    with pytest.raises(GatewayError, match="4 messages; the limit is 3"):
        check_history_items(4, 3)
