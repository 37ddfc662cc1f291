"""What every task format offers: `TaskFormat`, its options and its result.

A format reads a path and returns the tasks it could read plus one `RefusedTask` per
task it could not, naming the task and the field: one bad task never stops the rest
of a dataset, and nothing is refused silently.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal, Protocol

from pydantic import Field, field_validator

from schemas.base import StrictModel
from schemas.environment import BuildNetwork
from schemas.evaluation import RewardRange
from schemas.tasks import HarnessSpec, RolloutTask

#: What to do with a task that asks for the public network (Harbor's default).
PublicNetwork = Literal["no-network", "allow", "refuse"]
_VAR_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class LoadOptions(StrictModel):
    """What the run chooses for a dataset whose tasks do not say it themselves."""

    #: The agent: the dataset formats name none (our JSONL tasks carry their own).
    harness: HarnessSpec | None = None
    #: Sandbox backend for the dataset's tasks.
    backend: str = Field(default="docker", min_length=1)
    #: Base images that cannot be pulled here → local tags (`ubuntu:24.04=my/ubuntu:24.04`).
    image_map: dict[str, str] = Field(default_factory=dict)
    #: A task asking for the public network: run it without (`no-network`, noted in the
    #: task's metadata), give it (`allow`, the operator's decision) or refuse it.
    public_network: PublicNetwork = "no-network"
    #: The network a task's Dockerfile build gets (`docker build --network`).
    build_network: BuildNetwork = "none"
    #: Variables of the loading process's environment a dataset may read (Harbor's
    #: `${VAR}` in env values); a task naming any other is refused.
    env_allow: list[str] = Field(default_factory=list)
    #: Format-specific settings (e.g. the SWE-bench image template), validated by the format.
    format_options: dict[str, Any] = Field(default_factory=dict)
    #: Harbor: the closed range every reward of the dataset lies in; a verifier's reward
    #: outside it is the agent's failure (`RewardFileCheck.reward_range`).
    reward_range: RewardRange = (0.0, 1.0)

    @field_validator("env_allow")
    @classmethod
    def _variable_names(cls, v: list[str]) -> list[str]:
        for name in v:
            if not _VAR_NAME.match(name):
                raise ValueError(f"env_allow: {name!r} is not a variable name")
        return sorted(set(v))


class RefusedTask(StrictModel):
    """A task that was not read, and why, in words that name the task and the field."""

    source: str = Field(description="the task directory, or file:line / instance id")
    field: str | None = Field(default=None, description="the offending field or file")
    reason: str

    def __str__(self) -> str:
        where = f" ({self.field})" if self.field else ""
        return f"{self.source}{where}: {self.reason}"


class LoadedTasks(StrictModel):
    """The tasks a source gave, and the ones it refused."""

    tasks: list[RolloutTask] = Field(default_factory=list)
    refused: list[RefusedTask] = Field(default_factory=list)


class TaskFormat(Protocol):
    """One dataset format: recognise a path, read it."""

    name: str

    def detect(self, path: Path) -> bool:
        """Whether `path` looks like this format (used when the run names none)."""
        ...

    def load(self, path: Path, options: LoadOptions) -> LoadedTasks:
        """Every task under `path`; bad ones go to `refused`, never raise for one task.

        Raises ValueError only when `path` as a whole cannot be read as this format.
        """
        ...
