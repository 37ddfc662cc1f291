"""Durable per-session capture: every call is appended to disk the moment it completes.

Layout under `--data-dir`: `sessions/<session_id>/meta.json` (config, token hash, engine,
template version) and `records.jsonl` (segment openings and calls, in order), plus a
`closed` marker. A crash loses at most the calls in flight; a restarted gateway rebuilds
any trajectory from these files alone.
"""

import asyncio
import json
import logging
import os
import secrets
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError

from gateway.capture.group_commit import GroupCommit, fsync_dir
from schemas.session import SessionConfig
from schemas.trajectory import RecordedCall

log = logging.getLogger("rollout.gateway")


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


class RequestOmitted(BaseModel):
    """What a call's record left out of the raw request part it keeps (`request`): the
    fields past the session's `max_stored_request_bytes`, and the whole part's size and
    sha256 (of its JSON as it would have been stored), so the loss is counted, not silent."""

    model_config = ConfigDict(extra="forbid")

    fields: list[str]
    size_bytes: int = Field(ge=0)
    sha256: str


class CallEntry(BaseModel):
    """A finished call plus what the agent sent, raw and normalized."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["call"] = "call"
    call: RecordedCall
    request: dict[str, Any] = Field(default_factory=dict)
    request_omitted: RequestOmitted | None = None
    """Set when `request` is cut to the per-call cap (`RequestOmitted`)."""
    normalized: dict[str, Any] = Field(default_factory=dict)
    prompt_ref: PromptRef | None = None
    request_digest: str | None = None
    """`retries.request_digest` of the request body: a retry of it gets this call's answer
    again, also after a restart. None in records written before digests were kept."""
    _prompt_source: str | None = PrivateAttr(default=None)
    _offset: int | None = PrivateAttr(default=None)

    @property
    def offset(self) -> int | None:
        """Where this record's line starts in the records file, once appended or loaded:
        a retry reads back only that line (`SessionStore.read_entry`)."""
        return self._offset

    @property
    def prompt_source(self) -> str | None:
        """After loading: the call whose prompt+output this call's prompt starts with (its
        `prompt_ref` before expansion), i.e. the held conversation the call extended."""
        return self._prompt_source


Entry = SegmentOpened | CallEntry
"""One line of a session's `records.jsonl`: a segment opened, or a call's entry (the
`RecordedCall` and what the agent sent)."""


Durability = Literal["group", "off"]
"""`group`: a call is acknowledged once its record is fsynced (batched, see `GroupCommit`);
`off`: once it is written to the page cache (survives a crash of the process, not of the
machine)."""


@dataclass
class _Records:
    """A session's records file as this process appends to it."""

    path: str
    size: int
    """Its bytes on disk, as of this process's last append (or its creation)."""


class CorruptRecordError(ValueError):
    """A complete record that cannot be read back; reported, never skipped."""


_SYNCED: Future[None] = Future()
_SYNCED.set_result(None)


def _checked(session_id: str) -> str:
    if not session_id or "/" in session_id or session_id.startswith("."):
        raise ValueError(f"invalid session id {session_id!r}")
    return session_id


class SessionStore:
    """Append-only files per session. Thread-safe.

    An append writes whole records or nothing: a failed write is cut back off the file, and
    a line torn by a crash is cut off before this process first appends to the file. With
    `durability="group"` every append returns a future that resolves once it is on disk.
    """

    def __init__(
        self, data_dir: Path, durability: Durability = "group", sync_interval_s: float = 0.005
    ) -> None:
        self.root = Path(data_dir) / "sessions"
        self.root.mkdir(parents=True, exist_ok=True)
        self._root_text = str(self.root)
        self.durability = durability
        self._group = GroupCommit(sync_interval_s) if durability == "group" else None
        self._lock = threading.Lock()
        self._appending: dict[str, _Records] = {}
        """The records file of each session this process appends to (its torn tail cut)."""

    def _dir(self, session_id: str) -> Path:
        return self.root / _checked(session_id)

    def _file(self, session_id: str, name: str) -> str:
        """A session file's path as text: the checks every call makes (`is_closed`,
        `last_write`) stat it without building pathlib objects, which cost several times
        the stat itself on the event loop."""
        return f"{self._root_text}/{_checked(session_id)}/{name}"

    def _sync_now(self, *paths: Path) -> None:
        """Synchronous fsync of rarely written files and directories (create, close)."""
        if self._group is None:
            return
        for path in paths:
            if path.is_dir():
                fsync_dir(path)
            else:
                with open(path, "rb") as fh:
                    os.fsync(fh.fileno())

    def secret(self) -> bytes:
        """This data dir's key for deriving idempotent session identities; created once,
        shared by every gateway process on the dir, readable only by its owner."""
        path = self.root.parent / "gateway.secret"
        if not path.exists():
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as fh:
                fh.write(secrets.token_bytes(32))
            self._sync_now(tmp)
            try:
                os.link(tmp, path)  # atomic: the first process to link wins
            except FileExistsError:
                pass
            finally:
                tmp.unlink()
            self._sync_now(path.parent)
        return path.read_bytes()

    def create(self, meta: SessionMeta) -> None:
        path = self._dir(meta.session_id)
        path.mkdir(parents=True, exist_ok=False)
        tmp = path / "meta.json.tmp"
        tmp.write_text(meta.model_dump_json())
        self._sync_now(tmp)
        tmp.replace(path / "meta.json")
        (path / "records.jsonl").touch()
        self._sync_now(path, self.root)
        with self._lock:
            self._appending[meta.session_id] = _Records(str(path / "records.jsonl"), 0)

    def append(self, session_id: str, *records: Entry) -> Future[None]:
        """Append records as one write; returns a future done once they are durable.

        Records are serialised before the file is touched (an unencodable one raises
        `ValueError` and writes nothing); a failed write raises `OSError` and leaves the
        file as it was.
        """
        fd = self._write(session_id, records)
        if self._group is None:
            os.close(fd)
            return _SYNCED
        return self._group.submit(fd)

    def append_on_loop(self, session_id: str, *records: Entry) -> asyncio.Future[None]:
        """`append` for a caller on the running event loop: the future is that loop's,
        which waking costs the loop less (`GroupCommit.submit_on_loop`)."""
        fd = self._write(session_id, records)
        if self._group is None:
            os.close(fd)
            done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            done.set_result(None)
            return done
        return self._group.submit_on_loop(fd)

    def _write(self, session_id: str, records: tuple[Entry, ...]) -> int:
        """Write `records` at the end of the session's file (`append`); returns the open
        descriptor, for the caller to sync and close."""
        lines = [r.__pydantic_serializer__.to_json(r) + b"\n" for r in records]
        data = b"".join(lines)
        with self._lock:
            file = self._appending.get(session_id)
            if file is None:
                file = _Records(str(self._dir(session_id) / "records.jsonl"), 0)
                cut_torn_tail(file.path)
                self._appending[session_id] = file
            fd = os.open(file.path, os.O_WRONLY | os.O_APPEND)
            try:
                start = _append_all(fd, data)
            except BaseException:
                os.close(fd)
                del self._appending[session_id]  # in case the cut-back failed
                raise
            file.size = start + len(data)
        for record, line in zip(records, lines, strict=True):
            if isinstance(record, CallEntry):
                record._offset = start
            start += len(line)
        return fd

    def mark_closed(self, session_id: str, reason: str | None = None) -> None:
        """The `closed` marker: its first line is when, an optional second line why."""
        marker = self._dir(session_id) / "closed"
        if not marker.exists():
            text = datetime.now(UTC).isoformat() + (f"\n{reason}" if reason else "")
            marker.write_text(text)
            self._sync_now(marker, marker.parent)

    def closed_reason(self, session_id: str) -> str | None:
        """Why a session was closed, when that was recorded (e.g. an expired TTL)."""
        try:
            _, _, reason = (self._dir(session_id) / "closed").read_text().partition("\n")
        except FileNotFoundError:
            return None
        return reason.strip() or None

    def last_write(self, session_id: str) -> float:
        """Wall-clock time of the last record appended (the file's mtime); 0 when a crash
        during `create` left no records file (nothing was ever appended)."""
        try:
            return os.stat(self._file(session_id, "records.jsonl")).st_mtime
        except FileNotFoundError:
            return 0.0

    def records_size(self, session_id: str) -> int:
        """Bytes of the session's records on disk (0 before the first append): kept in
        memory for the sessions this process appends to, which alone write their files
        (a stat on every call cost more than anything else the store does for it)."""
        with self._lock:
            file = self._appending.get(session_id)
        if file is not None:
            return file.size
        try:
            return (self._dir(session_id) / "records.jsonl").stat().st_size
        except FileNotFoundError:
            return 0

    def exists(self, session_id: str) -> bool:
        try:
            return (self._dir(session_id) / "meta.json").is_file()
        except ValueError:
            return False

    def is_closed(self, session_id: str) -> bool:
        try:
            os.stat(self._file(session_id, "closed"))
        except (FileNotFoundError, NotADirectoryError):
            return False
        return True

    def load_meta(self, session_id: str) -> SessionMeta:
        return SessionMeta.model_validate_json((self._dir(session_id) / "meta.json").read_text())

    def load_records(self, session_id: str) -> list[Entry]:
        """Read back every complete record; raises `CorruptRecordError` (file and line) on
        a complete line that does not read back.

        Bytes after the last newline are a record still being written or torn by a crash:
        never acknowledged, so ignored here and cut off before the next append. Prompt
        references are expanded, so every returned call has its full `prompt_ids`.
        """
        records: list[Entry] = []
        sequences: dict[str, list[int]] = {}
        path = self._dir(session_id) / "records.jsonl"
        offset = 0
        with open(path, "rb") as fh:
            for number, line in enumerate(fh, start=1):
                if not line.endswith(b"\n"):
                    break  # torn or still being written
                try:
                    record = _parse(line, sequences)
                except (ValueError, ValidationError) as exc:
                    raise CorruptRecordError(
                        f"{path} line {number}: corrupt record: {exc}"
                    ) from exc
                if isinstance(record, CallEntry):
                    record._offset = offset
                offset += len(line)
                records.append(record)
        return records

    def read_entry(self, session_id: str, offset: int) -> CallEntry:
        """The call record whose line starts at `offset` (`CallEntry.offset`), read alone:
        its `prompt_ref` is not expanded (see `prompt_tail`)."""
        path = self._dir(session_id) / "records.jsonl"
        with open(path, "rb") as fh:
            fh.seek(offset)
            line = fh.readline()
        try:
            if not line.endswith(b"\n"):
                raise ValueError("no complete record there")
            data = json.loads(line)
            if not isinstance(data, dict) or data.get("kind") != "call":
                raise ValueError("not a call record")
            entry = CallEntry.model_validate(data)
        except (ValueError, ValidationError) as exc:
            raise CorruptRecordError(f"{path} at byte {offset}: corrupt record: {exc}") from exc
        entry._offset = offset
        return entry

    def prompt_tail(
        self, session_id: str, entry: CallEntry, locate: Callable[[str], int | None], count: int
    ) -> tuple[int, list[int]]:
        """(prompt length, its last `count` ids) of a call read by `read_entry`, following
        its prompt reference back (`locate`: call id → offset) only as far as those ids
        need: a retry's answer needs the prompt's length and tail, not the whole prompt."""
        ref = entry.prompt_ref
        length = (ref.length if ref else 0) + len(entry.call.prompt_ids)
        parts: list[list[int]] = []
        upto, want = length, count
        while want > 0:
            ref = entry.prompt_ref
            before = ref.length if ref else 0
            own = entry.call.prompt_ids + entry.call.output_ids  # after the first `before`
            end = min(upto, before + len(own))
            got = own[max(0, end - before - want) : max(0, end - before)]
            parts.append(got)
            want -= len(got)
            if ref is None or before == 0 or want <= 0:
                break
            at = locate(ref.call_id)
            if at is None:
                raise CorruptRecordError(f"call {entry.call.call_id} refers to unknown prompt")
            entry, upto = self.read_entry(session_id, at), min(end, before)
        return length, [i for part in reversed(parts) for i in part]

    def session_ids(self) -> list[str]:
        return sorted(p.name for p in self.root.iterdir() if (p / "meta.json").is_file())


def _parse(line: bytes, sequences: dict[str, list[int]]) -> Entry:
    """One line → its record; `sequences` (call id → prompt+output) expands prompt refs."""
    data = json.loads(line)
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    if data.get("kind") == "segment":
        return SegmentOpened.model_validate(data)
    record = CallEntry.model_validate(data)
    call = record.call
    if record.prompt_ref is not None:
        ref = record.prompt_ref
        if ref.call_id not in sequences or len(sequences[ref.call_id]) < ref.length:
            raise ValueError(f"call {call.call_id} refers to unknown prompt {ref.call_id}")
        call.prompt_ids = sequences[ref.call_id][: ref.length] + call.prompt_ids
        record.prompt_ref = None
        record._prompt_source = ref.call_id
    sequences[call.call_id] = call.prompt_ids + call.output_ids
    return record


def _append_all(fd: int, data: bytes) -> int:
    """Write all of `data` at the end of the file, or cut what was written and raise;
    returns the offset it starts at (one process appends to a session's file)."""
    start = os.fstat(fd).st_size
    view = memoryview(data)
    try:
        while view:
            view = view[os.write(fd, view) :]
    except OSError:
        try:
            os.ftruncate(fd, start)
        except OSError:
            log.exception("could not cut a failed append off fd %d; cut on next open", fd)
        raise
    return start


def cut_torn_tail(path: str | Path) -> int:
    """Cut the file back to its last complete line (after a crash mid-write); returns the
    number of bytes removed. Without this the next record would be glued onto the torn one."""
    with open(path, "r+b") as fh:
        size = fh.seek(0, os.SEEK_END)
        end = 0
        pos = size
        while pos > 0:
            step = min(1 << 16, pos)
            pos -= step
            fh.seek(pos)
            newline = fh.read(step).rfind(b"\n")
            if newline >= 0:
                end = pos + newline + 1
                break
        if end < size:
            log.warning("%s: cut a torn last record (%d bytes)", path, size - end)
            fh.truncate(end)
        return size - end
