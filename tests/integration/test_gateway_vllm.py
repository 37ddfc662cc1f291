"""The Gateway in front of the real vLLM CPU server, driven by the official openai SDK and
LangChain: trajectories are token-exact by construction.

The random tiny model never calls tools by itself, so the session's sampling policy
forces the reply format through vLLM's structured outputs (a regex): the tokens are still
sampled by the real engine, with real logprobs.
"""

import json
from pathlib import Path
from typing import Any

import openai
import pytest
from tokenizers import Tokenizer

from devstack.background_server import BackgroundServer
from tests.fixtures.gateway import RecordingProxy
from workers.local_stack import InProcessGateway

pytestmark = pytest.mark.integration

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]
TOOL_REGEX = (
    r'<think>\n[a-z]{1,6}( [a-z]{1,6}){0,2}\n</think>\n\n<tool_call>\n\{"name": "get_weather", '
    r'"arguments": \{"city": "[a-z]{2,8}"\}\}\n</tool_call>'
)
TOOL_SESSION = {
    "policy_version": "step-7",
    "sampling": {
        "temperature": 1.0,
        "seed": 1234,
        "max_tokens": 96,
        "engine_extra": {"structured_outputs": {"regex": TOOL_REGEX}},
    },
}


def tool_turn_text(result: str) -> str:
    """What our template puts between a tool-calling reply's <|im_end|> and the next reply."""
    return (
        f"\n<|im_start|>user\n<tool_response>\n{result}\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )


@pytest.fixture
def proxied_gateway(vllm_server: Any, tiny_model_dir: Path, gateway_factory: Any):
    proxy = RecordingProxy(vllm_server.url)
    with BackgroundServer(proxy.app()) as proxy_server:
        yield gateway_factory(proxy_server.url, tiny_model_dir, vllm_server.model), proxy


def run_tool_conversation(
    gw: InProcessGateway,
    session: dict[str, Any],
    turns: int,
    *,
    stream: bool,
    echo: str,
) -> list[str]:
    """Drive a tool loop with the openai SDK; `echo` says how the client returns our reply."""
    client = openai.OpenAI(base_url=session["openai_base_url"], api_key=session["token"])
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You check the weather."},
        {"role": "user", "content": "Weather in a few cities, one at a time."},
    ]
    results = []
    for turn in range(turns):
        if stream:
            with client.chat.completions.stream(
                model="tiny-qwen3", messages=messages, tools=TOOLS
            ) as events:
                message = events.get_final_completion().choices[0].message
        else:
            reply = client.chat.completions.create(
                model="tiny-qwen3", messages=messages, tools=TOOLS, temperature=0.0
            )
            message = reply.choices[0].message
        assert message.tool_calls, f"turn {turn}: no tool call in {message}"
        call = message.tool_calls[0]
        arguments = call.function.arguments
        if echo == "reserialized":
            arguments = json.dumps(json.loads(arguments), indent=2, sort_keys=True)
        assistant: dict[str, Any] = {
            "role": "assistant",
            "content": message.content,
            "tool_calls": [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.function.name, "arguments": arguments},
                }
            ],
        }
        reasoning = getattr(message, "reasoning_content", None) or (
            (message.model_extra or {}).get("reasoning_content")
        )
        if echo == "exact":
            assert reasoning, "the gateway returns the model's reasoning"
            assistant["reasoning_content"] = reasoning
        messages.append(assistant)
        result = f"sunny, {20 + turn} degrees"
        results.append(result)
        messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return results


def assert_one_exact_segment(
    gw: InProcessGateway, session_id: str, proxy: RecordingProxy, results: list[str], tok: Tokenizer
) -> dict[str, Any]:
    trajectory = gw.trajectory(session_id)
    assert len(trajectory["segments"]) == 1, [c["match"] for c in trajectory["calls"]]
    segment = trajectory["segments"][0]
    calls = trajectory["calls"]
    engine_outputs = [reply["choices"][0]["token_ids"] for _, reply in proxy.exchanges]
    engine_logprobs = [
        reply["choices"][0]["logprobs"]["token_logprobs"] for _, reply in proxy.exchanges
    ]
    assert len(engine_outputs) == len(calls) == len(results)
    matches = [c["match"] for c in calls]
    assert matches[0] == "fork", "the first call opens the segment"
    assert set(matches[1:]) <= {"clean", "realign"}, f"every later call extends it: {matches}"
    # The first prompt is what vLLM was sent first; everything after it is, call by call,
    # exactly vLLM's sampled IDs, then our tokenization of the tool result turn.
    assert segment["prompt_ids"] == proxy.exchanges[0][0]["prompt"]
    expected_ids: list[int] = []
    expected_mask: list[int] = []
    expected_logprobs: list[float] = []
    for index, (output, logprobs) in enumerate(zip(engine_outputs, engine_logprobs, strict=True)):
        if index > 0:
            glue = tok.encode(tool_turn_text(results[index - 1]), add_special_tokens=False).ids
            expected_ids += glue
            expected_mask += [0] * len(glue)
            expected_logprobs += [0.0] * len(glue)
        expected_ids += output
        expected_mask += [1] * len(output)
        expected_logprobs += logprobs
    assert segment["response_ids"] == expected_ids
    assert segment["loss_mask"] == expected_mask
    assert segment["logprobs"] == pytest.approx(expected_logprobs)
    # Each prompt sent to vLLM is the held segment so far plus only the new turn.
    for index in range(1, len(calls)):
        sent = proxy.exchanges[index][0]["prompt"]
        held = segment["prompt_ids"] + expected_ids[: len(sent) - len(segment["prompt_ids"])]
        assert sent == held
        assert calls[index]["new_prompt_tokens"] < 40
    return trajectory


@pytest.mark.parametrize(
    ("stream", "echo"),
    [(False, "exact"), (True, "exact"), (False, "stripped"), (True, "reserialized")],
)
def test_ten_turn_tool_conversation_is_one_token_exact_segment(
    proxied_gateway: tuple[InProcessGateway, RecordingProxy],
    tiny_model_dir: Path,
    stream: bool,
    echo: str,
) -> None:
    gw, proxy = proxied_gateway
    tok = Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json"))
    session = gw.create_session(**TOOL_SESSION)
    results = run_tool_conversation(gw, session, 10, stream=stream, echo=echo)
    trajectory = assert_one_exact_segment(gw, session["session_id"], proxy, results, tok)
    for call in trajectory["calls"]:
        # The session policy won over the client's temperature=0 and is what was used.
        assert call["sampling"]["temperature"] == 1.0
        assert call["sampling"]["seed"] == 1234
        assert call["policy_version"] == "step-7"
        assert call["status"] == "ok"
    for request, _ in proxy.exchanges:
        assert request["temperature"] == 1.0 and request["return_token_ids"] is True
    if echo != "exact":
        assert any(c["match"] == "realign" for c in trajectory["calls"][1:])


@pytest.mark.parametrize("stream", [False, True])
def test_the_generate_endpoint_records_what_completions_records(
    vllm_server: Any, tiny_model_dir: Path, gateway_factory: Any, stream: bool
) -> None:
    """`engine_api="generate"`: vLLM's token-in/token-out `/inference/v1/generate` (no
    detokenizing, no prompt echo). The same seeded tool conversation through it and through
    `/v1/completions` records the same segment: prompt, sampled ids, mask, logprobs."""
    proxy = RecordingProxy(vllm_server.url)
    with BackgroundServer(proxy.app()) as proxy_server:
        gateways = (
            gateway_factory(vllm_server.url, tiny_model_dir, vllm_server.model),
            gateway_factory(
                proxy_server.url, tiny_model_dir, vllm_server.model, engine_api="generate"
            ),
        )
        segments = []
        for gw in gateways:
            session = gw.create_session(**TOOL_SESSION)
            run_tool_conversation(gw, session, 4, stream=stream, echo="exact")
            trajectory = gw.trajectory(session["session_id"])
            assert [c["status"] for c in trajectory["calls"]] == ["ok"] * 4
            assert len(trajectory["segments"]) == 1
            segments.append(trajectory["segments"][0])
    assert proxy.posted == ["/inference/v1/generate"] * 4
    plain, generated = segments
    for key in ("prompt_ids", "response_ids", "loss_mask"):
        assert generated[key] == plain[key], key
    assert generated["logprobs"] == pytest.approx(plain["logprobs"], abs=1e-6)


def test_langchain_chat_openai_tool_loop_stays_one_segment(
    proxied_gateway: tuple[InProcessGateway, RecordingProxy], tiny_model_dir: Path
) -> None:
    from langchain_core.messages import HumanMessage, SystemMessage, ToolMessage
    from langchain_openai import ChatOpenAI

    gw, _ = proxied_gateway
    session = gw.create_session(**TOOL_SESSION)
    llm = ChatOpenAI(
        model="tiny-qwen3", base_url=session["openai_base_url"], api_key=session["token"]
    ).bind_tools(TOOLS)
    history: list[Any] = [SystemMessage("You check the weather."), HumanMessage("Weather?")]
    for turn in range(4):
        ai = llm.invoke(history)
        assert ai.tool_calls, ai
        history.append(ai)
        history.append(ToolMessage(f"rain {turn}", tool_call_id=ai.tool_calls[0]["id"]))
    trajectory = gw.trajectory(session["session_id"])
    assert len(trajectory["segments"]) == 1
    assert trajectory["calls"][0]["match"] == "fork"
    assert all(c["match"] in ("clean", "realign") for c in trajectory["calls"][1:])


def test_cjk_sampled_ids_are_kept_even_when_reencoding_differs(
    proxied_gateway: tuple[InProcessGateway, RecordingProxy], tiny_model_dir: Path
) -> None:
    gw, proxy = proxied_gateway
    tok = Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json"))
    regex = "[天气北京上海今明晴雨好]{4,10}"
    session = gw.create_session(
        sampling={
            "temperature": 1.0,
            "seed": 7,
            "max_tokens": 24,
            "engine_extra": {"structured_outputs": {"regex": regex}},
        }
    )
    client = openai.OpenAI(base_url=session["openai_base_url"], api_key=session["token"])
    messages: list[dict[str, Any]] = [{"role": "user", "content": "今天天气怎么样"}]
    diverged = False
    for _ in range(3):
        reply = client.chat.completions.create(model="tiny-qwen3", messages=messages)
        text = reply.choices[0].message.content
        messages += [{"role": "assistant", "content": text}, {"role": "user", "content": "明天呢"}]
        sampled = proxy.exchanges[-1][1]["choices"][0]["token_ids"]
        body = sampled[:-1] if sampled[-1] == tok.token_to_id("<|im_end|>") else sampled
        reencoded = tok.encode(
            tok.decode(body, skip_special_tokens=False), add_special_tokens=False
        ).ids
        diverged = diverged or reencoded != body
    segment = gw.trajectory(session["session_id"])["segments"]
    assert len(segment) == 1, "a CJK conversation echoed as text stays one segment"
    held = segment[0]["prompt_ids"] + segment[0]["response_ids"]
    for _, reply in proxy.exchanges:
        ids = reply["choices"][0]["token_ids"]
        assert any(held[i : i + len(ids)] == ids for i in range(len(held))), "sampled ids kept"
    assert diverged, "constrained CJK sampling produced a non-canonical tokenization"
