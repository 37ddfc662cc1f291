"""What a task puts into a sandbox's workspace: files and a repository at a commit.

Shared by the task contract (hidden evaluation files, the task's repo) and the sandbox
backends that materialise them, so both validate the same fields the same way.
"""

from __future__ import annotations

import base64
import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, field_validator

_COMMIT_RE = re.compile(r"^[0-9a-f]{40}([0-9a-f]{24})?$")


def full_commit(value: str, field: str = "repo.commit") -> str:
    """`value` lower-cased if it is a full commit hash (immutable), else a ValueError."""
    v = value.strip().lower()
    if not _COMMIT_RE.match(v):
        raise ValueError(f"{field} must be a full commit hash (immutable), not a ref")
    return v


def absolute_dir(value: str, field: str) -> str:
    """`value` without trailing slashes if it is an absolute path, else a ValueError."""
    if not value.startswith("/"):
        raise ValueError(f"{field} must be absolute, got {value!r}")
    return value.rstrip("/") or "/"


class SandboxFile(BaseModel):
    """A file to place in the sandbox (at create time, or before evaluation)."""

    model_config = ConfigDict(extra="forbid")

    path: str
    content: str
    encoding: Literal["utf-8", "base64"] = "utf-8"
    mode: int = 0o644

    def data(self) -> bytes:
        if self.encoding == "base64":
            return base64.b64decode(self.content)
        return self.content.encode("utf-8")

    @classmethod
    def from_bytes(cls, path: str, data: bytes, mode: int = 0o644) -> SandboxFile:
        return cls(path=path, content=base64.b64encode(data).decode(), encoding="base64", mode=mode)


class RepoSpec(BaseModel):
    """A git repository checked out at an immutable commit.

    Cloned host-side (the sandbox has no network) and copied in, so `url` may be a
    local path or any URL the *host* can fetch.
    """

    model_config = ConfigDict(extra="forbid")

    url: str
    commit: str
    path: str = "/workspace/repo"

    @field_validator("commit")
    @classmethod
    def _immutable(cls, v: str) -> str:
        return full_commit(v)
