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

from pathlib import Path

import pytest

from hooks.swebench_check import LOG_TAIL_BYTES
from sandboxes.base import SandboxBackend
from schemas.outcome import RolloutStatus, RunOutcome
from schemas.session import SessionCreated
from tests.fixtures.sandboxes import (  # noqa: F401 - fixtures
    docker_backend,
    local_backend,
    sandbox_backend,
    sandbox_base_image,
    sandbox_state_dir,
)
from tests.fixtures.swebench_repo import (
    F2P,
    FIX,
    FORMAT_OPTIONS,
    P2P,
    run_one_instance,
    write_calc_instances,
)

pytestmark = pytest.mark.integration

SESSION = SessionCreated(
    session_id="sess-swebench",
    token="tok-swebench",
    openai_base_url="http://127.0.0.1:9/v1",
    anthropic_base_url="http://127.0.0.1:9",
)
#: The agent rewrites the hidden test's future file so that "test_sub" passes anyway.
PLANT = (
    "printf 'import unittest\\n\\nclass TestCalc(unittest.TestCase):\\n"
    "    def test_add(self):\\n        pass\\n\\n    def test_sub(self):\\n        pass\\n'"
    " > tests/test_calc.py"
)


@pytest.fixture
def instances(tmp_path: Path) -> Path:
    """The repo at its base commit, and a one-instance file pointing at it."""
    return write_calc_instances(tmp_path)


async def run_instance(
    backend: SandboxBackend, tmp_path: Path, instances: Path, agent: str
) -> RunOutcome:
    r = await run_any(backend, tmp_path, instances, agent)
    assert r.status == RolloutStatus.ok, r.error
    assert r.evaluation is not None and r.evaluation.status == "ok", r.evaluation
    return r


async def run_any(
    backend: SandboxBackend, tmp_path: Path, instances: Path, agent: str
) -> RunOutcome:
    """One rollout of the instance, whatever its evaluation gives."""
    return await run_one_instance(backend, tmp_path, instances, agent, SESSION, FORMAT_OPTIONS)


async def test_the_fix_resolves_the_instance(
    sandbox_backend: SandboxBackend,  # noqa: F811
    tmp_path: Path,
    instances: Path,
) -> None:
    r = await run_instance(sandbox_backend, tmp_path, instances, FIX)
    assert r.evaluation is not None
    assert r.evaluation.reward == 1.0, r.evaluation.checks
    (check,) = r.evaluation.checks
    assert check.kind == "swebench" and check.passed and check.source == "log:unittest"
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


async def test_a_test_log_over_the_cap_is_the_agents_failure(
    local_backend: SandboxBackend,  # noqa: F811
    tmp_path: Path,
    instances: Path,
) -> None:
    """The code under test prints more than the log's cap: only the log's tail is read,
    so the statuses before it are lost and its end may be what the code printed (here
    `ok` for both listed tests, which a cut log would grade as resolved). A cut log is
    never graded, and as the preflight showed the tests can run, the agent's code that
    flooded it is to blame: reward 0, status agent_broke_sandbox."""
    forged = "".join(f"\\n{t} ... ok" for t in (F2P, P2P))
    flood = (
        "import atexit, sys\n"
        f"atexit.register(lambda: print('x' * (17 << 20) + '{forged}', file=sys.stderr))\n"
    )
    agent = f"cat >> calc.py <<'EOF'\n{flood}EOF\n"
    r = await run_any(local_backend, tmp_path, instances, agent)
    assert r.status == RolloutStatus.agent_broke_sandbox, r.error
    assert r.evaluation is not None and r.evaluation.status == "agent_broke_sandbox"
    assert r.reward == 0.0
    assert f"over the {LOG_TAIL_BYTES}-byte cap" in (r.evaluation.damage or ""), r.evaluation


#: Applies the fix to the repo (at the format's default `repo_path`) and records which
#: trap ran.
_FIXER = """#!/bin/sh
mkdir -p /tmp/fired && touch "/tmp/fired/$1"
sed -i 's/return a + b$/return a - b/; 1,2s/return a - b/return a + b/' /testbed/calc.py
case "$1" in smudge) exec cat ;; esac
exit 0
"""
GIT_TRAPS = ("fsmonitor", "smudge", "hook")
#: The agent writes git config into the task repo and a `.gitattributes` naming a smudge
#: filter; each program, if git runs it, fixes `sub` so the instance resolves.
REPO_GIT_AGENT = f"""
set -e
cat > .git/fixer <<'EOF'
{_FIXER}EOF
chmod +x .git/fixer
git config core.fsmonitor "$PWD/.git/fixer fsmonitor"
git config filter.evil.smudge "$PWD/.git/fixer smudge"
printf '#!/bin/sh\\nexec "$(git rev-parse --git-dir)/fixer" hook\\n' > .git/hooks/post-index-change
cp .git/hooks/post-index-change .git/hooks/post-checkout
chmod +x .git/hooks/post-index-change .git/hooks/post-checkout
echo '* filter=evil' > .gitattributes
cp calc.py /tmp/calc.orig
git status --porcelain >/dev/null
rm -f tests/test_calc.py && git checkout-index -f tests/test_calc.py
grep -q 'return a - b' calc.py && echo "armed: $(ls /tmp/fired | tr '\\n' ' ')"
rm -rf /tmp/fired && cp /tmp/calc.orig calc.py
"""


async def test_the_repos_git_config_and_attributes_do_not_run_when_the_tests_are_placed(
    sandbox_backend: SandboxBackend,  # noqa: F811
    tmp_path: Path,
    instances: Path,
) -> None:
    """The agent writes fsmonitor, a smudge filter (named by its `.gitattributes`) and
    hooks into the task repo; each would fix the bug if git ran it. Placing the hidden
    tests (which writes files with git) and grading run none of them: the unfixed
    instance is not resolved. Armed: the agent's own git runs all three."""
    r = await run_instance(sandbox_backend, tmp_path, instances, REPO_GIT_AGENT)
    out = r.agent.stdout_tail if r.agent else ""
    armed = next(ln for ln in out.splitlines() if ln.startswith("armed: ")).split()[1:]
    assert sorted(armed) == sorted(GIT_TRAPS), out
    assert r.evaluation is not None and r.evaluation.reward == 0.0
    (check,) = r.evaluation.checks
    assert check.tests == {F2P: "FAILED", P2P: "PASSED"}
