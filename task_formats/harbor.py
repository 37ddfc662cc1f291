"""Harbor task directories as rollout tasks.

A Harbor task is a directory: `task.toml`, `instruction.md` (the prompt),
`environment/Dockerfile` (or `[environment].docker_image`), `tests/test.sh` (the
verifier, which writes `/logs/verifier/reward.json` or `reward.txt`) and an optional
`solution/solve.sh`. A dataset is a directory of such directories. Each becomes one
`RolloutTask`; a task we cannot run as its author meant is refused naming the field,
and the rest of the dataset is read. See docs/tasks.md, "Bring your dataset".

What the agent never sees: `tests/` arrives only for the evaluation (the evaluation's
hidden files), `solution/` only when the harness is the oracle (its config).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from schemas.environment import EnvironmentBuild, NetworkPolicy
from schemas.evaluation import SCORING_VERSION, EvaluationSpec, RewardFileCheck
from schemas.tasks import TASK_ID_MAX, RolloutBudget, RolloutTask, SandboxRequest, TaskSource
from schemas.workspace import SandboxFile
from task_formats.base import LoadedTasks, LoadOptions, RefusedTask
from task_formats.content_hash import hash_tree
from task_formats.harbor_config import HarborTaskConfig, size_to_mb
from task_formats.harbor_environment import (
    TaskRefusal,
    agent_network,
    dockerfile_workdir,
    resolve_env,
    verifier_network,
)

TASK_FILE = "task.toml"
#: The harness that runs the task's own solution instead of an agent.
ORACLE = "oracle"
#: tests/ (and, for the oracle, solution/) travel inside the task, which is a Temporal
#: payload (a few MB at most): a bigger directory is refused rather than failing later.
MAX_INLINE_BYTES = 1 << 20
_COMPOSE_FILES = ("docker-compose.yaml", "docker-compose.yml", "compose.yaml", "compose.yml")
_UNSAFE_ID_CHARS = re.compile(r"[^A-Za-z0-9._:-]+")


def is_task_dir(path: Path) -> bool:
    return path.is_dir() and (path / TASK_FILE).is_file()


def task_id_for(dir_name: str) -> str:
    """The directory name made a safe task id (other characters become '-')."""
    cleaned = _UNSAFE_ID_CHARS.sub("-", dir_name).lstrip("._:-")
    return cleaned[:TASK_ID_MAX]


def _config(task_dir: Path) -> HarborTaskConfig:
    try:
        raw = tomllib.loads((task_dir / TASK_FILE).read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise TaskRefusal(TASK_FILE, f"not valid TOML: {exc}") from None
    try:
        return HarborTaskConfig.model_validate(raw)
    except ValidationError as exc:
        errors = exc.errors()
        first = errors[0]
        field = ".".join(str(p) for p in first["loc"]) or TASK_FILE
        more = f" (and {len(errors) - 1} more problem(s))" if len(errors) > 1 else ""
        if first["type"] == "extra_forbidden":
            reason = "unknown key: not part of Harbor's task.toml schema 1.x as we read it"
        else:
            reason = first["msg"]
        raise TaskRefusal(field, reason + more) from None


def _inline_files(root: Path, place_at: str, label: str) -> list[SandboxFile]:
    """Every file under `root` as a file placed at `place_at/<relative path>`, bytes
    as they are (base64) and the executable bit kept."""
    files: list[SandboxFile] = []
    total = 0
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            path = Path(dirpath) / name
            rel = path.relative_to(root).as_posix()
            st = path.lstat()
            if not stat.S_ISREG(st.st_mode):
                raise TaskRefusal(
                    f"{label}/{rel}", "only regular files can be placed (no symlinks or devices)"
                )
            total += st.st_size
            if total > MAX_INLINE_BYTES:
                raise TaskRefusal(
                    f"{label}/",
                    f"more than {MAX_INLINE_BYTES // 1024} KiB: it travels inside the task; "
                    "move large data into the environment image",
                )
            mode = 0o755 if st.st_mode & 0o111 else 0o644
            files.append(SandboxFile.from_bytes(f"{place_at}/{rel}", path.read_bytes(), mode=mode))
    return files


def _prompt(task_dir: Path) -> str:
    path = task_dir / "instruction.md"
    if not path.is_file():
        raise TaskRefusal("instruction.md", "missing: it is the agent's prompt")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise TaskRefusal("instruction.md", "not UTF-8 text") from None
    if not text.strip():
        raise TaskRefusal("instruction.md", "empty: it is the agent's prompt")
    return text


def _refuse_unsupported(task_dir: Path, cfg: HarborTaskConfig) -> None:
    env = cfg.environment
    if (task_dir / "steps").is_dir():
        raise TaskRefusal("steps/", "multi-step Harbor tasks are not supported")
    if env.os == "windows":
        raise TaskRefusal("environment.os", "Windows tasks are not supported (Linux sandboxes)")
    if env.gpus > 0:
        raise TaskRefusal("environment.gpus", f"asks for {env.gpus} GPU(s); sandboxes have none")
    if env.mcp_servers:
        raise TaskRefusal("environment.mcp_servers", "MCP servers are not supported")
    if env.skills_dir is not None:
        raise TaskRefusal("environment.skills_dir", "agent skills are not supported")
    if env.healthcheck is not None:
        raise TaskRefusal(
            "environment.healthcheck",
            "not supported: the sandbox does not start the image's own services "
            "(CMD/ENTRYPOINT), which a healthcheck waits for",
        )
    for name in _COMPOSE_FILES:
        if (task_dir / "environment" / name).is_file():
            raise TaskRefusal(
                f"environment/{name}", "multi-container (Docker Compose) tasks are not supported"
            )


def _size(field: str, text: str | None, default: int | None) -> int | None:
    if text is None:
        return default
    try:
        return size_to_mb(text)
    except ValueError as exc:
        raise TaskRefusal(field, str(exc)) from None


def _resources(cfg: HarborTaskConfig) -> dict[str, Any]:
    """Only what the task gives (the backend's defaults apply to the rest)."""
    env = cfg.environment
    given = {
        "cpus": env.cpus,
        "memory_mb": _size("environment.memory", env.memory, env.memory_mb),
        "disk_mb": _size("environment.storage", env.storage, env.storage_mb),
    }
    return {k: v for k, v in given.items() if v is not None}


def _budget(cfg: HarborTaskConfig, agent_s: float) -> RolloutBudget:
    """Room for the build, the agent's time and the verifier's, never less than ours."""
    default = RolloutBudget()
    verifier_s = cfg.verifier.timeout_sec
    provision_s = max(default.provision_s, cfg.environment.build_timeout_sec + 300)
    return RolloutBudget(
        provision_s=provision_s,
        grace_s=max(default.grace_s, verifier_s + 60),
        hooks_s=max(default.hooks_s, verifier_s + 60),
        total_s=max(default.total_s, provision_s + agent_s + 300),
    )


class HarborFormat:
    """`TaskFormat` for a Harbor task directory or a directory of them."""

    name = "harbor"

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        #: Where `${VAR}` in env values comes from (default: this process's environment),
        #: for the variables `LoadOptions.env_allow` names.
        self.environ = environ

    def detect(self, path: Path) -> bool:
        if is_task_dir(path):
            return True
        return path.is_dir() and any(is_task_dir(child) for child in path.iterdir())

    def load(self, path: Path, options: LoadOptions) -> LoadedTasks:
        if options.harness is None:
            raise ValueError(
                f"{path}: Harbor tasks name no agent; choose one (--harness NAME, "
                "or LoadOptions.harness)"
            )
        path = path.resolve()
        if is_task_dir(path):
            candidates = [path]
        elif path.is_dir():
            candidates = sorted(p for p in path.iterdir() if p.is_dir())
        else:
            raise ValueError(f"{path}: not a Harbor task directory (no {TASK_FILE})")
        loaded = LoadedTasks()
        seen: dict[str, Path] = {}
        for task_dir in candidates:
            if task_dir.name.startswith("."):
                continue
            if not is_task_dir(task_dir):
                loaded.refused.append(
                    RefusedTask(
                        source=str(task_dir),
                        field=TASK_FILE,
                        reason="not a Harbor task directory: no task.toml",
                    )
                )
                continue
            try:
                task = self.read_task(task_dir, options)
                if task.task_id in seen:
                    raise TaskRefusal(
                        "task directory name",
                        f"task id {task.task_id!r} is already taken by {seen[task.task_id]}",
                    )
            except TaskRefusal as refusal:
                loaded.refused.append(
                    RefusedTask(source=str(task_dir), field=refusal.field, reason=refusal.reason)
                )
                continue
            seen[task.task_id] = task_dir
            loaded.tasks.append(task)
        if not loaded.tasks and not loaded.refused:
            raise ValueError(f"{path}: no Harbor task directories (none holds {TASK_FILE})")
        return loaded

    def read_task(self, task_dir: Path, options: LoadOptions) -> RolloutTask:
        """One task directory as a task; `TaskRefusal` names what is wrong."""
        assert options.harness is not None
        host_env = os.environ if self.environ is None else self.environ
        task_id = task_id_for(task_dir.name)
        if not task_id:
            raise TaskRefusal("task directory name", "has no letter or digit to make a task id")
        cfg = self._config_checked(task_dir)
        prompt = _prompt(task_dir)
        if not (task_dir / "tests" / "test.sh").is_file():
            raise TaskRefusal("tests/test.sh", "missing: it is the task's verifier")

        env = cfg.environment
        allowed = options.env_allow
        env_vars = resolve_env(env.env, host_env, allowed, "environment.env")
        verifier_env = resolve_env(cfg.verifier.env, host_env, allowed, "verifier.env")
        network, downgraded = agent_network(env, cfg.agent, options.public_network)
        verifier_policy = verifier_network(cfg.verifier)

        env_dir = task_dir / "environment"
        dockerfile = env_dir / "Dockerfile"
        build: EnvironmentBuild | None = None
        image: str | None = None
        workdir = env.workdir
        if env.docker_image:
            image = options.image_map.get(env.docker_image, env.docker_image)
        elif dockerfile.is_file():
            build = EnvironmentBuild(
                context=str(env_dir),
                dockerfile="Dockerfile",
                content_hash=hash_tree(env_dir, extra={"base_image_map": options.image_map}),
                timeout_s=env.build_timeout_sec,
                base_image_map=dict(options.image_map),
                network=options.build_network,
            )
            if workdir is None:
                workdir = dockerfile_workdir(
                    dockerfile.read_text(encoding="utf-8", errors="replace")
                )
        else:
            raise TaskRefusal(
                "environment/Dockerfile",
                "no environment: neither environment/Dockerfile nor [environment].docker_image",
            )

        tests = _inline_files(task_dir / "tests", "/tests", "tests")
        verifier_dump = cfg.verifier.model_dump(mode="json") | {"env": verifier_env}
        tests_hash = hash_tree(task_dir / "tests")
        scoring = {"reward_range": options.reward_range, "rules": SCORING_VERSION}
        blob = json.dumps(
            {"tests": tests_hash, "verifier": verifier_dump, "scoring": scoring}, sort_keys=True
        )
        evaluation = EvaluationSpec(
            checks=[
                RewardFileCheck(
                    name="harbor-verifier",
                    timeout_s=cfg.verifier.timeout_sec,
                    env=verifier_env,
                    user=None if cfg.verifier.user is None else str(cfg.verifier.user),
                    cwd=workdir,
                    reward_range=options.reward_range,
                )
            ],
            files=tests,
            # The verifier's reward is the reward (Harbor rewards need not be 0/1).
            aggregate="sum",
            version=f"harbor-{hashlib.sha256(blob.encode()).hexdigest()[:16]}",
        )

        harness = options.harness.model_copy(deep=True)
        if cfg.agent.timeout_sec is not None:
            harness.budget_s = cfg.agent.timeout_sec
        if harness.name == ORACLE:
            oracle = self._oracle_config(task_dir, cfg, host_env, options.env_allow)
            harness.config = {**harness.config, **oracle}

        sandbox: dict[str, Any] = {
            "backend": options.backend,
            "image": image,
            "build": build,
            "env": env_vars,
            "resources": _resources(cfg),
            "network": network.model_dump(mode="json"),
        }
        if workdir is not None:
            sandbox["workdir"] = workdir
        metadata: dict[str, Any] = {"harbor": self._metadata(cfg, verifier_policy)}
        if downgraded:
            metadata["network_downgraded"] = downgraded
        return RolloutTask(
            task_id=task_id,
            prompt=prompt,
            harness=harness,
            sandbox=SandboxRequest.model_validate(sandbox),
            evaluation=evaluation,
            budget=_budget(cfg, harness.budget_s),
            metadata=metadata,
            source=TaskSource(
                format=self.name,
                ref=str(task_dir),
                content_hash=hash_tree(task_dir, exclude=("solution",)),
            ),
        )

    def _config_checked(self, task_dir: Path) -> HarborTaskConfig:
        cfg = _config(task_dir)
        _refuse_unsupported(task_dir, cfg)
        return cfg

    @staticmethod
    def _oracle_config(
        task_dir: Path, cfg: HarborTaskConfig, host_env: Mapping[str, str], allowed: list[str]
    ) -> dict[str, Any]:
        if not (task_dir / "solution" / "solve.sh").is_file():
            raise TaskRefusal("solution/solve.sh", "missing: the oracle harness runs it")
        files = _inline_files(task_dir / "solution", "/solution", "solution")
        return {
            "solution_files": [f.model_dump(mode="json") for f in files],
            "solution_env": resolve_env(cfg.solution.env, host_env, allowed, "solution.env"),
        }

    @staticmethod
    def _metadata(cfg: HarborTaskConfig, verifier_policy: NetworkPolicy | None) -> dict[str, Any]:
        """What Harbor says about the task that we keep but do not act on."""
        info: dict[str, Any] = {"schema_version": cfg.schema_version}
        if cfg.task is not None:
            info["task"] = cfg.task.model_dump(mode="json")
        if cfg.metadata:
            # TOML has dates and times; the task travels as JSON.
            info["metadata"] = json.loads(json.dumps(cfg.metadata, default=str))
        if cfg.source is not None:
            info["source"] = cfg.source
        if cfg.agent.user is not None:
            info["agent_user"] = str(cfg.agent.user)
        if verifier_policy is not None:
            info["verifier_network"] = verifier_policy.model_dump(mode="json")
        return info
