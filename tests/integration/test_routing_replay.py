"""Routing replay end to end without a GPU: the Gateway, asked for routing, in front of the
STAND-IN reference MoE engine (`devstack.reference_moe`: a tiny random Qwen3-MoE in
transformers behind vLLM's token-in/token-out wire); an agent's tool conversation with
the official openai SDK; samples written and read back; then an independent
transformers forward over each sample's tokens picks the stored experts for every
(token, layer), ties aside.

The random model does not write tool calls by itself: the session pins a regex
(vLLM `structured_outputs`, which the engine applies with xgrammar as vLLM does) that
allows a tool call or a short answer, and the agent picks the branch per call with
`logit_bias` (left to it by the session). Every token is still sampled from the model's
own logits under that mask and bias, so its routing is the model's real routing.
"""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import openai
import pytest
from tokenizers import Tokenizer

from activities.samples import build_rows
from devstack.reference_moe import ReferenceMoeServer, RoutedSequence, recompute_routing
from rollout_client.storage import read_samples, write_samples
from schemas.routing import RoutedExperts
from schemas.samples import table_to_rows
from schemas.trajectory import Trajectory
from tests.fixtures.collect import collect_request
from tests.fixtures.reference_moe import moe_engine, moe_model_dir  # noqa: F401
from tests.fixtures.vllm import vllm_python  # noqa: F401

pytestmark = [pytest.mark.integration, pytest.mark.needs("vllm_venv")]

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file of the repository.",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}},
                "required": ["path"],
            },
        },
    }
]
REPLY_REGEX = (
    r"<think>\n[a-z]{1,6}( [a-z]{1,6}){0,2}\n</think>\n\n"
    r'(<tool_call>\n\{"name": "read_file", "arguments": \{"path": "[a-z]{1,8}\.py"\}\}\n'
    r"</tool_call>|[a-z]{2,8}( [a-z]{2,8}){0,4}\.)"
)
POLICY = {
    "temperature": 1.0,
    "seed": 5,
    "max_tokens": 80,
    "engine_extra": {"structured_outputs": {"regex": REPLY_REGEX}},
}
TOOL_TURNS = 3


def steering(tok: Tokenizer) -> tuple[dict[str, int], dict[str, int]]:
    """logit_bias that picks the tool-call branch, and one that rules it out: every token
    that could begin `<tool_call>` (its own id, and any spelling of its first bytes)."""
    call_id = tok.token_to_id("<tool_call>")
    openers = [
        i
        for i in range(tok.get_vocab_size())
        if (text := tok.decode([i], skip_special_tokens=False)) and "<tool_call>".startswith(text)
    ]
    return {str(call_id): 100}, {str(i): -100 for i in [call_id, *openers]}


def run_agent(session: dict[str, Any], tok: Tokenizer) -> list[str]:
    """A tool loop as an agent writes it with the openai SDK: read files until done, then
    answer. Streams every other call. Returns the final answer and each call's mode."""
    client = openai.OpenAI(base_url=session["openai_base_url"], api_key=session["token"])
    call_tool, answer = steering(tok)
    messages: list[Any] = [
        {"role": "system", "content": "You read code and answer briefly."},
        {"role": "user", "content": "What does the repository do?"},
    ]
    for turn in range(TOOL_TURNS + 1):
        bias = call_tool if turn < TOOL_TURNS else answer
        args: dict[str, Any] = {"model": "tiny-qwen3-moe", "messages": messages, "tools": TOOLS}
        if turn % 2:
            with client.chat.completions.stream(**args, logit_bias=bias) as events:
                message = events.get_final_completion().choices[0].message
        else:
            message = client.chat.completions.create(**args, logit_bias=bias).choices[0].message
        if turn == TOOL_TURNS:
            assert not message.tool_calls and message.content, message
            return [message.content]
        assert message.tool_calls, f"turn {turn}: {message}"
        call = message.tool_calls[0]
        path = json.loads(call.function.arguments)["path"]
        messages.append(message.model_dump(exclude_none=True))
        messages.append(
            {"role": "tool", "tool_call_id": call.id, "content": f"# {path}\nprint({turn})\n"}
        )
    raise AssertionError("unreachable")


def vllm_encoding(routing: RoutedExperts) -> str:
    """A stored routing in vLLM's wire encoding (base64 `.npy`), as the check reads it."""
    buffer = io.BytesIO()
    np.save(buffer, routing.array(), allow_pickle=False)
    return base64.b64encode(buffer.getvalue()).decode()


def test_agent_tool_conversation_routing_is_recorded_and_recomputes(
    moe_engine: ReferenceMoeServer,  # noqa: F811
    moe_model_dir: Path,  # noqa: F811
    gateway_factory: Any,
    tmp_path: Path,
) -> None:
    tok = Tokenizer.from_file(str(moe_model_dir / "tokenizer.json"))
    gw = gateway_factory(moe_engine.url, moe_model_dir, moe_engine.model, engine_api="generate")
    session = gw.create_session(
        sampling=POLICY, sampling_control={"logit_bias": "agent"}, routed_experts=True
    )
    run_agent(session, tok)

    trajectory = Trajectory.model_validate(gw.trajectory(session["session_id"]))
    assert [c.status for c in trajectory.calls] == ["ok"] * (TOOL_TURNS + 1)
    assert all(c.routed_experts is not None for c in trajectory.calls), trajectory.notes
    [segment] = trajectory.segments
    assert segment.routed_experts is not None, segment.routing_missing
    # Each later call re-reads the previous call's sampled tokens; the engine routes them
    # as it did when it sampled them.
    assert segment.routing_rereads > 0 and segment.routing_reread_differs == 0

    path = tmp_path / "samples.parquet"
    write_samples(
        build_rows(trajectory, collect_request(session, POLICY, rollout_id="r-moe")), path
    )
    [row] = table_to_rows(read_samples(path))
    routing = row.routed_experts
    assert routing is not None
    tokens = [*row.prompt_ids, *row.response_ids]
    assert routing.shape == (len(tokens) - 1, 3, 2) and routing.dtype == "uint8"

    stored = vllm_encoding(routing)
    report = recompute_routing(
        moe_model_dir,
        [
            RoutedSequence(name="sample", token_ids=tokens, routed_experts=stored),
            # Control: the same routing over the conversation one token late disagrees.
            RoutedSequence(name="late", token_ids=tokens[1:] + tokens[:1], routed_experts=stored),
        ],
    )
    counts = report.total("sample")
    assert counts.compared + counts.ties == (len(tokens) - 1) * 3
    assert counts.agree == counts.compared, report.mismatches
    assert counts.ties <= counts.compared // 100
    late = report.total("late")
    assert late.agree < late.compared * 0.6
