"""Unit tests: what a dataset may take from the run: `${VAR}` only from the variables
the run allows, and its Dockerfile builds without network unless the run says so.

A dataset is not trusted with the loading process's environment: the real `rollout run`
command line and the loader, on a copy of our own hello task.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import typer
from pydantic import ValidationError
from rich.console import Console
from typer.testing import CliRunner

from schemas.tasks import HarnessSpec
from task_formats import LoadOptions
from task_formats.harbor import HarborFormat
from workers.cli import app
from workers.task_source_cmd import load_options, parse_env_allow, read_task_source

HELLO = Path(__file__).resolve().parents[1] / "data" / "harbor" / "hello"
SECRET_ENV = {"ROLLOUT_ADMIN_TOKEN": "admin-secret", "MODE": "fast", "HOME": "/root"}


@pytest.fixture
def task(tmp_path: Path) -> Path:
    return Path(shutil.copytree(HELLO, tmp_path / "hello"))


def load(task_dir: Path, allow: list[str], env: dict[str, str] = SECRET_ENV):  # type: ignore[no-untyped-def]
    options = LoadOptions(
        harness=HarnessSpec(name="oracle"),
        image_map={"ubuntu:24.04": "agentic-rollout/sandbox-base:latest"},
        env_allow=allow,
    )
    return HarborFormat(environ=env).load(task_dir, options)


@pytest.mark.parametrize(
    ("section", "field"),
    [
        ("environment", "environment.env.T"),
        ("verifier", "verifier.env.T"),
        ("solution", "solution.env.T"),
    ],
)
@pytest.mark.parametrize("form", ["${ROLLOUT_ADMIN_TOKEN}", "x-${ROLLOUT_ADMIN_TOKEN:-none}"])
def test_a_variable_not_allowed_refuses_the_task_naming_field_variable_and_flag(
    task: Path, section: str, field: str, form: str
) -> None:
    (task / "task.toml").write_text(f"[{section}]\nenv = {{ T = '{form}' }}\n")
    loaded = load(task, allow=["MODE"])
    assert loaded.tasks == []
    (refused,) = loaded.refused
    assert refused.source == str(task.resolve())  # the task directory (its id)
    assert refused.field == field
    assert "ROLLOUT_ADMIN_TOKEN" in refused.reason
    assert "--env-allow ROLLOUT_ADMIN_TOKEN" in refused.reason
    assert "admin-secret" not in str(refused)


def test_allowed_variables_resolve_and_the_rest_of_the_env_is_never_read(task: Path) -> None:
    (task / "task.toml").write_text(
        "[environment]\nenv = { A = 'm=${MODE}', B = '${UNSET:-dflt}' }\n"
        "[verifier]\nenv = { C = '${MODE}' }\n"
        "[solution]\nenv = { D = 'plain' }\n"
    )
    (loaded_task,) = load(task, allow=["MODE", "UNSET"]).tasks
    assert loaded_task.sandbox.spec_fields()["env"] == {"A": "m=fast", "B": "dflt"}
    assert loaded_task.evaluation.checks[0].env == {"C": "fast"}  # type: ignore[union-attr]
    assert loaded_task.harness.config["solution_env"] == {"D": "plain"}
    # Control: the same task with nothing allowed is refused, so the allowlist decided.
    assert load(task, allow=[]).refused[0].field == "environment.env.A"


def test_env_allow_names_are_checked() -> None:
    assert parse_env_allow(["A,B", " C ", "A"]) == ["A", "B", "C", "A"]
    assert LoadOptions(env_allow=["B", "A", "B"]).env_allow == ["A", "B"]
    with pytest.raises(typer.BadParameter, match="not a variable name"):
        parse_env_allow(["OK,BAD-NAME"])
    with pytest.raises(ValidationError, match="not a variable name"):
        LoadOptions(env_allow=["$X"])


def test_rollout_run_refuses_before_anything_runs_and_env_allow_lets_it_through(
    task: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the real `rollout run` command line: the refusal names the task, the
    field, the variable and the flag; repeated and comma-separated flags both count."""
    (task / "task.toml").write_text(
        "[environment]\nenv = { T = '${ROLLOUT_TEST_SECRET}', M = '${ROLLOUT_TEST_MODE}' }\n"
    )
    monkeypatch.setenv("ROLLOUT_TEST_SECRET", "s3cret")
    monkeypatch.setenv("ROLLOUT_TEST_MODE", "m")
    runner = CliRunner(env={"COLUMNS": "400"})
    base = ["run", str(task), "--harness", "oracle", "--backend", "local"]
    refused = runner.invoke(app, [*base, "--env-allow", "ROLLOUT_TEST_MODE"])
    assert refused.exit_code != 0
    assert "refused:" in refused.output and "hello" in refused.output
    assert "environment.env.T" in refused.output
    assert "--env-allow ROLLOUT_TEST_SECRET" in refused.output
    assert "s3cret" not in refused.output
    # Control: allowed both ways, the task is read (the loader, not the CLI, refused).
    both = ["ROLLOUT_TEST_SECRET", "ROLLOUT_TEST_MODE"]
    for flags in ([",".join(both)], both):
        options = load_options(
            harness="oracle",
            harness_config=None,
            backend="local",
            image_map=["ubuntu:24.04=agentic-rollout/sandbox-base:latest"],
            image_map_file=None,
            public_network="no-network",
            env_allow=flags,
        )
        (read,) = read_task_source(task, "auto", options, Console(file=None, quiet=True))
        assert read.sandbox.spec_fields()["env"] == {"T": "s3cret", "M": "m"}


def test_build_network_reaches_the_task_build_and_is_checked(task: Path) -> None:
    def build_of(**kw: str):  # type: ignore[no-untyped-def]
        options = load_options(
            harness="oracle",
            harness_config=None,
            backend="docker",
            image_map=None,
            image_map_file=None,
            public_network="no-network",
            **kw,
        )
        (read,) = HarborFormat(environ={}).load(task, options).tasks
        return read.sandbox.build

    assert build_of().network == "none"
    assert build_of(build_network="host").network == "host"
    with pytest.raises(typer.BadParameter, match="one of none, default, host"):
        build_of(build_network="bridge")
    shown = CliRunner(env={"COLUMNS": "400"}).invoke(app, ["run", "--help"]).output
    assert re.search(r"--build-network\s.*\[default: none\]", shown), shown
    assert "--env-allow" in shown
