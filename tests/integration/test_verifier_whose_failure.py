"""Integration: whose failure a Harbor verifier's missing reward is, decided by evidence,
on real sandboxes (local bubblewrap and docker).

A verifier that wrote a reward where the agent could not interfere — the task's own
solution, run by the `oracle` harness, recorded by `task_formats.verifier_evidence` and
carried in the task as `RewardFileCheck.shown_working` — but writes none after the
agent's code ran, failed by the agent's doing: reward 0, `agent_broke_sandbox`, the
reason in `damage`. Each attack below is a program the verifier runs (the agent's
`answer.py`): it kills test.sh, empties /logs/verifier, ends the test runner before it
prints, or never returns. The controls: the oracle's own run scores 1 and a wrong answer
0 with the same verifier; the same attack without the evidence is masked (eval_error),
as every one of them was before. Resource exhaustion is decided by the damage probe with
no evidence needed: a disk left with 1 MiB, a full /dev/shm — controls: the same with the
old 64 KiB threshold is masked. And the verifier's environment: a `unittest.py` the agent
leaves in the workdir forges a reward only when PYTHONSAFEPATH is switched off.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from sandboxes.base import SandboxBackend
from schemas.outcome import RolloutStatus, RunOutcome
from schemas.rollout import RolloutResult
from schemas.session import SessionCreated
from schemas.tasks import RolloutTask
from task_formats import verifier_evidence
from tests.fixtures.runtime import RuntimeManager
from tests.fixtures.sandboxes import (  # noqa: F401 - fixtures
    docker_backend,
    local_backend,
    sandbox_backend,
    sandbox_base_image,
    sandbox_state_dir,
)

pytestmark = pytest.mark.integration

SESSION = SessionCreated(
    session_id="sess-whose-failure",
    token="tok-whose-failure",
    openai_base_url="http://127.0.0.1:9/v1",
    anthropic_base_url="http://127.0.0.1:9",
)

#: The task's test runner: imports the agent's module from the workdir, takes a
#: semaphore (multiprocessing's, in /dev/shm, as parallel test runners do) and prints
#: the result line test.sh reads.
RUN_TESTS = """\
import multiprocessing, os, sys
sys.path.insert(0, os.getcwd())
import answer
lock = multiprocessing.Lock()
print("RESULT", 1 if answer.value() == 42 else 0)
"""
#: test.sh, written as verifiers are: scratch room for the run (a cache, an install),
#: the runner's output kept, its result line read; `set -e` ends it at the first failure.
TEST_SH = """\
#!/bin/bash
set -e
head -c 8M /dev/zero > "$TMPDIR/scratch"
python3 /tests/run_tests.py > /logs/verifier/out.txt 2>&1 || true
summary=$(grep '^RESULT ' /logs/verifier/out.txt)
echo "${summary#RESULT }" > /logs/verifier/reward.txt
"""
SOLUTION = "cat > answer.py <<'EOF'\ndef value():\n    return 42\nEOF\n"
WRONG = "cat > answer.py <<'EOF'\ndef value():\n    return 41\nEOF\n"


def _answer(module: str) -> str:
    """An agent that leaves `module` as its answer.py."""
    return f"cat > answer.py <<'EOF'\n{module}\nEOF\n"


#: Programs the verifier runs that make it give no reward.
KILL_TEST_SH = _answer(
    "import os, signal\n"
    "pid = os.getppid()\n"
    "while pid > 1:\n"
    "    cmd = open(f'/proc/{pid}/cmdline', 'rb').read()\n"
    "    if b'/tests/test.sh' in cmd:\n"
    "        os.kill(pid, signal.SIGKILL)\n"
    "    pid = int(open(f'/proc/{pid}/stat').read().rsplit(')', 1)[1].split()[1])\n"
    "def value():\n    return 41"
)
EMPTY_REWARD_DIR = _answer(
    "import shutil\nshutil.rmtree('/logs/verifier')\ndef value():\n    return 41"
)
EXIT_BEFORE_PRINTING = _answer("import os\nos._exit(0)")
NEVER_RETURNS = _answer("import time\ntime.sleep(3600)")
VERIFIER_TIMEOUT_S = 20.0


def harbor_task(backend: str, agent: str, harness: str = "command", **sandbox: Any) -> RolloutTask:
    """A Harbor-shaped task (hidden tests at /tests, reward in /logs/verifier) with a
    content hash, as the loader makes it, and the oracle's solution when `harness` is
    the oracle."""
    config: dict[str, Any] = {"command": agent}
    if harness == "oracle":
        config = {"solution_files": [{"path": "/solution/solve.sh", "content": SOLUTION}]}
    return RolloutTask.model_validate(
        {
            "task_id": "whose-failure",
            "prompt": "write answer.py whose value() is 42",
            "sandbox": {"backend": backend, **sandbox},
            "harness": {"name": harness, "config": config, "budget_s": 120},
            "evaluation": {
                "aggregate": "sum",
                "version": "harbor-whose-failure-1",
                "checks": [
                    {
                        "kind": "reward_file",
                        "name": "harbor-verifier",
                        "timeout_s": VERIFIER_TIMEOUT_S,
                    }
                ],
                "files": [
                    {"path": "/tests/test.sh", "content": TEST_SH, "mode": 0o755},
                    {"path": "/tests/run_tests.py", "content": RUN_TESTS},
                ],
            },
            "hooks": [{"name": "evaluate"}],
            "source": {"format": "harbor", "ref": "/data/whose-failure", "content_hash": "c0"},
        }
    )


async def run(backend: SandboxBackend, tmp_path: Path, task: RolloutTask) -> RunOutcome:
    rid = f"it-whose-{time.monotonic_ns()}"
    r = await RuntimeManager(tmp_path, backends={backend.name: backend}).run(task, SESSION, rid)
    assert r.evaluation is not None, r.problem
    return r


async def with_oracle_evidence(
    backend: SandboxBackend, tmp_path: Path, agent: str, **sandbox: Any
) -> RolloutTask:
    """The agent's task, marked as a later `rollout run` marks it after an oracle run of
    the same task recorded its success (the oracle's rollout runs here, for real)."""
    oracle = harbor_task(backend.name, "", "oracle", **sandbox)
    r = await run(backend, tmp_path, oracle)
    assert (r.status, r.reward) == (RolloutStatus.ok, 1.0), r.problem
    result = RolloutResult(
        rollout_id="oracle-run-0",
        batch_id="oracle",
        task_id=oracle.task_id,
        group_id="oracle-g",
        sample_index=0,
        status=r.status,
        reward=r.reward,
        harness="oracle",
        harness_version=r.harness_version,
        policy_version="unversioned",
        image_digest=r.env_version,
    )
    store = tmp_path / "evidence.json"
    assert verifier_evidence.record(store, [oracle], [result]) == (1, 0)
    [task], covered = verifier_evidence.apply([harbor_task(backend.name, agent, **sandbox)], store)
    assert covered == 1
    return task


def assert_agents_failure(r: RunOutcome, *words: str) -> None:
    assert (r.status, r.reward) == (RolloutStatus.agent_broke_sandbox, 0.0), r.problem
    assert r.evaluation is not None and r.evaluation.verdict == "fail"
    damage = r.evaluation.damage or ""
    for word in words:
        assert word in damage, damage


def assert_masked(r: RunOutcome, why: str) -> None:
    assert (r.status, r.reward) == (RolloutStatus.eval_error, None), r.problem
    ev = r.evaluation
    assert ev is not None and ev.damage is None and why in (ev.error or ""), ev


# ------------------------------------------------------------------ the controls


async def test_control_the_verifier_scores_the_solution_1_and_a_wrong_answer_0(
    sandbox_backend: SandboxBackend,  # noqa: F811
    tmp_path: Path,
) -> None:
    task = await with_oracle_evidence(sandbox_backend, tmp_path, WRONG)
    r = await run(sandbox_backend, tmp_path, task)
    assert (r.status, r.reward) == (RolloutStatus.ok, 0.0), r.problem
    assert r.evaluation is not None and r.evaluation.checks[0].source == "reward.txt"


# ------------------------------------------------------------------ the attacks

ATTACKS = [
    pytest.param(KILL_TEST_SH, "wrote neither reward.txt nor reward.json", id="test_sh_killed"),
    pytest.param(EMPTY_REWARD_DIR, "wrote neither", id="reward_dir_emptied"),
    pytest.param(EXIT_BEFORE_PRINTING, "wrote neither", id="runner_exits_before_printing"),
    pytest.param(NEVER_RETURNS, f"timed out after {VERIFIER_TIMEOUT_S}s", id="verifier_timeout"),
]


@pytest.mark.parametrize(("agent", "why"), ATTACKS)
async def test_no_reward_from_a_verifier_shown_working_is_the_agents_failure(
    sandbox_backend: SandboxBackend,  # noqa: F811
    tmp_path: Path,
    agent: str,
    why: str,
) -> None:
    task = await with_oracle_evidence(sandbox_backend, tmp_path, agent)
    r = await run(sandbox_backend, tmp_path, task)
    assert_agents_failure(r, why, "oracle rollout oracle-run-0, reward 1.0")


@pytest.mark.parametrize(("agent", "why"), ATTACKS)
async def test_control_the_same_attack_without_evidence_is_masked(
    sandbox_backend: SandboxBackend,  # noqa: F811
    tmp_path: Path,
    agent: str,
    why: str,
) -> None:
    """What every one of these attacks earned before: a masked row, left out of the
    loss. The error says how to show the verifier works."""
    r = await run(sandbox_backend, tmp_path, harbor_task(sandbox_backend.name, agent))
    assert_masked(r, why)
    assert "--harness oracle" in (r.evaluation.error or "")  # type: ignore[union-attr]


#: Fills the disk, then frees 1 MiB of it: the agent leaves its sandbox almost full.
LEAVE_1_MIB = WRONG + (
    "cat /dev/zero > /tmp/fill 2>/dev/null\n"
    "truncate -s $(( $(stat -c %s /tmp/fill) - 1048576 )) /tmp/fill\n"
)


@pytest.mark.parametrize("old_threshold", [False, True], ids=["headroom", "control_64KiB"])
async def test_a_disk_left_with_1_mib_is_the_agents_failure(
    sandbox_backend: SandboxBackend,  # noqa: F811
    tmp_path: Path,
    old_threshold: bool,
) -> None:
    """No evidence needed: the verifier needs 8 MiB of scratch, the agent left 1 MiB of
    the 64 MiB disk, under what an evaluation needs there (4 MiB by default). Control:
    the probe's old threshold (64 KiB free) finds nothing and the failure is masked."""
    resources: dict[str, Any] = {"disk_mb": 64}
    if old_threshold:
        resources["eval_headroom"] = {"disk_mb": 64 / 1024}
    task = harbor_task(sandbox_backend.name, LEAVE_1_MIB, resources=resources)
    r = await run(sandbox_backend, tmp_path, task)
    if old_threshold:
        assert_masked(r, "wrote neither")
    else:
        assert_agents_failure(r, "disk", "is full (", "an evaluation needs 4 MiB")


#: Fills /dev/shm to its limit (docker's 64 MiB tmpfs).
FILL_SHM = WRONG + "head -c 128M /dev/zero > /dev/shm/fill 2>/dev/null; true\n"


@pytest.mark.parametrize("old_threshold", [False, True], ids=["headroom", "control_none"])
async def test_a_full_dev_shm_is_the_agents_failure(
    docker_backend: SandboxBackend,  # noqa: F811
    tmp_path: Path,
    old_threshold: bool,
) -> None:
    """The test runner's semaphore cannot be made in a full /dev/shm. Docker only: the
    local backend's /dev/shm is bounded by the sandbox's memory, and memory held there
    is damage by its own rule (test_agent_broke_sandbox.py). Control: without the
    /dev/shm headroom the failure is masked."""
    resources: dict[str, Any] = {"eval_headroom": {"shm_mb": 0}} if old_threshold else {}
    task = harbor_task(docker_backend.name, FILL_SHM, resources=resources)
    r = await run(docker_backend, tmp_path, task)
    if old_threshold:
        assert_masked(r, "wrote neither")
    else:
        assert_agents_failure(r, "/dev/shm is full (", "an evaluation needs 16 MiB")


# ------------------------------------------------------------------ the verifier's env

#: A Harbor test.sh that runs the stdlib's test runner in the workdir.
UNITTEST_SH = """\
#!/bin/bash
if python3 -m unittest discover -s /tests -p 'test_*.py'; then r=1; else r=0; fi
echo $r > /logs/verifier/reward.txt
"""
UNITTEST_TEST = """\
import unittest
class T(unittest.TestCase):
    def test_answer(self):
        self.assertEqual(open("answer.txt").read().strip(), "42")
"""
#: Answers wrong and leaves a `unittest.py` that passes whatever it is asked to run.
SHADOW_UNITTEST = "echo 41 > answer.txt\nprintf 'raise SystemExit(0)\\n' > unittest.py\n"


@pytest.mark.parametrize("safe_path", [True, False], ids=["safe_path", "control_switched_off"])
async def test_a_unittest_module_in_the_workdir_shadows_nothing(
    sandbox_backend: SandboxBackend,  # noqa: F811
    tmp_path: Path,
    safe_path: bool,
) -> None:
    """PYTHONSAFEPATH keeps the workdir off `python -m`'s path: the real unittest runs
    and scores the wrong answer 0. Control: the task switching it off (its verifier env
    may) runs the agent's module, which forges 1.0."""
    env = {} if safe_path else {"PYTHONSAFEPATH": ""}
    task = RolloutTask.model_validate(
        {
            "task_id": "shadow",
            "prompt": "write 42 to answer.txt",
            "sandbox": {"backend": sandbox_backend.name},
            "harness": {"name": "command", "config": {"command": SHADOW_UNITTEST}},
            "evaluation": {
                "aggregate": "sum",
                "checks": [{"kind": "reward_file", "env": env}],
                "files": [
                    {"path": "/tests/test.sh", "content": UNITTEST_SH},
                    {"path": "/tests/test_answer.py", "content": UNITTEST_TEST},
                ],
            },
            "hooks": [{"name": "evaluate"}],
        }
    )
    r = await run(sandbox_backend, tmp_path, task)
    assert r.status == RolloutStatus.ok, r.problem
    assert r.reward == (0.0 if safe_path else 1.0)


#: A test.sh that makes its venv in the workdir (as many do) and reads which index
#: pip would install from: reward 1 for PyPI's default, 0 for another.
PIP_SH = """\
#!/bin/bash
python3 -m venv --system-site-packages --without-pip .venv-test
index=$(.venv-test/bin/python -m pip config list 2>&1 | grep index-url || true)
echo "index: [$index]"
if [ -z "$index" ]; then r=1; else r=0; fi
echo $r > /logs/verifier/reward.txt
"""
#: Leaves a pip.conf where the verifier's venv will be (pip reads `$VIRTUAL_ENV/pip.conf`).
PIP_CONF_AGENT = (
    "mkdir -p .venv-test && printf '[global]\\nindex-url = http://agent.invalid/simple\\n' "
    "> .venv-test/pip.conf\n"
)


@pytest.mark.parametrize("isolated", [True, False], ids=["isolated", "control_config_read"])
async def test_a_pip_conf_in_the_workdir_does_not_choose_the_verifiers_index(
    sandbox_backend: SandboxBackend,  # noqa: F811
    tmp_path: Path,
    isolated: bool,
) -> None:
    """PIP_CONFIG_FILE=/dev/null: pip loads no config file, the venv's neither. Control:
    the task pointing PIP_CONFIG_FILE at a file that does not exist (pip then reads its
    usual files) gets the agent's index."""
    env = {} if isolated else {"PIP_CONFIG_FILE": "/nonexistent/pip.conf"}
    task = RolloutTask.model_validate(
        {
            "task_id": "pip-conf",
            "prompt": "anything",
            "sandbox": {"backend": sandbox_backend.name},
            "harness": {"name": "command", "config": {"command": PIP_CONF_AGENT}},
            "evaluation": {
                "aggregate": "sum",
                "checks": [{"kind": "reward_file", "env": env}],
                "files": [{"path": "/tests/test.sh", "content": PIP_SH}],
            },
            "hooks": [{"name": "evaluate"}],
        }
    )
    r = await run(sandbox_backend, tmp_path, task)
    assert r.status == RolloutStatus.ok, r.problem
    detail = r.evaluation.checks[0].detail  # type: ignore[union-attr]
    if isolated:
        assert r.reward == 1.0 and "index: []" in detail, detail
    else:
        assert r.reward == 0.0 and "agent.invalid" in detail, detail
