"""SWE-bench-style instances (SWE-bench, Verified, SWE-Gym, SWE-rebench) as rollout tasks.

A JSONL file (or a JSON array) of instance records. Each becomes a task whose agent
works in the repo at `base_commit` and whose success check is a `swebench` check: the
hidden `test_patch` placed after the agent stopped, the tests run, and reward 1 only
when every FAIL_TO_PASS and PASS_TO_PASS test passed. The gold `patch` is never placed.

The repo is either already in the instance's image at `repo_path` (SWE-bench's own
images: `/testbed`), or, with `repo_url_template`, cloned on the sandbox host at
`base_commit` and copied to `repo_path`. Where a setting can come from the run's
options, the instance or the default, an option the run sets explicitly wins, then the
instance's own value (`image_name`/`docker_image`, `pytest_plugins`, SWE-rebench's
`install_config`), then the default. Only chosen by name (`--format swebench`): a JSONL
file is ours unless the run says otherwise.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from schemas.base import StrictModel
from schemas.evaluation import EvaluationSpec, SweBenchCheck
from schemas.tasks import HookSpec, RolloutTask, TaskSource, check_task_id, default_hooks
from schemas.workspace import absolute_dir, full_commit
from task_formats.base import LoadedTasks, LoadOptions, RefusedTask

#: SWE-bench's published image names (`__` is not allowed in a Docker Hub name).
DEFAULT_IMAGE_TEMPLATE = "swebench/sweb.eval.x86_64.{instance_id}:latest"
DEFAULT_TEST_COMMAND = "python -m pytest -rA {tests}"
#: Files a test patch touches that are data, not tests to run (SWE-bench's list).
NON_TEST_SUFFIXES = (
    ".json", ".png", ".csv", ".txt", ".md", ".jpg", ".jpeg", ".pkl", ".yml", ".yaml", ".toml",
)  # fmt: skip
_PLACEHOLDERS = {"instance_id", "raw_id", "repo", "org", "name", "version"}


class SweBenchOptions(StrictModel):
    """`LoadOptions.format_options` for this format."""

    #: The image of an instance: `{instance_id}` (lower-cased, `__` → `_1776_`, as
    #: SWE-bench names its images), `{raw_id}`, `{repo}` (org/name), `{org}`, `{name}`,
    #: `{version}`. The run's image map then applies to the name.
    image_template: str = DEFAULT_IMAGE_TEMPLATE
    #: Where the host clones the repo from (a path or URL, same placeholders); unset:
    #: the image already holds the repo at `repo_path`, checked out at `base_commit`.
    repo_url_template: str | None = None
    repo_path: str = "/testbed"
    #: Run in `repo_path`; `{tests}` is replaced by the test files `test_patch` touches
    #: (shell-quoted); a command without it gets them appended, as SWE-bench does.
    test_command: str = DEFAULT_TEST_COMMAND
    #: A test-log parser by name (`pytest`, `unittest`, or one registered in
    #: `hooks.test_logs`); SWE-rebench's `parse_log_pytest` spelling is accepted.
    log_parser: str = "pytest"
    #: pytest plugins the image's test env provides and the tests need (``-p NAME``
    #: each; the tests run with plugin autoloading off): an instance's own
    #: `pytest_plugins` list is used unless the run sets this.
    pytest_plugins: list[str] = Field(default_factory=list)
    #: Environment of the test command (e.g. a PATH with the image's test env first).
    test_env: dict[str, str] = Field(default_factory=dict)
    test_timeout_s: float = Field(default=1800.0, gt=0)
    #: More sandbox fields for every task (`resources`, `env`, `timeout_s`, `setup`, …).
    sandbox: dict[str, Any] = Field(default_factory=dict)
    #: Add the instance's `hints_text` to the prompt.
    include_hints: bool = False

    @field_validator("image_template", "repo_url_template")
    @classmethod
    def _known_placeholders(cls, v: str | None) -> str | None:
        if v is not None:
            names = {m for m in re.findall(r"{(\w*)}", v)}
            unknown = names - _PLACEHOLDERS
            if unknown:
                raise ValueError(
                    f"unknown placeholder(s) {sorted(unknown)} in {v!r}; "
                    f"known: {', '.join(sorted(_PLACEHOLDERS))}"
                )
        return v

    @field_validator("repo_path")
    @classmethod
    def _absolute(cls, v: str) -> str:
        return absolute_dir(v, "repo_path")

    @field_validator("sandbox")
    @classmethod
    def _not_ours(cls, v: dict[str, Any]) -> dict[str, Any]:
        taken = sorted({"backend", "image", "repo", "workdir", "build"} & set(v))
        if taken:
            raise ValueError(f"sandbox may not set {taken}: the format sets them")
        return v


def _test_list(v: Any) -> Any:
    """SWE-bench stores the test lists as JSON text; other datasets as lists."""
    if isinstance(v, str):
        try:
            return json.loads(v)
        except ValueError as e:
            raise ValueError(f"not a JSON list of test names: {e}") from None
    return v


class InstallConfig(BaseModel):
    """SWE-rebench's per-instance test setup (other keys are kept, unused)."""

    model_config = ConfigDict(extra="allow")

    test_cmd: str | list[str] | None = None
    log_parser: str | None = None


class SweBenchInstance(BaseModel):
    """One instance record; fields this format does not use are kept, unused."""

    model_config = ConfigDict(extra="allow")

    instance_id: str
    repo: str = Field(min_length=1)
    base_commit: str
    problem_statement: str = Field(min_length=1)
    test_patch: str = Field(min_length=1)
    FAIL_TO_PASS: list[str]
    PASS_TO_PASS: list[str] = Field(default_factory=list)
    patch: str | None = None
    hints_text: str | None = None
    version: str | None = None
    environment_setup_commit: str | None = None
    image_name: str | None = None
    docker_image: str | None = None
    install_config: InstallConfig | None = None
    pytest_plugins: list[str] | None = None

    @field_validator("instance_id")
    @classmethod
    def _safe_id(cls, v: str) -> str:
        return check_task_id(v)

    @field_validator("base_commit")
    @classmethod
    def _commit(cls, v: str) -> str:
        return full_commit(v, "base_commit")

    @field_validator("test_patch")
    @classmethod
    def _diff(cls, v: str) -> str:
        if not any(ln.startswith(("diff --git ", "--- ")) for ln in v.splitlines()):
            raise ValueError("not a diff (no 'diff --git' or '---' line)")
        return v

    @field_validator("FAIL_TO_PASS", "PASS_TO_PASS", "pytest_plugins", mode="before")
    @classmethod
    def _lists(cls, v: Any) -> Any:
        return _test_list(v)

    @field_validator("version", mode="before")
    @classmethod
    def _version_text(cls, v: Any) -> Any:
        return str(v) if isinstance(v, int | float) else v


def patch_test_files(test_patch: str) -> list[str]:
    """The test files `test_patch` adds or changes (not those it deletes, not data files),
    in patch order: what the default test command runs."""
    files: list[str] = []
    blocks = re.split(r"^(?=diff --git )", test_patch, flags=re.MULTILINE)
    for block in blocks:
        header = re.match(r"diff --git a/(.*) b/(.*)$", block, flags=re.MULTILINE)
        if header is None or re.search(r"^deleted file mode ", block, flags=re.MULTILINE):
            continue
        new = re.search(r"^\+\+\+ b/(.*?)\t?$", block, flags=re.MULTILINE)
        path = new.group(1) if new else header.group(2)
        if not path.endswith(NON_TEST_SUFFIXES) and path not in files:
            files.append(path)
    return files


def _fill(template: str, inst: SweBenchInstance) -> str:
    org, _, name = inst.repo.rpartition("/")
    values = {
        "instance_id": inst.instance_id.lower().replace("__", "_1776_"),
        "raw_id": inst.instance_id,
        "repo": inst.repo,
        "org": org,
        "name": name,
        "version": inst.version or "",
    }
    return re.sub(r"{(\w+)}", lambda m: values[m.group(1)], template)


def _test_command(
    inst: SweBenchInstance, opts: SweBenchOptions, explicit: set[str]
) -> tuple[str, str]:
    """(the test command with its test files, the log parser's name)."""
    command, parser = opts.test_command, opts.log_parser
    own = inst.install_config
    if own is not None and own.test_cmd and "test_command" not in explicit:
        command = own.test_cmd if isinstance(own.test_cmd, str) else " && ".join(own.test_cmd)
    if own is not None and own.log_parser and "log_parser" not in explicit:
        parser = own.log_parser
    tests = " ".join(shlex.quote(f) for f in patch_test_files(inst.test_patch))
    if "{tests}" in command:
        return command.replace("{tests}", tests).rstrip(), parser
    return f"{command} {tests}".rstrip(), parser


def _prompt(inst: SweBenchInstance, opts: SweBenchOptions) -> str:
    parts = [inst.problem_statement.strip()]
    if opts.include_hints and inst.hints_text and inst.hints_text.strip():
        parts.append("Hints:\n" + inst.hints_text.strip())
    parts.append(
        f"The repository is checked out at {opts.repo_path}. Change its non-test files "
        "so the issue above is resolved."
    )
    return "\n\n".join(parts)


def _hooks(inst: SweBenchInstance, opts: SweBenchOptions) -> list[HookSpec]:
    """The default hooks, the diff taken in the repo against the base commit."""
    hooks = default_hooks()
    for hook in hooks:
        if hook.name == "capture_diff":
            hook.params = {"path": opts.repo_path, "base_commit": inst.base_commit}
    return hooks


def instance_task(
    record: dict[str, Any], inst: SweBenchInstance, path: Path, options: LoadOptions
) -> RolloutTask:
    """The rollout task of one validated instance (ValueError: the options do not fit it)."""
    opts = SweBenchOptions.model_validate(options.format_options)
    explicit = set(opts.model_fields_set)
    if options.harness is None:
        raise ValueError("no harness: the run must name one (--harness)")
    own_image = inst.image_name or inst.docker_image
    image = own_image if own_image and "image_template" not in explicit else None
    image = image or _fill(opts.image_template, inst)
    image = options.image_map.get(image, image)
    command, parser = _test_command(inst, opts, explicit)
    sandbox: dict[str, Any] = {
        **opts.sandbox,
        "backend": options.backend,
        "image": image,
        "workdir": opts.repo_path,
    }
    if opts.repo_url_template:
        sandbox["repo"] = {
            "url": _fill(opts.repo_url_template, inst),
            "commit": inst.base_commit,
            "path": opts.repo_path,
        }
    check = SweBenchCheck(
        name="swebench",
        repo_path=opts.repo_path,
        base_commit=inst.base_commit,
        test_patch=inst.test_patch,
        test_command=command,
        fail_to_pass=inst.FAIL_TO_PASS,
        pass_to_pass=inst.PASS_TO_PASS,
        log_parser=parser,
        pytest_plugins=(
            inst.pytest_plugins
            if inst.pytest_plugins is not None and "pytest_plugins" not in explicit
            else opts.pytest_plugins
        ),
        timeout_s=opts.test_timeout_s,
        env=opts.test_env,
    )
    blob = json.dumps(record, sort_keys=True, ensure_ascii=False).encode()
    return RolloutTask(
        task_id=inst.instance_id,
        prompt=_prompt(inst, opts),
        harness=options.harness,
        sandbox=sandbox,  # type: ignore[arg-type]
        hooks=_hooks(inst, opts),
        evaluation=EvaluationSpec(checks=[check]),
        metadata={
            "swebench": {
                "instance_id": inst.instance_id,
                "repo": inst.repo,
                "version": inst.version,
                "base_commit": inst.base_commit,
                "environment_setup_commit": inst.environment_setup_commit,
            }
        },
        source=TaskSource(
            format="swebench",
            ref=f"{path}#{inst.instance_id}",
            content_hash=hashlib.sha256(blob).hexdigest(),
        ),
    )


def _records(path: Path) -> list[tuple[str, Any]]:
    """(where, parsed record or the JSON error) per instance in the file."""
    text = path.read_text(encoding="utf-8")
    if text.lstrip().startswith("["):
        try:
            items = json.loads(text)
        except ValueError as e:
            raise ValueError(f"{path}: not a JSON array of instances: {e}") from None
        return [(f"{path}[{i}]", item) for i, item in enumerate(items)]
    out: list[tuple[str, Any]] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            out.append((f"{path}:{number}", json.loads(line)))
        except ValueError as e:
            out.append((f"{path}:{number}", e))
    return out


def _refusal(where: str, record: Any, error: ValidationError) -> RefusedTask:
    """A refusal naming the instance (its id if it has a usable one) and the field."""
    first = error.errors()[0]
    loc = ".".join(str(p) for p in first["loc"]) or None
    iid = record.get("instance_id") if isinstance(record, dict) else None
    source = f"{iid} ({where})" if isinstance(iid, str) and iid else where
    message = first["msg"].removeprefix("Value error, ")
    if first["type"] == "missing":
        message = "missing (required)"
    return RefusedTask(source=source, field=loc, reason=message)


class SweBenchFormat:
    name = "swebench"

    def detect(self, path: Path) -> bool:
        """Never: a JSONL file is read as ours unless the run names this format."""
        return False

    def load(self, path: Path, options: LoadOptions) -> LoadedTasks:
        """Every instance in the file; a bad one is refused (naming it and the field).

        ValueError only when the file as a whole cannot be read, the options are
        invalid or the run gave no harness."""
        try:
            SweBenchOptions.model_validate(options.format_options)
        except ValidationError as e:
            raise ValueError(f"--format-option for swebench: {e}") from None
        if options.harness is None:
            raise ValueError(f"{path}: swebench instances name no agent; give --harness")
        if not path.is_file():
            raise ValueError(f"{path}: a swebench source is one JSONL or JSON file")
        loaded = LoadedTasks()
        seen: set[str] = set()
        for where, record in _records(path):
            if isinstance(record, ValueError):
                loaded.refused.append(RefusedTask(source=where, reason=f"bad JSON: {record}"))
                continue
            if not isinstance(record, dict):
                loaded.refused.append(RefusedTask(source=where, reason="not a JSON object"))
                continue
            try:
                inst = SweBenchInstance.model_validate(record)
            except ValidationError as e:
                loaded.refused.append(_refusal(where, record, e))
                continue
            if not inst.FAIL_TO_PASS and not inst.PASS_TO_PASS:
                loaded.refused.append(
                    RefusedTask(
                        source=f"{inst.instance_id} ({where})",
                        field="FAIL_TO_PASS",
                        reason="FAIL_TO_PASS and PASS_TO_PASS are both empty: nothing to check",
                    )
                )
                continue
            if inst.instance_id in seen:
                loaded.refused.append(
                    RefusedTask(
                        source=f"{inst.instance_id} ({where})",
                        field="instance_id",
                        reason="duplicate instance_id (an earlier record has it)",
                    )
                )
                continue
            try:
                task = instance_task(record, inst, path, options)
            except ValidationError as e:
                loaded.refused.append(_refusal(where, record, e))
                continue
            seen.add(inst.instance_id)
            loaded.tasks.append(task)
        return loaded
