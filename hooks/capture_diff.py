"""`capture_diff`: the agent's change to the workspace as a git patch.

With a task repo, the diff is against the task's immutable commit; without one, against
a baseline snapshot of the workspace committed before the agent starts. Untracked files
are included, via a throw-away index, so the repo's own index and history are untouched.

Git here runs after the agent, over files the agent wrote, so it runs in the clean room
(`Sandbox.evaluator_exec`) and reads no config, hooks or attributes file the agent could
have written:
* its git dir is a fresh one in a directory made after the agent was killed; the task
  repo's objects are read from there as data (``GIT_ALTERNATE_OBJECT_DIRECTORIES``; its
  ``.git/config`` only by the ``rev-parse`` that finds them), its hooks and ``info/``
  never;
* the baseline git dir is copied out to the host right after it is made and removed
  from the sandbox, so the agent never sees it; it goes back in only for the diff;
* diffs run with ``--no-ext-diff --no-textconv --ignore-submodules=dirty`` (no program
  named by an attribute runs; a ``filter=`` attribute names a driver no config defines).
"""

from __future__ import annotations

import shlex
from pathlib import Path

from pydantic import Field

from hooks.base import Hook, HookContext, register_hook
from sandboxes.base import (
    DEFAULT_MAX_ARCHIVE_BYTES,
    SYSTEM_TOOLS_ENV,
    ArchiveTooLarge,
    SandboxError,
)
from schemas.base import StrictModel
from schemas.outcome import DiffSummary

#: Tar headers and padding around one file in an archive read out of the sandbox.
_TAR_SLACK = 64 * 1024
#: A scratch dir for one git step, made at run time (random name, created exclusively).
_SCRATCH = "mktemp -d /tmp/rollout-diff.XXXXXXXXXX"
#: Never let git run a program named by the agent's attributes or submodules.
_DIFF_FLAGS = "--no-ext-diff --no-textconv --ignore-submodules=dirty"
_IDENTITY = "-c user.name=rollout -c user.email=rollout@sandbox.invalid -c commit.gpgSign=false"


class CaptureDiffParams(StrictModel):
    #: Directory to diff (default: the task repo's path, else the agent's workdir).
    path: str | None = None
    #: Commit to diff against (default: the task repo's commit, else a baseline). It is
    #: looked up in the object store of the repo at `path`.
    base_commit: str | None = None
    #: git pathspecs to leave out of the diff.
    exclude: list[str] = Field(default_factory=lambda: ["**/__pycache__/**", "**/*.pyc"])
    #: The patch kept is cut here (`DiffSummary.truncated`); it is also the read cap.
    max_bytes: int = Field(default=20 * 1024 * 1024, gt=0)
    #: Cap on the baseline git dir copied out to the host (a bigger one fails the hook).
    baseline_max_bytes: int = Field(default=DEFAULT_MAX_ARCHIVE_BYTES, gt=0)
    timeout_s: float = 300.0


@register_hook
class CaptureDiffHook(Hook):
    name = "capture_diff"
    Params = CaptureDiffParams
    params: CaptureDiffParams

    @property
    def _key(self) -> str:
        """Per-instance state key (a task may diff two directories)."""
        return f"capture_diff.{id(self)}"

    def _dir(self, ctx: HookContext) -> str:
        if self.params.path:
            return self.params.path
        return ctx.repo.path if ctx.repo else ctx.workdir

    def _baseline_file(self, ctx: HookContext) -> Path:
        """Host-side home of the baseline git dir (a tar), out of the agent's reach."""
        return ctx.artifacts_dir / ".capture_diff" / f"{id(self)}.tar"

    async def before_run(self, ctx: HookContext) -> None:
        base = self.params.base_commit or (ctx.repo.commit if ctx.repo else None)
        if base:
            ctx.state[self._key] = {"commit": base}
            return
        q = shlex.quote
        script = (
            f'd=$({_SCRATCH}) && export GIT_DIR="$d/git" GIT_WORK_TREE={q(self._dir(ctx))} && '
            "git init -q --template= && git add -A && "
            f"git {_IDENTITY} commit -q --allow-empty --no-verify -m baseline && "
            'git rev-parse HEAD && echo "$d"'
        )
        # Before the agent: nothing of its runs yet, and the harness may have started
        # something it needs.
        res = await ctx.sandbox.evaluator_exec(
            script, cwd=self._dir(ctx), timeout=self.params.timeout_s, stop_processes=False
        )
        lines = res.stdout.split()
        if res.exit_code != 0 or len(lines) < 2:
            raise RuntimeError(f"baseline snapshot failed: {(res.stderr or res.stdout)[-500:]}")
        commit, scratch = lines[-2], lines[-1]
        try:
            tar = await ctx.sandbox.get_archive(
                f"{scratch}/git", max_bytes=self.params.baseline_max_bytes
            )
        finally:
            await ctx.sandbox.exec(["rm", "-rf", scratch], cwd="/", timeout=self.params.timeout_s)
        path = self._baseline_file(ctx)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(tar)
        ctx.state[self._key] = {"commit": commit, "baseline": str(path)}

    async def after_run(self, ctx: HookContext) -> None:
        info = ctx.state.get(self._key)
        if not info:
            return
        sb = ctx.sandbox
        res = await sb.evaluator_exec(_SCRATCH, cwd="/", timeout=self.params.timeout_s)
        if res.exit_code != 0 or not res.stdout.strip():
            raise RuntimeError(f"no scratch dir for the diff: {(res.stderr or res.stdout)[-500:]}")
        scratch = res.stdout.split()[-1]
        try:
            await self._diff(ctx, info, scratch)
        finally:
            await sb.exec(
                ["rm", "-rf", "--", scratch],
                env=SYSTEM_TOOLS_ENV,
                cwd="/",
                timeout=self.params.timeout_s,
            )
        if info.get("baseline"):
            Path(info["baseline"]).unlink(missing_ok=True)

    async def _diff(self, ctx: HookContext, info: dict[str, str], scratch: str) -> None:
        """Diff the work tree against `info["commit"]` with a git dir in `scratch`."""
        sb, q = ctx.sandbox, shlex.quote
        if info.get("baseline"):
            await sb.put_archive(scratch, Path(info["baseline"]).read_bytes())
            tree = f"top={q(self._dir(ctx))} && "
        else:
            # The task repo's objects (data only: its hooks and info/ stay unread) and its
            # top dir (`path` may be a dir inside it: the diff is then that dir's).
            tree = (
                "top=$(git rev-parse --show-toplevel) && "
                "GIT_ALTERNATE_OBJECT_DIRECTORIES=$(git rev-parse --path-format=absolute "
                "--git-path objects) && export GIT_ALTERNATE_OBJECT_DIRECTORIES && "
            )
        base, out = info["commit"], f"{scratch}/diff.patch"
        excludes = " ".join(q(f":(exclude,glob){p}") for p in self.params.exclude)
        diff = f"git diff --cached {_DIFF_FLAGS} {q(base)}"
        script = (
            f'{tree}export GIT_DIR={q(scratch + "/git")} GIT_WORK_TREE="$top" '
            f"GIT_INDEX_FILE={q(scratch + '/index')} && "
            '{ test -d "$GIT_DIR" || git init -q --template=; } && git add -A && '
            f"{diff} --binary -- . {excludes} > {q(out)} && {diff} --numstat -- . {excludes}"
        )
        res = await sb.evaluator_exec(script, cwd=self._dir(ctx), timeout=self.params.timeout_s)
        if res.exit_code != 0:
            raise RuntimeError(f"git diff failed: {(res.stderr or res.stdout)[-500:]}")
        summary = DiffSummary(base=base)
        for line in res.stdout.splitlines():
            parts = line.split("\t")
            if len(parts) < 3:
                continue
            summary.files_changed += 1
            summary.insertions += int(parts[0]) if parts[0].isdigit() else 0
            summary.deletions += int(parts[1]) if parts[1].isdigit() else 0
        data, summary.bytes = await self._read_patch(ctx, out)
        if len(data) > self.params.max_bytes:
            data, summary.truncated = data[: self.params.max_bytes], True
        elif summary.bytes > len(data):
            summary.truncated = True
        path = ctx.artifacts_dir / "diff.patch"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        summary.local_path = str(path)
        ctx.outcome.diff = summary
        ctx.add_artifact(path, "diff")

    async def _read_patch(self, ctx: HookContext, out: str) -> tuple[bytes, int]:
        """The patch (at most about `max_bytes` of it is ever read) and its full size.

        A patch over the cap is cut to its first `max_bytes` inside the sandbox and only
        that head is read; a missing patch is empty.
        """
        cap = self.params.max_bytes + _TAR_SLACK
        try:
            data = await ctx.sandbox.get_file(out, max_bytes=cap)
            return data, len(data)
        except ArchiveTooLarge:
            pass
        except SandboxError:
            return b"", 0
        q, head = shlex.quote, f"{out}.head"
        res = await ctx.sandbox.evaluator_exec(
            f"head -c {self.params.max_bytes} {q(out)} > {q(head)} && wc -c < {q(out)}",
            cwd="/",
            timeout=self.params.timeout_s,
        )
        if res.exit_code != 0:
            raise RuntimeError(f"cutting the diff failed: {(res.stderr or res.stdout)[-500:]}")
        return await ctx.sandbox.get_file(head, max_bytes=cap), int(res.stdout.split()[-1])

    async def on_error(self, ctx: HookContext, error: BaseException) -> None:
        # The agent's partial work is worth keeping when the run failed late.
        if ctx.outcome.diff is None and ctx.state.get(self._key):
            await self.after_run(ctx)
