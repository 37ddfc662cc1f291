"""Large new content is tokenized in the gateway's tokenizer pool (a worker process), off
the event loop, and the prompt it yields is token for token the one inline tokenization
gives: the same conversation through a gateway that offloads everything large and one
that never offloads records the same prompt ids and sends the engine the same prompts."""

from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from devstack.background_server import BackgroundServer
from devstack.scripted_engine import Script, ScriptedEngine, ScriptRule

pytestmark = pytest.mark.integration

TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "run",
            "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
        },
    }
]
TOOL_REPLY = '<tool_call>\n{"name": "run", "arguments": {"cmd": "cat big.log"}}\n</tool_call>'


def offloaded_encodes(metrics: str) -> float:
    for line in metrics.splitlines():
        if line.startswith("rollout_gateway_offloaded_encodes_total "):
            return float(line.split()[1])
    raise AssertionError("rollout_gateway_offloaded_encodes_total is not exported")


def run_conversation(gateway: Any) -> list[list[int]]:
    """A fork with a large first message, then a tool turn whose output is large: two
    large new texts. Returns the recorded prompt ids of its calls."""
    session = gateway.create_session()
    client = openai.OpenAI(base_url=session["openai_base_url"], api_key=session["token"])
    messages: list[Any] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Read the log. " + "error: disk quota ünïcode 42\n" * 120},
    ]
    first = client.chat.completions.create(model="m", messages=messages, tools=TOOLS)
    call = first.choices[0].message.tool_calls[0]  # type: ignore[index]
    messages.append(first.choices[0].message.model_dump(exclude_none=True))
    log = "".join(f"line {i}: worker {i % 7} wrote block {i * 31}\n" for i in range(300))
    messages.append({"role": "tool", "tool_call_id": call.id, "content": log})
    client.chat.completions.create(model="m", messages=messages, tools=TOOLS)
    calls = gateway.trajectory(session["session_id"])["calls"]
    assert [c["status"] for c in calls] == ["ok", "ok"]
    return [c["prompt_ids"] for c in calls]


def test_large_new_text_is_tokenized_off_the_loop_with_the_same_ids(
    tiny_model_dir: Path, gateway_factory: Any
) -> None:
    engine = ScriptedEngine(
        tiny_model_dir / "tokenizer.json",
        Script(default_reply="done", rules=[ScriptRule(reply=TOOL_REPLY)]),
    )
    with BackgroundServer(engine.app()) as engine_server:
        offloading = gateway_factory(
            engine_server.url, tiny_model_dir, "tiny", tokenize_offload_chars=1000
        )
        offloaded_prompts = run_conversation(offloading)
        sent_offloaded = [list(p) for p in engine.prompts]
        engine.reset()
        inline = gateway_factory(
            engine_server.url, tiny_model_dir, "tiny", tokenize_offload_chars=0
        )
        inline_prompts = run_conversation(inline)
        sent_inline = [list(p) for p in engine.prompts]

        assert offloaded_prompts == inline_prompts
        assert sent_offloaded == sent_inline == inline_prompts
        # The second prompt extends the first call's held tokens (a clean extension).
        assert offloaded_prompts[1][: len(offloaded_prompts[0])] == offloaded_prompts[0]
        metrics = [
            httpx.get(f"{g.control_url}/metrics", headers=g.admin_headers).text
            for g in (offloading, inline)
        ]
        assert offloaded_encodes(metrics[0]) == 2  # the fork's whole text, the tool output
        assert offloaded_encodes(metrics[1]) == 0


def test_a_many_message_request_planned_in_a_thread_gets_the_same_ids(
    tiny_model_dir: Path, gateway_factory: Any
) -> None:
    """A request of at least `plan_thread_messages` messages is planned off the event loop
    (in a thread): the same conversation planned there and on the loop records the same
    prompt ids, a fork and then an extension of its held segment."""
    engine = ScriptedEngine(
        tiny_model_dir / "tokenizer.json",
        Script(default_reply="done", rules=[ScriptRule(reply=TOOL_REPLY)]),
    )
    with BackgroundServer(engine.app()) as engine_server:
        prompts = []
        for threshold in (2, 0):
            engine.reset()
            gateway = gateway_factory(engine_server.url, tiny_model_dir, "tiny")
            gateway.gateway.options.plan_thread_messages = threshold
            prompts.append(run_conversation(gateway))
    assert prompts[0] == prompts[1]
    assert prompts[0][1][: len(prompts[0][0])] == prompts[0][0]
