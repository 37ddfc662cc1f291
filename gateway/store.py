"""Durable per-session capture: every call is appended to disk the moment it completes.

Layout under `--data-dir`: `sessions/<session_id>/meta.json` (config, token hash, engine,
template version) and `records.jsonl` (segment openings and calls, in order), plus a
`closed` marker. A crash loses at most the calls in flight; a restarted gateway rebuilds
any trajectory from these files alone.
"""

import json
import os
import secrets
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from schemas.session import SessionConfig
from schemas.trajectory import RecordedCall


class SessionMeta(BaseModel):
    model_config = ConfigDict(extra="forbid")

    session_id: str
    config: SessionConfig
    token_sha256: str
    engine_url: str
    prompt_template_version: str
    created_at: datetime
    owner_url: str | None = None


class SegmentOpened(BaseModel):
    """A new segment and its place in the tree, written before its first call."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["segment"] = "segment"
    segment_id: str
    parent_id: str | None = None
    link: Literal["continues", "spawned_by"] | None = None
    scene: str


class PromptRef(BaseModel):
    """On disk, a call's prompt may start with the first `length` tokens of an earlier
    call's prompt+output; only the rest is written (see `SessionStore.load_records`)."""

    model_config = ConfigDict(extra="forbid")

    call_id: str
    length: int = Field(ge=0)


class CallRecord(BaseModel):
    """A finished call plus what the agent sent, raw and normalized."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["call"] = "call"
    call: RecordedCall
    request: dict[str, Any] = Field(default_factory=dict)
    normalized: dict[str, Any] = Field(default_factory=dict)
    prompt_ref: PromptRef | None = None


Record = SegmentOpened | CallRecord


class SessionStore:
    """Append-only files per session. Thread-safe; writes are flushed per record."""

    def __init__(self, data_dir: Path, fsync: bool = False) -> None:
        self.root = Path(data_dir) / "sessions"
        self.root.mkdir(parents=True, exist_ok=True)
        self._fsync = fsync
        self._lock = threading.Lock()

    def _dir(self, session_id: str) -> Path:
        if not session_id or "/" in session_id or session_id.startswith("."):
            raise ValueError(f"invalid session id {session_id!r}")
        return self.root / session_id

    def secret(self) -> bytes:
        """This data dir's key for deriving idempotent session identities; created once,
        shared by every gateway process on the dir, readable only by its owner."""
        path = self.root.parent / "gateway.secret"
        if not path.exists():
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as fh:
                fh.write(secrets.token_bytes(32))
            try:
                os.link(tmp, path)  # atomic: the first process to link wins
            except FileExistsError:
                pass
            finally:
                tmp.unlink()
        return path.read_bytes()

    def create(self, meta: SessionMeta) -> None:
        path = self._dir(meta.session_id)
        path.mkdir(parents=True, exist_ok=False)
        tmp = path / "meta.json.tmp"
        tmp.write_text(meta.model_dump_json())
        tmp.replace(path / "meta.json")
        (path / "records.jsonl").touch()

    def append(self, session_id: str, record: Record) -> None:
        line = record.model_dump_json() + "\n"
        with self._lock, open(self._dir(session_id) / "records.jsonl", "a") as fh:
            fh.write(line)
            fh.flush()
            if self._fsync:
                os.fsync(fh.fileno())

    def mark_closed(self, session_id: str) -> None:
        marker = self._dir(session_id) / "closed"
        if not marker.exists():
            marker.write_text(datetime.now(UTC).isoformat())

    def exists(self, session_id: str) -> bool:
        try:
            return (self._dir(session_id) / "meta.json").is_file()
        except ValueError:
            return False

    def is_closed(self, session_id: str) -> bool:
        return (self._dir(session_id) / "closed").exists()

    def load_meta(self, session_id: str) -> SessionMeta:
        return SessionMeta.model_validate_json((self._dir(session_id) / "meta.json").read_text())

    def load_records(self, session_id: str) -> list[Record]:
        """Read back every complete record; a torn last line (crash mid-write) is ignored.

        Prompt references are expanded, so every returned call has its full `prompt_ids`.
        """
        records: list[Record] = []
        sequences: dict[str, list[int]] = {}
        text = (self._dir(session_id) / "records.jsonl").read_text()
        for line in text.splitlines():
            if not line.strip():
                continue
            try:
                data = json.loads(line)
            except json.JSONDecodeError:
                continue  # only the final line can be torn; everything before it is intact
            if data.get("kind") == "segment":
                records.append(SegmentOpened.model_validate(data))
                continue
            record = CallRecord.model_validate(data)
            call = record.call
            if record.prompt_ref is not None:
                ref = record.prompt_ref
                if ref.call_id not in sequences or len(sequences[ref.call_id]) < ref.length:
                    raise ValueError(f"call {call.call_id} refers to unknown prompt {ref.call_id}")
                call.prompt_ids = sequences[ref.call_id][: ref.length] + call.prompt_ids
                record.prompt_ref = None
            sequences[call.call_id] = call.prompt_ids + call.output_ids
            records.append(record)
        return records

    def session_ids(self) -> list[str]:
        return sorted(p.name for p in self.root.iterdir() if (p / "meta.json").is_file())
