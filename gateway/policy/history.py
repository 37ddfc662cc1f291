"""The policy-update history: one JSONL file on the data dir that every gateway process
shares, so each one (and a restarted one) knows what the engines serve.

Why durable: a restarted process takes the version it labels calls with from here, so an
entry that the OS still held in memory when the machine died would relabel calls with a
version the engines no longer serve. Each entry is one `write` on an `O_APPEND` file,
fsynced (the directory too when the file is created), under an exclusive `flock` shared
by the processes. A crash mid-write leaves a last line without its newline: `repair`
drops it at start (and says so in the log) instead of failing the start; readers skip
an unterminated last line, which may be another process's append in progress.
"""

import contextlib
import fcntl
import logging
import os
from collections.abc import Iterator
from pathlib import Path

from pydantic import ValidationError

from schemas.policy import PolicyUpdateRecord

log = logging.getLogger("rollout.gateway")

HISTORY_FILE = "policy_history.jsonl"


class PolicyHistory:
    """Append, read and repair `policy_history.jsonl` in `data_dir`."""

    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / HISTORY_FILE

    @contextlib.contextmanager
    def _locked(self, flags: int) -> Iterator[int]:
        fd = os.open(self.path, flags | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield fd
        finally:
            os.close(fd)  # releases the lock

    def repair(self) -> int:
        """Drop a torn last line (no newline: a crash mid-write); the bytes dropped."""
        if not self.path.exists():
            return 0
        with self._locked(os.O_RDWR) as fd:
            size = os.fstat(fd).st_size
            data = os.pread(fd, size, 0)
            keep = data.rfind(b"\n") + 1
            if keep == size:
                return 0
            os.ftruncate(fd, keep)
            os.fsync(fd)
        torn = data[keep:]
        log.warning(
            "%s: dropped a torn last line of %d bytes (a crash mid-write): %r",
            self.path,
            len(torn),
            torn[:200],
        )
        return len(torn)

    def append(self, record: PolicyUpdateRecord) -> None:
        """One entry, on disk when this returns (OSError when it cannot be)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        created = not self.path.exists()
        line = (record.model_dump_json() + "\n").encode()
        with self._locked(os.O_WRONLY | os.O_APPEND | os.O_CREAT) as fd:
            written = os.write(fd, line)
            if written != len(line):
                raise OSError(f"short write to {self.path}: {written} of {len(line)} bytes")
            os.fsync(fd)
        if created:
            dir_fd = os.open(self.path.parent, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)

    def read(self) -> list[PolicyUpdateRecord]:
        """Every complete entry, oldest first; a damaged line is skipped and logged."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return []
        records: list[PolicyUpdateRecord] = []
        lines = data.split(b"\n")
        for number, line in enumerate(lines[:-1], 1):  # the last piece has no newline
            if not line.strip():
                continue
            try:
                records.append(PolicyUpdateRecord.model_validate_json(line))
            except ValidationError as exc:
                log.error("%s line %d is damaged, skipped: %s", self.path, number, exc)
        return records
