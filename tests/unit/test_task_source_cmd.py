"""Unit tests: the command line's task-source options (`rollout run` / `rollout demo`).

Parsing and refusal reporting only: every command here stops before it would connect
to Temporal or start a stack (all tasks refused, or a bad option), so no stack is needed.
"""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Annotated

import pytest
import typer
from rich.console import Console
from typer.testing import CliRunner

from workers.cli import app
from workers.task_source_cmd import (
    TaskSourceArgs,
    load_options,
    parse_format_options,
    parse_image_map,
    read_task_source,
    task_source_options,
)

DATA = Path(__file__).resolve().parents[1] / "data"
BROKEN = DATA / "harbor_broken"


def opts(**kw: object):  # type: ignore[no-untyped-def]
    base: dict[str, object] = {
        "harness": "oracle",
        "harness_config": None,
        "backend": "docker",
        "image_map": None,
        "image_map_file": None,
        "public_network": "no-network",
    }
    return load_options(**(base | kw))  # type: ignore[arg-type]


def test_image_map_from_json_file_lines_file_and_flags(tmp_path: Path) -> None:
    as_json = tmp_path / "map.json"
    as_json.write_text(json.dumps({"ubuntu:24.04": "local/base:1", "debian:12": "local/deb"}))
    assert parse_image_map(["debian:12=local/deb:2"], as_json) == {
        "ubuntu:24.04": "local/base:1",
        "debian:12": "local/deb:2",  # flags win over the file
    }
    as_lines = tmp_path / "map.txt"
    as_lines.write_text("# base images\n\nubuntu:24.04 = local/base:1\n")
    assert parse_image_map(None, as_lines) == {"ubuntu:24.04": "local/base:1"}
    as_lines.write_text("ubuntu:24.04\n")
    with pytest.raises(typer.BadParameter, match=r"map\.txt:1"):
        parse_image_map(None, as_lines)
    with pytest.raises(typer.BadParameter, match="FROM=TO"):
        parse_image_map(["=x"], None)


def test_load_options_from_flags(tmp_path: Path) -> None:
    cfg = tmp_path / "harness.json"
    cfg.write_text('{"command": "my-agent {{prompt}}"}')
    got = opts(
        harness="command",
        harness_config=cfg,
        backend="local",
        image_map=["a=b"],
        public_network="allow",
    )
    assert got.harness is not None and got.harness.name == "command"
    assert got.harness.config == {"command": "my-agent {{prompt}}"}
    assert (got.backend, got.image_map, got.public_network) == ("local", {"a": "b"}, "allow")
    assert opts(harness=None).harness is None


@pytest.mark.parametrize(
    ("kw", "words"),
    [
        ({"public_network": "sometimes"}, "no-network, allow, refuse"),
        ({"harness": None, "harness_config": "CFG"}, "needs --harness"),
        ({"harness_config": "LIST"}, "JSON object"),
    ],
)
def test_bad_options_are_refused(tmp_path: Path, kw: dict[str, object], words: str) -> None:
    (tmp_path / "cfg.json").write_text("{}")
    (tmp_path / "list.json").write_text("[1]")
    files = {"CFG": tmp_path / "cfg.json", "LIST": tmp_path / "list.json"}
    kw = {k: files.get(v, v) if isinstance(v, str) else v for k, v in kw.items()}
    with pytest.raises(typer.BadParameter, match=words):
        opts(**kw)


def test_refused_tasks_are_printed_one_line_each_and_the_rest_is_read() -> None:
    out = io.StringIO()
    tasks = read_task_source(BROKEN, "auto", opts(), Console(file=out, width=400))
    assert [t.task_id for t in tasks] == ["good"]
    lines = [line for line in out.getvalue().splitlines() if line.startswith("refused: ")]
    assert len(lines) == 7
    assert f"refused: {BROKEN.resolve() / 'gpus'} (environment.gpus): " in out.getvalue()
    assert "1 task(s) read, 7 refused" in out.getvalue()


def test_source_problems_are_parameter_errors(tmp_path: Path) -> None:
    console = Console(file=io.StringIO())
    with pytest.raises(typer.BadParameter, match="every task was refused"):
        read_task_source(BROKEN / "gpus", "harbor", opts(), console)
    with pytest.raises(typer.BadParameter, match="one of auto"):
        read_task_source(BROKEN, "yaml", opts(), console)
    jsonl = tmp_path / "tasks.jsonl"
    jsonl.write_text("")
    with pytest.raises(typer.BadParameter, match="JSONL tasks name their own harness"):
        read_task_source(jsonl, "auto", opts(), console)
    with pytest.raises(typer.BadParameter, match="not a task source"):
        read_task_source(tmp_path, "auto", opts(), console)


@pytest.mark.parametrize("command", ["run", "demo"])
def test_cli_prints_refusals_and_exits_non_zero_when_nothing_is_left(command: str) -> None:
    target = (
        ["--tasks", str(BROKEN / "multi-step")]
        if command == "demo"
        else [str(BROKEN / "multi-step")]
    )
    result = CliRunner(env={"COLUMNS": "400"}).invoke(
        app, [command, *target, "--harness", "oracle", "--image-map", "ubuntu:24.04=x:1"]
    )
    assert result.exit_code == 2, result.output
    assert "(steps/): multi-step Harbor tasks are not supported" in result.output
    assert "every task was refused" in result.output


def test_cli_run_needs_a_harness_for_a_dataset() -> None:
    result = CliRunner(env={"COLUMNS": "400"}).invoke(app, ["run", str(DATA / "harbor")])
    assert result.exit_code == 2
    assert "--harness" in result.output


def test_format_options_take_json_values_else_text() -> None:
    assert parse_format_options(
        ["repo_url_template=/data/repos/{repo}", "test_timeout_s=60", 'test_env={"A": "1"}']
    ) == {"repo_url_template": "/data/repos/{repo}", "test_timeout_s": 60, "test_env": {"A": "1"}}
    assert opts(format_options=["repo_path=/src"]).format_options == {"repo_path": "/src"}
    with pytest.raises(typer.BadParameter, match="KEY=VALUE"):
        parse_format_options(["no-equals-sign"])


def test_a_command_gets_the_dataset_options_as_one_value_with_its_own_backend() -> None:
    """`task_source_options` declares the dataset flags once for `rollout run` and
    `rollout demo`: the command receives them as one `TaskSourceArgs`, its own
    parameters around them untouched, and its `--backend` default is its own."""
    seen: list[tuple[Path, TaskSourceArgs, int]] = []

    @task_source_options(backend="local", backend_help="sandbox backend")
    def command(
        path: Annotated[Path, typer.Argument()], *, source: TaskSourceArgs, after: int = 1
    ) -> None:
        seen.append((path, source, after))

    cli = typer.Typer()
    cli.command()(command)
    args = ["tasks", "--harness", "oracle", "--image-map", "a=b", "--format-option", "k=1"]
    result = CliRunner().invoke(cli, [*args, "--after", "2"])
    assert result.exit_code == 0, result.output
    given = TaskSourceArgs(
        task_format="auto",
        harness="oracle",
        harness_config=None,
        backend="local",
        image_map=["a=b"],
        image_map_file=None,
        public_network="no-network",
        format_option=["k=1"],
    )
    assert seen == [(Path("tasks"), given, 2)]
    assert given.load_options().format_options == {"k": 1}
    for name, default in (("run", "docker"), ("demo", "local")):
        shown = CliRunner(env={"COLUMNS": "400"}).invoke(app, [name, "--help"]).output
        assert re.search(rf"--backend\s.*\[default: {default}\]", shown), shown
