"""Integration: the code under test does not configure the runner that grades it.

A pytest-graded SWE-bench-style instance (tests/fixtures/swebench_pytest_repo.py) runs on
real local (bubblewrap) and docker sandboxes with the `command` harness as the agent (a
shell script). Each trap is planted by the agent, which first shows it is armed: the
same pytest, run the ordinary way in the sandbox, grades its failing probe test as
passed (or deselects it, or ends before reporting). Then the evaluate hook grades the
unfixed instance: 0, from pytest's JUnit report, with the hidden test FAILED.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

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
from tests.fixtures.swebench_pytest_repo import (
    F2P,
    FIX,
    FORMAT_OPTIONS,
    P2P,
    PYTHON,
    REPO,
    sandbox_options,
    write_pytest_instance,
)
from tests.fixtures.swebench_repo import run_one_instance

pytestmark = pytest.mark.integration

SESSION = SessionCreated(
    session_id="sess-swebench-runner",
    token="tok-swebench-runner",
    openai_base_url="http://127.0.0.1:9/v1",
    anthropic_base_url="http://127.0.0.1:9",
)
#: A pytest plugin that turns every test report into a pass.
FORCE_PASS = """import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    report.outcome = "passed"
    report.longrepr = None
"""
#: A module named like the runner or the stdlib: it writes a JUnit report passing every
#: test in the files pytest was given, where PYTEST_ADDOPTS says, prints the passes, and
#: ends the process before the real pytest runs a test.
SHADOW = """import os, re, shlex, sys
names = []
for arg in sys.argv[1:]:
    if arg.endswith(".py") and os.path.exists(arg):
        module = arg[:-3].replace("/", ".")
        names += [(module, n) for n in re.findall(r"def (test_\\w+)", open(arg).read())]
cases = "".join(f'<testcase classname="{m}" name="{n}"/>' for m, n in names)
for opt in shlex.split(os.environ.get("PYTEST_ADDOPTS", "")):
    if opt.startswith("--junitxml="):
        with open(opt.split("=", 1)[1], "w") as f:
            f.write(f"<testsuites><testsuite>{cases}</testsuite></testsuites>")
for m, n in names:
    print(f"PASSED {m.replace('.', '/')}.py::{n}")
sys.stdout.flush()
os._exit(0)
"""
#: The agent's probe: a failing test it runs the ordinary way to show a trap is armed.
PROBE = (
    "printf 'def test_probe():\\n    assert False\\n' > tests/test_probe.py\n"
    f'probe() {{ {PYTHON} -m pytest -rA -p no:cacheprovider tests/test_probe.py "$@"; }}\n'
)


def _write(path: str, text: str) -> str:
    return f"mkdir -p \"$(dirname '{path}')\" && cat > '{path}' <<'EOF'\n{text}EOF\n"


def _agent(plant: str, armed_if: str) -> str:
    """Plant the trap, print `armed` if the probe shows it works, remove the probe."""
    return (
        f"set -e\n{plant}{PROBE}out=$(probe 2>&1 || true)\n"
        f'if {armed_if}; then echo armed; else echo "not armed: $out"; fi\n'
        "rm -f tests/test_probe.py /tmp/probe.xml\n"
    )


_PASSED = "echo \"$out\" | grep -q '^PASSED tests/test_probe.py::test_probe'"
_SITE = f"$({PYTHON} -c 'import sysconfig; print(sysconfig.get_path(\"purelib\"))')"
#: Trap name → the agent's script.
TRAPS = {
    # An untracked conftest.py at the repo's root.
    "conftest forces passes": _agent(_write("conftest.py", FORCE_PASS), _PASSED),
    # The tracked setup.cfg gains addopts loading a plugin module of the agent's.
    "setup.cfg loads a plugin": _agent(
        _write("calc_forge.py", FORCE_PASS) + "printf 'addopts = -p calc_forge\\n' >> setup.cfg\n",
        _PASSED,
    ),
    "pytest.ini deselects the failing tests": _agent(
        _write("pytest.ini", '[pytest]\naddopts = -k "not test_sub and not test_probe"\n'),
        'echo "$out" | grep -q \'1 deselected\' && ! echo "$out" | grep -q FAILED',
    ),
    # Debian's python has a sitecustomize of its own, found first unless the repo is on
    # PYTHONPATH (a conda env has none: there an editable install's path is enough).
    "sitecustomize loads a plugin": _agent(
        _write("sitecustomize.py", 'import os\nos.environ["PYTEST_PLUGINS"] = "calc_forge"\n')
        + _write("calc_forge.py", FORCE_PASS)
        + f"export PYTHONPATH={REPO}\n",
        _PASSED,
    ),
    "an installed package's plugin entry point": _agent(
        f'site={_SITE}\n_w() {{ mkdir -p "$(dirname "$1")"; cat > "$1"; }}\n'
        f"_w \"$site/calc_forge.py\" <<'EOF'\n{FORCE_PASS}EOF\n"
        "_w \"$site/calc_forge-1.0.dist-info/METADATA\" <<'EOF'\n"
        "Metadata-Version: 2.1\nName: calc-forge\nVersion: 1.0\nEOF\n"
        "_w \"$site/calc_forge-1.0.dist-info/entry_points.txt\" <<'EOF'\n"
        "[pytest11]\ncalc_forge = calc_forge\nEOF\n",
        _PASSED,
    ),
    "a pytest.py shadows the runner": _agent(
        _write("pytest.py", SHADOW),
        "PYTEST_ADDOPTS=--junitxml=/tmp/probe.xml probe >/dev/null 2>&1; "
        "grep -q 'name=\"test_probe\"' /tmp/probe.xml && ! grep -q '<failure' /tmp/probe.xml",
    ),
    "a unittest.py shadows the stdlib": _agent(
        _write("unittest.py", SHADOW),
        "PYTEST_ADDOPTS=--junitxml=/tmp/probe.xml probe >/dev/null 2>&1; "
        "grep -q 'name=\"test_probe\"' /tmp/probe.xml && ! grep -q '<failure' /tmp/probe.xml",
    ),
    "conftest ends the runner before it reports": _agent(
        _write("conftest.py", "import os\n\nos._exit(0)\n"),
        '[ -z "$out" ]',
    ),
}


@pytest.fixture
def instances(tmp_path: Path) -> Path:
    return write_pytest_instance(tmp_path)


async def run_instance(
    backend: SandboxBackend, tmp_path: Path, instances: Path, agent: str, **options: Any
) -> RunOutcome:
    """One rollout of the instance; the agent's script must succeed."""
    options = {"sandbox": sandbox_options(), **FORMAT_OPTIONS, **options}
    return await run_one_instance(backend, tmp_path, instances, agent, SESSION, options)


async def test_the_fix_resolves_with_the_patch_conftest_and_the_declared_plugin(
    sandbox_backend: SandboxBackend,  # noqa: F811
    tmp_path: Path,
    instances: Path,
) -> None:
    """The honest fix scores 1: the test patch's own conftest.py stays (fixture `five`)
    and the env's declared plugin loads (`three`), graded from the JUnit report."""
    r = await run_instance(sandbox_backend, tmp_path, instances, FIX)
    assert r.status == RolloutStatus.ok and r.evaluation is not None, r.error
    assert r.evaluation.reward == 1.0, r.evaluation.checks
    (check,) = r.evaluation.checks
    assert check.tests == {F2P: "PASSED", P2P: "PASSED"} and check.source == "junit-xml"


async def test_a_plugin_the_instance_does_not_declare_is_not_loaded(
    local_backend: SandboxBackend,  # noqa: F811
    tmp_path: Path,
    instances: Path,
) -> None:
    """Installed with an entry point, but autoloading is off: without the declaration
    the hidden test's fixture from it is missing, so even the fix does not resolve."""
    r = await run_instance(local_backend, tmp_path, instances, FIX, pytest_plugins=[])
    assert r.evaluation is not None and r.evaluation.reward == 0.0, r.evaluation
    (check,) = r.evaluation.checks
    assert check.tests == {F2P: "ERROR", P2P: "PASSED"}, check.detail


@pytest.mark.parametrize("trap", list(TRAPS))
async def test_a_trap_in_the_repo_or_test_env_does_not_configure_the_grading_run(
    sandbox_backend: SandboxBackend,  # noqa: F811
    tmp_path: Path,
    instances: Path,
    trap: str,
) -> None:
    options = {"test_env": {**FORMAT_OPTIONS["test_env"], "PYTHONPATH": REPO}}
    extra = options if trap == "sitecustomize loads a plugin" else {}
    r = await run_instance(sandbox_backend, tmp_path, instances, TRAPS[trap], **extra)
    out = r.agent.stdout_tail if r.agent else ""
    assert out.strip().splitlines()[-1] == "armed", out
    assert r.status == RolloutStatus.ok and r.evaluation is not None, r.error
    assert r.evaluation.status == "ok" and r.evaluation.reward == 0.0, r.evaluation
    (check,) = r.evaluation.checks
    assert check.tests == {F2P: "FAILED", P2P: "PASSED"}, check.detail
    assert check.source == "junit-xml"


async def test_code_that_ends_the_runner_before_its_report_is_the_agents_failure(
    sandbox_backend: SandboxBackend,  # noqa: F811
    tmp_path: Path,
    instances: Path,
) -> None:
    """The package under test ends the process at import (before pytest writes its
    report): the preflight showed the tests can be placed, so no verdict is the agent's
    doing, reward 0, not a masked evaluator error."""
    agent = "printf 'import os\\nos._exit(0)\\n' >> calc.py"
    r = await run_instance(sandbox_backend, tmp_path, instances, agent)
    assert r.status == RolloutStatus.agent_broke_sandbox, r.error
    assert r.evaluation is not None and r.evaluation.status == "agent_broke_sandbox"
    assert r.reward == 0.0 and r.evaluation.reward == 0.0
    assert "pytest wrote no JUnit report" in (r.evaluation.damage or ""), r.evaluation


async def test_code_that_hangs_the_tests_is_the_agents_failure(
    local_backend: SandboxBackend,  # noqa: F811
    tmp_path: Path,
    instances: Path,
) -> None:
    agent = "printf 'import time\\ntime.sleep(3600)\\n' >> calc.py"
    r = await run_instance(local_backend, tmp_path, instances, agent, test_timeout_s=5)
    assert r.status == RolloutStatus.agent_broke_sandbox, r.error
    assert r.evaluation is not None and r.reward == 0.0
    assert "the tests timed out after 5.0s" in (r.evaluation.damage or ""), r.evaluation
