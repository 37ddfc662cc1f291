"""What the prompt caps count, and the 413 that names the limit."""

from collections.abc import Callable
from typing import Any

import pytest

from gateway.calls import prompt_limits
from gateway.calls.prompt_limits import (
    PromptSizes,
    check_history_items,
    check_prompt_size,
    history_items,
    prompt_size,
)
from gateway.canonical import CanonicalRequest, Message, Tool, ToolCall
from gateway.errors import GatewayError
from gateway.protocols.anthropic_messages.request import parse_messages_request
from gateway.protocols.history import HistoryCache
from gateway.protocols.openai_chat.request import parse_chat_request
from gateway.protocols.openai_responses.request import parse_responses_request


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


def _chat(turns: int) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "List the files."},
    ]
    for t in range(turns):
        call = {"id": f"c{t}", "type": "function", "function": {"name": "ls", "arguments": "{}"}}
        messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": f"c{t}", "content": f"out {t}"})
    return {"model": "m", "messages": messages}


def _responses(turns: int) -> dict[str, Any]:
    items: list[dict[str, Any]] = [{"role": "user", "content": "List the files."}]
    for t in range(turns):
        items.append({"type": "function_call", "call_id": f"c{t}", "name": "ls", "arguments": "{}"})
        items.append({"type": "function_call_output", "call_id": f"c{t}", "output": f"out {t}"})
    return {"model": "m", "instructions": "Be brief.", "input": items}


def _messages(turns: int) -> dict[str, Any]:
    history: list[dict[str, Any]] = [{"role": "user", "content": "List the files."}]
    for t in range(turns):
        use = {"type": "tool_use", "id": f"t{t}", "name": "ls", "input": {}}
        history.append({"role": "assistant", "content": [use]})
        result = {"type": "tool_result", "tool_use_id": f"t{t}", "content": f"out {t}"}
        history.append({"role": "user", "content": [result]})
    return {"model": "m", "system": "Be brief.", "messages": history, "max_tokens": 8}


@pytest.mark.parametrize(
    ("body", "parse"),
    [
        (_chat, parse_chat_request),
        (_responses, parse_responses_request),
        (_messages, parse_messages_request),
    ],
)
def test_a_session_counts_only_the_messages_its_last_call_did_not_have(
    body: Callable[[int], dict[str, Any]],
    parse: Callable[..., CanonicalRequest],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    read: list[Message] = []
    counted = prompt_limits._message_chars
    monkeypatch.setattr(prompt_limits, "_message_chars", lambda m: read.append(m) or counted(m))
    history, sizes = HistoryCache(), PromptSizes()
    for turn in range(6):
        canonical = parse(body(turn), None, history=history)
        read.clear()
        size = sizes.size(canonical)
        by_sizes = len(read)
        read.clear()
        assert size == prompt_size(canonical)
        assert len(read) == len(canonical.messages)  # a full count reads every message
        if turn >= 3:
            # of the resent history, the cache resumed the very messages the last call
            # had: only this turn's two new ones (and what a protocol builds again each
            # call: a system prompt, the turn it was folding) are read
            assert by_sizes <= 4 < len(canonical.messages)


def test_an_edited_or_shorter_history_is_counted_again() -> None:
    sizes = PromptSizes()
    first = [Message(role="user", content="abc"), Message(role="assistant", content="de")]
    assert sizes.size(request(first)).chars == 5
    edited = [first[0], Message(role="assistant", content="defgh")]
    assert sizes.size(request(edited)) == prompt_size(request(edited))
    assert sizes.size(request(edited[:1])).chars == 3
    other = [Message(role="user", content="x" * 7)]
    assert sizes.size(request(other)).chars == 7
