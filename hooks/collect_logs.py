"""`collect_logs`: copy the agent's own transcripts/logs out of the sandbox.

The harness profile says where its agent writes (Claude Code's `projects/**.jsonl`,
Codex's `sessions/**`, mini's trajectory, Hermes' logs and state db); the runtime hands
those `LogSpec`s to the hooks; a task in Harbor's layout also has the agent write
`/logs/agent` and `/logs/artifacts` (`TASK_LOG_SPECS`). This hook moves them to the
rollout's artifacts dir after the run *and* on error, because the transcript of a
failed or cancelled run is exactly what an operator needs to look at.

Log collection never decides a rollout: the agent writes these trees, so every file is
copied on its own — one that cannot be copied (a name too long for the host, a file cut
short) or that passes a cap (`LogCaps`: depth, path length, file size, file count, total
bytes) is skipped, and the skip is recorded with its reason and the limit's name, in
`<subdir>/collect_logs.json` and (caps and copy errors) the outcome's `hook_errors`.
"""

from __future__ import annotations

import fnmatch
import io
import json
import tarfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from pydantic import Field

from hooks.base import Hook, HookContext, register_hook
from sandboxes.base import (
    DEFAULT_MAX_ARCHIVE_BYTES,
    LOGS_DIR,
    UNREADABLE_PAX,
    ArchiveTooLarge,
    Sandbox,
    SandboxError,
    SandboxNotFound,
)
from schemas.base import StrictModel
from schemas.outcome import LogFile, LogSpec

#: Log kind (and artifacts subdir under ``logs/``) of the task's own log dirs.
TASK_LOG_KIND = "task_logs"
#: The dirs of Harbor's layout the agent writes during its run (`sandboxes.base.LOGS_DIR`):
#: its logs and the artifacts a task asks it to leave.
TASK_LOG_SPECS = [
    LogSpec(path=f"{LOGS_DIR}/agent", kind=TASK_LOG_KIND),
    LogSpec(path=f"{LOGS_DIR}/artifacts", kind=TASK_LOG_KIND),
]
#: Longest file name the host's filesystems take (Linux NAME_MAX).
NAME_MAX_BYTES = 255
#: The manifest of one collection: what was copied, what was skipped and why.
MANIFEST = "collect_logs.json"
#: Skips listed one by one in the manifest (all of them are counted).
MAX_LISTED_SKIPS = 1000


class LogCaps(StrictModel):
    """How much of the agent's log trees the host copies (the agent decides their shape)."""

    #: Cap on the archive read per log location; past it the location is skipped.
    max_bytes: int = Field(default=DEFAULT_MAX_ARCHIVE_BYTES, gt=0)
    #: Cap on one file.
    max_file_bytes: int = Field(default=64 * 2**20, gt=0)
    #: Cap on the bytes copied over all locations.
    max_total_bytes: int = Field(default=DEFAULT_MAX_ARCHIVE_BYTES, gt=0)
    #: Cap on the files copied over all locations.
    max_files: int = Field(default=10_000, gt=0)
    #: Cap on a file's depth below its location (`a/b/c.log`: 3).
    max_depth: int = Field(default=32, gt=0)
    #: Cap on a file's path below its location, in bytes.
    max_path_bytes: int = Field(default=1024, gt=0)


class CollectLogsParams(LogCaps):
    #: More sandbox locations to collect (besides the harness's own).
    extra: list[LogSpec] = Field(default_factory=list)
    #: Also collect `TASK_LOG_SPECS` (absent or empty: nothing is added).
    task_dirs: bool = True
    subdir: str = "logs"


class SkippedLog(StrictModel):
    """A file (or a location) not copied, and why."""

    sandbox_path: str
    reason: str
    #: The cap that was hit (`LogCaps` field name, or `NAME_MAX`); None: not a cap.
    limit: str | None = None


@dataclass
class _Collection:
    """What one collection copied and skipped, with the running totals the caps use."""

    caps: LogCaps
    files: list[LogFile] = field(default_factory=list)
    skipped: list[SkippedLog] = field(default_factory=list)
    #: Caps and copy errors, first path each: what the operator must hear about.
    problems: dict[str, tuple[int, SkippedLog]] = field(default_factory=dict)
    copied_bytes: int = 0

    def skip(self, path: str, reason: str, limit: str | None = None, problem: bool = True) -> None:
        entry = SkippedLog(sandbox_path=_short(path), reason=reason, limit=limit)
        self.skipped.append(entry)
        if problem:
            key = limit or reason.split(":", 1)[0]
            n, first = self.problems.get(key, (0, entry))
            self.problems[key] = (n + 1, first)

    def errors(self) -> list[str]:
        return [
            f"{n} skipped: {first.reason} (first: {first.sandbox_path})" if n > 1 else
            f"skipped {first.sandbox_path}: {first.reason}"
            for n, first in self.problems.values()
        ]  # fmt: skip


def _short(path: str, keep: int = 300) -> str:
    return path if len(path) <= keep else f"{path[:keep]}… ({len(path.encode())} bytes)"


def _cap_hit(rel: PurePosixPath, size: int, got: _Collection) -> tuple[str, str] | None:
    """(reason, limit) of the first cap this file passes, or None."""
    caps = got.caps
    if any(len(p.encode()) > NAME_MAX_BYTES for p in rel.parts):
        return f"a name is longer than {NAME_MAX_BYTES} bytes", "NAME_MAX"
    if len(str(rel).encode()) > caps.max_path_bytes:
        return f"path over max_path_bytes={caps.max_path_bytes}", "max_path_bytes"
    if len(rel.parts) > caps.max_depth:
        return f"depth {len(rel.parts)} over max_depth={caps.max_depth}", "max_depth"
    if size > caps.max_file_bytes:
        return f"{size} bytes over max_file_bytes={caps.max_file_bytes}", "max_file_bytes"
    if len(got.files) >= caps.max_files:
        return f"max_files={caps.max_files} files copied already", "max_files"
    if got.copied_bytes + size > caps.max_total_bytes:
        return f"would pass max_total_bytes={caps.max_total_bytes}", "max_total_bytes"
    return None


def _kind_of(m: tarfile.TarInfo) -> str:
    kinds = {tarfile.SYMTYPE: "symlink", tarfile.LNKTYPE: "hard link", tarfile.FIFOTYPE: "fifo"}
    return kinds.get(m.type, "device" if m.isdev() else f"type {m.type!r}")


def _copy_archive(raw: bytes, spec: LogSpec, dest_dir: Path, got: _Collection) -> None:
    """Copy the regular files of one location's tar, each on its own."""
    base = PurePosixPath(spec.path)
    with tarfile.open(fileobj=io.BytesIO(raw), mode="r:") as tf:
        last = spec.path
        while True:
            try:
                m = tf.next()
            except tarfile.TarError as e:
                got.skip(spec.path, f"archive ended early after {last}: {e}")
                return
            if m is None:
                break
            member = PurePosixPath(m.name)
            rel = PurePosixPath(*member.parts[1:])
            inside = str(base / rel) if rel.parts else str(base)
            last = inside
            name = member.name
            if m.isdir() or not any(fnmatch.fnmatch(name, p) for p in spec.patterns):
                continue
            if member.is_absolute() or ".." in member.parts:
                got.skip(m.name, "path leaves its location")
                continue
            if UNREADABLE_PAX in m.pax_headers:
                got.skip(inside, f"unreadable in the sandbox: {m.pax_headers[UNREADABLE_PAX]}")
                continue
            if not m.isfile():
                got.skip(inside, f"not a regular file ({_kind_of(m)})", problem=False)
                continue
            hit = _cap_hit(rel, m.size, got)
            if hit is not None:
                got.skip(inside, *hit)
                continue
            target = (
                dest_dir / spec.kind / base.name / rel if rel.parts else dest_dir / spec.kind / name
            )
            try:
                f = tf.extractfile(m)
                data = f.read() if f is not None else b""
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(data)
            except (OSError, tarfile.TarError) as e:
                got.skip(inside, f"copy failed: {e}")
                continue
            got.copied_bytes += len(data)
            got.files.append(
                LogFile(kind=spec.kind, sandbox_path=inside, local_path=str(target), size=len(data))
            )
        if raw[tf.offset : tf.offset + tarfile.BLOCKSIZE] != bytes(tarfile.BLOCKSIZE):
            got.skip(spec.path, f"archive ended early after {last}: nothing more was read")


async def _collect(
    sandbox: Sandbox, dest_dir: Path, specs: list[LogSpec], caps: LogCaps
) -> _Collection:
    got = _Collection(caps)
    for spec in specs:
        try:
            raw = await sandbox.get_archive(spec.path, max_bytes=caps.max_bytes)
        except ArchiveTooLarge as e:
            got.skip(spec.path, str(e), "max_bytes")
            continue
        except (SandboxNotFound, FileNotFoundError):
            continue  # an agent that crashed early has none
        except SandboxError as e:
            got.skip(spec.path, f"could not read: {e}")
            continue
        try:
            _copy_archive(raw, spec, dest_dir, got)
        except tarfile.TarError as e:  # not a tar at all
            got.skip(spec.path, f"archive unreadable: {e}")
    return got


async def collect_log_files(
    sandbox: Sandbox,
    dest_dir: Path,
    specs: list[LogSpec],
    *,
    caps: LogCaps | None = None,
    errors: list[str] | None = None,
) -> list[LogFile]:
    """Copy the files matching `specs` out of the sandbox into `dest_dir` (host).

    One tar per log location, filtered host-side, so it needs no tools in the sandbox.
    Missing locations are skipped (an agent that crashed early has none). Each file is
    copied on its own: one past a cap or that cannot be copied is skipped, noted in
    `errors`. Member paths come from the sandbox, so absolute paths and `..` are never
    followed.
    """
    got = await _collect(sandbox, dest_dir, specs, caps or LogCaps())
    if errors is not None:
        errors += got.errors()
    return got.files


@register_hook
class CollectLogsHook(Hook):
    name = "collect_logs"
    Params = CollectLogsParams
    params: CollectLogsParams

    async def after_run(self, ctx: HookContext) -> None:
        specs = [*ctx.log_specs, *self.params.extra]
        if self.params.task_dirs:
            specs += TASK_LOG_SPECS
        dest = ctx.artifacts_dir / self.params.subdir
        try:
            got = await _collect(ctx.sandbox, dest, specs, self.params)
        except Exception as e:  # never the rollout's verdict
            ctx.outcome.hook_errors.append(f"{self.name}: {e!r}")
            return
        finally:
            ctx.state["collect_logs.done"] = True
        ctx.outcome.hook_errors += [f"{self.name}: {e}" for e in got.errors()]
        agent = ctx.outcome.agent
        if agent is not None:
            known = {lf.local_path for lf in agent.logs}
            agent.logs += [lf for lf in got.files if lf.local_path not in known]
        for lf in got.files:
            if lf.local_path:
                ctx.add_artifact(Path(lf.local_path), lf.kind)
        if got.skipped:
            ctx.add_artifact(_write_manifest(dest, got), "log_manifest")

    async def on_error(self, ctx: HookContext, error: BaseException) -> None:
        if not ctx.state.get("collect_logs.done"):
            await self.after_run(ctx)


def _write_manifest(dest: Path, got: _Collection) -> Path:
    path = dest / MANIFEST
    path.parent.mkdir(parents=True, exist_ok=True)
    manifest = {
        "caps": got.caps.model_dump(include=set(LogCaps.model_fields)),
        "copied_files": len(got.files),
        "copied_bytes": got.copied_bytes,
        "skipped_count": len(got.skipped),
        "skipped": [s.model_dump() for s in got.skipped[:MAX_LISTED_SKIPS]],
    }
    path.write_text(json.dumps(manifest, indent=1))
    return path
