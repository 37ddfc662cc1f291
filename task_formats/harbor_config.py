"""A Harbor task's `task.toml` (schema 1.x) as pydantic models, read with `tomllib`.

Harbor itself needs Python >= 3.12, so we read its format rather than import it. The
models are strict: a key we do not know, or a value of the wrong type, refuses the task
naming the field, because a setting we silently dropped (a resource, a network rule)
would change what the task means. Field names and defaults are Harbor's; the older
top-level `version` key is read as `schema_version`, and the deprecated `memory` /
`storage` size strings ("4G") and `allow_internet` are read as Harbor reads them.
What we cannot honour (GPUs, Windows, MCP servers, healthchecks…) is refused by the
loader (`task_formats/harbor.py`), not here.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from schemas.environment import NetworkMode


class _Section(BaseModel):
    #: strict: TOML is typed, so "2" for a number is a mistake, not something to coerce.
    model_config = ConfigDict(extra="forbid", strict=True)


class HarborAuthor(_Section):
    name: str
    email: str | None = None


class HarborTaskInfo(_Section):
    """`[task]`: the package name ("org/name") and what describes it."""

    name: str = Field(min_length=1)
    description: str = ""
    authors: list[HarborAuthor] = Field(default_factory=list)
    keywords: list[str] = Field(default_factory=list)


class HarborAgent(_Section):
    """`[agent]`: the agent phase (its time limit and network override)."""

    timeout_sec: float | None = Field(default=None, gt=0)
    user: str | int | None = None
    network_mode: NetworkMode | None = None
    allowed_hosts: list[str] = Field(default_factory=list)


class HarborVerifier(_Section):
    """`[verifier]`: how `tests/test.sh` runs."""

    timeout_sec: float = Field(default=600.0, gt=0)
    env: dict[str, str] = Field(default_factory=dict)
    user: str | int | None = None
    network_mode: NetworkMode | None = None
    allowed_hosts: list[str] = Field(default_factory=list)


class HarborHealthcheck(_Section):
    """`[environment.healthcheck]`: Docker-HEALTHCHECK-like readiness probe."""

    command: str
    interval_sec: float = 5.0
    timeout_sec: float = 30.0
    start_period_sec: float = 0.0
    start_interval_sec: float = 5.0
    retries: int = 3


class HarborEnvironment(_Section):
    """`[environment]`: the container the agent works in."""

    build_timeout_sec: float = Field(default=600.0, gt=0)
    docker_image: str | None = Field(default=None, min_length=1)
    os: Literal["linux", "windows"] = "linux"
    #: Resources: none is injected when omitted (the backend's default applies).
    cpus: float | None = Field(default=None, gt=0)
    memory_mb: int | None = Field(default=None, gt=0)
    storage_mb: int | None = Field(default=None, gt=0)
    #: Deprecated size strings ("4G", "512M"), read into memory_mb / storage_mb.
    memory: str | None = None
    storage: str | None = None
    gpus: int = Field(default=0, ge=0)
    gpu_types: list[str] | None = None
    #: Deprecated: false means no network when `network_mode` is not given.
    allow_internet: bool = True
    network_mode: NetworkMode | None = None
    allowed_hosts: list[str] = Field(default_factory=list)
    #: Values may use `${VAR}` / `${VAR:-default}`, resolved from the loading process's
    #: environment for the variables the run allows (`LoadOptions.env_allow`).
    env: dict[str, str] = Field(default_factory=dict)
    workdir: str | None = Field(default=None, min_length=1)
    healthcheck: HarborHealthcheck | None = None
    mcp_servers: list[dict[str, Any]] = Field(default_factory=list)
    skills_dir: str | None = None


class HarborSolution(_Section):
    """`[solution]`: the env of `solution/solve.sh` (the oracle)."""

    env: dict[str, str] = Field(default_factory=dict)


class HarborTaskConfig(_Section):
    """One `task.toml`."""

    schema_version: str = "1.0"
    task: HarborTaskInfo | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    verifier: HarborVerifier = Field(default_factory=HarborVerifier)
    agent: HarborAgent = Field(default_factory=HarborAgent)
    environment: HarborEnvironment = Field(default_factory=HarborEnvironment)
    solution: HarborSolution = Field(default_factory=HarborSolution)
    source: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _old_version_key(cls, data: Any) -> Any:
        """Schema 1.0 wrote `version = "1.0"` at the top; later ones `schema_version`."""
        if isinstance(data, dict) and "version" in data:
            data = dict(data)
            old = data.pop("version")
            data.setdefault("schema_version", old)
        return data

    @field_validator("schema_version")
    @classmethod
    def _schema_1x(cls, v: str) -> str:
        if v.split(".", 1)[0] != "1":
            raise ValueError(f"schema_version {v!r}: only Harbor task schema 1.x is read")
        return v


def size_to_mb(text: str) -> int:
    """Harbor's deprecated size strings ("4G", "512M", "2048K") in MB; ValueError else."""
    value = text.strip().upper()
    factors = {"G": 1024.0, "M": 1.0, "K": 1 / 1024}
    if not value or value[-1] not in factors:
        raise ValueError(f"size {text!r} must be a number with G, M or K (e.g. '4G')")
    try:
        number = float(value[:-1])
    except ValueError:
        raise ValueError(f"size {text!r} must be a number with G, M or K (e.g. '4G')") from None
    return int(number * factors[value[-1]])
