"""Non-Qwen3 tiny families served by the real vLLM CPU server, one server per family.

GLM-4.7-Flash, gpt-oss (harmony) and Qwen3.5: each has its own markers (special tokens,
or for Qwen3.5 plain added tokens that stay in decoded text), its own template and
several end-of-turn ids. For each, vLLM must load the model dir (tokenizer, real
template, generation_config), render a tool conversation to the same ids as the
Gateway's renderer, and stop a reply on a non-primary end-of-turn id; the Gateway in
front of it must read the family's own tool calls and keep a tool loop as one segment.

The random tiny model would never write a tool call, so vLLM is made to sample one by a
structured-outputs regex spelling the family's call format (the end-of-turn id is pushed
by a logit bias once the regex is complete: vLLM stops on ids, so the end marker must be
its single id, never spelled by the grammar). The grammar may spell other markers as
several byte-level pieces instead of their single id (seen: gpt-oss `<|channel|>`,
`<|end|>`, `<|constrain|>`; Qwen3.5 `</tool_call>`): the decoded text is the same, so
the calls parse, and the continuation holds those ids as sampled. Everything
family-specific is in `CASES`.

The servers start one at a time: the module-scoped fixture is parametrized by family, so
pytest runs every test of one family before it stops that server and starts the next.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
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

pytestmark = [pytest.mark.integration, pytest.mark.needs("vllm_venv")]

CALL_ID = "call00001"
TOOL = Tool(
    name="count_files",
    description="Count files in a folder.",
    parameters={"type": "object", "properties": {"folder": {"type": "string"}}},
)
ARGUMENTS = {"folder": "src/lib"}

THOUGHT = r"[a-z]{1,6}( [a-z]{1,6}){0,2}"
"""A few words of reasoning (the regex leaves the model a choice: it is still sampling)."""
FOLDER = r"[a-z]{2,8}"


@dataclass(frozen=True)
class FamilyCase:
    """What differs between families in these tests."""

    family: str
    prompt_markers: tuple[str, ...]
    """Tokens the rendered tool conversation must hold as single ids."""
    secondary_end: str
    """An end-of-turn token that is not the tokenizer's eos: vLLM must stop on it too."""
    call_end: str
    """The end-of-turn token the family closes a tool-call turn with."""
    call_regex: str
    """The family's own spelling of reasoning then one `count_files` call, up to (not
    including) `call_end`."""


CASES = (
    FamilyCase(
        family="glm-4.7-flash",
        prompt_markers=("[gMASK]", "<sop>", "<|observation|>", "<tool_call>", "<arg_key>"),
        secondary_end="<|observation|>",
        call_end="<|observation|>",
        call_regex=(
            rf"{THOUGHT}</think><tool_call>count_files"
            rf"<arg_key>folder</arg_key><arg_value>{FOLDER}</arg_value></tool_call>"
        ),
    ),
    FamilyCase(
        family="gpt-oss",
        prompt_markers=("<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|call|>"),
        secondary_end="<|call|>",
        call_end="<|call|>",
        call_regex=(
            rf"<\|channel\|>analysis<\|message\|>{THOUGHT}<\|end\|>"
            r"<\|start\|>assistant<\|channel\|>commentary to=functions\.count_files "
            rf'<\|constrain\|>json<\|message\|>\{{"folder": "{FOLDER}"\}}'
        ),
    ),
    FamilyCase(
        family="qwen3.5",
        prompt_markers=("<|im_start|>", "<think>", "<tool_call>", "<tool_response>"),
        secondary_end="<|endoftext|>",
        call_end="<|im_end|>",
        call_regex=(
            rf"{THOUGHT}\n</think>\n\n<tool_call>\n<function=count_files>\n"
            rf"<parameter=folder>\n{FOLDER}\n</parameter>\n</function>\n</tool_call>"
        ),
    ),
)


@pytest.fixture(scope="module", params=CASES, ids=[c.family for c in CASES])
def case(request: pytest.FixtureRequest) -> FamilyCase:
    return request.param


@pytest.fixture(scope="module")
def model_dir(case: FamilyCase) -> Path:
    real_templates_dir()  # fail at once, saying how to get them, when they are missing
    return ensure_family_model(case.family)


@pytest.fixture(scope="module")
def server(case: FamilyCase, model_dir: Path, vllm_python: Path) -> Iterator[VllmServer]:
    server = VllmServer(
        VllmServerConfig(
            model_dir=model_dir,
            python=vllm_python,
            served_model_name=served_model_name(case.family),
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


def _tokenizer(model_dir: Path) -> Tokenizer:
    return Tokenizer.from_file(str(model_dir / "tokenizer.json"))


def _token_id(model_dir: Path, token: str) -> int:
    token_id = _tokenizer(model_dir).token_to_id(token)
    assert token_id is not None, token
    return token_id


def _openai_tools() -> list[dict[str, Any]]:
    function = {"name": TOOL.name, "description": TOOL.description, "parameters": TOOL.parameters}
    return [{"type": "function", "function": function}]


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
    return _tokenizer(model_dir).encode(text, add_special_tokens=False).ids


def test_vllm_renders_the_family_template_to_the_gateway_ids(
    case: FamilyCase, server: VllmServer, model_dir: Path
) -> None:
    body = {
        "model": server.model,
        "messages": _openai_messages(),
        "tools": _openai_tools(),
        "add_generation_prompt": True,
        "add_special_tokens": False,
    }
    engine_ids = _post(server, "/tokenize", body)["tokens"]
    ours = _gateway_prompt(model_dir)
    assert engine_ids == ours
    for marker in case.prompt_markers:
        assert _token_id(model_dir, marker) in ours, marker


def test_vllm_samples_and_stops_on_a_secondary_end_of_turn_id(
    case: FamilyCase, server: VllmServer, model_dir: Path
) -> None:
    prompt = _gateway_prompt(model_dir)
    tokenizer = _tokenizer(model_dir)
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

    family = get_family(case.family)
    secondary = _token_id(model_dir, case.secondary_end)
    assert family.eos != case.secondary_end and case.secondary_end in family.end_of_turn
    forced = _post(
        server,
        "/v1/completions",
        {
            "model": server.model,
            "prompt": prompt,
            "max_tokens": 8,
            "min_tokens": 2,
            "logit_bias": {str(secondary): 100},
            "return_token_ids": True,
            "skip_special_tokens": False,
        },
    )["choices"][0]
    assert forced["finish_reason"] == "stop"
    assert forced["token_ids"][-1] == secondary
    assert len(forced["token_ids"]) == 3


def test_the_gateway_reads_the_family_tool_calls_sampled_by_vllm(
    case: FamilyCase, server: VllmServer, model_dir: Path, gateway_factory: Any
) -> None:
    """Two tool turns through the Gateway: vLLM samples the family's own call format
    (forced by a regex, the random model would not), the Gateway hands back parsed calls
    and keeps the conversation as one trainable segment."""
    call_end = _token_id(model_dir, case.call_end)
    gw = gateway_factory(server.url, model_dir, server.model)
    session = gw.create_session(
        sampling={
            "temperature": 1.0,
            "seed": 7,
            "max_tokens": 96,
            "engine_extra": {
                "structured_outputs": {"regex": case.call_regex},
                "logit_bias": {str(call_end): 50},
            },
        }
    )
    client = openai.OpenAI(base_url=session["openai_base_url"], api_key=session["token"])
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You keep answers short."},
        {"role": "user", "content": "Count the files of two folders."},
    ]
    for turn in range(2):
        reply = client.chat.completions.create(
            model=server.model, messages=messages, tools=_openai_tools()
        )
        choice = reply.choices[0]
        assert choice.finish_reason == "tool_calls", choice
        call = choice.message.tool_calls[0]
        assert call.function.name == TOOL.name
        assert list(json.loads(call.function.arguments)) == ["folder"]
        reasoning = (choice.message.model_extra or {}).get("reasoning_content")
        assert reasoning, choice.message
        messages.append(
            {
                "role": "assistant",
                "content": choice.message.content or "",
                "reasoning_content": reasoning,
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
    tokenizer = _tokenizer(model_dir)
    ends = {tokenizer.token_to_id(t) for t in get_family(case.family).end_of_turn}
    for call_record in trajectory["calls"]:
        assert call_record["output_ids"][-1] in ends, "vLLM stops on the family's end ids"
    matches = [c["match"] for c in trajectory["calls"]]
    assert len(trajectory["segments"]) == 1, trajectory["calls"]
    assert matches[0] == "fork" and matches[1] in {"clean", "realign"}, matches
    (segment,) = trajectory["segments"]
    trained = [i for i, m in zip(segment["response_ids"], segment["loss_mask"], strict=True) if m]
    sampled = [i for c in trajectory["calls"] for i in c["output_ids"]]
    assert trained == sampled, "the segment trains on exactly the ids vLLM sampled"
