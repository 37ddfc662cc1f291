"""`collect_logs`: copy the agent's own transcripts/logs out of the sandbox.

The harness profile says where its agent writes (Claude Code's `projects/**.jsonl`,
Codex's `sessions/**`, mini's trajectory, Hermes' logs and state db); the runtime hands
those `LogSpec`s to the hooks; a task in Harbor's layout also has the agent write
`/logs/agent` and `/logs/artifacts` (`TASK_LOG_SPECS`). This hook moves them to the
rollout's artifacts dir after the run *and* on error, because the transcript of a
failed or cancelled run is exactly what an operator needs to look at.
"""

from __future__ import annotations

import fnmatch
import io
import tarfile
from pathlib import Path, PurePosixPath

from pydantic import Field

from hooks.base import Hook, HookContext, register_hook
from sandboxes.base import (
    DEFAULT_MAX_ARCHIVE_BYTES,
    LOGS_DIR,
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


class CollectLogsParams(StrictModel):
    #: More sandbox locations to collect (besides the harness's own).
    extra: list[LogSpec] = Field(default_factory=list)
    #: Also collect `TASK_LOG_SPECS` (absent or empty: nothing is added).
    task_dirs: bool = True
    subdir: str = "logs"
    #: Cap on the archive read per log location (the agent decides how much it logs).
    max_bytes: int = Field(default=DEFAULT_MAX_ARCHIVE_BYTES, gt=0)


async def collect_log_files(
    sandbox: Sandbox,
    dest_dir: Path,
    specs: list[LogSpec],
    *,
    max_bytes: int = DEFAULT_MAX_ARCHIVE_BYTES,
    errors: list[str] | None = None,
) -> list[LogFile]:
    """Copy the files matching `specs` out of the sandbox into `dest_dir` (host).

    One tar per log location, filtered host-side, so it needs no tools in the sandbox.
    Missing locations are skipped (an agent that crashed early has none); a location
    whose archive passes `max_bytes` is skipped too, noted in `errors`. Member paths
    come from the sandbox, so absolute paths and `..` are never followed.
    """
    out: list[LogFile] = []
    for spec in specs:
        try:
            raw = await sandbox.get_archive(spec.path, max_bytes=max_bytes)
        except ArchiveTooLarge as e:
            if errors is not None:
                errors.append(str(e))
            continue
        except (SandboxNotFound, SandboxError, FileNotFoundError):
            continue
        base = PurePosixPath(spec.path)
        with tarfile.open(fileobj=io.BytesIO(raw)) as tf:
            for m in tf.getmembers():
                name = PurePosixPath(m.name).name
                member = PurePosixPath(m.name)
                if not m.isfile() or not any(fnmatch.fnmatch(name, p) for p in spec.patterns):
                    continue
                if member.is_absolute() or ".." in member.parts:
                    continue
                rel = PurePosixPath(*member.parts[1:])
                inside = str(base / rel) if rel.parts else str(base)
                target = (
                    dest_dir / spec.kind / base.name / rel
                    if rel.parts
                    else dest_dir / spec.kind / name
                )
                f = tf.extractfile(m)
                if f is None:
                    continue
                data = f.read()
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(data)
                out.append(
                    LogFile(
                        kind=spec.kind, sandbox_path=inside, local_path=str(target), size=len(data)
                    )
                )
    return out


@register_hook
class CollectLogsHook(Hook):
    name = "collect_logs"
    Params = CollectLogsParams
    params: CollectLogsParams

    async def after_run(self, ctx: HookContext) -> None:
        specs = [*ctx.log_specs, *self.params.extra]
        if self.params.task_dirs:
            specs += TASK_LOG_SPECS
        errors: list[str] = []
        logs = await collect_log_files(
            ctx.sandbox,
            ctx.artifacts_dir / self.params.subdir,
            specs,
            max_bytes=self.params.max_bytes,
            errors=errors,
        )
        ctx.outcome.hook_errors += [f"{self.name}: {e}" for e in errors]
        agent = ctx.outcome.agent
        if agent is not None:
            known = {lf.local_path for lf in agent.logs}
            agent.logs += [lf for lf in logs if lf.local_path not in known]
        for lf in logs:
            if lf.local_path:
                ctx.add_artifact(Path(lf.local_path), lf.kind)
        ctx.state["collect_logs.done"] = True

    async def on_error(self, ctx: HookContext, error: BaseException) -> None:
        if not ctx.state.get("collect_logs.done"):
            await self.after_run(ctx)
