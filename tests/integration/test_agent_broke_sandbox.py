"""Integration: an agent that breaks its sandbox earns 0, not an excuse.

A masked rollout (`eval_error`, `infra_error`) is left out of the loss and the group
baseline, so an agent that can turn a likely 0 into one is never pushed away from it.
Each test here is a `command` agent that answers wrong and then breaks what the
evaluation needs — fills its disk, kills its supervisor, removes or closes its workdir
or /tmp, takes every pid — in a real sandbox: the rollout must end
`agent_broke_sandbox` with reward 0 and what was broken named, and no `RuntimeFailure`
(which would give it a fresh attempt). The control: a truly broken evaluator on a
sandbox the agent left alone stays `eval_error` (masked), and the same evaluation on an
intact sandbox scores the answer, so the damage is what decides.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandboxes.base import SandboxBackend
from schemas.outcome import RolloutStatus, RunOutcome
from schemas.session import SessionCreated
from schemas.tasks import RolloutTask
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

#: The evaluation every task here uses: a test command run in the workdir and a reward
#: script (written into a fresh directory under /tmp, its reward read from stdout). The
#: agent always answers 41, so an honest evaluation gives 0; on today's rules each
#: attack below made one of the two fail to run instead (an evaluator error, masked).
REWARD_SCRIPT = (
    "import json\n"
    "answer = open('answer.txt').read().strip()\n"
    "print(json.dumps({'reward': 1.0 if answer == '42' else 0.0}))\n"
)
EVALUATION: dict[str, Any] = {
    "checks": [
        {"kind": "command", "name": "test", "command": 'test "$(cat answer.txt)" = 42'},
        {
            "kind": "script",
            "name": "reward",
            "interpreter": "/usr/bin/python3",
            "reward_from": "stdout_json",
            "script": REWARD_SCRIPT,
        },
    ],
}
ANSWER = "echo 41 > answer.txt\n"

KILL_SUPERVISOR = """python3 - <<'EOF'
import os, signal
for pid in os.listdir("/proc"):
    try:
        cmd = open("/proc/%s/cmdline" % pid, "rb").read()
    except OSError:
        continue
    if b"supervisor.py" in cmd:
        os.kill(int(pid), signal.SIGKILL)
EOF
"""


@pytest.fixture
def gateway() -> Iterator[RecordingLLMServerForTests]:
    with RecordingLLMServerForTests() as srv:
        yield srv


def _task(
    backend: str, agent: str, evaluation: dict[str, Any] = EVALUATION, **sandbox: Any
) -> RolloutTask:
    return RolloutTask.model_validate(
        {
            "task_id": "broke",
            "prompt": "write 42 to answer.txt",
            "sandbox": {"backend": backend, **sandbox},
            "harness": {"name": "command", "config": {"command": agent}, "budget_s": 60},
            "evaluation": evaluation,
            "hooks": [{"name": "evaluate"}],
        }
    )


async def _run(
    backend: SandboxBackend, gw: RecordingLLMServerForTests, tmp: Path, task: RolloutTask
) -> RunOutcome:
    session = SessionCreated(
        session_id="sess-broke",
        token="tok-broke",
        openai_base_url=f"{gw.url}/v1",
        anthropic_base_url=gw.url,
    )
    rid = f"it-broke-{time.monotonic_ns()}"
    return await RuntimeManager(tmp, backends={backend.name: backend}).run(task, session, rid)


def _assert_agents_fault(r: RunOutcome, damage: str) -> None:
    assert r.status == "agent_broke_sandbox", (r.status, r.problem)
    assert r.reward == 0.0
    problem = r.problem or ""
    assert damage in problem, problem


# ------------------------------------------------------------------ the controls


async def test_control_a_broken_evaluator_on_an_intact_sandbox_stays_masked(
    sandbox_backend: SandboxBackend,  # noqa: F811
    gateway: RecordingLLMServerForTests,
    tmp_path: Path,
) -> None:
    """Command not found on the image, sandbox untouched: ours, masked."""
    broken = {"checks": [{"kind": "command", "command": "no-such-test-runner"}]}
    task = _task(sandbox_backend.name, ANSWER, evaluation=broken)
    r = await _run(sandbox_backend, gateway, tmp_path, task)
    assert r.status == RolloutStatus.eval_error, r.problem
    assert r.reward is None and r.evaluation is not None
    assert r.evaluation.damage is None and r.evaluation.verdict == "error"


async def test_control_the_same_evaluation_on_an_intact_sandbox_scores_the_answer(
    local_backend: SandboxBackend,  # noqa: F811
    gateway: RecordingLLMServerForTests,
    tmp_path: Path,
) -> None:
    """Without the damage, the checks the attacks break run and score 41 as wrong, and
    42 as right: the status below comes from the damage, not from the checks."""
    wrong = await _run(local_backend, gateway, tmp_path, _task("local", ANSWER))
    assert wrong.status == RolloutStatus.ok and wrong.reward == 0.0
    assert wrong.evaluation is not None and wrong.evaluation.damage is None
    right = await _run(local_backend, gateway, tmp_path, _task("local", "echo 42 > answer.txt"))
    assert right.status == RolloutStatus.ok and right.reward == 1.0


# ------------------------------------------------------------------ the attacks


async def test_filling_the_disk_scores_0(
    sandbox_backend: SandboxBackend,  # noqa: F811
    gateway: RecordingLLMServerForTests,
    tmp_path: Path,
) -> None:
    """The sized disk (workdir, home and /tmp) is filled to the last block: the hidden
    test cannot be placed."""
    agent = ANSWER + (
        "cat /dev/zero > /tmp/fill 2>/dev/null\n"
        "i=0; while echo x > /tmp/f$i 2>/dev/null; do i=$((i+1)); done\n"
    )
    task = _task(sandbox_backend.name, agent, resources={"disk_mb": 32})
    r = await _run(sandbox_backend, gateway, tmp_path, task)
    _assert_agents_fault(r, "disk is full")


async def test_killing_the_supervisor_scores_0(
    sandbox_backend: SandboxBackend,  # noqa: F811
    gateway: RecordingLLMServerForTests,
    tmp_path: Path,
) -> None:
    """The agent kills the in-sandbox supervisor (same uid): the sandbox ends under its
    own run. That is its doing, not a crashed host to retry on a fresh sandbox."""
    task = _task(sandbox_backend.name, ANSWER + KILL_SUPERVISOR)
    r = await _run(sandbox_backend, gateway, tmp_path, task)
    _assert_agents_fault(r, "supervisor is gone")


async def test_deleting_the_workdir_scores_0(
    local_backend: SandboxBackend,  # noqa: F811
    gateway: RecordingLLMServerForTests,
    tmp_path: Path,
) -> None:
    """A workdir that is a plain directory (under home; docker and a top-level local
    workdir are mount points, which cannot be removed)."""
    workdir = "/home/agent/work"
    agent = ANSWER + f"cd / && rm -rf {workdir}\n"
    r = await _run(local_backend, gateway, tmp_path, _task("local", agent, workdir=workdir))
    _assert_agents_fault(r, f"{workdir} is gone")


@pytest.mark.parametrize("target", ["workdir", "/tmp"])
async def test_closing_a_directory_the_evaluator_writes_scores_0(
    sandbox_backend: SandboxBackend,  # noqa: F811
    gateway: RecordingLLMServerForTests,
    tmp_path: Path,
    target: str,
) -> None:
    """chmod 000 of the workdir (the hidden test goes there) or of /tmp (the script
    check's private directory is made there)."""
    path = "/workspace" if target == "workdir" else "/tmp"
    r = await _run(
        sandbox_backend,
        gateway,
        tmp_path,
        _task(sandbox_backend.name, ANSWER + f"chmod 000 {path}\n"),
    )
    _assert_agents_fault(r, f"{path} cannot be read")


async def test_taking_every_pid_scores_0(
    sandbox_backend: SandboxBackend,  # noqa: F811
    gateway: RecordingLLMServerForTests,
    tmp_path: Path,
) -> None:
    """The agent leaves sleepers holding every pid of its cgroup (a fork bomb's end
    state, without the CPU): nothing new can start when the run ends."""
    agent = ANSWER + "i=0; while [ $i -lt 80 ]; do sleep 600 & i=$((i+1)); done; true\n"
    task = _task(sandbox_backend.name, agent, resources={"pids": 32})
    r = await _run(sandbox_backend, gateway, tmp_path, task)
    assert r.status == "agent_broke_sandbox", (r.status, r.problem)
    assert r.reward == 0.0 and r.problem


#: A hidden test the evaluation places under a directory of the workdir, and the check
#: that runs it.
HIDDEN_TEST = {
    "checks": [{"kind": "command", "name": "test", "command": "sh tests/hidden.sh"}],
    "files": [{"path": "tests/hidden.sh", "content": 'test "$(cat answer.txt)" = 42\n'}],
}
#: Harbor's verifier: its tests under /tests, its reward file in /logs/verifier.
VERIFIER = {
    "checks": [{"kind": "reward_file", "command": "bash /tests/test.sh"}],
    "files": [
        {
            "path": "/tests/test.sh",
            "content": 'if test "$(cat answer.txt)" = 42; then r=1; else r=0; fi\n'
            "echo $r > /logs/verifier/reward.txt\n",
        }
    ],
}


@pytest.mark.parametrize(
    ("evaluation", "block", "where"),
    [
        (HIDDEN_TEST, "rm -rf tests && echo x > tests", "/workspace/tests is not a directory"),
        (HIDDEN_TEST, "ln -s /nowhere/at/all tests", "/workspace/tests is a dangling symlink"),
        (HIDDEN_TEST, "mkdir -p tests && chmod 555 tests", "/workspace/tests takes no new file"),
        (
            VERIFIER,
            "rm -rf /logs/verifier && echo x > /logs/verifier && chmod 555 /logs",
            "/logs takes no new file",
        ),
    ],
    ids=["file_in_place_of_its_dir", "dangling_symlink", "closed_dir", "reward_dir_blocked"],
)
async def test_blocking_where_the_evaluation_writes_scores_0(
    sandbox_backend: SandboxBackend,  # noqa: F811
    gateway: RecordingLLMServerForTests,
    tmp_path: Path,
    evaluation: dict[str, Any],
    block: str,
    where: str,
) -> None:
    """The agent blocks the path a hidden file or the verifier's reward dir is written to
    (a file where its directory goes, a symlink to nowhere, a closed directory): it could
    be written before the agent ran, so the failure is the agent's, named."""
    task = _task(sandbox_backend.name, ANSWER + block + "\n", evaluation=evaluation)
    r = await _run(sandbox_backend, gateway, tmp_path, task)
    _assert_agents_fault(r, where)


async def test_control_a_hidden_file_the_task_cannot_place_stays_masked(
    local_backend: SandboxBackend,  # noqa: F811
    gateway: RecordingLLMServerForTests,
    tmp_path: Path,
) -> None:
    """A hidden file under a read-only system dir could not be placed before the agent
    ran either: the task's fault, ours, masked — whatever the agent did."""
    evaluation = {**HIDDEN_TEST, "files": [{"path": "/usr/lib/hidden.sh", "content": "true\n"}]}
    task = _task("local", ANSWER + "mkdir -p tests && chmod 555 tests\n", evaluation=evaluation)
    r = await _run(local_backend, gateway, tmp_path, task)
    assert r.status == RolloutStatus.eval_error, r.problem
    assert r.reward is None and r.evaluation is not None and r.evaluation.damage is None


#: A reward script that needs 96 MiB: more than a sandbox whose memory the agent filled
#: with files has left, well within one the agent left alone.
HUNGRY = {
    "checks": [
        {
            "kind": "script",
            "name": "reward",
            "interpreter": "/usr/bin/python3",
            "reward_from": "stdout_json",
            "script": "room = bytearray(96 << 20)\n" + REWARD_SCRIPT,
        }
    ]
}
FILL_SHM = "head -c 176M /dev/zero > /dev/shm/fill 2>/dev/null; true\n"


@pytest.mark.parametrize("fill", [True, False], ids=["filled", "control_not_filled"])
async def test_filling_memory_with_files_scores_0(
    local_backend: SandboxBackend,  # noqa: F811
    gateway: RecordingLLMServerForTests,
    tmp_path: Path,
    fill: bool,
) -> None:
    """The agent leaves files in /dev/shm (memory, charged to its 256 MiB limit), which
    no kill frees: the reward script is killed for want of memory. Control: without the
    files the same script runs and scores the wrong answer 0."""
    agent = ANSWER + (FILL_SHM if fill else "")
    task = _task("local", agent, evaluation=HUNGRY, resources={"memory_mb": 256})
    r = await _run(local_backend, gateway, tmp_path, task)
    if fill:
        _assert_agents_fault(r, "files in memory (tmpfs: /dev/shm, /run) hold 176 MiB")
    else:
        assert (r.status, r.reward) == (RolloutStatus.ok, 0.0), r.problem
