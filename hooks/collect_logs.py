"""`collect_logs`: copy the agent's own transcripts/logs out of the sandbox.

The harness knows where its agent writes (Claude Code's `projects/**.jsonl`, Codex's
`sessions/**`, mini's trajectory, Hermes' logs and state db); this hook moves them to
the rollout's artifacts dir after the run *and* on error, because the transcript of a
failed or cancelled run is exactly what an operator needs to look at.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from harnesses.base import LogSpec
from hooks.base import Hook, HookContext, register_hook
from schemas.base import StrictModel


class CollectLogsParams(StrictModel):
    #: More sandbox locations to collect (besides the harness's own).
    extra: list[LogSpec] = Field(default_factory=list)
    subdir: str = "logs"


@register_hook
class CollectLogsHook(Hook):
    name = "collect_logs"
    Params = CollectLogsParams
    params: CollectLogsParams

    async def after_run(self, ctx: HookContext) -> None:
        specs = [*ctx.harness.log_specs(), *self.params.extra]
        logs = await ctx.harness.collect_logs(
            ctx.sandbox, ctx.artifacts_dir / self.params.subdir, specs
        )
        if ctx.agent_result is not None:
            known = {lf.local_path for lf in ctx.agent_result.logs}
            ctx.agent_result.logs += [lf for lf in logs if lf.local_path not in known]
        for lf in logs:
            if lf.local_path:
                ctx.add_artifact(Path(lf.local_path), lf.kind)
        ctx.state["collect_logs.done"] = True

    async def on_error(self, ctx: HookContext, error: BaseException) -> None:
        if not ctx.state.get("collect_logs.done"):
            await self.after_run(ctx)
