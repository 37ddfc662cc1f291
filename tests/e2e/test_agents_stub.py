"""Real agent CLIs against a recording stand-in LLM server (no Gateway, no model).

Why: independent of the Gateway, this proves each harness's *config* is right — the
agent starts, reaches the base URL we gave it, sends our session token and
model name, and (with a scripted reply) completes a tiny task whose result `evaluate`
scores. The server only replays canned replies; it is not a model and not the Gateway.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandboxes.base import SandboxBackend
from schemas import agent_versions as versions
from schemas.outcome import RolloutStatus
from schemas.session import SessionCreated
from schemas.tasks import RolloutTask
from tests.fixtures.llm_stand_in import RecordedRequest, RecordingLLMServerForTests, Reply, Script
from tests.fixtures.runtime import RuntimeManager
from tests.fixtures.sandboxes import (  # noqa: F401 - fixtures
    docker_backend,
    local_backend,
    sandbox_backend,
    sandbox_base_image,
    sandbox_state_dir,
)

# --------------------------------------------------------------------------- tests

pytestmark = pytest.mark.e2e

TOKEN = "tok-e2e-stub"
MODEL = "stub-policy"
WRITE_HELLO = "printf 'print(42)\\n' > hello.py"
#: Per agent: its shell tool, how it wants the command argument, how it finishes.
AGENTS: dict[str, dict[str, Any]] = {
    "mini_swe_agent": {"tool": "bash", "arg": "command", "finish": "bash"},
    "hermes": {"tool": "terminal", "arg": "command", "finish": "text"},
    "codex": {"tool": "exec_command", "arg": "cmd", "finish": "text"},
    "claude_code": {"tool": "Bash", "arg": "command", "finish": "text"},
}


def solve_hello(agent: str) -> Script:
    """Scripted 'model': call the agent's own shell tool to write hello.py, then finish
    the way that agent expects (mini: its submit command; others: a plain answer)."""
    spec = AGENTS[agent]

    def script(r: RecordedRequest) -> Reply:
        if spec["tool"] not in r.tool_names():
            return Reply(text="done")  # an auxiliary call (title, summary...)
        if not r.has_tool_result():
            args = {spec["arg"]: WRITE_HELLO}
            if agent == "claude_code":
                args["description"] = "Write hello.py"
            return Reply(tool=spec["tool"], args=args)
        if spec["finish"] == "bash":
            return Reply(
                tool="bash", args={"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"}
            )
        return Reply(text="hello.py now prints 42")

    return script


@pytest.fixture
def backend(sandbox_backend: SandboxBackend) -> SandboxBackend:  # noqa: F811
    """Local (bubblewrap on the image rootfs) and docker in turn; both hold the agents."""
    return sandbox_backend


@pytest.fixture
def llm() -> Iterator[RecordingLLMServerForTests]:
    with RecordingLLMServerForTests() as srv:
        yield srv


def hello_task(agent: str, backend: str) -> RolloutTask:
    return RolloutTask.model_validate(
        {
            "task_id": f"hello-{agent}",
            "prompt": "Create hello.py in the current directory that prints 42.",
            "sandbox": {"backend": backend},
            "harness": {
                "name": agent,
                "config": {"model": MODEL, "context_window": 32768, "max_output_tokens": 1024},
                "budget_s": 240,
            },
            "evaluation": {
                "checks": [{"kind": "command", "command": 'test "$(python3 hello.py)" = 42'}]
            },
        }
    )


PINNED = {
    "claude_code": versions.CLAUDE_CODE_VERSION,
    "codex": versions.CODEX_VERSION,
    "hermes": versions.HERMES_VERSION,
    "mini_swe_agent": versions.MINI_SWE_AGENT_VERSION,
}
#: Transcript each agent must leave behind (collected by the collect_logs hook).
TRANSCRIPT_KIND = {
    "claude_code": "transcript",
    "codex": "transcript",
    "hermes": "log",
    "mini_swe_agent": "trajectory",
}


@pytest.mark.parametrize("agent", list(AGENTS))
async def test_real_agent_solves_hello_against_stand_in(
    agent: str, backend: SandboxBackend, llm: RecordingLLMServerForTests, tmp_path: Path
) -> None:
    """Config correctness end to end: the real CLI, inside the sandbox, reaches the
    URL we configured with our token and model, runs the scripted tool call, and the
    task's success check scores its work."""
    llm.script = solve_hello(agent)
    session = SessionCreated(
        session_id="s-e2e",
        token=TOKEN,
        openai_base_url=f"{llm.url}/v1",
        anthropic_base_url=llm.url,
    )
    rid = f"e2e-stub-{agent}-{backend.name}-{time.monotonic_ns()}"
    r = await RuntimeManager(tmp_path, backends={backend.name: backend}).run(
        hello_task(agent, backend.name), session, rid
    )
    calls = llm.model_requests()
    assert r.agent is not None
    diag = f"stdout={r.agent.stdout_tail[-1500:]}\nstderr={r.agent.stderr_tail[-1500:]}"
    assert calls, f"{agent} made no model call\n{diag}"
    first = calls[0]
    assert first.bearer_or_key() == TOKEN, diag
    assert (first.body or {}).get("model") == MODEL, diag
    want_protocol = {"claude_code": "messages", "codex": "responses"}.get(agent, "chat")
    assert {c.protocol for c in calls} == {want_protocol}
    assert first.path.startswith("/v1/")
    assert r.status == RolloutStatus.ok, f"{r.status} {r.error}\n{diag}"
    assert r.reward == 1.0, diag
    assert r.harness_version == PINNED[agent]
    kinds = {lf.kind for lf in r.agent.logs}
    assert TRANSCRIPT_KIND[agent] in kinds, kinds
    if agent == "claude_code":
        assert first.headers.get("x-claude-code-request-class") == "main"
        assert (first.body or {}).get("max_tokens") == 1024
    if agent == "codex":
        assert "x-codex-turn-metadata" in first.headers
        assert r.agent.final_message == "hello.py now prints 42"
    if agent == "hermes":
        assert (first.body or {}).get("max_tokens") == 1024
    if agent == "mini_swe_agent":
        assert r.agent.details.get("exit_status") == "Submitted"
