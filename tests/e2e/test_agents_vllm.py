"""E2E: real agent CLIs, in a docker sandbox, through the real Gateway, served by the real
vLLM CPU engine (the tiny model with random weights) — one agent per protocol:

- Chat Completions: mini-swe-agent (non-stream) and Hermes (stream),
- OpenAI Responses: Codex CLI,
- Anthropic Messages: Claude Code.

The model's output is noise, so the agent gives up or ends quickly (any exit code is
fine), but everything on the path is real: the agent's HTTP client and stream parser,
the Gateway's adapters, prompt rendering, token capture and SSE framing, vLLM sampling.
Each test checks that the agent process exited, that no request got a 5xx, and that
every recorded call carries the prompt IDs sent to vLLM and exactly the output IDs and
logprobs vLLM returned (compared with vLLM's own replies, captured by a recording proxy
between the Gateway and vLLM).

Where the agent shows the model's text (Codex's `agent_message` events, Claude Code's
stream-json `assistant` messages), that text must be part of the decoded sampled tokens:
the SSE stream the agent parsed carried exactly what vLLM produced.

Prompts must fit the shared vLLM server's 16k window, so Claude Code runs with one tool
and a short system prompt, Hermes with its terminal toolset only, and Codex without its
multi-agent/goals/apps tools. No `seed` in the sampling policy: vLLM CPU 0.32 kills its
engine (`CPU Generator does not use offset`) when a seeded request's prompt is prefilled
in chunks, which these prompts are.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer

from devstack.background_server import BackgroundServer
from sandboxes.base import SandboxBackend
from tests.fixtures.agents import AgentStack, run_agent, start_agent_stack
from tests.fixtures.gateway import RecordingProxy
from tests.fixtures.sandboxes import (  # noqa: F401 - fixtures
    docker_backend,
    sandbox_base_image,
    sandbox_state_dir,
)

pytestmark = pytest.mark.e2e

#: Small replies: the random model rarely samples its end-of-turn token. Not greedy: at
#: temperature 0 the random model emits nothing but newlines, which shows no text.
SAMPLING = {"max_tokens": 24, "temperature": 1.0}
PROMPT = "Create hello.py that prints 42."
WINDOW = 16384

AGENTS: dict[str, dict[str, Any]] = {
    "mini_swe_agent": {"step_limit": 2},
    "hermes": {"toolsets": "terminal", "max_turns": 2},
    "codex": {
        "disable_features": ["multi_agent", "goals", "apps", "plugins", "image_generation"],
    },
    "claude_code": {
        "args": ["--tools", "Bash", "--system-prompt", "You are a coding agent. Be brief."],
        "max_turns": 3,
    },
}
PROTOCOLS = {
    "mini_swe_agent": ("openai_chat", "/v1/chat/completions"),
    "hermes": ("openai_chat", "/v1/chat/completions"),
    "codex": ("openai_responses", "/v1/responses"),
    "claude_code": ("anthropic_messages", "/v1/messages"),
}


def shown_texts(agent: str, stdout: str) -> list[str]:
    """The model text the agent itself reports in its JSON output, per message."""
    texts: list[str] = []
    for line in stdout.splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if not isinstance(event, dict):
            continue
        if agent == "codex" and event.get("type") == "item.completed":
            item = event.get("item") or {}
            if item.get("type") == "agent_message":
                texts.append(item.get("text") or "")
        message = event.get("message") if agent == "claude_code" else None
        # Claude Code reports its own errors as "<synthetic>" assistant messages.
        if (
            event.get("type") == "assistant"
            and isinstance(message, dict)
            and message.get("model") != "<synthetic>"
        ):
            for block in message.get("content") or []:
                if block.get("type") == "text":
                    texts.append(block.get("text") or "")
    return [t.strip() for t in texts if t.strip()]


@pytest.fixture(scope="module")
def vllm_stack(
    vllm_server: Any, tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[AgentStack, RecordingProxy]]:
    proxy = RecordingProxy(vllm_server.url)
    proxy_server = BackgroundServer(proxy.app()).start()
    stack = start_agent_stack(
        proxy_server.url,
        tiny_model_dir,
        tmp_path_factory.mktemp("gw"),
        vllm_server.model,
        engine_server=proxy_server,
    )
    try:
        yield stack, proxy
    finally:
        stack.stop()


@pytest.mark.parametrize("agent", list(AGENTS))
async def test_real_agent_with_real_vllm(
    agent: str,
    vllm_stack: tuple[AgentStack, RecordingProxy],
    docker_backend: SandboxBackend,  # noqa: F811 - the imported fixture
    tiny_model_dir: Path,
    tmp_path: Path,
) -> None:
    stack, proxy = vllm_stack
    tokenizer = Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json"))
    proxy.exchanges.clear()
    config = {
        "model": stack.gateway.gateway.options.model_name,
        "context_window": WINDOW,
        "max_output_tokens": SAMPLING["max_tokens"],
        **AGENTS[agent],
    }
    run = await run_agent(
        stack,
        docker_backend,
        tmp_path,
        agent=agent,
        prompt=PROMPT,
        harness_config=config,
        sampling=SAMPLING,
        budget_s=180,
    )
    result = run.result.agent
    assert result is not None, run.diag
    # The agent process ended by itself (any exit code), not by our budget.
    assert result.exit_code is not None and not result.timed_out, run.diag

    protocol, path = PROTOCOLS[agent]
    requests = [e for e in run.wire if e.path == path]
    assert requests, f"{agent} made no {path} request\n{run.diag}"
    assert all(e.status is not None and e.status < 500 for e in run.wire), [
        (e.path, e.status) for e in run.wire
    ]

    calls = run.trajectory["calls"]
    assert calls, run.diag
    assert len(calls) == len(requests)
    assert len(proxy.exchanges) == len(calls)
    for c, (sent, got) in zip(calls, proxy.exchanges, strict=True):
        assert c["protocol"] == protocol and c["status"] == "ok", c
        assert c["prompt_ids"] and c["prompt_ids"] == sent["prompt"]
        choice = got["choices"][0]
        assert c["output_ids"] and c["output_ids"] == choice["token_ids"]
        assert c["output_logprobs"] == choice["logprobs"]["token_logprobs"]
        assert all(math.isfinite(lp) and lp <= 0.0 for lp in c["output_logprobs"])
        assert len(c["output_ids"]) <= SAMPLING["max_tokens"]
        assert c["sampling"]["max_tokens"] <= SAMPLING["max_tokens"]
    streamed = {"mini_swe_agent": False}.get(agent, True)
    assert all(bool(e.json_body().get("stream")) == streamed for e in requests)
    if agent in ("codex", "claude_code"):
        decoded = [tokenizer.decode(c["output_ids"], skip_special_tokens=False) for c in calls]
        texts = shown_texts(agent, result.stdout_tail)
        markup = ("<think>", "</think>", "<tool_call>")
        if any(d.strip() and not any(m in d for m in markup) for d in decoded):
            assert texts, run.diag  # plain text was sampled, so the agent must show it
        for text in texts:
            assert any(text in d for d in decoded), (text, decoded)
    # Every ok call is in a segment; the first one is the trainable main conversation.
    segment_calls = [cid for s in run.trajectory["segments"] for cid in s["call_ids"]]
    assert sorted(segment_calls) == sorted(c["call_id"] for c in calls)
    assert run.trajectory["segments"][0]["scene"] == "main"
