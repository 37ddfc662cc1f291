"""Runs one task in one provisioned sandbox: harness, hooks, agent, evaluation.

Why a plain composition (no Temporal here): the activities that wrap it decide retries,
heartbeats and task queues; this module only guarantees the *order* and the *cleanup*:

    harness.setup → before_run hooks → harness.run → kill every process left in the
    sandbox → (kill again → after_run hook) for each hook
    (on any failure or cancellation: on_error hooks)
    finally, always — also on asyncio.CancelledError: harness.cleanup

The kills come before every after_run hook because the evaluation runs in the agent's
sandbox: a process the agent left behind — or one that something the agent planted
started during an earlier hook — could otherwise rewrite its answer, or the checks,
while they run. The hooks that run commands there do so in the clean room
(`Sandbox.evaluator_exec`, which kills once more before each command). If a kill fails
the run fails (no reward can be trusted).

Outcomes of the agent (bad exit, time-out, wrong answer, broken evaluator) are *data*
in the returned `RunOutcome`. An evaluation once computed stands: a later hook's failure
or time-out is recorded in `hook_errors`, never turned into a failed run. Infrastructure
failures (harness setup, a required hook before the evaluation, the sandbox) raise
`RuntimeFailure`, which carries the partial outcome — unless the
failure came once the agent could act and its sandbox shows damage the agent could have
done (`Sandbox.agent_damage`: its supervisor killed, its disk filled...). That run is
the agent's doing, not a failure to retry: it returns with status
`agent_broke_sandbox` (reward 0, its samples trained on), so no agent earns a fresh
attempt, or a masked row, by breaking its sandbox.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any

from harnesses.base import AgentHarness, GatewayEndpoints, HarnessContext
from harnesses.registry import get_harness
from hooks.base import Hook, HookContext, build_hooks, run_on_error, run_phase
from sandboxes.base import EvalHeadroom, Sandbox
from schemas.outcome import RolloutStatus, RunOutcome, run_status
from schemas.session import SessionCreated
from schemas.tasks import RolloutTask

log = logging.getLogger(__name__)

__all__ = ["RuntimeFailure", "build_harness", "build_task_hooks", "run_in_sandbox"]


class RuntimeFailure(RuntimeError):
    """An infrastructure failure; `outcome` is the partial outcome (status infra_error)."""

    def __init__(self, phase: str, outcome: RunOutcome, cause: BaseException) -> None:
        super().__init__(f"run failed in {phase}: {cause!r}")
        self.phase = phase
        self.outcome = outcome
        self.cause = cause


def build_harness(task: RolloutTask) -> AgentHarness:
    """The task's harness with its config validated (KeyError: unknown harness)."""
    return get_harness(task.harness.name, task.harness.config)


def build_task_hooks(task: RolloutTask) -> list[Hook]:
    """The task's hooks (or the defaults), params validated (KeyError: unknown hook)."""
    return build_hooks(task.hook_specs())


async def to_completion(coro: Coroutine[Any, Any, Any], timeout: float, what: str) -> None:
    """Run cleanup to the end even if the caller is cancelled meanwhile (bounded by
    `timeout`); a cancellation that arrived during it is re-raised afterwards."""
    task = asyncio.ensure_future(asyncio.wait_for(coro, timeout))
    cancelled = False
    while not task.done():
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            cancelled = cancelled or not task.done()
        except Exception:
            break
    if task.done() and not task.cancelled() and task.exception() is not None:
        log.warning("%s failed: %r", what, task.exception())
    if cancelled:
        raise asyncio.CancelledError


PhaseCallback = Callable[[str], Awaitable[None] | None]


class _Phases:
    """Tracks the current phase, times each one into `timings` and tells the caller
    (heartbeats)."""

    def __init__(self, on_phase: PhaseCallback | None, timings: dict[str, float]) -> None:
        self.on_phase = on_phase
        self.current = "start"
        self.timings = timings

    async def enter(self, name: str) -> None:
        self.current = name
        if self.on_phase is not None:
            r = self.on_phase(name)
            if inspect.isawaitable(r):
                await r

    async def run(self, name: str, aw: Awaitable[Any], timeout: float | None = None) -> Any:
        await self.enter(name)
        t0 = time.monotonic()
        try:
            return await (aw if timeout is None else asyncio.wait_for(aw, timeout))
        finally:
            self.timings[name] = round(time.monotonic() - t0, 3)


#: Phases that run after the agent could act in its sandbox (its own run included).
_AFTER_AGENT_STARTED = frozenset({"agent", "stop_agent", "after_run"})


async def _damage_by_agent(
    sandbox: Sandbox, workdir: str, phase: str, task: RolloutTask
) -> str | None:
    """What the agent broke, when a failure came once it could act (see
    `Sandbox.agent_damage`, with the room the task says an evaluation needs, as the
    evaluate hook measures it); None: the failure is ours."""
    if phase not in _AFTER_AGENT_STARTED:
        return None
    headroom = EvalHeadroom.of_task(task.sandbox.spec_fields().get("resources"))
    return await sandbox.agent_damage(workdir, headroom=headroom)


def _endpoints(session: SessionCreated, sandbox: Sandbox) -> GatewayEndpoints:
    return GatewayEndpoints.inside_sandbox(
        token=session.token,
        openai_base_url=session.openai_base_url,
        anthropic_base_url=session.anthropic_base_url,
        sandbox_base_url=sandbox.gateway_base_url,
        session_id=session.session_id,
    )


async def run_in_sandbox(
    sandbox: Sandbox,
    task: RolloutTask,
    session: SessionCreated,
    rollout_id: str,
    artifacts_dir: str | Path,
    *,
    harness: AgentHarness | None = None,
    hooks: list[Hook] | None = None,
    on_phase: PhaseCallback | None = None,
) -> RunOutcome:
    """Harness + hooks in a provisioned sandbox. Does not destroy the sandbox; does run
    `harness.cleanup` and, on failure or cancellation, the `on_error` hooks.

    `harness` and `hooks` default to the task's (pass them when the caller built them
    already to report config errors its own way)."""
    artifacts_dir = Path(artifacts_dir)
    artifacts_dir.mkdir(parents=True, exist_ok=True)
    # Build harness and hooks first: a bad config fails before anything runs.
    harness = harness or build_harness(task)
    hooks = build_task_hooks(task) if hooks is None else hooks
    handle = sandbox.handle
    outcome = RunOutcome(
        harness=task.harness.name,
        reward_fn_version=task.reward_fn_id(),
        env_version=handle.env_version,
        sandbox_id=handle.sandbox_id,
        host=handle.host,
        artifacts_dir=str(artifacts_dir),
    )
    phases = _Phases(on_phase, outcome.timings)
    repo = task.sandbox.repo()
    hctx = HarnessContext(
        rollout_id=rollout_id,
        task=task,
        endpoints=_endpoints(session, sandbox),
        workdir=repo.path if repo else sandbox.workdir,
        output_dir=str(artifacts_dir / "agent"),
    )
    ctx = HookContext(
        rollout_id=rollout_id,
        task=task,
        sandbox=sandbox,
        workdir=hctx.workdir,
        artifacts_dir=artifacts_dir,
        outcome=outcome,
        log_specs=harness.log_specs(),
    )
    budget = task.budget
    try:
        await phases.run("setup", harness.setup(sandbox, hctx), budget.setup_s)
        ctx.log_specs = harness.log_specs()  # setup decides where the agent keeps its state
        outcome.harness_version = task.harness.version or harness.harness_version
        await phases.run("before_run", run_phase(hooks, "before_run", ctx), budget.hooks_s)
        agent = await phases.run("agent", harness.run(sandbox, hctx))
        if task.harness.version:
            agent.harness_version = task.harness.version
        outcome.agent = agent
        for lf in agent.logs:
            if lf.local_path:
                ctx.add_artifact(Path(lf.local_path), lf.kind)
        await phases.run("stop_agent", sandbox.kill_all_processes(), budget.cleanup_s)
        after = run_phase(hooks, "after_run", ctx, before_each=sandbox.kill_all_processes)
        try:
            await phases.run("after_run", after, budget.hooks_s)
        except TimeoutError:
            if outcome.evaluation is None:
                raise
            # The verdict stands; what a later hook did not finish is recorded.
            outcome.hook_errors.append(f"after_run hooks passed hooks_s={budget.hooks_s}")
        outcome.status = run_status(outcome.agent, outcome.evaluation)
        if task.reward_fn_version is None and outcome.evaluation is not None:
            outcome.reward_fn_version = outcome.evaluation.reward_fn_version
    except asyncio.CancelledError as e:
        outcome.error = f"cancelled during {phases.current}"
        await to_completion(run_on_error(hooks, ctx, e), budget.cleanup_s, "on_error hooks")
        raise
    except Exception as e:
        outcome.error = f"{phases.current}: {e!r}"
        try:
            damage = await _damage_by_agent(sandbox, ctx.workdir, phases.current, task)
        except asyncio.CancelledError:  # cancelled while looking: as any cancellation
            outcome.error = f"cancelled during {phases.current}"
            await to_completion(run_on_error(hooks, ctx, e), budget.cleanup_s, "on_error hooks")
            raise
        outcome.status = RolloutStatus.infra_error
        if damage is not None:
            outcome.status = RolloutStatus.agent_broke_sandbox
            outcome.error += f"; the agent broke its sandbox: {damage}"
        await to_completion(run_on_error(hooks, ctx, e), budget.hooks_s, "on_error hooks")
        if damage is None:
            raise RuntimeFailure(phases.current, outcome, e) from e
    finally:
        await to_completion(harness.cleanup(sandbox), budget.cleanup_s, "harness cleanup")
    return outcome
