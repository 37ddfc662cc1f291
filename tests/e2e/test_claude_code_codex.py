"""E2E: the real Claude Code and Codex CLIs, in a docker sandbox, through the real Gateway,
served by the scripted engine (a fake vLLM that replays scripted replies, tokenized with
the real tokenizer, and remembers exactly which token IDs it returned).

What each test proves (issue 3, "What it must show"):

- `test_three_tool_task_is_one_token_exact_main_segment` (Claude Code, Codex): the agent
  really does the tool work (files checked inside the sandbox before it is destroyed),
  every engine reply the agent consumed is in the trajectory, and the one trainable
  `main` segment's sampled tokens (loss_mask == 1) are, in order, the engine's returned
  IDs for the main calls — with the mask exactly on them, the engine's logprobs on them,
  and 0 everywhere else. Side calls, if the agent makes any, must be non-main and
  non-trainable (the session trains `main` only); the agent's own request labels (its
  hint headers / turn metadata) are compared with the recorded scenes.
- `test_codex_auto_compaction_links_segments`: Codex's own auto-compaction (forced by a
  small `model_auto_compact_token_limit` and a large command output) yields
  main → compaction (`continues`) → main (`continues`), each segment token-exact, every
  ok call in exactly one segment.
- `test_claude_code_subagent_is_spawned_by_main`: Claude Code's `Agent` tool starts a
  sub-agent; its calls form a `spawned_by` segment under the main one, the main segment
  stays one segment across the sub-agent's run, nothing dropped or duplicated.
- `test_claude_code_auto_compaction_links_segments`: Claude Code's own auto-compaction
  (a 32k window) gives main → compaction → main → ... segments, each `continues` the
  previous one — also for its second compaction request, which is a clean extension of
  the main conversation (the Gateway only extends segments of the call's own scene).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devstack.background_server import BackgroundServer
from devstack.scripted_engine import Script, ScriptedEngine, ScriptedReply, ScriptRule
from devstack.tiny_model import ensure_tiny_model
from harnesses.claude_code import COMPACTION_MARKER as CC_COMPACTION_MARKER
from sandboxes.base import SandboxBackend
from tests.fixtures.agents import (
    AgentRun,
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

MODEL = "tiny"
#: Large enough that neither agent auto-compacts unless a test asks for it.
CONTEXT = 131072
COMPLETION_PATHS = {"claude_code": "/v1/messages", "codex": "/v1/responses"}


def call(name: str, **arguments: Any) -> str:
    """A tool call in the served model's output format (parsed by the Gateway)."""
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentStack]:
    model = ensure_tiny_model()
    engine = ScriptedEngine(model / "tokenizer.json", Script(), model=MODEL, max_model_len=CONTEXT)
    server = BackgroundServer(engine.app()).start()
    running = start_agent_stack(
        server.url,
        model,
        tmp_path_factory.mktemp("gw"),
        MODEL,
        engine=engine,
        engine_server=server,
    )
    try:
        yield running
    finally:
        running.stop()


async def scripted_run(
    stack: AgentStack,
    backend: SandboxBackend,
    tmp_path: Path,
    agent: str,
    rules: list[ScriptRule],
    prompt: str,
    files: list[str],
    trainable: list[str] | None = None,
    **config: Any,
) -> tuple[AgentRun, list[ScriptedReply]]:
    assert stack.engine is not None
    stack.engine.reset(Script(rules=rules, default_reply="Done."))
    harness_config = {
        "model": MODEL,
        "context_window": CONTEXT,
        "max_output_tokens": 1024,
        **config,
    }
    run = await run_agent(
        stack,
        backend,
        tmp_path,
        agent=agent,
        prompt=prompt,
        harness_config=harness_config,
        files=files,
        trainable=trainable,
    )
    return run, list(stack.engine.replies)


def completions(run: AgentRun, agent: str) -> list[WireEntry]:
    """The agent's model requests, in order (they are sequential in these runs)."""
    entries = [e for e in run.wire if e.path == COMPLETION_PATHS[agent]]
    assert all(e.status is not None and e.status < 400 for e in run.wire), [
        (e.path, e.status) for e in run.wire
    ]
    return entries


def agent_label(agent: str, entry: WireEntry) -> str:
    """How the agent itself labels a request: Claude Code's request-class hint header,
    Codex's `request_kind` / `thread_source` turn metadata."""
    if agent == "claude_code":
        return entry.headers.get("x-claude-code-request-class", "?")
    meta = json.loads(entry.headers.get("x-codex-turn-metadata", "{}"))
    if meta.get("thread_source") == "subagent":
        return "subagent"
    return {"turn": "main"}.get(meta.get("request_kind"), meta.get("request_kind", "?"))


def decode(stack: AgentStack, ids: list[int]) -> str:
    assert stack.engine is not None
    return stack.engine.tokenizer.decode(ids, skip_special_tokens=False)


# --------------------------------------------------------------------------- 1. tools

TOOL_PROMPT = (
    "TASK-7: write calc.py that prints RESULT and 6*7, run it saving its output to "
    "result.txt, read result.txt back, then report."
)
CALC_PY = "print('RESULT', 6 * 7)\n"
FINAL_ANSWER = "result.txt says: RESULT 42."


def think(reasoning: str, body: str) -> str:
    """A reply with reasoning first, as Qwen3-style models produce it."""
    return f"<think>\n{reasoning}\n</think>\n\n{body}"


#: Rules answer in order; rules 2-4 fire on text that only the previous tool's *result*
#: contains ("10 result.txt" from `wc`, "RESULT 42" from reading the file calc.py
#: wrote), so each reply proves the previous tool really ran. Every reply carries
#: reasoning (echoed back by the agents as thinking blocks / reasoning items) and the
#: second one makes two tool calls at once.
RUN_CALC = "python3 calc.py > result.txt && wc -c result.txt"
THREE_TOOL_SCRIPTS: dict[str, list[ScriptRule]] = {
    "claude_code": [
        ScriptRule(
            when_contains="TASK-7",
            reply=think(
                "Write calc.py first.",
                call("Write", file_path="/workspace/calc.py", content=CALC_PY),
            ),
        ),
        ScriptRule(
            when_contains="File created successfully",
            reply=think(
                "Run it, and leave a marker.",
                call("Bash", command=RUN_CALC, description="Run calc.py")
                + "\n"
                + call("Bash", command="echo second > two.txt", description="Write two.txt"),
            ),
        ),
        ScriptRule(
            when_contains="10 result.txt",
            reply=think("Read it back.", call("Read", file_path="/workspace/result.txt")),
        ),
        ScriptRule(when_contains="RESULT 42", reply=think("Done.", FINAL_ANSWER)),
    ],
    "codex": [
        ScriptRule(
            when_contains="TASK-7",
            reply=think(
                "Write calc.py first.",
                call("exec_command", cmd=f'printf "{CALC_PY.strip()}\\n" > calc.py'),
            ),
        ),
        ScriptRule(
            when_contains="Process exited with code 0",
            reply=think(
                "Run it, and leave a marker.",
                call("exec_command", cmd=RUN_CALC)
                + "\n"
                + call("exec_command", cmd="echo second > two.txt"),
            ),
        ),
        ScriptRule(
            when_contains="10 result.txt",
            reply=think("Read it back.", call("exec_command", cmd="cat result.txt")),
        ),
        ScriptRule(when_contains="RESULT 42", reply=think("Done.", FINAL_ANSWER)),
    ],
}


@pytest.mark.parametrize("agent", list(THREE_TOOL_SCRIPTS))
async def test_three_tool_task_is_one_token_exact_main_segment(
    agent: str,
    stack: AgentStack,
    docker_backend: SandboxBackend,  # noqa: F811 - the imported fixture
    tmp_path: Path,
) -> None:
    rules = THREE_TOOL_SCRIPTS[agent]
    run, replies = await scripted_run(
        stack,
        docker_backend,
        tmp_path,
        agent,
        rules,
        TOOL_PROMPT,
        ["calc.py", "result.txt", "two.txt"],
        trainable=["main"],
    )
    assert run.result.agent is not None and run.result.agent.exit_code == 0, run.diag
    # The tool work really happened in the sandbox.
    assert run.files["calc.py"] == CALC_PY, run.diag
    assert run.files["result.txt"] == "RESULT 42\n", run.diag
    assert run.files["two.txt"] == "second\n", run.diag
    assert run.result.agent.final_message == FINAL_ANSWER, run.diag

    calls = run.trajectory["calls"]
    assert calls and all(c["status"] == "ok" for c in calls), run.diag
    # Every engine reply is a recorded call and vice versa, outputs identical.
    paired = match_engine_replies(calls, replies)
    # The agent labels each request itself; the recorded scene must agree.
    requests = completions(run, agent)
    assert len(requests) == len(calls)
    for entry, c in zip(requests, calls, strict=True):
        assert (agent_label(agent, entry) == "main") == (c["scene"] == "main"), (
            agent_label(agent, entry),
            c["scene"],
        )
    # The reasoning went out in the protocol's own form and came back in the next request
    # (Claude Code: a thinking block; Codex: a reasoning item), as the agents replay it.
    assert "Write calc.py first." in json.dumps(requests[1].json_body())
    main_calls = [c for c in calls if c["scene"] == "main"]
    # All four scripted replies went to main calls, in script order: tool, tool, tool, answer.
    assert [paired[c["call_id"]].rule for c in main_calls] == [0, 1, 2, 3]

    segments = check_partition(run.trajectory)
    mains = [s for s in segments.values() if s["scene"] == "main"]
    assert len(mains) == 1, [(s["scene"], s["call_ids"]) for s in segments.values()]
    main = mains[0]
    assert main["trainable"] and main["parent_id"] is None and main["link"] is None
    check_segment_tokens(main, main_calls, [paired[c["call_id"]].output_ids for c in main_calls])
    assert TOOL_PROMPT in decode(stack, main["prompt_ids"])
    # Side calls (none observed with these CLIs in non-interactive mode) would be
    # recorded in their own non-main, non-trainable segments.
    for s in segments.values():
        if s is not main:
            assert s["scene"] != "main" and not s["trainable"], s["scene"]


# --------------------------------------------------------------------------- 2. compaction

COMPACT_PROMPT = (
    "TASK-CMP: write the numbers 1..2000 to big.txt and show them, then write step2.txt."
)
#: First Codex prompt is ~18.6k tokens (instructions + tools); the big command output
#: pushes the next response's `usage.total_tokens` past this limit, so Codex compacts
#: mid-turn before it continues. After compaction the context is back under it.
COMPACT_LIMIT = 21000
SUMMARY = "SUMMARY-1: big.txt holds 1..2000; step2.txt is next."
COMPACTION_SCRIPT = [
    ScriptRule(
        when_contains="TASK-CMP",
        reply=call("exec_command", cmd="seq 1 2000 > big.txt && cat big.txt"),
    ),
    # Codex's inline compaction request (tools: [], checkpoint instruction last).
    ScriptRule(when_contains="CONTEXT CHECKPOINT COMPACTION", reply=SUMMARY),
    ScriptRule(
        when_contains="Process exited with code 0",
        reply=call("exec_command", cmd="echo step2 > step2.txt"),
    ),
    # The continued conversation carries the summary.
    ScriptRule(when_contains="SUMMARY-1", reply="Done: big.txt and step2.txt written."),
]


async def test_codex_auto_compaction_links_segments(
    stack: AgentStack,
    docker_backend: SandboxBackend,  # noqa: F811 - the imported fixture
    tmp_path: Path,
) -> None:
    run, replies = await scripted_run(
        stack,
        docker_backend,
        tmp_path,
        "codex",
        COMPACTION_SCRIPT,
        COMPACT_PROMPT,
        ["big.txt", "step2.txt"],
        auto_compact_token_limit=COMPACT_LIMIT,
    )
    assert run.result.agent is not None and run.result.agent.exit_code == 0, run.diag
    assert run.files["big.txt"] == "".join(f"{i}\n" for i in range(1, 2001)), run.diag
    assert run.files["step2.txt"] == "step2\n", run.diag

    # Codex compacted on its own: its turn metadata says so, and the window advanced.
    requests = completions(run, "codex")
    metas = [json.loads(e.headers["x-codex-turn-metadata"]) for e in requests]
    assert [m["request_kind"] for m in metas] == ["turn", "turn", "compaction", "turn"], metas
    assert metas[2]["compaction"]["trigger"] == "auto"
    assert requests[2].json_body()["tools"] == []
    windows = [e.headers["x-codex-window-id"].rsplit(":", 1)[1] for e in requests]
    assert windows == ["0", "0", "0", "1"]

    calls = run.trajectory["calls"]
    assert [c["scene"] for c in calls] == ["main", "main", "compaction", "main"]
    paired = match_engine_replies(calls, replies)
    assert [paired[c["call_id"]].rule for c in calls] == [0, 2, 1, 3]

    segments = check_partition(run.trajectory)
    assert len(segments) == 3
    first, compaction, resumed = (segments[calls[i]["segment_id"]] for i in (0, 2, 3))
    assert calls[1]["segment_id"] == first["segment_id"]
    assert (first["scene"], first["parent_id"], first["link"]) == ("main", None, None)
    assert compaction["scene"] == "compaction"
    assert (compaction["parent_id"], compaction["link"]) == (first["segment_id"], "continues")
    assert resumed["scene"] == "main"
    assert (resumed["parent_id"], resumed["link"]) == (compaction["segment_id"], "continues")
    assert all(s["trainable"] for s in segments.values())  # the default trainable scenes
    for s in segments.values():
        seg_calls = [c for c in calls if c["call_id"] in s["call_ids"]]
        check_segment_tokens(s, seg_calls, [paired[c["call_id"]].output_ids for c in seg_calls])
    assert decode(stack, compaction["response_ids"]).startswith(SUMMARY)
    assert SUMMARY in decode(stack, resumed["prompt_ids"])
    # The resumed prompt no longer carries the big output; the compaction prompt did.
    assert "1999\n2000" in decode(stack, compaction["prompt_ids"])
    assert "1999\n2000" not in decode(stack, resumed["prompt_ids"])


# --------------------------------------------------------------------------- 3. sub-agent

SUB_PROMPT = "TASK-SUB: have a sub-agent write sub.txt, then report."
SUBAGENT_SCRIPT = [
    # Main: spawn a blocking general-purpose sub-agent.
    ScriptRule(
        when_contains="TASK-SUB",
        reply=call(
            "Agent",
            description="Write sub.txt",
            prompt="SUBTASK-9: create /workspace/sub.txt containing the line SUB-OK.",
            subagent_type="general-purpose",
            run_in_background=False,
        ),
    ),
    # Sub-agent: one tool call, then its report.
    ScriptRule(
        when_contains="SUBTASK-9",
        reply=call("Write", file_path="/workspace/sub.txt", content="SUB-OK\n"),
    ),
    ScriptRule(when_contains="File created successfully", reply="Wrote sub.txt. SUBDONE"),
    # Main again, with the sub-agent's report as the Agent tool's result.
    ScriptRule(when_contains="SUBDONE", reply="The sub-agent wrote sub.txt."),
]


async def test_claude_code_subagent_is_spawned_by_main(
    stack: AgentStack,
    docker_backend: SandboxBackend,  # noqa: F811 - the imported fixture
    tmp_path: Path,
) -> None:
    run, replies = await scripted_run(
        stack,
        docker_backend,
        tmp_path,
        "claude_code",
        SUBAGENT_SCRIPT,
        SUB_PROMPT,
        ["sub.txt"],
    )
    assert run.result.agent is not None and run.result.agent.exit_code == 0, run.diag
    assert run.files["sub.txt"] == "SUB-OK\n", run.diag

    requests = completions(run, "claude_code")
    labels = [agent_label("claude_code", e) for e in requests]
    assert labels == ["main", "subagent", "subagent", "main"], labels
    agent_ids = {e.headers["x-claude-code-agent-id"] for e in requests[1:3]}
    assert len(agent_ids) == 1 and "x-claude-code-agent-id" not in requests[0].headers

    calls = run.trajectory["calls"]
    assert [c["scene"] for c in calls] == ["main", "subagent", "subagent", "main"]
    paired = match_engine_replies(calls, replies)
    assert [paired[c["call_id"]].rule for c in calls] == [0, 1, 2, 3]

    segments = check_partition(run.trajectory)
    assert len(segments) == 2
    main, sub = segments[calls[0]["segment_id"]], segments[calls[1]["segment_id"]]
    assert main["call_ids"] == [calls[0]["call_id"], calls[3]["call_id"]]
    assert sub["call_ids"] == [calls[1]["call_id"], calls[2]["call_id"]]
    assert (main["scene"], main["parent_id"], main["link"]) == ("main", None, None)
    assert (sub["scene"], sub["parent_id"], sub["link"]) == (
        "subagent",
        main["segment_id"],
        "spawned_by",
    )
    assert main["trainable"] and sub["trainable"]
    for s, idx in ((main, (0, 3)), (sub, (1, 2))):
        seg_calls = [calls[i] for i in idx]
        check_segment_tokens(s, seg_calls, [paired[c["call_id"]].output_ids for c in seg_calls])
    assert "SUBTASK-9" in decode(stack, sub["prompt_ids"])
    assert "TASK-SUB" not in decode(stack, sub["prompt_ids"])


# --------------------------------------------------------------------------- 4. Claude compaction

CC_COMPACT_PROMPT = "TASK-CC: write a.txt, b.txt and c.txt with the shell."
CC_SUMMARY = (
    "<analysis>Three files.</analysis>\n<summary>SUMMARY-CC: a.txt and b.txt exist.</summary>"
)
CC_COMPACTION_SCRIPT = [
    # Claude Code's compaction request (its summary instruction ends the last user turn).
    ScriptRule(when_contains=CC_COMPACTION_MARKER, reply=CC_SUMMARY, repeat=True),
    ScriptRule(
        when_contains="TASK-CC",
        reply=call("Bash", command="seq 1 300 > a.txt && echo A-DONE", description="Write a"),
    ),
    ScriptRule(
        when_contains="A-DONE",
        reply=call("Bash", command="seq 1 300 > b.txt && echo B-DONE", description="Write b"),
    ),
    ScriptRule(
        when_contains="B-DONE",
        reply=call("Bash", command="echo C-DONE > c.txt && cat c.txt", description="Write c"),
    ),
]


async def test_claude_code_auto_compaction_links_segments(
    stack: AgentStack,
    docker_backend: SandboxBackend,  # noqa: F811 - the imported fixture
    tmp_path: Path,
) -> None:
    """Claude Code compacts on its own when its context window (32k here; its prompt
    alone is ~23k tokens with the tiny tokenizer) fills up: every compaction call must
    open a `compaction` segment continuing the main one, and the main conversation that
    resumes from the summary a `main` segment continuing the compaction."""
    run, replies = await scripted_run(
        stack,
        docker_backend,
        tmp_path,
        "claude_code",
        CC_COMPACTION_SCRIPT,
        CC_COMPACT_PROMPT,
        ["a.txt", "b.txt", "c.txt"],
        context_window=32768,
    )
    assert run.result.agent is not None and run.result.agent.exit_code == 0, run.diag
    assert run.files["c.txt"] == "C-DONE\n", run.diag
    assert run.files["a.txt"] == run.files["b.txt"] == "".join(f"{i}\n" for i in range(1, 301))

    requests = completions(run, "claude_code")
    labels = [agent_label("claude_code", e) for e in requests]
    assert "compaction" in labels, labels
    calls = run.trajectory["calls"]
    assert [c["scene"] for c in calls] == labels
    paired = match_engine_replies(calls, replies)

    segments = check_partition(run.trajectory)
    ordered = list(segments.values())  # in opening order
    # Each call sits in a segment of its own scene ...
    for c in calls:
        assert segments[c["segment_id"]]["scene"] == c["scene"], (c["scene"], c["match"])
    # ... and the segments alternate main → compaction → main ..., each continuing the last.
    assert ordered[0]["scene"] == "main" and ordered[0]["parent_id"] is None
    for previous, s in itertools.pairwise(ordered):
        assert {previous["scene"], s["scene"]} == {"main", "compaction"}
        assert (s["parent_id"], s["link"]) == (previous["segment_id"], "continues")
        if s["scene"] == "main":
            assert "SUMMARY-CC" in decode(stack, s["prompt_ids"])
    for s in ordered:
        seg_calls = [c for c in calls if c["call_id"] in s["call_ids"]]
        check_segment_tokens(s, seg_calls, [paired[c["call_id"]].output_ids for c in seg_calls])
