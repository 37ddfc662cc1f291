"""E2E: real agents through the real Gateway on tiny models of other model families.

Claude Code (Anthropic Messages) and Codex (Responses) run in a docker sandbox against the
Gateway served by the scripted engine (a FAKE vLLM) on the tiny model of each family:
qwen3.5 (XML `<function=…>` calls after `<think>`), glm-4.7-flash (`<tool_call>NAME<arg_key>…`,
turns closed by the next role's marker) and gpt-oss (harmony channels, `<|call|>` /
`<|return|>`); mini-swe-agent (Chat Completions) on qwen3.5. Every scripted reply is the text
the family's model writes, cut from its real chat template's rendering of the assistant
message (`devstack.family_output`), so the Gateway must parse each family's own format and
continue its own token stream.

Each run writes a file, then reads it back through a second tool (upper-cased, so the
reply that answers proves the tool ran) and reports. It checks that the files are there in
the sandbox, that every call was parsed without a parse error and each tool call came back
in the agent's next request as the tool call the script wrote (name and arguments), that the
reasoning went out and was echoed back where the agent echoes it, and that the whole run is
one trainable `main` segment whose sampled ids are exactly the engine's returned ids.

One scripted engine + Gateway per family (module scoped: pytest runs a family's cases
together) and the session's one docker base image.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from devstack.background_server import BackgroundServer
from devstack.family_output import assistant_output
from devstack.scripted_engine import Script, ScriptedEngine, ScriptRule
from devstack.tiny_families import ensure_family_model, served_model_name
from gateway.canonical import Message, Tool, ToolCall
from gateway.prompt.model_files import load_model_files
from sandboxes.base import SandboxBackend
from tests.fixtures.agents import (
    AgentStack,
    WireEntry,
    check_partition,
    check_segment_tokens,
    match_engine_replies,
    run_agent,
    start_agent_stack,
)
from tests.fixtures.sandboxes import (  # noqa: F401 - fixtures
    docker_backend,
    sandbox_base_image,
    sandbox_state_dir,
)

pytestmark = pytest.mark.e2e

FAMILIES = ["qwen3.5", "glm-4.7-flash", "gpt-oss"]
#: Large enough that no agent compacts.
CONTEXT = 131072
COMPLETION_PATHS = {
    "claude_code": "/v1/messages",
    "codex": "/v1/responses",
    "mini_swe_agent": "/v1/chat/completions",
}

#: GLM's template closes an assistant turn with the next message's role marker, which the
#: model samples (both are stop ids of its generation config): `<|observation|>` before a
#: tool result, `<|user|>` after an answer.
NEXT_ROLE_MARKER = {"glm-4.7-flash": ("<|observation|>", "<|user|>")}

#: gpt-oss re-renders a call as `<|start|>assistant to=functions.X<|channel|>commentary json`;
#: the model itself samples the recipient after the channel and constrains the format.
_HARMONY_RENDERED_CALL = re.compile(
    r"<\|start\|>assistant to=(functions\.[^<\s]+)<\|channel\|>commentary json<\|message\|>"
)
HARMONY_SAMPLED_CALL = r"<|start|>assistant<|channel|>commentary to=\1 <|constrain|>json<|message|>"


@dataclass
class FamilyStack:
    family: str
    model: str
    agents: AgentStack
    engine: ScriptedEngine
    end_of_turn: list[str]


@pytest.fixture(scope="module", params=FAMILIES)
def stack(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[FamilyStack]:
    """The family's tiny model behind the scripted engine and the real Gateway."""
    family: str = request.param
    model_dir = ensure_family_model(family)
    files = load_model_files(model_dir)
    model = served_model_name(family)
    engine = ScriptedEngine(
        model_dir / "tokenizer.json",
        Script(),
        eos_token=files.eos_token,
        model=model,
        max_model_len=CONTEXT,
        stop_tokens=files.end_of_turn,
    )
    server = BackgroundServer(engine.app()).start()
    agents = start_agent_stack(
        server.url,
        model_dir,
        tmp_path_factory.mktemp(f"gw-{family}"),
        model,
        engine=engine,
        engine_server=server,
    )
    try:
        # The Gateway chose the family's parser from the model directory alone.
        assert agents.gateway.gateway.parser.name == family
        yield FamilyStack(family, model, agents, engine, files.end_of_turn)
    finally:
        agents.stop()


# --------------------------------------------------------------------------- replies


@dataclass(frozen=True)
class Step:
    """One scripted turn: it answers the first request whose prompt shows `after`."""

    after: str
    reasoning: str
    calls: tuple[tuple[str, dict[str, Any]], ...] = ()
    content: str = ""


def family_reply(stack: FamilyStack, prompt: str, step: Step, harmony_sampled: bool) -> str:
    """The family model's output for `step`: the real template's rendering of the
    assistant message after the task prompt, up to and including the end-of-turn marker
    the model stops on."""
    template = stack.agents.gateway.gateway.template
    tools = [
        Tool(
            name=name,
            description=f"The {name} tool.",
            parameters={"type": "object", "properties": {k: {"type": "string"} for k in args}},
        )
        for name, args in step.calls
    ]
    reply = Message(
        role="assistant",
        content=step.content,
        reasoning=step.reasoning,
        tool_calls=[
            ToolCall(id=f"call_{i}", name=name, arguments=json.dumps(args))
            for i, (name, args) in enumerate(step.calls)
        ],
    )
    text = assistant_output(template, [Message(role="user", content=prompt)], reply, tools)
    if stack.family in NEXT_ROLE_MARKER:
        before_tool, after_answer = NEXT_ROLE_MARKER[stack.family]
        text += before_tool if step.calls else after_answer
    if harmony_sampled:
        text = _HARMONY_RENDERED_CALL.sub(HARMONY_SAMPLED_CALL, text)
    ends = [i + len(m) for m in stack.end_of_turn if (i := text.find(m)) >= 0]
    assert ends, f"{stack.family}: no end-of-turn marker in {text!r}"
    return text[: min(ends)]


# --------------------------------------------------------------------------- tasks

PROMPT = (
    "TASK-F7: write note.txt containing family-ok, read it back upper-cased into "
    "upper.txt, then report what upper.txt says."
)
UPPER = "tr a-z A-Z < note.txt | tee upper.txt"
FINAL = "upper.txt says FAMILY-OK."
FILES = {"note.txt": "family-ok\n", "upper.txt": "FAMILY-OK\n"}

#: Per agent, its own tools: write the note, upper-case it (the reply after that fires on
#: FAMILY-OK, which only the second tool's output holds), then answer.
STEPS: dict[str, list[Step]] = {
    "claude_code": [
        Step(
            "TASK-F7",
            "Write the note first.",
            (("Write", {"file_path": "/workspace/note.txt", "content": "family-ok\n"}),),
        ),
        Step(
            "File created successfully",
            "Now read it back upper-cased.",
            (("Bash", {"command": UPPER, "description": "Upper-case note.txt"}),),
        ),
        Step("FAMILY-OK", "The tool printed it.", content=FINAL),
    ],
    "codex": [
        Step(
            "TASK-F7",
            "Write the note first.",
            (("exec_command", {"cmd": "printf 'family-ok\\n' > note.txt"}),),
        ),
        Step(
            "Process exited with code 0",
            "Now read it back upper-cased.",
            (("exec_command", {"cmd": UPPER}),),
        ),
        Step("FAMILY-OK", "The tool printed it.", content=FINAL),
    ],
    # mini-swe-agent's config offers one `bash` tool and ends when a command prints its
    # submit marker first.
    "mini_swe_agent": [
        Step(
            "TASK-F7",
            "Write the note first.",
            (("bash", {"command": "printf 'family-ok\\n' > note.txt"}),),
        ),
        Step("returncode", "Now read it back upper-cased.", (("bash", {"command": UPPER}),)),
        Step(
            "FAMILY-OK",
            "Submit.",
            (("bash", {"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"}),),
        ),
    ],
}

#: Claude Code gets gpt-oss calls in the model's sampled form, Codex in the template's
#: re-rendered form: both are gpt-oss output the Gateway must read.
HARMONY_SAMPLED = {"claude_code": True, "codex": False, "mini_swe_agent": True}


AGENT_CONTEXT = {
    "claude_code": "Primary working directory: /workspace",
    "codex": "<permissions instructions>",
    "mini_swe_agent": PROMPT,
}


def echoed_calls(agent: str, body: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The tool calls an agent's request echoes from earlier replies (name, arguments)."""
    if agent == "claude_code":
        return [
            (block["name"], block["input"])
            for m in body.get("messages", [])
            if m.get("role") == "assistant" and isinstance(m.get("content"), list)
            for block in m["content"]
            if block.get("type") == "tool_use"
        ]
    if agent == "codex":
        return [
            (item["name"], json.loads(item["arguments"]))
            for item in body.get("input", [])
            if isinstance(item, dict) and item.get("type") == "function_call"
        ]
    return [
        (c["function"]["name"], json.loads(c["function"]["arguments"]))
        for m in body.get("messages", [])
        if m.get("role") == "assistant"
        for c in m.get("tool_calls") or []
    ]


def completions(run_wire: list[WireEntry], agent: str) -> list[WireEntry]:
    assert all(e.status is not None and e.status < 400 for e in run_wire), [
        (e.path, e.status) for e in run_wire
    ]
    return [e for e in run_wire if e.path == COMPLETION_PATHS[agent]]


@pytest.mark.parametrize("agent", ["claude_code", "codex"])
async def test_agent_round_trip_on_family(
    stack: FamilyStack,
    agent: str,
    docker_backend: SandboxBackend,  # noqa: F811 - the imported fixture
    tmp_path: Path,
) -> None:
    await round_trip(stack, agent, docker_backend, tmp_path)


@pytest.mark.parametrize("stack", ["qwen3.5"], indirect=True)
async def test_mini_swe_agent_round_trip_on_qwen3_5(
    stack: FamilyStack,
    docker_backend: SandboxBackend,  # noqa: F811 - the imported fixture
    tmp_path: Path,
) -> None:
    await round_trip(stack, "mini_swe_agent", docker_backend, tmp_path)


async def round_trip(
    stack: FamilyStack, agent: str, backend: SandboxBackend, tmp_path: Path
) -> None:
    steps = STEPS[agent]
    rules = [
        ScriptRule(
            when_contains=s.after, reply=family_reply(stack, PROMPT, s, HARMONY_SAMPLED[agent])
        )
        for s in steps
    ]
    stack.engine.reset(Script(rules=rules, default_reply="Unscripted."))
    run = await run_agent(
        stack.agents,
        backend,
        tmp_path,
        agent=agent,
        prompt=PROMPT,
        harness_config={
            "model": stack.model,
            "context_window": CONTEXT,
            "max_output_tokens": 1024,
        },
        files=list(FILES),
        trainable=["main"],
    )
    replies = list(stack.engine.replies)
    calls = run.trajectory["calls"]
    summary = [(c["scene"], c["match"], c["drift"], c["fork_reason"]) for c in calls]
    diag = f"{run.diag}\ncalls={summary}"
    assert run.result.agent is not None and run.result.agent.exit_code == 0, diag
    # The tool work really happened in the sandbox.
    assert run.files == FILES, diag
    if steps[-1].content:
        assert run.result.agent.final_message == FINAL, diag

    # Every reply was read in the family's format: no parse error, and each scripted call
    # came back in the agent's next request as that call.
    assert calls and all(c["status"] == "ok" for c in calls), diag
    assert all(c["parse_error"] is None for c in calls), [c["parse_error"] for c in calls]
    paired = match_engine_replies(calls, replies)
    main_calls = [c for c in calls if c["scene"] == "main"]
    assert [paired[c["call_id"]].rule for c in main_calls] == list(range(len(steps))), diag
    requests = completions(run.wire, agent)
    assert len(requests) == len(calls)
    for k, step in enumerate(steps[:-1]):
        echoed = echoed_calls(agent, requests[k + 1].json_body())
        for call in step.calls:
            assert call in echoed, (call, echoed)
    if agent != "mini_swe_agent":
        # Reasoning went out as a thinking block / reasoning item and was echoed back.
        assert steps[0].reasoning in json.dumps(requests[1].json_body())

    segments = check_partition(run.trajectory)
    mains = [s for s in segments.values() if s["scene"] == "main"]
    print(
        f"\nFAMILY-RESULT {stack.family} {agent}: segments={len(segments)} "
        f"main_segments={len(mains)} calls={summary}"
    )
    assert len(mains) == 1, diag
    (main,) = mains
    assert main["trainable"] and main["parent_id"] is None
    check_segment_tokens(main, main_calls, [paired[c["call_id"]].output_ids for c in main_calls])
    # The model saw the task and the agent's own context, whatever the template's rules on
    # system messages (Claude Code's environment comes after the first user turn, Codex's
    # permissions in a second developer message).
    prompt = stack.engine.tokenizer.decode(main["prompt_ids"], skip_special_tokens=False)
    assert PROMPT in prompt and AGENT_CONTEXT[agent] in prompt
    for s in segments.values():
        if s is not main:
            assert s["scene"] != "main" and not s["trainable"], s["scene"]
