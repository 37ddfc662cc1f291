"""Unit tests: Harbor task directories read as rollout tasks.

Real files only: the task directories under tests/data/harbor (our own tiny tasks) and
tests/data/harbor_broken (one defect each), plus variants written into tmp_path. No
Docker: what the loader produces is data (a build request, a network policy, hidden
test files), checked here field by field.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from harnesses.base import GatewayEndpoints, HarnessContext, HarnessSetupError
from harnesses.oracle import OracleHarness
from schemas.evaluation import RewardFileCheck
from schemas.tasks import HarnessSpec, RolloutTask
from task_formats import LoadOptions, detect_format, load_task_source
from task_formats.content_hash import hash_tree
from task_formats.harbor import MAX_INLINE_BYTES, HarborFormat, task_id_for
from task_formats.harbor_environment import dockerfile_workdir
from tests.fixtures.fake_sandbox import FakeSandbox

DATA = Path(__file__).resolve().parents[1] / "data"
GOOD = DATA / "harbor"
BROKEN = DATA / "harbor_broken"
IMAGE_MAP = {"ubuntu:24.04": "agentic-rollout/sandbox-base:latest"}


def options(harness: str = "command", **kw: object) -> LoadOptions:
    spec = HarnessSpec(name=harness, config={"command": "true"} if harness == "command" else {})
    return LoadOptions(harness=spec, image_map=dict(IMAGE_MAP), **kw)  # type: ignore[arg-type]


def read_one(task_dir: Path, opts: LoadOptions | None = None, **env: str) -> RolloutTask:
    loaded = HarborFormat(environ=env).load(task_dir, opts or options())
    assert not loaded.refused, loaded.refused
    (task,) = loaded.tasks
    return task


def refusal(task_dir: Path, opts: LoadOptions | None = None, **env: str) -> tuple[str, str]:
    loaded = HarborFormat(environ=env).load(task_dir, opts or options())
    assert not loaded.tasks
    (refused,) = loaded.refused
    assert refused.source == str(task_dir.resolve())
    return refused.field or "", refused.reason


def make_ctx(workdir: str = "/workspace") -> HarnessContext:
    return HarnessContext(
        rollout_id="r-1",
        task=RolloutTask(task_id="t", prompt="p", harness=HarnessSpec(name="oracle")),
        endpoints=GatewayEndpoints(
            token="t", openai_base_url="http://127.0.0.1:1/v1", anthropic_base_url="http://x"
        ),
        workdir=workdir,
    )


@pytest.fixture
def hello(tmp_path: Path) -> Path:
    """A writable copy of the hello task, to vary."""
    return Path(shutil.copytree(GOOD / "hello", tmp_path / "hello"))


def set_toml(task_dir: Path, text: str) -> Path:
    (task_dir / "task.toml").write_text(text)
    return task_dir


# --------------------------------------------------------------------------- mapping


def test_hello_maps_every_part_of_the_task() -> None:
    task = read_one(GOOD / "hello")
    env_dir = (GOOD / "hello" / "environment").resolve()
    assert task.task_id == "hello"
    assert task.prompt == (GOOD / "hello" / "instruction.md").read_text()
    assert task.harness.name == "command" and task.harness.budget_s == 120.0
    sandbox = task.sandbox
    assert sandbox.backend == "docker"
    build = sandbox.build
    assert build is not None
    assert build.context == str(env_dir) and build.dockerfile == "Dockerfile"
    assert build.timeout_s == 300.0 and build.base_image_map == IMAGE_MAP
    assert build.content_hash == hash_tree(env_dir, extra={"base_image_map": IMAGE_MAP})
    fields = sandbox.spec_fields()
    assert fields["image"] is None
    assert fields["workdir"] == "/app"  # the Dockerfile's WORKDIR
    assert fields["env"] == {}
    assert fields["resources"] == {"cpus": 1.0, "memory_mb": 1024}
    # Harbor's default is the public network; by default the run takes it away, noted.
    assert fields["network"] == {"mode": "no-network", "allowed_hosts": []}
    assert task.metadata["network_downgraded"] == "public→no-network"
    assert task.metadata["harbor"]["task"]["name"] == "agentic-rollout/hello"
    assert task.metadata["harbor"]["metadata"] == {"difficulty": "easy"}

    evaluation = task.evaluation
    assert evaluation is not None
    (check,) = evaluation.checks
    assert isinstance(check, RewardFileCheck)
    assert check.command == "bash /tests/test.sh" and check.reward_dir == "/logs/verifier"
    assert check.timeout_s == 60.0 and check.cwd == "/app" and check.user is None
    (test_sh,) = evaluation.files
    assert test_sh.path == "/tests/test.sh" and test_sh.mode == 0o755
    assert test_sh.data() == (GOOD / "hello" / "tests" / "test.sh").read_bytes()
    assert evaluation.aggregate == "sum"  # the verifier's reward is the reward
    assert evaluation.version and evaluation.version.startswith("harbor-")
    assert task.reward_fn_id() == evaluation.version

    assert task.source is not None and task.source.format == "harbor"
    assert task.source.ref == str((GOOD / "hello").resolve())
    assert task.source.content_hash == hash_tree(GOOD / "hello", exclude=("solution",))
    # The solution is nowhere in a task an agent runs.
    dumped = task.model_dump_json()
    assert "solve.sh" not in dumped and "/solution" not in dumped


def test_minimal_task_takes_harbor_defaults(hello: Path) -> None:
    set_toml(hello, "")
    (hello / "environment" / "Dockerfile").write_text("FROM ubuntu:24.04\n")
    task = read_one(hello, LoadOptions(harness=HarnessSpec(name="command", budget_s=77)))
    fields = task.sandbox.spec_fields()
    assert "workdir" not in fields  # unknown: the backend's default applies
    assert fields["resources"] == {}  # none injected
    assert task.harness.budget_s == 77  # no [agent].timeout_sec: the run's choice
    check = task.evaluation.checks[0]  # type: ignore[union-attr]
    assert check.timeout_s == 600.0 and check.cwd is None
    assert task.sandbox.build is not None and task.sandbox.build.timeout_s == 600.0
    assert task.sandbox.build.base_image_map == {}
    assert task.metadata["harbor"] == {"schema_version": "1.0"}


def test_the_older_version_key_is_the_schema_version(hello: Path) -> None:
    assert read_one(GOOD / "multi-metric").metadata["harbor"]["schema_version"] == "1.0"
    set_toml(hello, 'version = "1.0"\nschema_version = "1.2"\n')
    assert read_one(hello).metadata["harbor"]["schema_version"] == "1.2"


def test_whole_dataset_directory_reads_every_task() -> None:
    loaded = load_task_source(GOOD, options())
    assert detect_format(GOOD) == "harbor" and detect_format(GOOD / "hello") == "harbor"
    assert not loaded.refused
    assert sorted(t.task_id for t in loaded.tasks) == [
        "allowlist",
        "failing",
        "hello",
        "multi-metric",
        "no-peek",
    ]


def test_docker_image_is_used_as_given_or_mapped(hello: Path) -> None:
    set_toml(hello, '[environment]\ndocker_image = "ubuntu:24.04"\nworkdir = "/srv"\n')
    task = read_one(hello)
    assert task.sandbox.build is None
    fields = task.sandbox.spec_fields()
    assert fields["image"] == IMAGE_MAP["ubuntu:24.04"]
    assert fields["workdir"] == "/srv"
    assert task.evaluation.checks[0].cwd == "/srv"  # type: ignore[union-attr]


def test_deprecated_sizes_and_allow_internet(hello: Path) -> None:
    set_toml(hello, '[environment]\nmemory = "4G"\nstorage = "512M"\nallow_internet = false\n')
    task = read_one(hello)
    fields = task.sandbox.spec_fields()
    assert fields["resources"] == {"memory_mb": 4096, "disk_mb": 512}
    assert fields["network"]["mode"] == "no-network"
    assert "network_downgraded" not in task.metadata  # the task asked for none


def test_verifier_settings_reach_the_check_and_the_budget(hello: Path) -> None:
    set_toml(
        hello,
        '[verifier]\ntimeout_sec = 1800.0\nuser = "root"\nenv = { MODE = "${MODE:-strict}" }\n'
        "[environment]\nbuild_timeout_sec = 1200.0\n",
    )
    task = read_one(hello, options(env_allow=["MODE"]))
    check = task.evaluation.checks[0]  # type: ignore[union-attr]
    assert check.user == "root" and check.env == {"MODE": "strict"} and check.timeout_s == 1800
    assert task.budget.grace_s >= 1800 and task.budget.hooks_s >= 1800
    assert task.budget.provision_s >= 1200
    assert task.budget.total_s >= task.budget.provision_s + task.harness.budget_s


# --------------------------------------------------------------------------- network


def test_public_network_policy_choices(hello: Path) -> None:
    allowed = read_one(hello, options(public_network="allow"))
    assert allowed.sandbox.spec_fields()["network"]["mode"] == "public"
    assert "network_downgraded" not in allowed.metadata
    field, reason = refusal(hello, options(public_network="refuse"))
    assert field == "environment.network_mode" and "public network" in reason


def test_agent_section_overrides_the_environment_network(hello: Path) -> None:
    set_toml(
        hello,
        '[environment]\nnetwork_mode = "public"\n'
        '[agent]\nallowed_hosts = ["PyPI.org.", "pypi.org"]\n'
        '[verifier]\nnetwork_mode = "public"\n',
    )
    task = read_one(hello, options(public_network="refuse"))
    assert task.sandbox.spec_fields()["network"] == {
        "mode": "allowlist",
        "allowed_hosts": ["pypi.org"],
    }
    # The verifier's own policy is kept for the record (it runs in the same sandbox).
    assert task.metadata["harbor"]["verifier_network"]["mode"] == "public"


def test_allowlist_task() -> None:
    """(`${VAR}` in env values: tests/unit/test_dataset_supply_chain.py.)"""
    task = read_one(GOOD / "allowlist")
    fields = task.sandbox.spec_fields()
    assert fields["network"] == {"mode": "allowlist", "allowed_hosts": ["allowed.test"]}
    assert fields["env"] == {"ALLOWLIST_URL": "http://allowed.test:8080/"}


# --------------------------------------------------------------------------- refusals


@pytest.mark.parametrize(
    ("name", "field", "words"),
    [
        ("no-instruction", "instruction.md", "missing"),
        ("no-test-sh", "tests/test.sh", "missing"),
        ("unknown-field", "environment.cpu_count", "unknown key"),
        ("wrong-type", "environment.cpus", "number"),
        ("multi-step", "steps/", "multi-step"),
        ("gpus", "environment.gpus", "GPU"),
        ("not-a-task", "task.toml", "no task.toml"),
    ],
)
def test_each_broken_task_is_refused_naming_task_and_field(
    name: str, field: str, words: str
) -> None:
    loaded = load_task_source(BROKEN, options(), "harbor")
    by_source = {Path(r.source).name: r for r in loaded.refused}
    assert by_source[name].field == field
    assert words in by_source[name].reason
    assert str(BROKEN.resolve() / name) in str(by_source[name])


def test_one_bad_task_never_stops_the_rest() -> None:
    loaded = load_task_source(BROKEN, options(), "harbor")
    assert [t.task_id for t in loaded.tasks] == ["good"]
    names = {Path(r.source).name for r in loaded.refused}
    assert ".hidden" not in names  # hidden directories are not datasets' tasks
    assert len(loaded.refused) == 7


@pytest.mark.parametrize(
    ("toml", "field", "words"),
    [
        ("[environment]\nos = 'windows'\n", "environment.os", "Windows"),
        ("[environment]\nmcp_servers = [{ name = 'x' }]\n", "environment.mcp_servers", "MCP"),
        ("[environment.healthcheck]\ncommand = 'true'\n", "environment.healthcheck", "services"),
        (
            "[environment]\nenv = { TOKEN = '${NOT_SET_ANYWHERE}' }\n",
            "environment.env.TOKEN",
            "NOT_SET_ANYWHERE",
        ),
        ("[verifier]\nenv = { K = '${MISSING}' }\n", "verifier.env.K", "MISSING"),
        ("[agent]\nallowed_hosts = ['10.0.0.1']\n", "agent.allowed_hosts", "IP address"),
        (
            "[environment]\nnetwork_mode = 'public'\nallowed_hosts = ['a.test']\n",
            "environment.allowed_hosts",
            "allowlist",
        ),
        ("[environment]\nmemory = 'lots'\n", "environment.memory", "G, M or K"),
        ("schema_version = '2.0'\n", "schema_version", "1.x"),
        ("[agent]\ntimeout_sec = -1\n", "agent.timeout_sec", "greater than 0"),
        ("[verifier]\nenv = { N = 1 }\n", "verifier.env.N", "string"),
        ("[task]\nname = 'a/b'\nfavourite = 'x'\n", "task.favourite", "unknown key"),
        ("[environment\n", "task.toml", "TOML"),
    ],
)
def test_task_toml_problems_name_the_field(hello: Path, toml: str, field: str, words: str) -> None:
    # The variables are allowed: what is refused is that they are unset.
    allowed = options(env_allow=["NOT_SET_ANYWHERE", "MISSING"])
    got_field, reason = refusal(set_toml(hello, toml), allowed)
    assert got_field == field
    assert words in reason


def test_environment_problems_are_refused(hello: Path) -> None:
    (hello / "environment" / "docker-compose.yaml").write_text("services: {}\n")
    assert refusal(hello)[0] == "environment/docker-compose.yaml"
    shutil.rmtree(hello / "environment")
    field, reason = refusal(hello)
    assert field == "environment/Dockerfile" and "docker_image" in reason


def test_empty_instruction_is_refused(hello: Path) -> None:
    (hello / "instruction.md").write_text("  \n\n")
    assert refusal(hello) == ("instruction.md", "empty: it is the agent's prompt")


def test_tests_that_cannot_be_placed_are_refused(hello: Path) -> None:
    (hello / "tests" / "link.sh").symlink_to("test.sh")
    assert refusal(hello)[0] == "tests/link.sh"
    (hello / "tests" / "link.sh").unlink()
    (hello / "tests" / "data.bin").write_bytes(b"\0" * (MAX_INLINE_BYTES + 1))
    field, reason = refusal(hello)
    assert field == "tests/" and "KiB" in reason


def test_task_ids_come_from_directory_names_and_must_not_clash(tmp_path: Path) -> None:
    assert task_id_for("my task (v2)") == "my-task-v2-"
    assert task_id_for("..hidden-ish") == "hidden-ish"
    assert task_id_for("x" * 300) == "x" * 128
    for name in ("a b", "a-b", "a+b"):
        shutil.copytree(GOOD / "hello", tmp_path / name)
    loaded = HarborFormat(environ={}).load(tmp_path, options())
    assert [t.task_id for t in loaded.tasks] == ["a-b"]
    assert [(Path(r.source).name, r.field) for r in loaded.refused] == [
        ("a+b", "task directory name"),
        ("a-b", "task directory name"),
    ]
    assert all("already taken" in r.reason for r in loaded.refused)


def test_a_dataset_needs_a_harness() -> None:
    with pytest.raises(ValueError, match="--harness"):
        load_task_source(GOOD, LoadOptions())


def test_a_directory_without_tasks_is_not_a_dataset(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no Harbor task directories"):
        load_task_source(tmp_path, options(), "harbor")
    assert not HarborFormat().detect(tmp_path)


# --------------------------------------------------------------------------- hashes


def test_content_hash_is_stable_across_copies(tmp_path: Path) -> None:
    one = shutil.copytree(GOOD / "hello", tmp_path / "one")
    two = shutil.copytree(GOOD / "hello", tmp_path / "two")
    os.chmod(two / "instruction.md", 0o600)  # umask differences do not count
    assert hash_tree(one) == hash_tree(two)
    a, b = read_one(one), read_one(two)
    assert a.source.content_hash == b.source.content_hash  # type: ignore[union-attr]
    assert a.evaluation.version == b.evaluation.version  # type: ignore[union-attr]
    assert a.sandbox.build.content_hash == b.sandbox.build.content_hash  # type: ignore[union-attr]


def test_content_hash_sees_every_change_that_matters(hello: Path) -> None:
    seen = {hash_tree(hello)}

    def changed() -> None:
        digest = hash_tree(hello)
        assert digest not in seen
        seen.add(digest)

    (hello / "instruction.md").write_text("something else\n")
    changed()
    os.chmod(hello / "instruction.md", 0o755)
    changed()
    (hello / "empty-dir").mkdir()
    changed()
    (hello / "link").symlink_to("instruction.md")
    changed()
    (hello / "link").unlink()
    (hello / "link").symlink_to("task.toml")
    changed()
    assert hash_tree(hello, extra={"k": "v"}) != hash_tree(hello)


def test_task_hash_ignores_the_solution_and_verifier_version_tracks_tests(hello: Path) -> None:
    before = read_one(hello)
    (hello / "solution" / "solve.sh").write_text("#!/bin/bash\necho other\n")
    assert read_one(hello).source == before.source
    (hello / "tests" / "test.sh").write_text("#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n")
    after_tests = read_one(hello)
    assert after_tests.evaluation.version != before.evaluation.version  # type: ignore[union-attr]
    assert after_tests.source != before.source
    set_toml(hello, (GOOD / "hello" / "task.toml").read_text().replace("60.0", "61.0"))
    after_verifier = read_one(hello)
    assert after_verifier.evaluation.version != after_tests.evaluation.version  # type: ignore[union-attr]


# --------------------------------------------------------------------------- workdir


@pytest.mark.parametrize(
    ("dockerfile", "want"),
    [
        ("FROM x\nWORKDIR /app\n", "/app"),
        ("FROM x\nWORKDIR /app\nWORKDIR src\n", "/app/src"),
        ("from x\nworkdir \\\n  /continued\n", "/continued"),
        ('FROM x\n# WORKDIR /commented\nWORKDIR "/quoted"\n', "/quoted"),
        ("FROM x\nWORKDIR $HOME/app\n", None),
        ("FROM x AS build\nWORKDIR /build\nFROM y\n", None),
        ("FROM x AS base\nWORKDIR /base\nFROM base\nRUN true\n", "/base"),
        ("FROM --platform=linux/amd64 x AS base\nWORKDIR /b\nFROM base AS final\n", "/b"),
    ],
)
def test_dockerfile_workdir(dockerfile: str, want: str | None) -> None:
    assert dockerfile_workdir(dockerfile) == want


# --------------------------------------------------------------------------- oracle


async def test_oracle_gets_the_solution_and_runs_it(hello: Path) -> None:
    set_toml(hello, '[solution]\nenv = { GREETING = "${GREETING:-hi}" }\n')
    (hello / "solution" / "data.bin").write_bytes(b"\x00\xff")
    task = read_one(hello, options("oracle", env_allow=["GREETING"]))
    files = task.harness.config["solution_files"]
    assert sorted((f["path"], f["mode"]) for f in files) == [
        ("/solution/data.bin", 0o644),
        ("/solution/solve.sh", 0o755),
    ]
    assert task.harness.config["solution_env"] == {"GREETING": "hi"}
    # The tests stay hidden from the oracle's phase too: they come with the evaluation.
    assert all(not f["path"].startswith("/tests") for f in files)

    harness = OracleHarness(task.harness.config)
    sandbox = FakeSandbox()
    await harness.setup(sandbox, make_ctx(workdir="/app"))
    assert sandbox.files["/solution/data.bin"] == b"\x00\xff"
    assert sandbox.files["/solution/solve.sh"] == (hello / "solution" / "solve.sh").read_bytes()
    assert harness.command(make_ctx()) == ["bash", "/solution/solve.sh"]
    assert harness.env["GREETING"] == "hi"
    assert harness.harness_version.startswith("oracle-")


def test_oracle_needs_a_solution(hello: Path) -> None:
    (hello / "solution" / "solve.sh").unlink()
    assert refusal(hello, options("oracle"))[0] == "solution/solve.sh"
    assert read_one(hello).harness.name == "command"  # other harnesses never need it


async def test_oracle_without_a_loaded_solution_fails_setup() -> None:
    with pytest.raises(HarnessSetupError, match=r"solve\.sh"):
        await OracleHarness({}).setup(FakeSandbox(), make_ctx())
    with pytest.raises(ValueError, match="under /solution"):
        OracleHarness({"solution_files": [{"path": "/etc/x", "content": ""}]})


def test_task_round_trips_as_json() -> None:
    """What travels to the workers (Temporal payloads are JSON) comes back the same."""
    for task in load_task_source(GOOD, options("oracle")).tasks:
        again = RolloutTask.model_validate(json.loads(task.model_dump_json()))
        assert again == task
