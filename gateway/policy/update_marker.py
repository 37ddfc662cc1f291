"""An update in progress, on disk: what a gateway process restarted in its middle knows.

A process that coordinates a policy update (`update`) or holds the policy for a
trainer's own sync (`external_sync`) marks it on the shared data dir before it pauses
anyone, and removes the mark once the history has the update's entry. Killed in
between, it leaves the mark: the engines may have begun to load the checkpoint, or the
trainer may still be moving weights into them, so the history's last version is no
longer known to be what they serve. The restarted process finds its own mark, labels
every engine `unknown` (its calls are never taken for a policy's samples) and records
the update as failed, instead of labelling calls with a version that may not be true.

One mark per process, named by the process's own address (`GatewayOptions.public_url`,
the same across its restarts); the other processes' marks are theirs.
"""

from __future__ import annotations

import hashlib
import logging
import os
from datetime import datetime
from pathlib import Path
from typing import Literal

from pydantic import ValidationError

from schemas.base import StrictModel

log = logging.getLogger("rollout.gateway")

MARKS_DIR = "policy_updates_running"


class UpdateMark(StrictModel):
    """The update a process was running."""

    update_id: str
    kind: Literal["checkpoint", "external"]
    policy_version: str | None
    checkpoint: str | None
    previous_version: str | None
    started_at: datetime


class UpdateMarker:
    """The mark of one process (`owner`: its own address) in `data_dir`."""

    def __init__(self, data_dir: Path, owner: str) -> None:
        name = hashlib.sha256(owner.encode()).hexdigest()[:16]
        self.path = data_dir / MARKS_DIR / f"{name}.json"

    def begin(self, mark: UpdateMark) -> None:
        """On disk when this returns (an update must not start unmarked)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            os.write(fd, mark.model_dump_json().encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)
        dir_fd = os.open(self.path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)

    def end(self) -> None:
        self.path.unlink(missing_ok=True)

    def left(self) -> UpdateMark | None:
        """The mark a killed run of this process left, if any (an unreadable one: an
        update of unknown version)."""
        try:
            text = self.path.read_bytes()
        except FileNotFoundError:
            return None
        try:
            return UpdateMark.model_validate_json(text)
        except ValidationError as exc:
            log.error("%s: unreadable update mark (%s); taken as an unknown update", self.path, exc)
            return UpdateMark(
                update_id="unknown",
                kind="checkpoint",
                policy_version=None,
                checkpoint=None,
                previous_version=None,
                started_at=datetime.fromtimestamp(self.path.stat().st_mtime).astimezone(),
            )
