"""Every test module that reaches a setup step declares it, so `scripts/test.sh` sets up
what a selection needs (tests/setup_steps.py). A test reaches a step through a mapped
fixture (`FIXTURE_STEPS`, found by collection) or by calling what builds it, which this
check finds by name in the module's source and in the helpers of tests/fixtures."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.setup_steps import (
    FIXTURE_STEPS,
    PLAN_ENV,
    STEPS,
    TRAINER_STEP,
    plan,
    require_step,
    trainer_names,
)

REPO = Path(__file__).resolve().parents[2]
TESTS = REPO / "tests"

# What builds or uses each step when called by name.
REACHES: dict[str, str] = {
    "vllm_venv": r"\bensure_vllm_venv\b|\bVllmServer\(|\bensure_engine_python\b",
    TRAINER_STEP: r"\btrainer_python\(|\bensure_trainer_env\b|\bensure_trainer_python\b",
    "warm_model": r"\bensure_warm_model\b|\bbuild_warm_model\b",
    # The local backend runs on the image's exported rootfs when it exists (a full run),
    # so do the demo and the workers configured with it.
    "base_image": r"\bensure_base_image\b|\bensure_rootfs\b|\bLocalBackend\(|\bDockerBackend\("
    r"|\brun_demo\(|\bDemoStack\(|\"workers\.demo\""
    r"|backend_config=\{\"local\"|\brun_chaos\(",
    "system": r"\brequire_docker\b|\brequire_bwrap\b|\bdocker\.from_env\b|\biptables\b"
    r"|\bheadless_chromium\(",
}
TRAINER_NAMED = re.compile(r"TRAINER_EXTRAS\[\"(\w+)\"\]")
NEEDS_MARK = re.compile(r"mark\.needs\(([^)]*)\)")


def declared(source: str) -> set[str]:
    """The steps a module names in its `needs` markers."""
    return {s for args in NEEDS_MARK.findall(source) for s in re.findall(r"\"([^\"]+)\"", args)}


def covered(step: str, have: set[str]) -> bool:
    """Whether `have` covers a reached step; a trainer call needs some trainer's step."""
    if step == TRAINER_STEP:
        return any(h.startswith(f"{TRAINER_STEP}:") for h in have)
    return step in plan(have) or step in have


def reached(source: str, helpers: dict[str, set[str]]) -> set[str]:
    """The steps `source` reaches by calling builders or tests/fixtures helpers by name."""
    found = {step for step, pattern in REACHES.items() if re.search(pattern, source)}
    found |= {f"{TRAINER_STEP}:{t}" for t in TRAINER_NAMED.findall(source)}
    for name, steps in helpers.items():
        if re.search(rf"\b{name}\b", source):
            found |= steps
    return found


def _is_fixture(node: ast.AST) -> bool:
    decorators = getattr(node, "decorator_list", [])
    return any("fixture" in ast.unparse(d) for d in decorators)


def fixture_modules() -> dict[str, tuple[str, bool]]:
    """Top-level definitions of tests/fixtures: name -> (source, is a fixture)."""
    return {name: (source, is_fixture) for name, source, is_fixture, _ in definitions()}


def definitions() -> list[tuple[str, str, bool, list[str]]]:
    """(name, source, is a fixture, argument names) of each top-level definition."""
    found = []
    for path in sorted((TESTS / "fixtures").glob("*.py")):
        text = path.read_text()
        for node in ast.parse(text).body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                args = [a.arg for a in node.args.args] if not isinstance(node, ast.ClassDef) else []
                source = ast.get_source_segment(text, node) or ""
                found.append((node.name, source, _is_fixture(node), args))
    return found


def helper_steps(defs: dict[str, tuple[str, bool]]) -> dict[str, set[str]]:
    """Steps each plain helper (not a fixture) of tests/fixtures reaches, through others."""
    steps: dict[str, set[str]] = {n: set() for n, (_, fixture) in defs.items() if not fixture}
    changed = True
    while changed:
        changed = False
        for name in steps:
            others = {k: v for k, v in steps.items() if k != name and v}
            now = reached(defs[name][0], others)
            if now - steps[name]:
                steps[name] |= now
                changed = True
    return {n: s for n, s in steps.items() if s}


def test_each_test_module_declares_the_steps_it_reaches_by_name() -> None:
    helpers = helper_steps(fixture_modules())
    missing: list[str] = []
    for path in sorted(TESTS.rglob("test_*.py")):
        if path == Path(__file__):
            continue
        source = path.read_text()
        have = declared(source)
        lacking = sorted(s for s in reached(source, helpers) if not covered(s, have))
        if lacking:
            missing.append(f"{path.relative_to(REPO)}: needs {lacking}")
    assert not missing, "modules reach setup steps without @pytest.mark.needs:\n" + "\n".join(
        missing
    )


def test_fixtures_that_reach_a_step_are_mapped() -> None:
    """A fixture that builds a step is in FIXTURE_STEPS, or requests one that is
    (collection follows fixture requests, so its users are covered)."""
    helpers = helper_steps(fixture_modules())
    unmapped = []
    for name, source, is_fixture, args in definitions():
        if not is_fixture:
            continue
        body = source.split("\n", 1)[1]  # the decorator names no step
        want = reached(body, helpers)
        have = {s for fixture in (name, *args) for s in FIXTURE_STEPS.get(fixture, ())}
        if any(not covered(s, have) for s in want):
            unmapped.append(f"{name}: reaches {sorted(want)}, mapped to {sorted(have)}")
    assert not unmapped, "fixtures missing from FIXTURE_STEPS:\n" + "\n".join(unmapped)


def test_the_check_catches_an_undeclared_call_and_accepts_a_declared_one() -> None:
    """Control: the same module text fails without the marker and passes with it."""
    bare = "def test_x():\n    python = venv_python(ensure_vllm_venv())\n"
    marked = 'pytestmark = pytest.mark.needs("vllm_venv")\n' + bare
    assert reached(bare, {}) == {"vllm_venv"}
    assert not covered("vllm_venv", declared(bare))
    assert covered("vllm_venv", declared(marked))
    via_helper = "from tests.fixtures.x import start_engine\n\ndef test_y():\n    start_engine()\n"
    assert reached(via_helper, {"start_engine": {"warm_model"}}) == {"warm_model"}
    assert reached('TRAINER_EXTRAS["verl"]', {}) == {f"{TRAINER_STEP}:verl"}


def test_a_full_run_needs_every_step() -> None:
    """Every step and every trainer's environment is needed by some test, so the full
    suite (CI) sets up everything."""
    named: set[str] = {s for steps in FIXTURE_STEPS.values() for s in steps}
    for path in TESTS.rglob("test_*.py"):
        named |= declared(path.read_text())
    everything = [s for s in STEPS if s != TRAINER_STEP]
    everything += [f"{TRAINER_STEP}:{t}" for t in trainer_names()]
    assert set(plan(named)) == set(everything)


def test_plan_adds_what_a_step_builds_on_in_step_order() -> None:
    assert plan(["base_image", "warm_model"]) == ["system", "vllm_venv", "warm_model", "base_image"]
    assert plan(["trainer_env:trl"]) == ["vllm_venv", "trainer_env:trl"]
    with pytest.raises(ValueError, match="unknown setup step 'trainer_env:nope'"):
        plan(["trainer_env:nope"])


def test_collection_writes_the_plan_of_the_selected_tests(tmp_path: Path) -> None:
    """The plan comes from the selected tests only: a unit module using the reference
    trainer's fixture, and nothing for a module that needs no setup."""
    out = {}
    for name, selection in {
        "trainer": "tests/unit/test_trainer_loss.py",
        "none": "tests/unit/test_setup_needs.py",
    }.items():
        target = tmp_path / name
        cmd = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"]
        proc = subprocess.run(
            [*cmd, f"--setup-plan-file={target}", selection],
            cwd=REPO,
            capture_output=True,
            text=True,
        )
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        out[name] = target.read_text().split()
    assert out == {"trainer": ["vllm_venv", "trainer_env:reference"], "none": []}


def test_a_step_outside_the_plan_fails_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under scripts/test.sh (a plan is set) a fixture whose step was left out fails its
    test, naming the step; plain pytest (no plan) lets the fixture build it."""
    monkeypatch.setenv(PLAN_ENV, "system base_image")
    require_step("base_image", "fixture sandbox_base_image")
    with pytest.raises(pytest.fail.Exception, match="setup step 'vllm_venv' did not run"):
        require_step("vllm_venv", "fixture vllm_python")
    monkeypatch.delenv(PLAN_ENV)
    require_step("vllm_venv", "fixture vllm_python")
