"""`capture_diff`: the agent's change to the workspace as a git patch.

With a task repo, the diff is against the task's immutable commit; without one, a
baseline snapshot of the workspace is committed in before_run into a git dir *outside*
the workspace (the agent never sees it). Either way untracked files are included, via
a throw-away index, so the repo's own index and history are left untouched.
"""

from __future__ import annotations

import shlex

from pydantic import Field

from hooks.base import Hook, HookContext, register_hook
from sandboxes.base import ArchiveTooLarge, SandboxError
from schemas.base import StrictModel
from schemas.outcome import DiffSummary

#: Tar headers and padding around one file in an archive read out of the sandbox.
_TAR_SLACK = 64 * 1024


class CaptureDiffParams(StrictModel):
    #: Directory to diff (default: the task repo's path, else the agent's workdir).
    path: str | None = None
    #: Commit to diff against (default: the task repo's commit, else a baseline).
    base_commit: str | None = None
    #: git pathspecs to leave out of the diff.
    exclude: list[str] = Field(default_factory=lambda: ["**/__pycache__/**", "**/*.pyc"])
    #: Where the baseline git dir and temporary index live inside the sandbox.
    state_dir: str = "/tmp/rollout-diff"
    #: The patch kept is cut here (`DiffSummary.truncated`); it is also the read cap.
    max_bytes: int = Field(default=20 * 1024 * 1024, gt=0)
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

    def _git_env(self, ctx: HookContext) -> dict[str, str]:
        """Env selecting the baseline git dir when we snapshot ourselves."""
        if ctx.state.get(self._key, {}).get("git_dir"):
            return {
                "GIT_DIR": ctx.state[self._key]["git_dir"],
                "GIT_WORK_TREE": self._dir(ctx),
            }
        return {}

    async def before_run(self, ctx: HookContext) -> None:
        base = self.params.base_commit or (ctx.repo.commit if ctx.repo else None)
        if base:
            ctx.state[self._key] = {"commit": base}
            return
        git_dir = f"{self.params.state_dir}/baseline.git"
        script = (
            "git init -q && git add -A && "
            "git -c user.name=rollout -c user.email=rollout@sandbox.invalid "
            "commit -q --allow-empty --no-verify -m baseline && git rev-parse HEAD"
        )
        env = {"GIT_DIR": git_dir, "GIT_WORK_TREE": self._dir(ctx)}
        res = await ctx.sandbox.exec(
            f"mkdir -p {shlex.quote(self.params.state_dir)} && {script}",
            env=env,
            cwd=self._dir(ctx),
            timeout=self.params.timeout_s,
        )
        if res.exit_code != 0:
            raise RuntimeError(f"baseline snapshot failed: {(res.stderr or res.stdout)[-500:]}")
        ctx.state[self._key] = {
            "commit": res.stdout.strip().splitlines()[-1],
            "git_dir": git_dir,
        }

    async def after_run(self, ctx: HookContext) -> None:
        info = ctx.state.get(self._key)
        if not info:
            return
        base = info["commit"]
        index = f"{self.params.state_dir}/diff.index"
        out = f"{self.params.state_dir}/diff.patch"
        excludes = " ".join(shlex.quote(f":(exclude,glob){p}") for p in self.params.exclude)
        q = shlex.quote
        script = (
            f"mkdir -p {q(self.params.state_dir)} && rm -f {q(index)} && "
            f"export GIT_INDEX_FILE={q(index)} && git add -A && "
            f"git diff --cached --binary {q(base)} -- . {excludes} > {q(out)} && "
            f"git diff --cached --numstat {q(base)} -- . {excludes}"
        )
        env = self._git_env(ctx)
        res = await ctx.sandbox.exec(
            script, env=env or None, cwd=self._dir(ctx), timeout=self.params.timeout_s
        )
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
        res = await ctx.sandbox.exec(
            f"head -c {self.params.max_bytes} {q(out)} > {q(head)} && wc -c < {q(out)}",
            timeout=self.params.timeout_s,
        )
        if res.exit_code != 0:
            raise RuntimeError(f"cutting the diff failed: {(res.stderr or res.stdout)[-500:]}")
        return await ctx.sandbox.get_file(head, max_bytes=cap), int(res.stdout.split()[-1])

    async def on_error(self, ctx: HookContext, error: BaseException) -> None:
        # The agent's partial work is worth keeping when the run failed late.
        if ctx.outcome.diff is None and ctx.state.get(self._key):
            await self.after_run(ctx)
