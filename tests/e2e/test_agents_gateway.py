"""E2E: real agent CLIs in a sandbox, talking to the project's real Gateway, which serves
them from a *scripted engine* (a fake vLLM that replays tool calls, tokenized with the
real tokenizer). Checks the rollout end to end: the task is solved (reward 1) and the
Gateway recorded every call token-exact, classified by the harness's scene profile.
Each agent uses its own protocol: Chat Completions (mini-swe-agent, Hermes), Responses
(Codex), Anthropic Messages (Claude Code).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from devstack.scripted_engine import Script, ScriptedEngine, ScriptRule
from devstack.tiny_model import ensure_tiny_model
from harnesses.registry import get_harness
from sandboxes.base import SandboxBackend
from schemas.outcome import RolloutStatus
from schemas.session import SessionCreated
from schemas.tasks import RolloutTask
from tests.fixtures.gateway import served_gateway
from tests.fixtures.runtime import RuntimeManager
from tests.fixtures.sandboxes import (  # noqa: F401 - fixtures
    docker_backend,
    sandbox_base_image,
    sandbox_state_dir,
)
from workers.local_stack import InProcessGateway

pytestmark = pytest.mark.e2e

MODEL = "tiny"
PROMPT = "Create hello.py in the current directory that prints 42."
WRITE_HELLO = "printf 'print(42)\\n' > hello.py"


def call(name: str, **arguments: Any) -> str:
    """A tool call in the served model's output format (parsed by the Gateway)."""
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


#: Per agent: the engine's replies, in order. Rule 1 answers the task prompt with the
#: agent's own shell tool; rule 2 answers once the tool result is in the prompt.
SCRIPTS: dict[str, list[ScriptRule]] = {
    "mini_swe_agent": [
        ScriptRule(when_contains="prints 42", reply=call("bash", command=WRITE_HELLO)),
        ScriptRule(
            when_contains="returncode",
            reply=call("bash", command="echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"),
        ),
    ],
    "hermes": [
        ScriptRule(when_contains="prints 42", reply=call("terminal", command=WRITE_HELLO)),
        ScriptRule(when_contains="exit_code", reply="hello.py now prints 42."),
    ],
    "codex": [
        ScriptRule(when_contains="prints 42", reply=call("exec_command", cmd=WRITE_HELLO)),
        ScriptRule(when_contains="Process exited with code 0", reply="hello.py now prints 42."),
    ],
    "claude_code": [
        ScriptRule(
            when_contains="prints 42",
            reply=call("Bash", command=WRITE_HELLO, description="Write hello.py"),
        ),
        ScriptRule(when_contains="tool", reply="hello.py now prints 42."),
    ],
}


@dataclass
class Stack:
    engine: ScriptedEngine
    gateway: InProcessGateway


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """Scripted engine + real Gateway on loopback (started once for this module)."""
    model = ensure_tiny_model()
    engine = ScriptedEngine(model / "tokenizer.json", Script(), model=MODEL)
    with served_gateway(engine.app(), model, tmp_path_factory.mktemp("gw"), MODEL) as gateway:
        yield Stack(engine, gateway)


@pytest.mark.parametrize("agent", list(SCRIPTS))
async def test_real_agent_through_gateway(
    agent: str,
    stack: Stack,
    docker_backend: SandboxBackend,  # noqa: F811 - the imported fixture
    tmp_path: Path,
) -> None:
    stack.engine.script = Script(rules=SCRIPTS[agent], default_reply="Done.")
    stack.engine._used.clear()
    harness_cfg = {"model": MODEL, "context_window": 32768, "max_output_tokens": 512}
    scenes = get_harness(agent, harness_cfg).scene_config()
    created = stack.gateway.create_session(
        policy_version="e2e", scenes=scenes.model_dump(mode="json")
    )
    session = SessionCreated.model_validate(created)
    task = RolloutTask.model_validate(
        {
            "task_id": f"hello-{agent}",
            "prompt": PROMPT,
            "sandbox": {"backend": "docker"},
            "harness": {"name": agent, "config": harness_cfg, "budget_s": 300},
            "evaluation": {
                "checks": [{"kind": "command", "command": 'test "$(python3 hello.py)" = 42'}]
            },
        }
    )
    rid = f"e2e-gw-{agent}-{time.monotonic_ns()}"
    r = await RuntimeManager(tmp_path, backends={"docker": docker_backend}).run(task, session, rid)
    assert r.agent is not None
    diag = f"stdout={r.agent.stdout_tail[-2000:]}\nstderr={r.agent.stderr_tail[-2000:]}"
    traj = stack.gateway.trajectory(session.session_id)
    calls = traj["calls"]
    assert calls, f"{agent} made no call through the Gateway\n{diag}"
    assert r.status == RolloutStatus.ok, f"{r.status} {r.error}\n{diag}"
    assert r.reward == 1.0, diag
    ok = [c for c in calls if c["status"] == "ok"]
    assert len(ok) >= 2, calls  # the tool call turn and the final turn
    assert {c["scene"] for c in ok} == {"main"}
    for c in ok:
        assert c["prompt_ids"] and c["output_ids"]
        assert len(c["output_logprobs"]) == len(c["output_ids"])
    # Both turns continue one conversation: one trainable main segment.
    mains = [s for s in traj["segments"] if s["scene"] == "main"]
    assert len(mains) == 1 and mains[0]["trainable"], traj["segments"]
