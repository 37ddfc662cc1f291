"""Unit tests for the run composition (`activities.runtime.run_in_sandbox`, driven by the
tests' `RuntimeManager`) with an in-memory backend and a scripted harness: order of
phases, status mapping, on_error, and that the sandbox is destroyed after success,
failure and cancellation."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import pytest

from activities.runtime import RuntimeFailure
from harnesses.base import AgentHarness, HarnessConfig, HarnessContext
from harnesses.registry import register_harness
from hooks.base import Hook, HookContext, register_hook
from sandboxes.base import (
    EvalHeadroom,
    ExecResult,
    Sandbox,
    SandboxBackend,
    SandboxError,
    SandboxHandle,
    SandboxSpec,
)
from schemas.evaluation import EvaluationResult
from schemas.outcome import AgentResult, LogSpec, RolloutStatus
from schemas.scenes import SceneRule
from schemas.session import SessionCreated
from schemas.tasks import RolloutTask
from tests.fixtures.fake_sandbox import FakeSandbox
from tests.fixtures.hooks import EVENTS
from tests.fixtures.runtime import RuntimeManager

SESSION = SessionCreated(
    session_id="s1",
    token="tok",
    openai_base_url="http://127.0.0.1:8000/v1",
    anthropic_base_url="http://127.0.0.1:8000",
)


class ScriptedConfig(HarnessConfig):
    behaviour: str = "ok"  # ok | fail_exit | timeout | raise | hang | setup_raise


@register_harness
class ScriptedHarness(AgentHarness):
    name = "test_scripted"
    config_model = ScriptedConfig
    config: ScriptedConfig

    async def setup(self, sandbox: Sandbox, ctx: HarnessContext) -> None:
        EVENTS.append("harness.setup")
        assert ctx.endpoints.openai_base_url == "http://127.0.0.1:18080/v1"
        assert ctx.endpoints.token == "tok"
        if self.config.behaviour == "setup_raise":
            raise RuntimeError("cannot configure")
        self.harness_version = "9.9.9"

    async def run(self, sandbox: Sandbox, ctx: HarnessContext) -> AgentResult:
        EVENTS.append("harness.run")
        b = self.config.behaviour
        if b == "raise":
            raise RuntimeError("sandbox went away")
        if b == "hang":
            await asyncio.sleep(3600)
        return AgentResult(
            harness=self.name,
            harness_version=self.harness_version,
            exit_code={"ok": 0, "fail_exit": 3, "timeout": 137}[b],
            timed_out=b == "timeout",
        )

    async def cleanup(self, sandbox: Sandbox) -> None:
        EVENTS.append("harness.cleanup")

    def scene_rules(self) -> list[SceneRule]:
        return []

    def log_specs(self) -> list[LogSpec]:
        """Like a CLI harness: where the logs are is known only after setup."""
        where = "/state-after-setup" if self.harness_version == "9.9.9" else "/guess"
        return [LogSpec(path=where)]


class FakeBackend(SandboxBackend):
    name = "fake"

    def __init__(
        self, fail_create: bool = False, fail_kill: bool = False, damage: str | None = None
    ) -> None:
        self.fail_create = fail_create
        self.fail_kill = fail_kill
        #: What its sandboxes' damage probe finds (None: an intact sandbox).
        self.damage = damage
        self.live: dict[str, SandboxHandle] = {}
        self.specs: list[SandboxSpec] = []
        #: The free space each damage probe was asked to find.
        self.headrooms: list[EvalHeadroom] = []

    async def create(self, spec: SandboxSpec) -> Sandbox:
        self.specs.append(spec)
        sb = _Sb(self)
        sb.handle = sb.handle.model_copy(update={"rollout_id": spec.rollout_id})
        self.live[sb.handle.sandbox_id] = sb.handle
        if self.fail_create:
            raise RuntimeError("no capacity")
        return sb

    async def attach(self, handle: SandboxHandle) -> Sandbox:
        raise NotImplementedError

    async def destroy(self, handle: SandboxHandle) -> None:
        EVENTS.append("sandbox.destroy")
        self.live.pop(handle.sandbox_id, None)

    async def list(self) -> list[SandboxHandle]:
        return list(self.live.values())


class _Sb(FakeSandbox):
    def __init__(self, backend: FakeBackend) -> None:
        super().__init__(lambda cmd, kw: ExecResult(exit_code=0))
        self._backend = backend  # type: ignore[assignment]

    async def kill_all_processes(self) -> None:
        EVENTS.append("sandbox.kill_all")
        if self._backend.fail_kill:  # type: ignore[attr-defined]
            raise SandboxError("processes survived SIGKILL: [42]")

    async def _find_damage(
        self, workdir: str, check_dirs: Sequence[str], headroom: EvalHeadroom
    ) -> str | None:
        EVENTS.append("sandbox.probe")
        self._backend.headrooms.append(headroom)  # type: ignore[attr-defined]
        if self._backend.damage == "hang":  # type: ignore[attr-defined]
            await asyncio.sleep(3600)
        return self._backend.damage  # type: ignore[attr-defined,no-any-return]


def task(behaviour: str = "ok", **kw: Any) -> RolloutTask:
    return RolloutTask.model_validate(
        {
            "task_id": "t1",
            "prompt": "do it",
            "sandbox": {"backend": "fake"},
            "harness": {"name": "test_scripted", "config": {"behaviour": behaviour}},
            "hooks": [{"name": "test_recorder", "params": {"tag": "h"}}],
            **kw,
        }
    )


@pytest.fixture(autouse=True)
def _clear() -> None:
    EVENTS.clear()


def manager(tmp_path: Path, backend: FakeBackend) -> RuntimeManager:
    return RuntimeManager(tmp_path, backends={"fake": backend})


async def test_phases_run_in_order_and_the_sandbox_is_destroyed(tmp_path: Path) -> None:
    backend = FakeBackend()
    phases: list[str] = []
    r = await manager(tmp_path, backend).run(task(), SESSION, "r1", on_phase=phases.append)
    # Every process the agent left is killed after it, and again before each after_run
    # hook (evaluation): one hook may have started what the agent planted.
    assert EVENTS == [
        "harness.setup",
        "h.before_run",
        "harness.run",
        "sandbox.kill_all",
        "sandbox.kill_all",
        "h.after_run",
        "harness.cleanup",
        "sandbox.destroy",
    ]
    assert phases == ["setup", "before_run", "agent", "stop_agent", "after_run"]
    assert r.status == RolloutStatus.ok and r.harness_version == "9.9.9"
    assert r.env_version == "fake:1" and not backend.live
    # the phases, and each hook that ran in one (`hook:<name>`, its phases added up)
    phases_timed = {"setup", "before_run", "agent", "stop_agent", "after_run"}
    assert set(r.timings) == phases_timed | {"hook:test_recorder"}
    # The sandbox is told where the Gateway is (a non-local backend: its public origin);
    # the harness sees it inside (asserted in ScriptedHarness.setup).
    assert backend.specs[0].gateway is not None
    assert backend.specs[0].gateway.public_url == "http://127.0.0.1:8000"
    assert backend.specs[0].rollout_id == "r1"


@pytest.mark.parametrize(
    ("behaviour", "status", "exit_code"),
    [("fail_exit", RolloutStatus.ok, 3), ("timeout", RolloutStatus.agent_timeout, 137)],
)
async def test_agent_outcomes_are_data_not_exceptions(
    tmp_path: Path, behaviour: str, status: RolloutStatus, exit_code: int
) -> None:
    """A non-zero exit is the policy's outcome (its reward stands): status ok."""
    backend = FakeBackend()
    r = await manager(tmp_path, backend).run(task(behaviour), SESSION, "r1")
    assert r.status == status and "h.after_run" in EVENTS and not backend.live
    assert r.agent is not None and r.agent.exit_code == exit_code


async def test_a_failed_kill_fails_the_run_before_any_evaluation(tmp_path: Path) -> None:
    """If the agent's processes cannot be stopped, no after_run hook (no evaluation)
    runs on a sandbox they could still change: the run is an infra error."""
    backend = FakeBackend(fail_kill=True)
    with pytest.raises(RuntimeFailure) as exc:
        await manager(tmp_path, backend).run(task(), SESSION, "r1")
    assert exc.value.phase == "stop_agent"
    assert exc.value.outcome.status == RolloutStatus.infra_error
    assert "h.after_run" not in EVENTS
    assert EVENTS[-5:] == [
        "sandbox.kill_all",
        "sandbox.probe",  # an intact sandbox: the failure is ours
        "h.on_error",
        "harness.cleanup",
        "sandbox.destroy",
    ]


@pytest.mark.parametrize("behaviour", ["raise", "setup_raise"])
async def test_infra_failure_runs_on_error_then_destroys(tmp_path: Path, behaviour: str) -> None:
    backend = FakeBackend()
    with pytest.raises(RuntimeFailure) as exc:
        await manager(tmp_path, backend).run(task(behaviour), SESSION, "r1")
    f = exc.value
    assert f.outcome.status == RolloutStatus.infra_error
    assert f.phase == ("agent" if behaviour == "raise" else "setup")
    assert EVENTS[-3:] == ["h.on_error", "harness.cleanup", "sandbox.destroy"]
    assert "h.after_run" not in EVENTS and not backend.live


@pytest.mark.parametrize(("behaviour", "fail_kill"), [("raise", False), ("ok", True)])
async def test_a_failure_in_a_sandbox_the_agent_broke_is_its_zero_not_a_retry(
    tmp_path: Path, behaviour: str, fail_kill: bool
) -> None:
    """The agent's run (or the kill after it) failed and the sandbox shows damage the
    agent could have done: the run returns `agent_broke_sandbox`, reward 0, saying what
    was broken; no RuntimeFailure (a fresh attempt), no evaluation on it. The same
    failures on an intact sandbox stay infra errors (the tests above)."""
    backend = FakeBackend(fail_kill=fail_kill, damage="its supervisor is gone")
    r = await manager(tmp_path, backend).run(task(behaviour), SESSION, "r1")
    assert r.status == RolloutStatus.agent_broke_sandbox and r.reward == 0.0
    assert r.problem is not None and "its supervisor is gone" in r.problem
    assert "h.after_run" not in EVENTS and "sandbox.probe" in EVENTS
    assert EVENTS[-3:] == ["h.on_error", "harness.cleanup", "sandbox.destroy"]


async def test_the_damage_probe_wants_the_room_the_task_says_an_evaluation_needs(
    tmp_path: Path,
) -> None:
    """A failed run is probed with the task's `eval_headroom`, as the evaluate hook
    probes a failed check: one rule of whose failure it is, not two."""
    backend = FakeBackend(damage="its disk is full")
    room = {"disk_mb": 100, "shm_mb": 2}
    spec = task("raise", sandbox={"backend": "fake", "resources": {"eval_headroom": room}})
    await manager(tmp_path, backend).run(spec, SESSION, "r1")
    assert backend.headrooms == [EvalHeadroom(disk_mb=100, shm_mb=2)]
    backend.headrooms.clear()
    await manager(tmp_path, backend).run(task("raise"), SESSION, "r2")
    assert backend.headrooms == [EvalHeadroom()]


async def test_a_failure_before_the_agent_ran_is_never_the_agents(tmp_path: Path) -> None:
    """Setup failed: whatever the sandbox looks like, the agent never acted in it."""
    backend = FakeBackend(damage="its disk is full")
    with pytest.raises(RuntimeFailure) as exc:
        await manager(tmp_path, backend).run(task("setup_raise"), SESSION, "r1")
    assert exc.value.outcome.status == RolloutStatus.infra_error
    assert "sandbox.probe" not in EVENTS


async def test_cancellation_while_the_sandbox_is_probed_still_runs_on_error(
    tmp_path: Path,
) -> None:
    backend = FakeBackend(fail_kill=True, damage="hang")
    run = asyncio.create_task(manager(tmp_path, backend).run(task(), SESSION, "r1"))
    while "sandbox.probe" not in EVENTS:
        assert not run.done(), "the run ended without probing its sandbox"
        await asyncio.sleep(0.01)
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    assert EVENTS[-3:] == ["h.on_error", "harness.cleanup", "sandbox.destroy"]
    assert not backend.live


async def test_cancellation_runs_on_error_and_destroys(tmp_path: Path) -> None:
    backend = FakeBackend()
    run = asyncio.create_task(manager(tmp_path, backend).run(task("hang"), SESSION, "r1"))
    while "harness.run" not in EVENTS:
        await asyncio.sleep(0.01)
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    assert EVENTS[-3:] == ["h.on_error", "harness.cleanup", "sandbox.destroy"]
    assert not backend.live


async def test_failed_create_reaps_a_half_made_sandbox(tmp_path: Path) -> None:
    backend = FakeBackend(fail_create=True)
    with pytest.raises(RuntimeFailure) as exc:
        await manager(tmp_path, backend).run(task(), SESSION, "r1")
    assert exc.value.phase == "provision"
    assert EVENTS == ["sandbox.destroy"] and not backend.live


async def test_bad_task_config_fails_before_any_sandbox(tmp_path: Path) -> None:
    backend = FakeBackend()
    bad_params = task(hooks=[{"name": "evaluate", "params": {"bogus": 1}}])
    with pytest.raises(ValueError):
        await manager(tmp_path, backend).run(bad_params, SESSION, "r1")
    unknown = task(hooks=[{"name": "no_such_hook"}])
    with pytest.raises(KeyError):
        await manager(tmp_path, backend).run(unknown, SESSION, "r1")
    assert not backend.specs


@register_hook
class LogSpecsProbe(Hook):
    """Test hook: notes where hooks are told the agent's logs are."""

    name = "test_log_specs_probe"
    seen: ClassVar[list[str]] = []

    async def after_run(self, ctx: HookContext) -> None:
        self.seen.extend(spec.path for spec in ctx.log_specs)


async def test_hooks_see_the_log_locations_decided_by_setup(tmp_path: Path) -> None:
    LogSpecsProbe.seen.clear()
    await manager(tmp_path, FakeBackend()).run(
        task(hooks=[{"name": "test_log_specs_probe"}]), SESSION, "r1"
    )
    assert LogSpecsProbe.seen == ["/state-after-setup"]


@register_hook
class _EvaluatesThenHangs(Hook):
    """Test hook: puts a passing evaluation in the outcome, then waits forever (a later
    step of the after_run phase that never ends)."""

    name = "test_evaluates_then_hangs"

    async def after_run(self, ctx: HookContext) -> None:
        ctx.outcome.evaluation = EvaluationResult(
            status="ok", reward=1.0, verdict="pass", reward_fn_version="v"
        )
        await asyncio.Event().wait()


@register_hook
class _Hangs(Hook):
    name = "test_hangs"

    async def after_run(self, ctx: HookContext) -> None:
        await asyncio.Event().wait()


async def test_after_run_hooks_passing_their_budget_after_the_evaluation_keep_it(
    tmp_path: Path,
) -> None:
    hooks = [{"name": "test_evaluates_then_hangs"}]
    t = task(hooks=hooks, budget={"hooks_s": 1})
    r = await manager(tmp_path, FakeBackend()).run(t, SESSION, "r1")
    assert r.status == RolloutStatus.ok and r.reward == 1.0
    assert r.hook_errors == ["after_run hooks passed hooks_s=1.0"]
    # Control: a phase that times out before any evaluation fails the run.
    with pytest.raises(RuntimeFailure) as exc:
        await manager(tmp_path, FakeBackend()).run(
            task("ok", hooks=[{"name": "test_hangs"}], budget={"hooks_s": 1}), SESSION, "r2"
        )
    assert exc.value.phase == "after_run" and isinstance(exc.value.cause, TimeoutError)
