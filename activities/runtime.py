"""The Runtime Manager: sandbox × harness × hooks for one rollout, as a plain async call.

Why a plain composition (no Temporal here): the activities that wrap it decide retries,
heartbeats and task queues; this module only guarantees the *order* and the *cleanup*:

    create sandbox → harness.setup → before_run hooks → harness.run → after_run hooks
    (on any failure or cancellation: on_error hooks)
    finally, always — also on asyncio.CancelledError: harness.cleanup, sandbox.destroy

Outcomes of the agent (bad exit, time-out, wrong answer, broken evaluator) are *data*
in the returned `RuntimeResult`. Infrastructure failures (sandbox, harness setup, a
required hook) raise `RuntimeFailure`, which carries the partial result, so the caller
can retry or record it. The task-side models (`TaskRuntimeSpec` and friends) live here
for now; they are plain pydantic and may move to `schemas/`.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from enum import StrEnum
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pydantic import Field

from harnesses.base import AgentResult, GatewayEndpoints, HarnessContext
from harnesses.registry import get_harness
from hooks.base import ArtifactRef, HookContext, build_hooks, run_on_error, run_phase
from hooks.capture_diff import DiffSummary
from hooks.evaluate import EvaluationResult, EvaluationSpec
from sandboxes.base import GatewayChannel, Sandbox, SandboxBackend, SandboxSpec
from sandboxes.registry import get_backend
from schemas.base import StrictModel
from schemas.scenes import SceneConfig
from schemas.session import SessionCreated
from schemas.tasks import HarnessSpec, HookSpec, RolloutTask

log = logging.getLogger(__name__)

__all__ = [
    "RuntimeBudget",
    "RuntimeFailure",
    "RuntimeManager",
    "RuntimeResult",
    "RuntimeStatus",
    "SandboxTemplate",
    "TaskRuntimeSpec",
    "default_hooks",
    "run_in_sandbox",
]


# --------------------------------------------------------------------------- task spec


class RuntimeBudget(StrictModel):
    """Wall-clock limits (seconds) around the agent; the agent's own budget is
    `HarnessSpec.budget_s` (it is killed at that point)."""

    provision_timeout_s: float = Field(default=900.0, gt=0)
    setup_timeout_s: float = Field(default=300.0, gt=0)
    #: Per hook phase (before_run, after_run, on_error).
    hooks_timeout_s: float = Field(default=900.0, gt=0)
    cleanup_timeout_s: float = Field(default=120.0, gt=0)


class SandboxTemplate(SandboxSpec):
    """A `SandboxSpec` without the rollout id: the per-task part of it."""

    rollout_id: str = ""

    def for_rollout(self, rollout_id: str, gateway: GatewayChannel | None) -> SandboxSpec:
        data = self.model_dump()
        data["rollout_id"] = rollout_id
        if data.get("gateway") is None and gateway is not None:
            data["gateway"] = gateway.model_dump()
        return SandboxSpec.model_validate(data)


def default_hooks() -> list[HookSpec]:
    """Logs, then the diff (before evaluation can touch the workspace), then the
    evaluation, then metrics summarising all of them."""
    return [
        HookSpec(name="collect_logs"),
        HookSpec(name="capture_diff", required=False),
        HookSpec(name="evaluate"),
        HookSpec(name="metrics"),
    ]


class TaskRuntimeSpec(StrictModel):
    """Everything the Runtime Manager needs from a task to run one rollout of it."""

    task_id: str
    prompt: str
    backend: str = "local"
    backend_config: dict[str, Any] = Field(default_factory=dict)
    sandbox: SandboxTemplate = Field(default_factory=SandboxTemplate)
    harness: HarnessSpec
    hooks: list[HookSpec] = Field(default_factory=default_hooks)
    #: The environment contract (success check) used by the `evaluate` hook.
    evaluation: EvaluationSpec | None = None
    budget: RuntimeBudget = Field(default_factory=RuntimeBudget)
    #: Where the agent starts (default: the repo path if any, else the sandbox workdir).
    workdir: str | None = None

    @classmethod
    def from_task(cls, task: RolloutTask) -> TaskRuntimeSpec:
        """The runtime view of a submitted task (an empty hook list means the defaults)."""
        return cls(
            task_id=task.task_id,
            prompt=task.prompt,
            backend=task.sandbox.backend,
            sandbox=SandboxTemplate.model_validate(task.sandbox.spec_fields()),
            harness=task.harness,
            hooks=list(task.hooks) or default_hooks(),
            evaluation=EvaluationSpec.model_validate(task.evaluation) if task.evaluation else None,
        )

    def scene_config(self) -> SceneConfig:
        """The harness's scene profile, to send when the Gateway session is created."""
        return get_harness(self.harness.name, self.harness.config).scene_config()


# --------------------------------------------------------------------------- result


class RuntimeStatus(StrEnum):
    ok = "ok"
    agent_error = "agent_error"  # the agent exited non-zero (its reward still stands)
    agent_timeout = "agent_timeout"
    eval_error = "eval_error"  # the success check itself could not be carried out
    infra_error = "infra_error"
    cancelled = "cancelled"


class RuntimeResult(StrictModel):
    """What one rollout's runtime produced: small, references only (no big data)."""

    rollout_id: str
    task_id: str
    status: RuntimeStatus
    harness: str
    harness_version: str = "unknown"
    backend: str
    #: Image digest / rootfs id / template of the sandbox (lineage).
    env_version: str | None = None
    sandbox_id: str | None = None
    host: str | None = None
    agent: AgentResult | None = None
    evaluation: EvaluationResult | None = None
    reward: float | None = None
    reward_fn_version: str | None = None
    diff: DiffSummary | None = None
    artifacts: list[ArtifactRef] = Field(default_factory=list)
    artifacts_dir: str | None = None
    metrics: dict[str, Any] = Field(default_factory=dict)
    timings: dict[str, float] = Field(default_factory=dict)
    error: str | None = None
    hook_errors: list[str] = Field(default_factory=list)


class RuntimeFailure(RuntimeError):
    """An infrastructure failure; `result` is the partial result (status infra_error)."""

    def __init__(self, phase: str, result: RuntimeResult, cause: BaseException) -> None:
        super().__init__(f"rollout {result.rollout_id} failed in {phase}: {cause!r}")
        self.phase = phase
        self.result = result
        self.cause = cause


def _status(agent: AgentResult, evaluation: EvaluationResult | None) -> RuntimeStatus:
    if agent.timed_out:
        return RuntimeStatus.agent_timeout
    if evaluation is not None and evaluation.status == "eval_error":
        return RuntimeStatus.eval_error
    if agent.exit_code != 0:
        return RuntimeStatus.agent_error
    return RuntimeStatus.ok


def _origin(url: str) -> str:
    u = urlsplit(url)
    return f"{u.scheme}://{u.netloc}"


async def _to_completion(coro: Coroutine[Any, Any, Any], timeout: float, what: str) -> None:
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
    """Tracks the current phase, times each one and tells the caller (heartbeats)."""

    def __init__(self, on_phase: PhaseCallback | None) -> None:
        self.on_phase = on_phase
        self.current = "start"
        self.timings: dict[str, float] = {}

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


def _endpoints(session: SessionCreated, sandbox: Sandbox) -> GatewayEndpoints:
    return GatewayEndpoints.inside_sandbox(
        token=session.token,
        openai_base_url=session.openai_base_url,
        anthropic_base_url=session.anthropic_base_url,
        sandbox_base_url=sandbox.gateway_base_url,
        session_id=session.session_id,
    )


def _new_result(task: TaskRuntimeSpec, rollout_id: str, artifacts_dir: Path) -> RuntimeResult:
    return RuntimeResult(
        rollout_id=rollout_id,
        task_id=task.task_id,
        status=RuntimeStatus.infra_error,
        harness=task.harness.name,
        backend=task.backend,
        artifacts_dir=str(artifacts_dir),
    )


def _fill(result: RuntimeResult, ctx: HookContext | None, timings: dict[str, float]) -> None:
    result.timings = dict(timings)
    if ctx is None:
        return
    result.agent = ctx.agent_result
    result.evaluation = ctx.evaluation
    if ctx.evaluation is not None:
        result.reward = ctx.evaluation.reward
        result.reward_fn_version = ctx.evaluation.reward_fn_version
    result.diff = ctx.diff
    result.artifacts = list(ctx.artifacts)
    result.metrics = dict(ctx.metrics)
    result.hook_errors = list(ctx.hook_errors)


async def run_in_sandbox(
    sandbox: Sandbox,
    task: TaskRuntimeSpec,
    session: SessionCreated,
    rollout_id: str,
    artifacts_dir: str | Path,
    *,
    on_phase: PhaseCallback | None = None,
    _phases: _Phases | None = None,
    _result: RuntimeResult | None = None,
) -> RuntimeResult:
    """Harness + hooks in an existing sandbox (for a `run_harness` activity that gets
    the sandbox from an earlier `provision_sandbox`). Does not destroy the sandbox;
    does run `harness.cleanup` and, on failure or cancellation, the `on_error` hooks."""
    artifacts_dir = Path(artifacts_dir)
    artifacts_dir.mkdir(parents=True, exist_ok=True)
    # Build harness and hooks first: a bad config fails before anything runs.
    harness = get_harness(task.harness.name, task.harness.config)
    hooks = build_hooks(task.hooks)
    phases = _phases or _Phases(on_phase)
    result = _result or _new_result(task, rollout_id, artifacts_dir)
    handle = sandbox.handle
    result.env_version, result.sandbox_id, result.host = (
        handle.env_version,
        handle.sandbox_id,
        handle.host,
    )
    workdir = task.workdir or (task.sandbox.repo.path if task.sandbox.repo else None)
    hctx = HarnessContext(
        rollout_id=rollout_id,
        prompt=task.prompt,
        endpoints=_endpoints(session, sandbox),
        budget_s=task.harness.budget_s,
        workdir=workdir or sandbox.workdir,
        output_dir=str(artifacts_dir / "agent"),
    )
    ctx = HookContext(
        rollout_id=rollout_id,
        task_id=task.task_id,
        sandbox=sandbox,
        harness=harness,
        harness_ctx=hctx,
        artifacts_dir=artifacts_dir,
        evaluation_spec=task.evaluation,
        repo=task.sandbox.repo,
        timings=phases.timings,
    )
    b = task.budget
    try:
        await phases.run("setup", harness.setup(sandbox, hctx), b.setup_timeout_s)
        result.harness_version = task.harness.version or harness.harness_version
        await phases.run("before_run", run_phase(hooks, "before_run", ctx), b.hooks_timeout_s)
        agent: AgentResult = await phases.run("agent", harness.run(sandbox, hctx))
        if task.harness.version:
            agent.harness_version = task.harness.version
        ctx.agent_result = agent
        for lf in agent.logs:
            if lf.local_path:
                ctx.add_artifact(Path(lf.local_path), lf.kind)
        await phases.run("after_run", run_phase(hooks, "after_run", ctx), b.hooks_timeout_s)
        result.status = _status(agent, ctx.evaluation)
    except asyncio.CancelledError as e:
        result.status = RuntimeStatus.cancelled
        result.error = f"cancelled during {phases.current}"
        await _to_completion(run_on_error(hooks, ctx, e), b.cleanup_timeout_s, "on_error hooks")
        raise
    except Exception as e:
        result.status = RuntimeStatus.infra_error
        result.error = f"{phases.current}: {e!r}"
        await _to_completion(run_on_error(hooks, ctx, e), b.hooks_timeout_s, "on_error hooks")
        raise RuntimeFailure(phases.current, result, e) from e
    finally:
        await _to_completion(harness.cleanup(sandbox), b.cleanup_timeout_s, "harness cleanup")
        _fill(result, ctx, phases.timings)
    return result


class RuntimeManager:
    """Runs whole rollouts on this host: provision → `run_in_sandbox` → destroy.

    Holds one backend client per backend config. `artifacts_root` is a host directory;
    each rollout writes to `<artifacts_root>/<rollout_id>/` (agent output, logs, diff,
    metrics), which the `upload_artifacts` hook can copy to S3. `gateway_target`
    overrides how sandboxes reach the Gateway (default: the session URL's origin).
    """

    def __init__(
        self,
        artifacts_root: str | Path,
        *,
        backends: Mapping[str, SandboxBackend] | None = None,
        gateway_target: str | None = None,
    ) -> None:
        self.artifacts_root = Path(artifacts_root)
        self.gateway_target = gateway_target
        self._backends: dict[str, SandboxBackend] = dict(backends or {})

    def backend_for(self, task: TaskRuntimeSpec) -> SandboxBackend:
        key = task.backend
        if task.backend_config:
            key += ":" + json.dumps(task.backend_config, sort_keys=True)
        if key not in self._backends:
            self._backends[key] = get_backend(task.backend, **task.backend_config)
        return self._backends[key]

    async def close(self) -> None:
        for b in self._backends.values():
            with contextlib.suppress(Exception):
                await b.close()

    async def run(
        self,
        task: TaskRuntimeSpec,
        session: SessionCreated,
        rollout_id: str,
        *,
        on_phase: PhaseCallback | None = None,
    ) -> RuntimeResult:
        """One rollout end to end. The sandbox is destroyed in `finally` — after
        success, failure and cancellation alike."""
        get_harness(task.harness.name, task.harness.config)  # fail fast on bad config
        build_hooks(task.hooks)
        backend = self.backend_for(task)
        artifacts_dir = self.artifacts_root / rollout_id
        artifacts_dir.mkdir(parents=True, exist_ok=True)
        result = _new_result(task, rollout_id, artifacts_dir)
        phases = _Phases(on_phase)
        t_start = time.monotonic()
        sandbox: Sandbox | None = None
        try:
            gateway = GatewayChannel(target=self.gateway_target or _origin(session.openai_base_url))
            spec = task.sandbox.for_rollout(rollout_id, gateway)
            sandbox = await phases.run(
                "provision", backend.create(spec), task.budget.provision_timeout_s
            )
            assert sandbox is not None
            return await run_in_sandbox(
                sandbox,
                task,
                session,
                rollout_id,
                artifacts_dir,
                _phases=phases,
                _result=result,
            )
        except asyncio.CancelledError:
            if sandbox is None:
                result.status = RuntimeStatus.cancelled
                result.error = "cancelled during provision"
            raise
        except RuntimeFailure:
            raise
        except Exception as e:
            result.error = f"{phases.current}: {e!r}"
            raise RuntimeFailure(phases.current, result, e) from e
        finally:
            await _to_completion(
                self._destroy(sandbox, backend, rollout_id, phases.timings),
                task.budget.cleanup_timeout_s,
                "sandbox destroy",
            )
            phases.timings["total"] = round(time.monotonic() - t_start, 3)
            result.timings = dict(phases.timings)

    @staticmethod
    async def _destroy(
        sandbox: Sandbox | None,
        backend: SandboxBackend,
        rollout_id: str,
        timings: dict[str, float],
    ) -> None:
        t0 = time.monotonic()
        try:
            if sandbox is not None:
                await sandbox.destroy()
            else:
                # Failed or cancelled mid-create: the backend may have made one anyway.
                for h in await backend.list():
                    if h.rollout_id == rollout_id:
                        await backend.destroy(h)
        finally:
            timings["destroy"] = round(time.monotonic() - t0, 3)
