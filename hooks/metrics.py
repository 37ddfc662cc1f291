"""`metrics`: flat numbers about the run (durations, exit codes, counts) for the result.

Why flat: these go into the rollout result and dashboards (and `metrics.json` among the
artifacts), so scalar key/values are easiest to aggregate across thousands of rollouts.
Put it after the hooks whose results it summarises and before `upload_artifacts`.
"""

from __future__ import annotations

import json
from typing import Any

from hooks.base import Hook, HookContext, register_hook
from schemas.base import StrictModel


class MetricsParams(StrictModel):
    write_file: bool = True


def collect_metrics(ctx: HookContext) -> dict[str, Any]:
    m: dict[str, Any] = {f"time.{k}_s": round(v, 3) for k, v in ctx.outcome.timings.items()}
    a = ctx.outcome.agent
    if a is not None:
        m.update(
            {
                "agent.exit_code": a.exit_code,
                "agent.timed_out": a.timed_out,
                "agent.oom_killed": a.oom_killed,
                "agent.duration_s": a.duration_s,
                "agent.stdout_bytes": a.stdout_bytes,
                "agent.stderr_bytes": a.stderr_bytes,
                "agent.log_files": len(a.logs),
            }
        )
        for k, v in a.details.items():
            if isinstance(v, int | float | str | bool) or v is None:
                m[f"agent.{k}"] = v
    e = ctx.outcome.evaluation
    if e is not None:
        m.update(
            {
                "eval.status": e.status,
                "eval.reward": e.reward,
                "eval.verdict": e.verdict,
                "eval.checks": len(e.checks),
                "eval.checks_passed": sum(c.passed for c in e.checks),
                "eval.duration_s": e.duration_s,
            }
        )
    d = ctx.outcome.diff
    if d is not None:
        m.update(
            {
                "diff.files_changed": d.files_changed,
                "diff.insertions": d.insertions,
                "diff.deletions": d.deletions,
                "diff.bytes": d.bytes,
            }
        )
    m["artifacts.count"] = len(ctx.outcome.artifacts)
    m["artifacts.bytes"] = sum(x.size for x in ctx.outcome.artifacts)
    m["hooks.errors"] = len(ctx.outcome.hook_errors)
    if ctx.error is not None:
        m["error.type"] = type(ctx.error).__name__
    return m


@register_hook
class MetricsHook(Hook):
    name = "metrics"
    Params = MetricsParams
    params: MetricsParams

    async def after_run(self, ctx: HookContext) -> None:
        ctx.outcome.metrics.update(collect_metrics(ctx))
        if self.params.write_file:
            path = ctx.artifacts_dir / "metrics.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(ctx.outcome.metrics, indent=2, sort_keys=True, default=str))
            ctx.add_artifact(path, "metrics")

    async def on_error(self, ctx: HookContext, error: BaseException) -> None:
        await self.after_run(ctx)
