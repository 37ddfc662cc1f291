"""What a call records of the conversation, through the real Gateway over HTTP with the
official `openai` and `anthropic` SDKs as clients and a scripted engine (a fake LLM that
follows a script; tokens come from the real tokenizer): per call, only the messages new
since the segment's previous call, the tools by name, and the reply as parsed, in each
protocol; hostile sizes are clipped."""

import json
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from devstack.background_server import BackgroundServer
from devstack.scripted_engine import Script, ScriptedEngine, ScriptRule
from schemas.conversation import CONVERSATION_TEXT_CHARS, CallConversation

pytestmark = pytest.mark.integration

TOOL_REPLY = (
    '<think>\nI should list files.\n</think>\n\n<tool_call>\n{"name": "bash", '
    '"arguments": {"command": "ls"}}\n</tool_call>'
)
FINAL_REPLY = "<think>\nDone now.\n</think>\n\nThe directory holds hello.py."
SYSTEM = "You are a coding agent."
RESULT = "hello.py <script>x</script>"


@pytest.fixture
def gw(tiny_model_dir: Path, gateway_factory: Any) -> Any:
    script = Script(
        rules=[ScriptRule(when_contains="hello.py", reply=FINAL_REPLY, repeat=True)],
        default_reply=TOOL_REPLY,
    )
    engine = ScriptedEngine(tiny_model_dir / "tokenizer.json", script, model="tiny-qwen3")
    with BackgroundServer(engine.app()) as server:
        yield gateway_factory(server.url, tiny_model_dir, "tiny-qwen3")


def conversations(gw: Any, session_id: str) -> list[CallConversation]:
    calls = gw.trajectory(session_id)["calls"]
    return [CallConversation.model_validate(c["conversation"]) for c in calls]


def chat_round_trip(session: dict[str, Any], result: str) -> None:
    client = openai.OpenAI(base_url=session["openai_base_url"], api_key=session["token"])
    tools = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]
    messages: list[Any] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "What is here?"},
    ]
    first = client.chat.completions.create(model="tiny-qwen3", messages=messages, tools=tools)
    call = first.choices[0].message.tool_calls[0]
    messages.append(first.choices[0].message.model_dump(exclude_none=True))
    messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    client.chat.completions.create(model="tiny-qwen3", messages=messages, tools=tools)


def messages_round_trip(session: dict[str, Any], result: str) -> None:
    client = anthropic.Anthropic(base_url=session["anthropic_base_url"], api_key=session["token"])
    tools = [{"name": "bash", "input_schema": {"type": "object"}}]
    messages: list[Any] = [{"role": "user", "content": "What is here?"}]
    kw: dict[str, Any] = {"model": "tiny-qwen3", "max_tokens": 256, "system": SYSTEM}
    first = client.messages.create(messages=messages, tools=tools, **kw)
    use = first.content[-1]
    messages.append({"role": "assistant", "content": [b.model_dump() for b in first.content]})
    messages.append(
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": use.id, "content": result}],
        }
    )
    client.messages.create(messages=messages, tools=tools, **kw)


def responses_round_trip(session: dict[str, Any], result: str) -> None:
    client = openai.OpenAI(base_url=session["openai_base_url"], api_key=session["token"])
    tools = [{"type": "function", "name": "bash", "parameters": {"type": "object"}}]
    items: list[Any] = [{"role": "user", "content": "What is here?"}]
    kw: dict[str, Any] = {"model": "tiny-qwen3", "instructions": SYSTEM, "tools": tools}
    first = client.responses.create(input=items, store=False, **kw)
    items += [item.model_dump(exclude_none=True) for item in first.output]
    call = first.output[-1]
    items.append({"type": "function_call_output", "call_id": call.call_id, "output": result})
    client.responses.create(input=items, store=False, **kw)


ROUND_TRIPS = {
    "openai_chat": chat_round_trip,
    "anthropic_messages": messages_round_trip,
    "openai_responses": responses_round_trip,
}


@pytest.mark.parametrize("protocol", list(ROUND_TRIPS))
def test_a_tool_round_trip_records_the_new_messages_and_the_reply(gw: Any, protocol: str) -> None:
    session = gw.create_session()
    ROUND_TRIPS[protocol](session, RESULT)
    first, second = conversations(gw, session["session_id"])

    assert first.history == 0 and first.tools == ["bash"]
    assert [(m.role, m.content) for m in first.messages] == [
        ("system", SYSTEM),
        ("user", "What is here?"),
    ]
    assert first.reply is not None and first.finish_reason == "stop"
    assert first.reply.reasoning == "I should list files."
    [tool_call] = first.reply.tool_calls
    assert tool_call.name == "bash" and json.loads(tool_call.arguments) == {"command": "ls"}

    # the second call carries only the tool's result: the history is held, not repeated
    assert second.history == 3
    [result] = second.messages
    assert result.role == "tool" and result.content == RESULT
    assert result.tool_call_id == tool_call.id
    assert second.reply is not None and second.reply.tool_calls == []
    assert second.reply.content == "The directory holds hello.py."


def test_a_text_past_the_cap_is_clipped_saying_how_much(gw: Any) -> None:
    """A tool result past the cap is kept to `CONVERSATION_TEXT_CHARS` characters, saying
    how many were cut; control: the same text under the cap is kept whole."""
    huge = "hello.py " + "x" * (CONVERSATION_TEXT_CHARS * 3)
    session = gw.create_session()
    chat_round_trip(session, huge)
    result = conversations(gw, session["session_id"])[1].messages[0].content
    assert result is not None and result.startswith(huge[:CONVERSATION_TEXT_CHARS])
    assert result.endswith(f"[… {len(huge) - CONVERSATION_TEXT_CHARS:,} more characters]")

    small = gw.create_session()
    chat_round_trip(small, huge[:CONVERSATION_TEXT_CHARS])
    kept = conversations(gw, small["session_id"])[1].messages[0].content
    assert kept == huge[:CONVERSATION_TEXT_CHARS]


def test_a_developer_message_is_recorded_as_one(gw: Any) -> None:
    """The record keeps the client's roles: a developer message (rendered as a system one)
    stays a developer message beside a system one."""
    session = gw.create_session()
    client = openai.OpenAI(base_url=session["openai_base_url"], api_key=session["token"])
    client.chat.completions.create(
        model="tiny-qwen3",
        messages=[
            {"role": "system", "content": SYSTEM},
            {"role": "developer", "content": "Answer in English."},
            {"role": "user", "content": "hello.py?"},
        ],
    )
    [call] = conversations(gw, session["session_id"])
    assert [(m.role, m.content) for m in call.messages] == [
        ("system", SYSTEM),
        ("developer", "Answer in English."),
        ("user", "hello.py?"),
    ]
