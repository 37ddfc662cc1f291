"""Which setup steps the selected tests need, so `scripts/test.sh` runs only those.

A test needs a step when it requests one of the fixtures in `FIXTURE_STEPS` (directly or
through other fixtures) or carries ``@pytest.mark.needs("step", ...)`` (a module that
reaches a step without such a fixture declares it; tests/unit/test_setup_needs.py
checks that every one does). `scripts/test.sh` collects the selection with
``--setup-plan-file FILE``, runs the steps written there, then runs pytest with
``ROLLOUT_SETUP_PLAN`` naming them: a step fixture outside that plan fails its test,
naming the step, instead of building it unannounced. Plain pytest (no plan) builds
what is missing on demand, as the fixtures always did.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

import pytest

# The steps, in the order they run, and what each is (test.sh prints it as a heading).
STEPS: dict[str, str] = {
    "system": "system packages and services (docker engine, bubblewrap, debootstrap, iptables, "
    "chromium)",
    "vllm_venv": "vLLM CPU virtual environment",
    "trainer_env": "trainer environments (one overlay on the vLLM environment per trainer)",
    "warm_model": "warm tiny model (minutes of CPU training on a fresh machine)",
    "base_image": "sandbox base image and its rootfs (docker + debootstrap)",
}
# A trainer's environment is the step `trainer_env:<trainer>`, one per trainer.
TRAINER_STEP = "trainer_env"
# Steps another step builds on.
REQUIRES: dict[str, tuple[str, ...]] = {
    TRAINER_STEP: ("vllm_venv",),
    "warm_model": ("vllm_venv",),
    "base_image": ("system",),
}
# Fixtures that reach a step, and the steps they need. `sandbox_backend` picks its
# backend at run time (getfixturevalue), so it is listed with what both backends need.
FIXTURE_STEPS: dict[str, tuple[str, ...]] = {
    "vllm_python": ("vllm_venv",),
    "trainer_env": ("trainer_env:reference",),
    "trl_env": ("trainer_env:trl",),
    "sandbox_base_image": ("base_image",),
    "sandbox_backend": ("base_image",),
    "chromium": ("system",),
}
PLAN_ENV = "ROLLOUT_SETUP_PLAN"


def trainer_names() -> tuple[str, ...]:
    """The trainers with an environment of their own (the `trainer_env:<name>` steps)."""
    from environments.trainer import TRAINER_EXTRAS

    return tuple(TRAINER_EXTRAS)


def ensure_trainer_envs(names: Iterable[str]) -> None:
    """The trainer step: build (or find cached) the environment of each named trainer."""
    from environments.trainer import TRAINER_EXTRAS, ensure_trainer_env

    for name in names:
        print(name, ensure_trainer_env(extras=TRAINER_EXTRAS[name]), flush=True)


def check_step(step: str) -> str:
    """`step` if it names a step, else a ValueError listing the known ones."""
    base, _, trainer = step.partition(":")
    if base == TRAINER_STEP and trainer in trainer_names():
        return step
    if base in STEPS and base != TRAINER_STEP and not trainer:
        return step
    known = [s for s in STEPS if s != TRAINER_STEP]
    known += [f"{TRAINER_STEP}:{t}" for t in trainer_names()]
    raise ValueError(f"unknown setup step {step!r} (known: {', '.join(known)})")


def plan(needs: Iterable[str]) -> list[str]:
    """The steps to run for `needs`: with the steps they build on, in `STEPS` order."""
    wanted: set[str] = set()
    todo = list(needs)
    while todo:
        step = check_step(todo.pop())
        if step not in wanted:
            wanted.add(step)
            todo.extend(REQUIRES.get(step.partition(":")[0], ()))
    return sorted(wanted, key=lambda s: (list(STEPS).index(s.partition(":")[0]), s))


def needs_of(item: pytest.Item) -> set[str]:
    """The steps one collected test needs: its fixtures' and its `needs` markers'."""
    found: set[str] = set()
    for name in getattr(item, "fixturenames", ()):
        found.update(FIXTURE_STEPS.get(name, ()))
    for mark in item.iter_markers("needs"):
        found.update(mark.args)
    return found


def require_step(step: str, via: str) -> None:
    """Fail the asking test when this run's plan (set by scripts/test.sh) left `step` out.

    Called by the fixtures that reach a step; without a plan (plain pytest) it does
    nothing and the fixture builds what is missing, as before.
    """
    planned = os.environ.get(PLAN_ENV)
    if planned is not None and step not in planned.split():
        pytest.fail(
            f"setup step {step!r} did not run: this test reaches it through {via} but does "
            f'not declare it, so scripts/test.sh left it out. Add @pytest.mark.needs("{step}") '
            f"(or map the fixture in tests/setup_steps.FIXTURE_STEPS). Planned: {planned!r}",
            pytrace=False,
        )


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--setup-plan-file",
        metavar="FILE",
        help="write the setup steps the selected tests need to FILE, one a line "
        "(scripts/test.sh runs them)",
    )


def pytest_collection_finish(session: pytest.Session) -> None:
    """After selection (-k, -m, deselection): the plan of the tests that will run."""
    needs: set[str] = set()
    for item in session.items:
        for step in needs_of(item):
            try:
                check_step(step)
            except ValueError as e:
                raise pytest.UsageError(f"{item.nodeid}: {e}") from None
            needs.add(step)
    out = session.config.getoption("--setup-plan-file")
    if out:
        Path(out).write_text("".join(f"{step}\n" for step in plan(needs)))
