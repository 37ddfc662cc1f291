"""Thinking switched off by the agent (`chat_template_kwargs: {"enable_thinking": false}`)
on the families whose template has the switch: the generation prompt then closes the
reasoning block, and the Gateway must read the reply as content and calls, not as
reasoning. The same reply with thinking on is reasoning up to the call, which shows the
reading follows the prompt actually rendered.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from devstack.family_output import assistant_output
from devstack.scripted_engine import Script, ScriptedEngine, ScriptRule
from devstack.tiny_families import ensure_family_model, served_model_name
from gateway.canonical import Message, Tool, ToolCall
from gateway.prompt.chat_template import ChatTemplate
from gateway.prompt.model_files import load_model_files
from tests.fixtures.gateway import served_gateway
from tests.fixtures.real_templates import real_templates_dir
from workers.local_stack import InProcessGateway

pytestmark = pytest.mark.integration

TOOL = Tool(
    name="get_weather",
    description="Weather of a city.",
    parameters={"type": "object", "properties": {"city": {"type": "string"}}},
)
CHAT_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": TOOL.name,
            "description": TOOL.description,
            "parameters": TOOL.parameters,
        },
    }
]
QUESTION = "What is the weather in Paris?"
SAID = "Checking the weather."
CALL = ToolCall(id="call_1", name=TOOL.name, arguments=json.dumps({"city": "Paris"}))
OFF = {"enable_thinking": False}


def reply_text(model_dir: Path) -> str:
    """What the family's model writes for `SAID` + the call once thinking is off."""
    files = load_model_files(model_dir)
    template = ChatTemplate(
        files.chat_template, bos_token=files.bos_token, eos_token=files.eos_token
    )
    history = [Message(role="user", content=QUESTION)]
    reply = Message(role="assistant", content=SAID, tool_calls=[CALL])
    return assistant_output(template, history, reply, [TOOL], OFF)


@pytest.fixture(scope="module", params=["qwen3.5", "glm-4.7-flash"])
def stack(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[InProcessGateway, str]]:
    real_templates_dir()
    model_dir = ensure_family_model(request.param)
    files = load_model_files(model_dir)
    model = served_model_name(request.param)
    engine = ScriptedEngine(
        model_dir / "tokenizer.json",
        Script(rules=[ScriptRule(reply=reply_text(model_dir), repeat=True)]),
        eos_token=files.eos_token,
        model=model,
        stop_tokens=files.end_of_turn,
    )
    with served_gateway(engine.app(), model_dir, tmp_path_factory.mktemp("gw"), model) as gateway:
        yield gateway, model


def ask(stack: tuple[InProcessGateway, str], extra_body: dict[str, Any]) -> Any:
    gateway, model = stack
    session = gateway.create_session()
    client = openai.OpenAI(
        base_url=session["openai_base_url"], api_key=session["token"], max_retries=0
    )
    return client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": QUESTION}],
        tools=CHAT_TOOLS,  # type: ignore[arg-type]
        extra_body=extra_body,
    ).choices[0]


def test_thinking_off_reads_content_and_calls(stack: tuple[InProcessGateway, str]) -> None:
    choice = ask(stack, {"chat_template_kwargs": OFF})
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == SAID
    assert not (choice.message.model_extra or {}).get("reasoning_content")
    [call] = choice.message.tool_calls
    assert (call.function.name, json.loads(call.function.arguments)) == (
        TOOL.name,
        {"city": "Paris"},
    )


def test_thinking_on_reads_the_same_text_as_reasoning(stack: tuple[InProcessGateway, str]) -> None:
    choice = ask(stack, {})
    assert choice.finish_reason == "tool_calls"
    assert (choice.message.model_extra or {}).get("reasoning_content") == SAID
    assert not choice.message.content
    assert [c.function.name for c in choice.message.tool_calls] == [TOOL.name]
