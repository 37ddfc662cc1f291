"""How a task's environment is made and what network it may reach.

Two contracts a dataset's task brings with it (a Harbor task's `[environment]`, a
SWE-bench instance's image) that are not files in the workspace: a Dockerfile the
sandbox host builds into the image the agent runs in, and the network policy of the
sandbox. They live with the task so a malformed one is refused when the task is read.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator

from schemas.base import StrictModel

#: `sha256:` plus 64 hex digits: the cache key of a build.
_CONTENT_HASH_RE = re.compile(r"^sha256:[0-9a-f]{64}$")


class EnvironmentBuild(StrictModel):
    """A Dockerfile the sandbox host builds into the task's image before provisioning.

    The build is cached by `content_hash` (every file of the context, the Dockerfile and
    the base-image map), so the same environment is built once per host however many
    tasks share it. `context` is a path on the sandbox hosts (a local run, or a dataset
    on storage every host mounts).
    """

    context: str = Field(min_length=1, description="absolute path of the build context")
    dockerfile: str = Field(default="Dockerfile", min_length=1, description="relative to context")
    content_hash: str = Field(description="sha256:<hex> of the context and the Dockerfile")
    timeout_s: float = Field(default=600.0, gt=0, description="the build's time limit")
    #: Base images that cannot be pulled here, resolved to local tags (`FROM` rewritten).
    base_image_map: dict[str, str] = Field(default_factory=dict)

    @field_validator("content_hash")
    @classmethod
    def _is_sha256(cls, v: str) -> str:
        if not _CONTENT_HASH_RE.match(v):
            raise ValueError("content_hash must be 'sha256:' followed by 64 hex digits")
        return v

    @field_validator("context")
    @classmethod
    def _absolute(cls, v: str) -> str:
        if not v.startswith("/"):
            raise ValueError(f"build context {v!r} must be an absolute path")
        return v


NetworkMode = Literal["no-network", "allowlist", "public"]


class NetworkPolicy(StrictModel):
    """What the sandbox may reach besides its Gateway session (always reachable).

    `no-network`: nothing else. `allowlist`: only `allowed_hosts` (`host` or
    `host:port`). `public`: anything, and only when the operator allowed it.
    """

    mode: NetworkMode = "no-network"
    allowed_hosts: list[str] = Field(default_factory=list)
