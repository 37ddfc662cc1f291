"""A non-Qwen tiny family served by the real vLLM CPU server (one server for the module).

GLM-4.7-Flash: its markers are special tokens, its template opens `[gMASK]<sop>` and its
replies end on any of three ids. vLLM must load the model dir (tokenizer, real template,
generation_config), render a tool conversation to the same ids as the Gateway's
renderer, and stop a reply on a non-primary end-of-turn id; the Gateway in front of it
must read GLM's tool calls and keep a tool loop as one segment.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from tokenizers import Tokenizer

from devstack.tiny_families import ensure_family_model, get_family, served_model_name
from devstack.vllm_server import VllmServer, VllmServerConfig, VllmServerError
from gateway.canonical import Message, Tool, ToolCall
from gateway.prompt.chat_template import ChatTemplate
from gateway.prompt.model_files import load_model_files
from tests.fixtures.real_templates import real_templates_dir

pytestmark = pytest.mark.integration

FAMILY = "glm-4.7-flash"
CALL_ID = "call00001"
TOOL = Tool(
    name="count_files",
    description="Count files in a folder.",
    parameters={"type": "object", "properties": {"folder": {"type": "string"}}},
)
ARGUMENTS = {"folder": "src/lib"}


@pytest.fixture(scope="module")
def model_dir() -> Path:
    real_templates_dir()  # fail at once, saying how to get them, when they are missing
    return ensure_family_model(FAMILY)


@pytest.fixture(scope="module")
def server(model_dir: Path, vllm_python: Path) -> Iterator[VllmServer]:
    server = VllmServer(
        VllmServerConfig(
            model_dir=model_dir,
            python=vllm_python,
            served_model_name=served_model_name(FAMILY),
            max_model_len=4096,
            extra_args=["--enforce-eager"],
        )
    )
    try:
        server.start()
    except VllmServerError as exc:
        pytest.fail(f"vLLM CPU server did not start: {exc}", pytrace=False)
    try:
        yield server
    finally:
        server.stop()


def _post(server: VllmServer, path: str, body: dict[str, Any]) -> dict[str, Any]:
    reply = httpx.post(f"{server.url}{path}", json=body, timeout=120)
    assert reply.status_code == 200, reply.text
    return reply.json()


def _openai_messages() -> list[dict[str, Any]]:
    call = {
        "id": CALL_ID,
        "type": "function",
        "function": {"name": TOOL.name, "arguments": json.dumps(ARGUMENTS)},
    }
    return [
        {"role": "system", "content": "You keep answers short."},
        {"role": "user", "content": "How many files are in src/lib?"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": "42 files", "tool_call_id": CALL_ID},
    ]


def _gateway_prompt(model_dir: Path) -> list[int]:
    files = load_model_files(model_dir)
    template = ChatTemplate(
        files.chat_template, bos_token=files.bos_token, eos_token=files.eos_token
    )
    call = ToolCall(id=CALL_ID, name=TOOL.name, arguments=json.dumps(ARGUMENTS))
    text = template.render(
        [
            Message(role="system", content="You keep answers short."),
            Message(role="user", content="How many files are in src/lib?"),
            Message(role="assistant", content=None, tool_calls=[call]),
            Message(role="tool", content="42 files", tool_call_id=CALL_ID),
        ],
        tools=[TOOL],
        add_generation_prompt=True,
    )
    tokenizer = Tokenizer.from_file(str(files.tokenizer_path))
    return tokenizer.encode(text, add_special_tokens=False).ids


def test_vllm_renders_the_family_template_to_the_gateway_ids(
    server: VllmServer, model_dir: Path
) -> None:
    function = {"name": TOOL.name, "description": TOOL.description, "parameters": TOOL.parameters}
    tool = {"type": "function", "function": function}
    body = {
        "model": server.model,
        "messages": _openai_messages(),
        "tools": [tool],
        "add_generation_prompt": True,
        "add_special_tokens": False,
    }
    engine_ids = _post(server, "/tokenize", body)["tokens"]
    ours = _gateway_prompt(model_dir)
    assert engine_ids == ours
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    for marker in ("[gMASK]", "<sop>", "<|observation|>", "<tool_call>", "<arg_key>"):
        assert tokenizer.token_to_id(marker) in ours, marker


def test_vllm_samples_and_stops_on_a_secondary_end_of_turn_id(
    server: VllmServer, model_dir: Path
) -> None:
    prompt = _gateway_prompt(model_dir)
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    free = _post(
        server,
        "/v1/completions",
        {
            "model": server.model,
            "prompt": prompt,
            "max_tokens": 5,
            "seed": 3,
            "ignore_eos": True,
            "return_token_ids": True,
        },
    )["choices"][0]
    assert free["finish_reason"] == "length"
    assert len(free["token_ids"]) == 5
    assert all(tokenizer.id_to_token(i) is not None for i in free["token_ids"])

    family = get_family(FAMILY)
    observation = tokenizer.token_to_id("<|observation|>")
    assert family.eos != "<|observation|>" and "<|observation|>" in family.end_of_turn
    forced = _post(
        server,
        "/v1/completions",
        {
            "model": server.model,
            "prompt": prompt,
            "max_tokens": 8,
            "min_tokens": 2,
            "logit_bias": {str(observation): 100},
            "return_token_ids": True,
            "skip_special_tokens": False,
        },
    )["choices"][0]
    assert forced["finish_reason"] == "stop"
    assert forced["token_ids"][-1] == observation
    assert len(forced["token_ids"]) == 3


GLM_CALL_REGEX = (
    r"[a-z]{1,6}( [a-z]{1,6}){0,2}</think><tool_call>count_files"
    r"<arg_key>folder</arg_key><arg_value>[a-z]{2,8}</arg_value></tool_call>"
)


def test_the_gateway_reads_glm_tool_calls_sampled_by_vllm(
    server: VllmServer, model_dir: Path, gateway_factory: Any
) -> None:
    """Two tool turns through the Gateway: vLLM samples GLM's own call format (forced by
    a regex, the random model would not), the Gateway hands back parsed calls and keeps
    the conversation as one trainable segment."""
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    observation = tokenizer.token_to_id("<|observation|>")
    gw = gateway_factory(server.url, model_dir, server.model)
    session = gw.create_session(
        sampling={
            "temperature": 1.0,
            "seed": 7,
            "max_tokens": 64,
            "engine_extra": {
                "structured_outputs": {"regex": GLM_CALL_REGEX},
                "logit_bias": {str(observation): 50},
            },
        }
    )
    client = openai.OpenAI(base_url=session["openai_base_url"], api_key=session["token"])
    function = {"name": TOOL.name, "description": TOOL.description, "parameters": TOOL.parameters}
    tools = [{"type": "function", "function": function}]
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You keep answers short."},
        {"role": "user", "content": "Count the files of two folders."},
    ]
    for turn in range(2):
        reply = client.chat.completions.create(model=server.model, messages=messages, tools=tools)
        choice = reply.choices[0]
        assert choice.finish_reason == "tool_calls", choice
        call = choice.message.tool_calls[0]
        assert call.function.name == TOOL.name
        assert list(json.loads(call.function.arguments)) == ["folder"]
        assert (choice.message.model_extra or {}).get("reasoning_content")
        messages.append(
            {
                "role": "assistant",
                "content": choice.message.content or "",
                "reasoning_content": choice.message.model_extra["reasoning_content"],
                "tool_calls": [
                    {
                        "id": call.id,
                        "type": "function",
                        "function": {
                            "name": call.function.name,
                            "arguments": call.function.arguments,
                        },
                    }
                ],
            }
        )
        messages.append({"role": "tool", "tool_call_id": call.id, "content": f"{turn + 3} files"})
    trajectory = gw.trajectory(session["session_id"])
    ends = {tokenizer.token_to_id(t) for t in get_family(FAMILY).end_of_turn}
    for call_record in trajectory["calls"]:
        assert call_record["output_ids"][-1] in ends, "vLLM stops on the family's end ids"
    matches = [c["match"] for c in trajectory["calls"]]
    assert len(trajectory["segments"]) == 1, matches
    assert matches[0] == "fork" and matches[1] in {"clean", "realign"}, matches
