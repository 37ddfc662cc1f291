"""The swebench task format: instance records → rollout tasks, bad records refused by name."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from schemas.evaluation import SweBenchCheck
from schemas.tasks import HarnessSpec, RolloutTask
from task_formats import LoadOptions, detect_format, load_task_source
from task_formats.swebench import patch_test_files

BASE = "a" * 40
TEST_PATCH = """\
diff --git a/tests/test_calc.py b/tests/test_calc.py
--- a/tests/test_calc.py
+++ b/tests/test_calc.py
@@ -1,2 +1,5 @@
 from calc import add
+
+def test_add_negative():
+    assert add(-1, -2) == -3
diff --git a/tests/data/cases.json b/tests/data/cases.json
new file mode 100644
--- /dev/null
+++ b/tests/data/cases.json
@@ -0,0 +1 @@
+[]
diff --git a/tests/test new.py b/tests/test new.py
new file mode 100644
--- /dev/null
+++ b/tests/test new.py
@@ -0,0 +1 @@
+def test_x(): pass
diff --git a/tests/test_old.py b/tests/test_old.py
deleted file mode 100644
--- a/tests/test_old.py
+++ /dev/null
@@ -1 +0,0 @@
-def test_y(): pass
"""
HARNESS = HarnessSpec(name="command", config={"command": "true"})


def instance(**over: Any) -> dict[str, Any]:
    rec: dict[str, Any] = {
        "instance_id": "org__calc-12",
        "repo": "org/calc",
        "base_commit": BASE,
        "patch": "diff --git a/calc.py b/calc.py\n--- a/calc.py\n+++ b/calc.py\n",
        "test_patch": TEST_PATCH,
        "problem_statement": "add() is wrong for negative numbers",
        "hints_text": "look at the sign",
        "version": "1.0",
        "FAIL_TO_PASS": json.dumps(["tests/test_calc.py::test_add_negative"]),
        "PASS_TO_PASS": json.dumps(["tests/test_calc.py::test_add"]),
        "environment_setup_commit": "b" * 40,
        "created_at": "2024-01-01T00:00:00Z",
    }
    rec.update(over)
    return {k: v for k, v in rec.items() if v is not None}


def write(tmp_path: Path, *records: Any, name: str = "instances.jsonl") -> Path:
    path = tmp_path / name
    lines = [r if isinstance(r, str) else json.dumps(r) for r in records]
    path.write_text("\n".join(lines) + "\n")
    return path


def load(path: Path, **format_options: Any) -> Any:
    opts = LoadOptions(harness=HARNESS, format_options=format_options)
    return load_task_source(path, opts, fmt="swebench")


def only_check(task: RolloutTask) -> SweBenchCheck:
    assert task.evaluation is not None
    (check,) = task.evaluation.checks
    assert isinstance(check, SweBenchCheck)
    return check


def test_an_instance_becomes_a_task(tmp_path: Path) -> None:
    path = write(tmp_path, instance())
    loaded = load(path)
    assert loaded.refused == []
    (task,) = loaded.tasks
    assert task.task_id == "org__calc-12"
    assert task.prompt.startswith("add() is wrong for negative numbers")
    assert "/testbed" in task.prompt and "look at the sign" not in task.prompt
    assert task.harness == HARNESS
    fields = task.sandbox.spec_fields()
    assert fields["image"] == "swebench/sweb.eval.x86_64.org_1776_calc-12:latest"
    assert fields["workdir"] == "/testbed" and "repo" not in fields
    assert task.sandbox.backend == "docker"
    check = only_check(task)
    assert check.base_commit == BASE and check.repo_path == "/testbed"
    assert check.fail_to_pass == ["tests/test_calc.py::test_add_negative"]
    assert check.pass_to_pass == ["tests/test_calc.py::test_add"]
    assert check.test_patch == TEST_PATCH and check.log_parser == "pytest"
    # The data file and the deleted test are not run; a path with a space is quoted.
    assert check.test_command == "python -m pytest -rA tests/test_calc.py 'tests/test new.py'"
    # The gold patch goes nowhere near the task.
    assert "calc.py b/calc.py" not in task.model_dump_json()
    diff = next(h for h in task.hook_specs() if h.name == "capture_diff")
    assert diff.params == {"path": "/testbed", "base_commit": BASE}
    assert task.source is not None and task.source.format == "swebench"
    assert task.source.ref == f"{path}#org__calc-12"
    assert task.source.content_hash and len(task.source.content_hash) == 64


def test_test_lists_as_lists_and_a_json_array_file(tmp_path: Path) -> None:
    rec = instance(FAIL_TO_PASS=["a::b"], PASS_TO_PASS=[])
    path = tmp_path / "instances.json"
    path.write_text(json.dumps([rec]))
    (task,) = load(path).tasks
    assert only_check(task).fail_to_pass == ["a::b"] and only_check(task).pass_to_pass == []


def test_content_hash_follows_the_record(tmp_path: Path) -> None:
    a = load(write(tmp_path, instance(), name="a.jsonl")).tasks[0].source.content_hash
    b = load(write(tmp_path, instance(), name="b.jsonl")).tasks[0].source.content_hash
    c = load(write(tmp_path, instance(hints_text="x"), name="c.jsonl")).tasks[0].source.content_hash
    assert a == b != c


@pytest.mark.parametrize(
    ("record", "field", "reason"),
    [
        (instance(base_commit=None), "base_commit", "missing"),
        (instance(base_commit="main"), "base_commit", "full commit hash"),
        (instance(FAIL_TO_PASS="not json"), "FAIL_TO_PASS", "JSON list"),
        (instance(FAIL_TO_PASS=json.dumps({"a": 1})), "FAIL_TO_PASS", "list"),
        (instance(PASS_TO_PASS=[1, 2]), "PASS_TO_PASS.0", "string"),
        (instance(FAIL_TO_PASS=None), "FAIL_TO_PASS", "missing"),
        (instance(FAIL_TO_PASS=[], PASS_TO_PASS=[]), "FAIL_TO_PASS", "both empty"),
        (instance(test_patch="just words"), "test_patch", "not a diff"),
        (instance(problem_statement=""), "problem_statement", "at least 1"),
        (instance(repo=None), "repo", "missing"),
    ],
)
def test_a_bad_instance_is_refused_by_name_and_field(
    tmp_path: Path, record: dict[str, Any], field: str, reason: str
) -> None:
    good = instance(instance_id="org__calc-13")
    loaded = load(write(tmp_path, record, good))
    assert [t.task_id for t in loaded.tasks] == ["org__calc-13"]
    (refused,) = loaded.refused
    assert refused.source.startswith("org__calc-12 (")
    assert refused.field == field
    assert reason in refused.reason
    assert "org__calc-12" in str(refused) and field in str(refused)


def test_refusals_without_an_id_name_the_line(tmp_path: Path) -> None:
    path = write(
        tmp_path, "{broken", instance(instance_id=None), instance(instance_id="a/b"), instance()
    )
    loaded = load(path)
    assert [t.task_id for t in loaded.tasks] == ["org__calc-12"]
    bad_json, no_id, unsafe = loaded.refused
    assert bad_json.source == f"{path}:1" and "bad JSON" in bad_json.reason
    assert no_id.source == f"{path}:2" and no_id.field == "instance_id"
    assert unsafe.source.startswith("a/b (") and unsafe.field == "instance_id"


def test_a_duplicate_instance_is_refused(tmp_path: Path) -> None:
    loaded = load(write(tmp_path, instance(), instance()))
    assert len(loaded.tasks) == 1
    (refused,) = loaded.refused
    assert refused.field == "instance_id" and "duplicate" in refused.reason


def test_image_template_placeholders_and_the_image_map(tmp_path: Path) -> None:
    path = write(tmp_path, instance(instance_id="Org__Calc-12"))
    (task,) = load(path, image_template="reg/{org}/{name}:{version}-{raw_id}").tasks
    assert task.sandbox.spec_fields()["image"] == "reg/org/calc:1.0-Org__Calc-12"
    opts = LoadOptions(
        harness=HARNESS,
        image_map={"swebench/sweb.eval.x86_64.org_1776_calc-12:latest": "local/calc:12"},
    )
    (task,) = load_task_source(path, opts, fmt="swebench").tasks
    assert task.sandbox.spec_fields()["image"] == "local/calc:12"
    with pytest.raises(ValueError, match=r"unknown placeholder.*'id'"):
        load(path, image_template="x/{id}")


def test_the_instances_own_image_unless_the_run_sets_a_template(tmp_path: Path) -> None:
    path = write(tmp_path, instance(docker_image="rebench/calc:12"))
    assert load(path).tasks[0].sandbox.spec_fields()["image"] == "rebench/calc:12"
    (task,) = load(path, image_template="mine/{instance_id}").tasks
    assert task.sandbox.spec_fields()["image"] == "mine/org_1776_calc-12"


def test_repo_url_template_places_the_repo_at_the_base_commit(tmp_path: Path) -> None:
    path = write(tmp_path, instance())
    (task,) = load(path, repo_url_template="/data/repos/{repo}", repo_path="/work/calc").tasks
    repo = task.sandbox.repo()
    assert repo is not None
    assert (repo.url, repo.commit, repo.path) == ("/data/repos/org/calc", BASE, "/work/calc")
    assert task.sandbox.spec_fields()["workdir"] == "/work/calc"
    assert only_check(task).repo_path == "/work/calc"


def test_install_config_gives_command_and_parser_unless_the_run_sets_them(tmp_path: Path) -> None:
    rec = instance(
        install_config={
            "test_cmd": "pytest --no-header -rA",
            "log_parser": "parse_log_pytest_v2",
            "python": "3.11",
        }
    )
    path = write(tmp_path, rec)
    check = only_check(load(path).tasks[0])
    assert check.test_command == "pytest --no-header -rA tests/test_calc.py 'tests/test new.py'"
    assert check.log_parser == "parse_log_pytest_v2"
    check = only_check(load(path, test_command="make test", log_parser="unittest").tasks[0])
    assert check.test_command == "make test tests/test_calc.py 'tests/test new.py'"
    assert check.log_parser == "unittest"


def test_pytest_plugins_from_the_instance_unless_the_run_sets_them(tmp_path: Path) -> None:
    assert only_check(load(write(tmp_path, instance())).tasks[0]).pytest_plugins == []
    path = write(tmp_path, instance(pytest_plugins='["xdist.plugin", "pytest_mock"]'))
    assert only_check(load(path).tasks[0]).pytest_plugins == ["xdist.plugin", "pytest_mock"]
    check = only_check(load(path, pytest_plugins=["timeout"]).tasks[0])
    assert check.pytest_plugins == ["timeout"]
    bad = load(write(tmp_path, instance(pytest_plugins=["-p evil"])))
    assert bad.tasks == [] and bad.refused[0].field == "pytest_plugins"
    assert "not plugin or module names" in bad.refused[0].reason


def test_options_hints_env_and_sandbox_extras(tmp_path: Path) -> None:
    path = write(tmp_path, instance())
    (task,) = load(
        path,
        include_hints=True,
        test_env={"PATH": "/venv/bin:/usr/bin:/bin"},
        test_timeout_s=60,
        sandbox={"resources": {"memory_mb": 8192}},
        test_command="python3 -m unittest -v",
    ).tasks
    assert "look at the sign" in task.prompt
    check = only_check(task)
    assert check.env == {"PATH": "/venv/bin:/usr/bin:/bin"} and check.timeout_s == 60
    assert task.sandbox.spec_fields()["resources"] == {"memory_mb": 8192}


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"nope": 1}, "nope"),
        ({"repo_path": "testbed"}, "absolute"),
        ({"sandbox": {"image": "x"}}, "may not set"),
    ],
)
def test_bad_options_refuse_the_file(tmp_path: Path, options: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        load(write(tmp_path, instance()), **options)


def test_no_harness_and_no_detection(tmp_path: Path) -> None:
    path = write(tmp_path, instance())
    with pytest.raises(ValueError, match="--harness"):
        load_task_source(path, LoadOptions(), fmt="swebench")
    assert detect_format(path) == "jsonl"


def test_the_test_files_of_a_patch() -> None:
    assert patch_test_files(TEST_PATCH) == ["tests/test_calc.py", "tests/test new.py"]
