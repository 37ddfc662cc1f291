"""A reply cut at `max_tokens`, then the agent's next call, through the real Gateway over
HTTP on Chat Completions, Responses and Anthropic Messages, with the scripted engine (a
fake LLM; the tiny model's real tokenizer and chat template).

The agent echoes the cut reply as it got it and adds its next message. The next call
must extend the same segment: the sampled ids unchanged (trained), then the template's
end-of-turn marker closing the cut turn and the new messages as prompt tokens (not
trained), the call's drift naming that marker. Cut points: mid-answer, inside reasoning
(`<think>` not closed), inside a tool call (the agent sees the broken block as text), and
inside a second tool call after a complete first one (the agent runs the first).
"""

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from tokenizers import Tokenizer

from devstack.background_server import BackgroundServer
from devstack.scripted_engine import Script, ScriptedEngine, ScriptRule
from workers.local_stack import InProcessGateway

pytestmark = pytest.mark.integration

IM_END = "<|im_end|>"
CALL_LS = '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>'
LONG_CALL = (
    '<tool_call>\n{"name": "bash", "arguments": {"command": "find . -name hello.py '
    '-newer setup.py -print -quit and a long tail of more words"}}\n</tool_call>'
)
FOLLOW_UP = "That was cut; try again, shorter."


@dataclass(frozen=True)
class Case:
    reply: str
    cut_after: str
    """The reply is cut at `max_tokens` a little after this text."""
    runs_a_tool: bool = False
    """The agent got a complete tool call (and sends its result next)."""


CASES = {
    "mid-answer": Case(
        "Let me look around the whole repository before I change anything at all.",
        "the whole",
    ),
    "in reasoning": Case(
        "<think>\nThe user wants many things and I must weigh each of them carefully "
        "before acting on any.\n</think>\n\nok",
        "weigh each",
    ),
    "in a tool call": Case(LONG_CALL, "-newer"),
    "in a second tool call": Case(
        f"<think>\nTwo lookups.\n</think>\n\n{CALL_LS}\n{LONG_CALL}", "-newer", runs_a_tool=True
    ),
}

BASH = {"type": "object", "properties": {"command": {"type": "string"}}}


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> Tokenizer:
    return Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json"))


@pytest.fixture
def engine_gateway(
    tiny_model_dir: Path, gateway_factory: Any
) -> Iterator[tuple[ScriptedEngine, InProcessGateway]]:
    engine = ScriptedEngine(
        tiny_model_dir / "tokenizer.json", Script(default_reply="Done {nonce}."), model="tiny"
    )
    with BackgroundServer(engine.app()) as server:
        yield engine, gateway_factory(server.url, tiny_model_dir, "tiny")


def cut_length(tokenizer: Tokenizer, case: Case) -> int:
    """`max_tokens` that cuts the reply a few tokens after `cut_after`."""
    upto = case.reply[: case.reply.index(case.cut_after) + len(case.cut_after)]
    return len(tokenizer.encode(upto, add_special_tokens=False).ids) + 2


def chat_calls(session: dict[str, Any], max_tokens: int) -> str:
    """Two calls as an agent on Chat Completions makes them; returns the first's finish."""
    url = f"{session['openai_base_url']}/chat/completions"
    headers = {"Authorization": f"Bearer {session['token']}"}
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "What is here?"},
    ]
    tools = [{"type": "function", "function": {"name": "bash", "parameters": BASH}}]
    finish = ""
    for limit in (max_tokens, 64):
        body = {"model": "tiny", "messages": messages, "tools": tools, "max_tokens": limit}
        reply = httpx.post(url, headers=headers, json=body)
        assert reply.status_code == 200, reply.text
        choice = reply.json()["choices"][0]
        finish = finish or choice["finish_reason"]
        # Echoed as the client library dumps it (None fields dropped).
        messages.append({k: v for k, v in choice["message"].items() if v is not None})
        calls = choice["message"].get("tool_calls") or []
        for call in calls:
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": "hello.py"})
        if not calls:
            messages.append({"role": "user", "content": FOLLOW_UP})
    return finish


def responses_calls(session: dict[str, Any], max_tokens: int) -> str:
    url = f"{session['openai_base_url']}/responses"
    headers = {"Authorization": f"Bearer {session['token']}"}
    items: list[dict[str, Any]] = [{"role": "user", "content": "What is here?"}]
    tools = [{"type": "function", "name": "bash", "parameters": BASH}]
    status = ""
    for limit in (max_tokens, 64):
        body = {
            "model": "tiny",
            "instructions": "You are a coding agent.",
            "input": items,
            "tools": tools,
            "store": False,
            "include": ["reasoning.encrypted_content"],
            "max_output_tokens": limit,
        }
        reply = httpx.post(url, headers=headers, json=body)
        assert reply.status_code == 200, reply.text
        response = reply.json()
        status = status or response["status"]
        items += response["output"]  # replayed verbatim, as Codex does
        calls = [i for i in response["output"] if i["type"] == "function_call"]
        for call in calls:
            items.append(
                {"type": "function_call_output", "call_id": call["call_id"], "output": "hello.py"}
            )
        if not calls:
            items.append({"role": "user", "content": FOLLOW_UP})
    return status


def anthropic_calls(session: dict[str, Any], max_tokens: int) -> str:
    url = f"{session['anthropic_base_url']}/v1/messages"
    headers = {"x-api-key": session["token"]}
    messages: list[dict[str, Any]] = [{"role": "user", "content": "What is here?"}]
    tools = [{"name": "bash", "input_schema": BASH}]
    stop = ""
    for limit in (max_tokens, 64):
        body = {
            "model": "tiny",
            "system": "You are a coding agent.",
            "messages": messages,
            "tools": tools,
            "max_tokens": limit,
        }
        reply = httpx.post(url, headers=headers, json=body)
        assert reply.status_code == 200, reply.text
        message = reply.json()
        stop = stop or message["stop_reason"]
        messages.append({"role": "assistant", "content": message["content"]})
        uses = [b for b in message["content"] if b["type"] == "tool_use"]
        results = [
            {"type": "tool_result", "tool_use_id": b["id"], "content": "hello.py"} for b in uses
        ]
        messages.append({"role": "user", "content": results or FOLLOW_UP})
    return stop


PROTOCOLS = {
    "chat": (chat_calls, {False: "length", True: "tool_calls"}),
    "responses": (responses_calls, {False: "incomplete", True: "completed"}),
    "anthropic": (anthropic_calls, {False: "max_tokens", True: "tool_use"}),
}
"""Each protocol's two calls, and how it reports the cut call (without, with a complete
tool call)."""


@pytest.mark.parametrize("protocol", list(PROTOCOLS))
@pytest.mark.parametrize("name", list(CASES))
def test_the_call_after_a_cut_reply_continues_its_segment(
    engine_gateway: tuple[ScriptedEngine, InProcessGateway],
    tokenizer: Tokenizer,
    name: str,
    protocol: str,
) -> None:
    engine, gw = engine_gateway
    case = CASES[name]
    engine.reset(Script(rules=[ScriptRule(reply=case.reply)], default_reply="Done {nonce}."))
    session = gw.create_session()
    calls, cut_status = PROTOCOLS[protocol]
    # A cut reply with a complete tool call is answered as a tool call, so the agent
    # runs it; the recorded finish stays the engine's.
    assert calls(session, cut_length(tokenizer, case)) == cut_status[case.runs_a_tool]

    trajectory = gw.trajectory(session["session_id"])
    first, second = trajectory["calls"]
    assert first["finish_reason"] == "length"
    assert first["output_ids"] == engine.replies[0].output_ids
    assert (first["parse_error"] is not None) == ("tool call" in name)
    assert second["match"] != "fork", second["fork_reason"]
    # Message 2: the system prompt (instructions, Anthropic's `system`) and the question
    # come first on every protocol.
    note = f"message 2 (assistant): cut at max_tokens, closed with {IM_END!r}"
    assert [d for d in second["drift"] if "cut at max_tokens" in d] == [
        f"{note} (prompt tokens, not trained)"
    ]

    # One segment: call 1's prompt, its sampled ids unchanged (trained), the closing
    # marker and the new messages (not trained), then call 2's sampled ids (trained).
    assert len(trajectory["segments"]) == 1
    segment = trajectory["segments"][0]
    out = first["output_ids"]
    assert segment["prompt_ids"] == first["prompt_ids"]
    assert second["prompt_ids"][: len(first["prompt_ids"]) + len(out)] == [
        *first["prompt_ids"],
        *out,
    ]
    added = second["prompt_ids"][len(first["prompt_ids"]) + len(out) :]
    assert added[0] == tokenizer.token_to_id(IM_END) and IM_END not in tokenizer.decode(
        out, skip_special_tokens=False
    )
    assert segment["response_ids"] == [*out, *added, *second["output_ids"]]
    assert segment["loss_mask"] == [1] * len(out) + [0] * len(added) + [1] * len(
        second["output_ids"]
    )
