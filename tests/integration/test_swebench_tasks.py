"""Integration: a SWE-bench-style instance on a small local git repo, run and graded.

The repo (made by the test) has a bug in `sub`; the instance's hidden test patch adds
`test_sub` (FAIL_TO_PASS: fails until the bug is fixed) next to `test_add`
(PASS_TO_PASS). The instance file goes through the `swebench` format, and each rollout
runs on a real local (bubblewrap) and docker sandbox with the `command` harness as the
agent (a shell script, so no model is needed): the repo is cloned at the base commit and
copied in, the agent acts, and the evaluate hook places the test patch, runs the tests
with unittest (the base image has no pytest) and grades them.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from sandboxes.base import SandboxBackend
from schemas.outcome import RolloutStatus, RunOutcome
from schemas.session import SessionCreated
from schemas.tasks import HarnessSpec
from task_formats import LoadOptions, load_task_source
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
    session_id="sess-swebench",
    token="tok-swebench",
    openai_base_url="http://127.0.0.1:9/v1",
    anthropic_base_url="http://127.0.0.1:9",
)
CALC = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a + b\n"
TESTS = (
    "import unittest\n\nfrom calc import add\n\n\n"
    "class TestCalc(unittest.TestCase):\n"
    "    def test_add(self):\n        self.assertEqual(add(2, 3), 5)\n"
)
#: The test file after the hidden test patch: `test_sub` added.
PATCHED_TESTS = (
    TESTS.replace("from calc import add", "from calc import add, sub")
    + "\n    def test_sub(self):\n        self.assertEqual(sub(5, 3), 2)\n"
)
F2P = "test_sub (tests.test_calc.TestCalc.test_sub)"
P2P = "test_add (tests.test_calc.TestCalc.test_add)"
FIX = "sed -i 's/return a + b$/return a - b/; 1,2s/return a - b/return a + b/' calc.py"
#: The agent rewrites the hidden test's future file so that "test_sub" passes anyway.
PLANT = (
    "printf 'import unittest\\n\\nclass TestCalc(unittest.TestCase):\\n"
    "    def test_add(self):\\n        pass\\n\\n    def test_sub(self):\\n        pass\\n'"
    " > tests/test_calc.py"
)


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args], check=True, capture_output=True, text=True
    ).stdout.strip()


@pytest.fixture
def instances(tmp_path: Path) -> Path:
    """The repo at its base commit, and a one-instance file pointing at it."""
    repo = tmp_path / "calc"
    (repo / "tests").mkdir(parents=True)
    (repo / "calc.py").write_text(CALC)
    (repo / "tests" / "test_calc.py").write_text(TESTS)
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "add", "-A")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t.invalid", "commit", "-qm", "base")
    # The test patch as git writes it; the repo stays at the base commit without it.
    (repo / "tests" / "test_calc.py").write_text(PATCHED_TESTS)
    test_patch = _git(repo, "diff") + "\n"
    _git(repo, "checkout", "--", ".")
    record = {
        "instance_id": "local__calc-1",
        "repo": "local/calc",
        "base_commit": _git(repo, "rev-parse", "HEAD"),
        "patch": "never placed",
        "test_patch": test_patch,
        "problem_statement": "sub(5, 3) returns 8; it should return 2.",
        "FAIL_TO_PASS": json.dumps([F2P]),
        "PASS_TO_PASS": json.dumps([P2P]),
        "version": "0.1",
    }
    path = tmp_path / "instances.jsonl"
    path.write_text(json.dumps(record) + "\n")
    return path


async def run_instance(
    backend: SandboxBackend, tmp_path: Path, instances: Path, agent: str
) -> RunOutcome:
    options = LoadOptions(
        harness=HarnessSpec(name="command", config={"command": agent}, budget_s=120),
        backend=backend.name,
        format_options={
            "repo_url_template": str(instances.parent / "calc"),
            "image_template": "agentic-rollout/sandbox-base:latest",
            "test_command": "python3 -m unittest -v {tests}",
            "log_parser": "unittest",
            "test_timeout_s": 120,
        },
    )
    loaded = load_task_source(instances, options, fmt="swebench")
    assert loaded.refused == []
    (task,) = loaded.tasks
    rid = f"it-swebench-{time.monotonic_ns()}"
    r = await RuntimeManager(tmp_path, backends={backend.name: backend}).run(task, SESSION, rid)
    assert r.status == RolloutStatus.ok, r.error
    assert r.agent is not None and r.agent.exit_code == 0, r.agent and r.agent.stderr_tail
    assert r.evaluation is not None and r.evaluation.status == "ok", r.evaluation
    return r


async def test_the_fix_resolves_the_instance(
    sandbox_backend: SandboxBackend,  # noqa: F811
    tmp_path: Path,
    instances: Path,
) -> None:
    r = await run_instance(sandbox_backend, tmp_path, instances, FIX)
    assert r.evaluation is not None
    assert r.evaluation.reward == 1.0, r.evaluation.checks
    (check,) = r.evaluation.checks
    assert check.kind == "swebench" and check.passed
    assert check.tests == {F2P: "PASSED", P2P: "PASSED"}
    assert r.evaluation.metrics == {
        "fail_to_pass_passed": 1.0,
        "fail_to_pass_total": 1.0,
        "pass_to_pass_passed": 1.0,
        "pass_to_pass_total": 1.0,
    }
    # The diff is the agent's fix against the base commit, nothing of the test patch.
    assert r.diff is not None and r.diff.files_changed == 1


async def test_no_fix_fails_its_fail_to_pass_test(
    sandbox_backend: SandboxBackend,  # noqa: F811
    tmp_path: Path,
    instances: Path,
) -> None:
    r = await run_instance(sandbox_backend, tmp_path, instances, "true")
    assert r.evaluation is not None and r.evaluation.reward == 0.0
    (check,) = r.evaluation.checks
    assert not check.passed and check.tests == {F2P: "FAILED", P2P: "PASSED"}
    assert r.evaluation.metrics["fail_to_pass_passed"] == 0.0
    assert r.evaluation.metrics["pass_to_pass_passed"] == 1.0
    assert f"not passing: {F2P} FAILED" in check.detail


async def test_the_agents_edit_of_a_test_file_is_replaced(
    sandbox_backend: SandboxBackend,  # noqa: F811
    tmp_path: Path,
    instances: Path,
) -> None:
    # Armed: the planted file makes both tests pass when run as the agent left it.
    agent = f"{PLANT} && python3 -m unittest -v tests/test_calc.py 2>&1 | grep -c ' ok$'"
    r = await run_instance(sandbox_backend, tmp_path, instances, agent)
    assert r.agent is not None and r.agent.stdout_tail.strip().endswith("2")
    assert r.evaluation is not None and r.evaluation.reward == 0.0
    (check,) = r.evaluation.checks
    assert check.tests == {F2P: "FAILED", P2P: "PASSED"}


async def test_removing_the_git_data_fails_the_check_not_the_evaluator(
    sandbox_backend: SandboxBackend,  # noqa: F811
    tmp_path: Path,
    instances: Path,
) -> None:
    r = await run_instance(sandbox_backend, tmp_path, instances, f"{FIX} && rm -rf .git")
    assert r.evaluation is not None and r.evaluation.reward == 0.0
    (check,) = r.evaluation.checks
    assert not check.passed and "changed the repository's git data" in check.detail
