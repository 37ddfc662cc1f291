"""Integration: the Runtime Manager with the `command` harness in real sandboxes.

The "agent" is a shell command, so these tests need no model: they prove the whole
composition — provision, harness setup, hooks, the budget kill, evaluation, the diff,
artifacts, on_error and cleanup on cancellation — on the real local (bubblewrap) and
docker backends, and that an agent inside reaches its Gateway through the forwarder.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest

import hooks.evaluate as evaluate_hook
from activities.runtime import RuntimeFailure
from hooks.base import Hook, HookContext, register_hook
from sandboxes.base import SandboxBackend
from sandboxes.supervision.supervised import SupervisedSandbox
from schemas.outcome import RolloutStatus
from schemas.session import SessionCreated
from schemas.tasks import RolloutTask
from tests.fixtures.forger import LEAVE_FORGER
from tests.fixtures.llm_stand_in import RecordingLLMServerForTests
from tests.fixtures.runtime import RuntimeManager
from tests.fixtures.sandboxes import (  # noqa: F401 - fixtures
    docker_backend,
    local_backend,
    sandbox_backend,
    sandbox_base_image,
    sandbox_state_dir,
)

pytestmark = pytest.mark.integration

ON_ERROR_CALLS: list[str] = []


@register_hook
class RecordOnErrorHook(Hook):
    """Test hook: notes that on_error ran, and what the sandbox looked like then."""

    name = "test_record_on_error"

    async def on_error(self, ctx: HookContext, error: BaseException) -> None:
        res = await ctx.sandbox.exec("cat hello.py", cwd=ctx.workdir, timeout=30)
        ON_ERROR_CALLS.append(f"{type(error).__name__}:{res.stdout.strip()}")


@pytest.fixture
def backend(sandbox_backend: SandboxBackend) -> SandboxBackend:  # noqa: F811
    """Each host backend in turn (local bubblewrap, docker), isolated state dir."""
    return sandbox_backend


@pytest.fixture
def gateway() -> Any:
    with RecordingLLMServerForTests() as srv:
        yield srv


def session_for(srv: RecordingLLMServerForTests) -> SessionCreated:
    return SessionCreated(
        session_id="sess-1",
        token="tok-integration",
        openai_base_url=f"{srv.url}/v1",
        anthropic_base_url=srv.url,
    )


HELLO_EVAL = {
    "checks": [
        {"kind": "command", "command": 'test "$(python3 hello.py)" = 42', "name": "prints 42"},
        {"kind": "file", "path": "hello.py", "contains": ["print"]},
    ]
}


def hello_task(backend: str, command: str, budget_s: float = 60, **kw: Any) -> RolloutTask:
    data: dict[str, Any] = {
        "task_id": "hello",
        "prompt": "create hello.py that prints 42",
        "sandbox": {"backend": backend},
        "harness": {"name": "command", "config": {"command": command}, "budget_s": budget_s},
        "evaluation": HELLO_EVAL,
        **kw,
    }
    return RolloutTask.model_validate(data)


def _rid(tag: str) -> str:
    return f"it-{tag}-{time.monotonic_ns()}"


async def _live_rollouts(backend: SandboxBackend) -> set[str]:
    return {h.rollout_id for h in await backend.list()}


async def test_agent_solves_task_reward_1(
    backend: SandboxBackend, gateway: RecordingLLMServerForTests, tmp_path: Path
) -> None:
    """The agent writes hello.py, the success check passes: reward 1, diff, artifacts."""
    task = hello_task(
        backend.name,
        "printf 'print(42)\\n' > hello.py && echo wrote it for {{model}}",
        hooks=[
            {"name": "collect_logs"},
            {"name": "capture_diff"},
            {"name": "evaluate"},
            {"name": "metrics"},
            {"name": "upload_artifacts", "params": {"dest": str(tmp_path / "store")}},
        ],
    )
    rid = _rid("ok")
    r = await RuntimeManager(tmp_path / "art", backends={backend.name: backend}).run(
        task, session_for(gateway), rid
    )
    assert r.status == RolloutStatus.ok, r.error
    assert r.agent is not None and r.agent.exit_code == 0
    assert "wrote it for policy" in r.agent.stdout_tail
    assert r.reward == 1.0 and r.evaluation is not None and r.evaluation.verdict == "pass"
    assert r.reward_fn_version and r.reward_fn_version.startswith("eval")
    assert r.env_version and r.harness_version.startswith("command-")
    assert r.diff is not None and r.diff.files_changed == 1 and r.diff.insertions == 1
    patch = (tmp_path / "art" / rid / "diff.patch").read_text()
    assert "+print(42)" in patch and "hello.py" in patch
    assert r.metrics["eval.reward"] == 1.0 and r.metrics["diff.files_changed"] == 1
    uploaded = {a.name for a in r.artifacts if a.uri}
    assert {"diff.patch", "evaluation.json", "metrics.json", "agent/agent.stdout.log"} <= uploaded
    assert (tmp_path / "store" / rid / "diff.patch").is_file()
    assert rid not in await _live_rollouts(backend)
    assert set(r.timings) >= {"setup", "before_run", "agent", "after_run"}


async def test_wrong_answer_reward_0(
    backend: SandboxBackend, gateway: RecordingLLMServerForTests, tmp_path: Path
) -> None:
    task = hello_task(backend.name, "printf 'print(41)\\n' > hello.py")
    r = await RuntimeManager(tmp_path, backends={backend.name: backend}).run(
        task, session_for(gateway), _rid("wrong")
    )
    assert r.status == RolloutStatus.ok  # the agent ran fine; it was just wrong
    assert r.reward == 0.0 and r.evaluation is not None
    assert r.evaluation.status == "ok" and r.evaluation.verdict == "fail"
    assert r.evaluation.step_rewards == [0.0, 1.0]


async def test_broken_evaluator_is_eval_error(
    backend: SandboxBackend, gateway: RecordingLLMServerForTests, tmp_path: Path
) -> None:
    task = hello_task(
        backend.name,
        "printf 'print(42)\\n' > hello.py",
        evaluation={"checks": [{"kind": "command", "command": "no-such-test-runner -q"}]},
    )
    r = await RuntimeManager(tmp_path, backends={backend.name: backend}).run(
        task, session_for(gateway), _rid("evalerr")
    )
    assert r.status == RolloutStatus.eval_error
    assert r.reward is None and r.evaluation is not None and r.evaluation.verdict == "error"


async def test_hanging_agent_is_killed_at_its_budget(
    backend: SandboxBackend, gateway: RecordingLLMServerForTests, tmp_path: Path
) -> None:
    task = hello_task(backend.name, "printf 'print(42)\\n' > hello.py; sleep 600", budget_s=3)
    t0 = time.monotonic()
    r = await RuntimeManager(tmp_path, backends={backend.name: backend}).run(
        task, session_for(gateway), _rid("hang")
    )
    assert r.status == RolloutStatus.agent_timeout
    # Killed at its budget: not before it, and not after the command's own 600 s.
    assert r.agent is not None and r.agent.timed_out and 2.5 <= r.agent.duration_s < 600
    assert time.monotonic() - t0 < 600
    # Partial work is still evaluated, but a timed-out rollout earns nothing.
    assert r.evaluation is not None and r.evaluation.reward == 1.0
    assert r.reward == 0.0


async def test_cancellation_destroys_the_sandbox(
    backend: SandboxBackend, gateway: RecordingLLMServerForTests, tmp_path: Path
) -> None:
    task = hello_task(
        backend.name,
        "printf 'print(42)\\n' > hello.py; sleep 600",
        hooks=[{"name": "test_record_on_error"}, {"name": "collect_logs"}],
    )
    rid = _rid("cancel")
    ON_ERROR_CALLS.clear()
    phases: list[str] = []
    run = asyncio.create_task(
        RuntimeManager(tmp_path, backends={backend.name: backend}).run(
            task, session_for(gateway), rid, on_phase=phases.append
        )
    )
    deadline = time.monotonic() + 60
    while "agent" not in phases:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)
    handles = [h for h in await backend.list() if h.rollout_id == rid]
    assert handles, "no sandbox while the agent runs"
    sandbox = await backend.attach(handles[0])
    while not (await sandbox.exec(["test", "-e", "hello.py"])).ok:  # the agent's first step
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    assert rid not in await _live_rollouts(backend)
    assert ON_ERROR_CALLS == ["CancelledError:print(42)"]


FAILING_UPLOAD = {
    "name": "upload_artifacts",
    "params": {"dest": "ftp://nowhere/x", "on_error": False},
}


async def test_on_error_runs_when_a_required_hook_fails(
    backend: SandboxBackend, gateway: RecordingLLMServerForTests, tmp_path: Path
) -> None:
    """Before the evaluation, a required hook's failure fails the run (on_error runs)."""
    task = hello_task(
        backend.name,
        "printf 'print(42)\\n' > hello.py",
        hooks=[{"name": "test_record_on_error"}, FAILING_UPLOAD, {"name": "evaluate"}],
    )
    rid = _rid("onerror")
    ON_ERROR_CALLS.clear()
    with pytest.raises(RuntimeFailure) as exc:
        await RuntimeManager(tmp_path, backends={backend.name: backend}).run(
            task, session_for(gateway), rid
        )
    assert exc.value.phase == "after_run"
    partial = exc.value.outcome
    assert partial.status == RolloutStatus.infra_error and partial.evaluation is None
    assert ON_ERROR_CALLS == ["HookError:print(42)"]
    assert rid not in await _live_rollouts(backend)


async def test_a_required_hook_failing_after_the_evaluation_keeps_the_reward(
    backend: SandboxBackend, gateway: RecordingLLMServerForTests, tmp_path: Path
) -> None:
    """The same failing hook after the evaluation: the verdict stands, the failure is
    recorded, and the hooks after it run (the control is the test above)."""
    task = hello_task(
        backend.name,
        "printf 'print(42)\\n' > hello.py",
        hooks=[
            {"name": "evaluate"},
            FAILING_UPLOAD,
            {"name": "test_record_on_error"},
            {"name": "metrics"},
        ],
    )
    ON_ERROR_CALLS.clear()
    r = await RuntimeManager(tmp_path, backends={backend.name: backend}).run(
        task, session_for(gateway), _rid("after-eval")
    )
    assert r.status == RolloutStatus.ok and r.reward == 1.0
    [error] = r.hook_errors
    assert error.startswith("upload_artifacts.after_run: ") and "ftp" in error
    assert r.metrics["hooks.errors"] == 1  # the metrics hook after it ran
    assert ON_ERROR_CALLS == []


async def test_agent_reaches_its_gateway_session_from_inside(
    backend: SandboxBackend, gateway: RecordingLLMServerForTests, tmp_path: Path
) -> None:
    """The command agent calls Chat Completions at the URL and key the harness gave it;
    the stand-in server on host loopback receives it through the sandbox forwarder."""
    agent = (
        "python3 - <<'EOF'\n"
        "import json, os, urllib.request\n"
        "req = urllib.request.Request(os.environ['OPENAI_BASE_URL'] + '/chat/completions',\n"
        "    data=json.dumps({'model': os.environ['ROLLOUT_MODEL'],\n"
        "                     'messages': [{'role': 'user', 'content': 'hi'}]}).encode(),\n"
        "    headers={'Authorization': 'Bearer ' + os.environ['OPENAI_API_KEY'],\n"
        "             'Content-Type': 'application/json'})\n"
        "body = json.load(urllib.request.urlopen(req, timeout=30))\n"
        "print(body['choices'][0]['message']['content'])\n"
        "EOF"
    )
    task = hello_task(backend.name, agent, evaluation=None, hooks=[{"name": "metrics"}])
    rid = _rid("gw")
    r = await RuntimeManager(tmp_path, backends={backend.name: backend}).run(
        task, session_for(gateway), rid
    )
    assert r.agent is not None and r.agent.exit_code == 0, r.agent and r.agent.stderr_tail
    assert r.agent.stdout_tail.strip() == "done"
    [call] = gateway.model_requests()
    assert call.bearer_or_key() == "tok-integration"
    assert call.path == "/v1/chat/completions" and (call.body or {})["model"] == "policy"
    assert json.loads((tmp_path / rid / "metrics.json").read_text())["agent.exit_code"] == 0


# ------------------------------------------------------------- hostile agents (reward)


@pytest.mark.parametrize("kill", [True, False], ids=["killed", "control_not_killed"])
async def test_a_process_the_agent_leaves_cannot_forge_its_answer(
    backend: SandboxBackend,
    gateway: RecordingLLMServerForTests,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    kill: bool,
) -> None:
    """The agent answers 41 and leaves a detached process that waits for the evaluation
    to start and then writes the right answer; the agent exits only once it saw the
    forger beat twice, so the forger is alive when the run stops the agent. The
    evaluation must see 41. Control: without the kill before the hooks (a no-op
    `kill_all_processes`) the same forger wins, so a 0 here means it was stopped."""
    if not kill:
        monkeypatch.setattr(SupervisedSandbox, "kill_all_processes", _no_kill)
    agent = LEAVE_FORGER + "echo 41 > answer.txt\n"
    evaluation = {
        "checks": [
            {"kind": "command", "name": "answer",
             "command": ': eval-marker; sleep 1; test "$(cat answer.txt)" = 42'},
            {"kind": "file", "name": "forger was running", "path": "/tmp/forger.beat"},
        ]
    }  # fmt: skip
    task = hello_task(backend.name, agent, evaluation=evaluation, hooks=[{"name": "evaluate"}])
    r = await RuntimeManager(tmp_path, backends={backend.name: backend}).run(
        task, session_for(gateway), _rid("forge")
    )
    assert r.status == RolloutStatus.ok, r.error
    assert r.evaluation is not None
    assert [(c.name, c.passed) for c in r.evaluation.checks] == [
        ("answer", not kill),
        ("forger was running", True),
    ]
    assert r.reward == (0.0 if kill else 1.0)


async def _no_kill(self: SupervisedSandbox) -> None:
    """The control's stand-in for the kill before the hooks: leaves every process."""


#: Where the agent plants: a fixed name in the sandbox's temp dir (where `mktemp` puts
#: its directories unless TMPDIR says otherwise).
PLANTED_DIR = "/tmp/tmp.rollout-eval"
#: The control's script runner: the real one with the one thing that protects it taken
#: out, its directory named in advance instead of made by `mktemp -d`.
PREDICTABLE_DIR = f'd={PLANTED_DIR}; mkdir -p "$d" || exit 126'


def predictable_runner() -> str:
    runner = evaluate_hook._SCRIPT_RUNNER
    assert "d=$(mktemp -d) || exit 126" in runner, "the script runner changed: update the test"
    return runner.replace("d=$(mktemp -d) || exit 126", PREDICTABLE_DIR)


@pytest.mark.parametrize(
    ("where", "defended"),
    [
        ("script_check", True),
        ("script_check", False),
        ("hidden_file", True),
        ("hidden_file", False),
    ],
    ids=["script_check", "script_check_control", "hidden_file", "hidden_file_control"],
)
async def test_planted_symlinks_cannot_replace_the_evaluation(
    backend: SandboxBackend,
    gateway: RecordingLLMServerForTests,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    where: str,
    defended: bool,
) -> None:
    """The agent answers 41 and, with no process left running, symlinks to /dev/null the
    path the evaluation would write its check to: for a script check, the `script` file
    in a directory of the sandbox's temp dir, as `mktemp` would make it but under a name
    fixed in advance; for a hidden file, its known name. An empty script passes; the
    evaluation must run the real one and fail.

    Controls (`defended=False`): the same plant against a script runner whose directory
    is that predictable name, and against a check that writes the hidden file itself
    through the shell, are defeated (reward 1), so the plant is where a writer that
    trusts the path would write."""
    check = 'test "$(cat answer.txt)" = 42\n'
    if where == "script_check":
        plant = f"mkdir -p {PLANTED_DIR} && ln -s /dev/null {PLANTED_DIR}/script"
        agent = f"{plant} && echo 41 > answer.txt\n"
        evaluation: dict[str, Any] = {"checks": [{"kind": "script", "script": check}]}
        if not defended:
            monkeypatch.setattr(evaluate_hook, "_SCRIPT_RUNNER", predictable_runner())
    else:
        agent = "ln -s /dev/null check.sh && echo 41 > answer.txt\n"
        command = "sh check.sh" if defended else f"printf '%s' '{check}' > check.sh; sh check.sh"
        evaluation = {"checks": [{"kind": "command", "command": command}]}
        if defended:
            evaluation["files"] = [{"path": "check.sh", "content": check}]
    task = hello_task(backend.name, agent, evaluation=evaluation, hooks=[{"name": "evaluate"}])
    r = await RuntimeManager(tmp_path, backends={backend.name: backend}).run(
        task, session_for(gateway), _rid("plant")
    )
    assert r.status == RolloutStatus.ok, r.error
    assert r.evaluation is not None and r.evaluation.status == "ok"
    assert r.evaluation.checks[0].exit_code == (1 if defended else 0)
    assert r.reward == (0.0 if defended else 1.0)
