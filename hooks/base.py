"""The hook protocol, per-task hook specs, the shared run context and the registry.

Why hooks: what happens around an agent run (evaluation, diffs, log collection,
uploads, metrics) differs per task, and must be composable without touching harnesses
or backends. A task lists `HookSpec`s; they run in list order at `before_run`,
`after_run` and (on failure or cancellation) `on_error`. Params are validated when the
hooks are built — before any sandbox exists — so a typo in a task fails fast.
"""

from __future__ import annotations

import abc
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel

from sandboxes.base import Sandbox
from schemas.base import StrictModel
from schemas.outcome import ArtifactRef, LogSpec, RunOutcome
from schemas.tasks import HookSpec, RolloutTask
from schemas.workspace import RepoSpec

log = logging.getLogger(__name__)

__all__ = [
    "Hook",
    "HookContext",
    "HookError",
    "build_hooks",
    "get_hook_class",
    "register_hook",
]


class HookError(RuntimeError):
    """A required hook failed."""


@dataclass
class HookContext:
    """Everything hooks share for one rollout: they read the task and the sandbox, and
    add their results to `outcome` (the same object the run returns)."""

    rollout_id: str
    task: RolloutTask
    sandbox: Sandbox
    #: Directory the agent works in (inside the sandbox).
    workdir: str
    #: Host directory for this rollout's artifacts (logs, diff, metrics...).
    artifacts_dir: Path
    outcome: RunOutcome
    #: Where the agent keeps its own transcripts (from the harness profile).
    log_specs: list[LogSpec] = field(default_factory=list)
    #: The failure being handled (set for on_error).
    error: BaseException | None = None
    #: Free-form state hooks keep between phases (keyed by hook name).
    state: dict[str, Any] = field(default_factory=dict)

    @property
    def repo(self) -> RepoSpec | None:
        return self.task.sandbox.repo()

    def add_artifact(self, path: Path, kind: str) -> ArtifactRef:
        ref = ArtifactRef(
            name=str(path.relative_to(self.artifacts_dir))
            if path.is_relative_to(self.artifacts_dir)
            else path.name,
            kind=kind,
            local_path=str(path),
            size=path.stat().st_size if path.exists() else 0,
        )
        artifacts = [a for a in self.outcome.artifacts if a.local_path != ref.local_path]
        self.outcome.artifacts = [*artifacts, ref]
        return ref


class EmptyParams(StrictModel):
    pass


class Hook(abc.ABC):  # every phase is optional, none is abstract
    """Base hook: override any of the three phases; the default does nothing."""

    name: ClassVar[str]
    Params: ClassVar[type[BaseModel]] = EmptyParams

    def __init__(self, params: BaseModel | dict[str, Any] | None = None) -> None:
        if not isinstance(params, self.Params):
            params = self.Params.model_validate(params or {})
        self.params = params
        self.required = True

    async def before_run(self, ctx: HookContext) -> None:  # noqa: B027
        """After harness setup, before the agent starts."""

    async def after_run(self, ctx: HookContext) -> None:  # noqa: B027
        """After the agent exited (any exit code, also on timeout)."""

    async def on_error(self, ctx: HookContext, error: BaseException) -> None:  # noqa: B027
        """When provisioning, setup, the agent run or a required hook failed, or the
        rollout was cancelled. Must not raise for missing state (it may run early)."""


_HOOKS: dict[str, type[Hook]] = {}
_BUILTIN = {
    "collect_logs": "hooks.collect_logs",
    "evaluate": "hooks.evaluate",
    "capture_diff": "hooks.capture_diff",
    "upload_artifacts": "hooks.upload_artifacts",
    "metrics": "hooks.metrics",
}


def register_hook(cls: type[Hook]) -> type[Hook]:
    """Class decorator: make a hook usable by name in task specs."""
    _HOOKS[cls.name] = cls
    return cls


def get_hook_class(name: str) -> type[Hook]:
    if name not in _HOOKS and name in _BUILTIN:
        import importlib

        importlib.import_module(_BUILTIN[name])
    if name not in _HOOKS:
        raise KeyError(f"unknown hook {name!r}; known: {sorted({*_HOOKS, *_BUILTIN})}")
    return _HOOKS[name]


def build_hooks(specs: list[HookSpec]) -> list[Hook]:
    """Instantiate hooks in order, validating every params block up front."""
    hooks: list[Hook] = []
    for spec in specs:
        hook = get_hook_class(spec.name)(spec.params)
        hook.required = spec.required
        hooks.append(hook)
    return hooks


async def run_phase(
    hooks: list[Hook],
    phase: str,
    ctx: HookContext,
    before_each: Callable[[], Awaitable[None]] | None = None,
) -> None:
    """Run `before_run` or `after_run` of every hook in order.

    A required hook's exception propagates (the runtime then runs `on_error`), unless an
    evaluation is in the outcome already: that verdict stands, so the failure is only
    recorded, as an optional hook's always is, in `ctx.outcome.hook_errors`, and the next
    hook runs. `before_each` runs before every hook (the runtime kills the sandbox's
    processes there); its failure always propagates.
    """
    for hook in hooks:
        if before_each is not None:
            await before_each()
        timed = getattr(type(hook), phase) is not getattr(Hook, phase)
        started = time.monotonic()
        try:
            await getattr(hook, phase)(ctx)
        except Exception as e:
            if hook.required and ctx.outcome.evaluation is None:
                raise HookError(f"hook {hook.name}.{phase} failed: {e!r}") from e
            log.warning("hook %s.%s failed (recorded): %r", hook.name, phase, e)
            ctx.outcome.hook_errors.append(f"{hook.name}.{phase}: {e!r}")
        finally:
            if timed:  # each hook's own time (fleet metrics, metrics.json): `hook:<name>`
                key = f"hook:{hook.name}"
                elapsed = time.monotonic() - started
                ctx.outcome.timings[key] = round(ctx.outcome.timings.get(key, 0.0) + elapsed, 3)


async def run_on_error(hooks: list[Hook], ctx: HookContext, error: BaseException) -> None:
    """Run every hook's `on_error` in order; their own failures are only recorded, so
    they can never mask the original error."""
    ctx.error = error
    for hook in hooks:
        try:
            await hook.on_error(ctx, error)
        except Exception as e:
            log.warning("hook %s.on_error failed: %r", hook.name, e)
            ctx.outcome.hook_errors.append(f"{hook.name}.on_error: {e!r}")
