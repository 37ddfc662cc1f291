"""Responses and Anthropic Messages through the real Gateway over HTTP, driven by the
official `openai` and `anthropic` SDKs, stream and not, with a scripted engine (a fake
LLM that follows a script; tokens come from the real tokenizer). Every stream parses,
tool loops stay one token-exact segment, and side calls land in the right scenes."""

from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from devstack.background_server import BackgroundServer
from devstack.scripted_engine import Script, ScriptedEngine, ScriptRule

pytestmark = pytest.mark.integration

TOOL_REPLY = (
    '<think>\nI should list files.\n</think>\n\n<tool_call>\n{"name": "bash", '
    '"arguments": {"command": "ls"}}\n</tool_call>'
)
FINAL_REPLY = "<think>\nDone now.\n</think>\n\nThe directory holds hello.py."


@pytest.fixture
def scripted_gateway(tiny_model_dir: Path, gateway_factory: Any):
    script = Script(
        rules=[
            ScriptRule(when_contains="Summarize", reply="Summary: we listed files.", repeat=True),
            ScriptRule(when_contains="FINISH", reply=FINAL_REPLY, repeat=True),
        ],
        default_reply=TOOL_REPLY,
    )
    engine = ScriptedEngine(tiny_model_dir / "tokenizer.json", script, model="tiny-qwen3")
    with BackgroundServer(engine.app()) as server:
        yield gateway_factory(server.url, tiny_model_dir, "tiny-qwen3"), engine


def one_segment(gw: Any, session_id: str, calls: int) -> dict[str, Any]:
    trajectory = gw.trajectory(session_id)
    assert len(trajectory["calls"]) == calls
    assert len(trajectory["segments"]) == 1, [c["match"] for c in trajectory["calls"]]
    segment = trajectory["segments"][0]
    assert sum(segment["loss_mask"]) == sum(len(c["output_ids"]) for c in trajectory["calls"])
    return segment


@pytest.mark.parametrize("stream", [False, True])
def test_anthropic_sdk_tool_loop(scripted_gateway: Any, stream: bool) -> None:
    gw, _ = scripted_gateway
    session = gw.create_session()
    client = anthropic.Anthropic(base_url=session["anthropic_base_url"], api_key=session["token"])
    tools = [
        {
            "name": "bash",
            "description": "Run a command.",
            "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}},
        }
    ]
    messages: list[dict[str, Any]] = [{"role": "user", "content": "What is here?"}]
    for turn in range(3):
        kwargs: dict[str, Any] = {
            "model": "tiny-qwen3",
            "max_tokens": 256,
            "system": [{"type": "text", "text": "You are a coding agent."}],
            "messages": messages,
            "tools": tools,
        }
        if stream:
            with client.messages.stream(**kwargs) as events:
                message = events.get_final_message()
        else:
            message = client.messages.create(**kwargs)
        assert message.stop_reason == "tool_use"
        kinds = [block.type for block in message.content]
        assert kinds == ["thinking", "tool_use"], kinds
        tool_use = message.content[-1]
        assert tool_use.name == "bash" and tool_use.input == {"command": "ls"}
        messages.append({"role": "assistant", "content": [b.model_dump() for b in message.content]})
        messages.append(
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": tool_use.id,
                        "content": f"hello.py {turn}",
                    }
                ],
            }
        )
    count = client.messages.count_tokens(model="tiny-qwen3", messages=messages, tools=tools)
    assert count.input_tokens > 50
    one_segment(gw, session["session_id"], 3)


@pytest.mark.parametrize("stream", [False, True])
def test_openai_responses_sdk_tool_loop_with_store_false(
    scripted_gateway: Any, stream: bool
) -> None:
    gw, _ = scripted_gateway
    session = gw.create_session()
    client = openai.OpenAI(base_url=session["openai_base_url"], api_key=session["token"])
    tools = [
        {
            "type": "function",
            "name": "bash",
            "description": "Run a command.",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
        }
    ]
    items: list[Any] = [{"role": "user", "content": "What is here?"}]
    for turn in range(3):
        kwargs: dict[str, Any] = {
            "model": "tiny-qwen3",
            "instructions": "You are a coding agent.",
            "input": items,
            "tools": tools,
            "store": False,
            "include": ["reasoning.encrypted_content"],
        }
        if stream:
            with client.responses.stream(**kwargs) as events:
                response = events.get_final_response()
        else:
            response = client.responses.create(**kwargs)
        types = [item.type for item in response.output]
        assert types == ["reasoning", "function_call"], types
        call = response.output[-1]
        assert call.name == "bash"
        # Codex replays the whole history itself, reasoning items verbatim.
        items += [item.model_dump(exclude_none=True) for item in response.output]
        items.append(
            {"type": "function_call_output", "call_id": call.call_id, "output": f"hello.py {turn}"}
        )
    one_segment(gw, session["session_id"], 3)


def test_side_calls_get_scenes_and_the_segment_tree_links(scripted_gateway: Any) -> None:
    gw, _ = scripted_gateway
    session = gw.create_session()
    token = session["token"]
    client = openai.OpenAI(base_url=session["openai_base_url"], api_key=token)
    main_items: list[Any] = [{"role": "user", "content": "Fix the bug."}]
    first = client.responses.create(model="m", input=main_items, store=False)
    main_items += [i.model_dump(exclude_none=True) for i in first.output]
    # A probe (max_tokens 1) and a sub-agent (Codex marks it with a header).
    client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "ping"}], max_tokens=1
    )
    client.responses.create(
        model="m",
        input=[{"role": "user", "content": "Explore the repo."}],
        store=False,
        extra_headers={"x-openai-subagent": "explorer"},
    )
    # Older Codex compacts through /responses/compact.
    compact = httpx.post(
        f"{session['openai_base_url']}/responses/compact",
        headers={"Authorization": f"Bearer {token}"},
        json={"model": "m", "input": main_items, "instructions": "Summarize"},
    )
    assert compact.status_code == 200, compact.text
    # The main conversation resumes from the summary.
    client.responses.create(
        model="m",
        input=[*compact.json()["output"], {"role": "user", "content": "Continue."}],
        store=False,
    )
    trajectory = gw.trajectory(session["session_id"])
    scenes = [c["scene"] for c in trajectory["calls"]]
    assert scenes == ["main", "probe", "subagent", "compaction", "main"]
    # Every call opened its own segment here, and says why it could not extend one.
    assert all(c["match"] == "fork" and c["fork_reason"] for c in trajectory["calls"])
    by_scene = {s["scene"]: s for s in trajectory["segments"] if s["scene"] != "main"}
    mains = [s for s in trajectory["segments"] if s["scene"] == "main"]
    assert len(mains) == 2
    assert not by_scene["probe"]["trainable"]
    assert by_scene["subagent"]["link"] == "spawned_by"
    assert by_scene["subagent"]["parent_id"] == mains[0]["segment_id"]
    assert by_scene["compaction"]["link"] == "continues"
    assert by_scene["compaction"]["parent_id"] == mains[0]["segment_id"]
    assert mains[1]["link"] == "continues"
    assert mains[1]["parent_id"] == by_scene["compaction"]["segment_id"]


def test_anthropic_errors_come_back_in_anthropic_shape(scripted_gateway: Any) -> None:
    gw, _ = scripted_gateway
    session = gw.create_session()
    client = anthropic.Anthropic(
        base_url=session["anthropic_base_url"], api_key=session["token"] + "x", max_retries=0
    )
    with pytest.raises(anthropic.AuthenticationError):
        client.messages.create(
            model="m", max_tokens=10, messages=[{"role": "user", "content": "hi"}]
        )
    reply = httpx.post(
        f"{session['anthropic_base_url']}/v1/messages?beta=true",
        headers={"x-api-key": session["token"]},
        json={"model": "m", "messages": [{"role": "user", "content": 3}], "max_tokens": 5},
    )
    assert reply.status_code == 400
    body = reply.json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"


@pytest.fixture
def two_gateways(tiny_model_dir: Path, gateway_factory: Any):
    """Two gateways on their own data dirs in front of one scripted engine."""
    engine = ScriptedEngine(
        tiny_model_dir / "tokenizer.json", Script(default_reply=FINAL_REPLY), model="tiny-qwen3"
    )
    with BackgroundServer(engine.app()) as server:
        yield [gateway_factory(server.url, tiny_model_dir, "tiny-qwen3") for _ in range(2)]


def test_reasoning_tokens_are_bound_to_their_session(two_gateways: Any) -> None:
    """The thinking `signature` and the reasoning `encrypted_content` a session's reply
    carries restore its reasoning in that session only: echoed into another session of the
    same gateway, or into a session of a gateway on another data dir, they are a 400 that
    names the field. The control is the same echo in the session that got them."""
    gw, other_gateway = two_gateways
    own, other, elsewhere = gw.create_session(), gw.create_session(), other_gateway.create_session()
    question = {"role": "user", "content": "What is here?"}

    def claude(session: dict[str, Any]) -> anthropic.Anthropic:
        return anthropic.Anthropic(
            base_url=session["anthropic_base_url"], api_key=session["token"], max_retries=0
        )

    first = claude(own).messages.create(model="tiny-qwen3", max_tokens=256, messages=[question])
    thinking = first.content[0].model_dump()
    assert thinking["type"] == "thinking" and thinking["signature"].startswith("rollout2.")
    # Claude Code may hide the thinking text; only the signature then carries it.
    echo = [
        question,
        {"role": "assistant", "content": [{**thinking, "thinking": ""}]},
        {"role": "user", "content": "Go on."},
    ]
    reply = claude(own).messages.create(model="tiny-qwen3", max_tokens=256, messages=echo)
    assert reply.content[-1].type == "text"  # control: its own session reads it back
    for stranger in (other, elsewhere):
        with pytest.raises(anthropic.BadRequestError) as refused:
            claude(stranger).messages.create(model="tiny-qwen3", max_tokens=256, messages=echo)
        assert refused.value.status_code == 400
        assert "messages[1].content[0].signature" in str(refused.value)

    def codex(session: dict[str, Any]) -> openai.OpenAI:
        return openai.OpenAI(
            base_url=session["openai_base_url"], api_key=session["token"], max_retries=0
        )

    kwargs: dict[str, Any] = {"model": "tiny-qwen3", "store": False}
    kwargs["include"] = ["reasoning.encrypted_content"]
    response = codex(own).responses.create(input=[question], **kwargs)
    reasoning = response.output[0].model_dump(exclude_none=True)
    assert reasoning["type"] == "reasoning"
    items = [question, reasoning, {"role": "user", "content": "Go on."}]
    assert codex(own).responses.create(input=items, **kwargs).status == "completed"
    for stranger in (other, elsewhere):
        with pytest.raises(openai.BadRequestError) as bad:
            codex(stranger).responses.create(input=items, **kwargs)
        assert bad.value.status_code == 400
        assert bad.value.param == "input[1].encrypted_content"  # type: ignore[attr-defined]
