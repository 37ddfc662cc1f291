"""run_harness: harness setup → before_run hooks → the agent → after_run hooks
(evaluate included), in an already provisioned sandbox, on the host that owns it.

Why it heartbeats and how it stops the agent:
- a background loop heartbeats with progress (phase, elapsed, LLM calls so far), so a
  dead worker/host is detected within `heartbeat_s` and a cancel request reaches us;
- cancellation (workflow cancel, or the workflow's budget timer) arrives as
  `CancelledError` at the awaited exec, and cancelling the exec kills the agent's whole
  process tree inside the sandbox; on_error hooks then run (logs of a killed agent are
  what an operator wants), bounded in time;
- if the workflow is gone (terminated), we destroy the sandbox ourselves: nobody else
  will run `finally`.
The agent's budget is enforced here (the harness kills it at `budget_s`); the result is
then `timed_out`, which the workflow turns into `agent_timeout`.

The composition itself (setup → hooks → agent → hooks, on_error, harness cleanup) is
`activities.runtime.run_in_sandbox`; provisioning and destroy are separate activities
(host affinity, whole-attempt retry).
"""

import asyncio
import contextlib
import logging
import time
from pathlib import Path
from typing import Any

import httpx
from pydantic import ValidationError
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.errors import agent_config_error, bad_task, tail
from activities.runtime import RuntimeFailure, build_harness, build_task_hooks, run_in_sandbox
from activities.sandbox import SandboxBackends
from gateway.control_client import GatewayControlClients, GatewayControlError
from harnesses.base import AgentHarness, HarnessSetupError
from hooks.base import Hook, HookError
from sandboxes.base import Sandbox, SandboxError, SandboxHandle, SandboxNotFound
from schemas.outcome import RunOutcome
from schemas.rollout import RUN_HARNESS, HarnessRequest

log = logging.getLogger("rollout.activities.harness")


class Progress:
    """What the heartbeat reports; also what a retried attempt would see."""

    def __init__(self, sandbox_id: str) -> None:
        self.sandbox_id = sandbox_id
        self.phase = "attach"
        self.started = time.monotonic()
        self.llm_calls: int | None = None

    def details(self) -> dict[str, Any]:
        return {
            "phase": self.phase,
            "sandbox_id": self.sandbox_id,
            "elapsed_s": round(time.monotonic() - self.started, 1),
            "llm_calls": self.llm_calls,
        }


class CallCounter:
    """Counts the session's recorded LLM calls through the Gateway control API.

    Only when this host has the admin token; reads the session summary (counts only).
    One client per gateway (`GatewayControlClients`), kept for the worker's life: a new
    httpx client per count built a TLS context each time (≈ 60 ms of CPU on the loaded box,
    once per rollout and every `every_s`; py-spy put it at about a quarter of the demo
    worker's busy samples).
    """

    def __init__(self, admin_token: str | None, every_s: float) -> None:
        self.admin_token = admin_token
        self.every_s = every_s
        self.clients = GatewayControlClients(admin_token, timeout_s=10.0)

    async def count(self, gateway_url: str, session_id: str) -> int | None:
        if not self.admin_token or self.every_s <= 0:
            return None
        try:
            return (await self.clients.client(gateway_url).summary(session_id)).calls
        except (httpx.HTTPError, GatewayControlError, ValidationError):
            return None

    async def aclose(self) -> None:
        await self.clients.aclose()


class HarnessActivities:
    def __init__(
        self,
        backends: SandboxBackends,
        artifacts_root: Path,
        gateway_admin_token: str | None = None,
        count_calls_every_s: float = 5.0,
    ) -> None:
        self.backends = backends
        self.artifacts_root = Path(artifacts_root)
        self.counter = CallCounter(gateway_admin_token, count_calls_every_s)

    async def aclose(self) -> None:
        await self.counter.aclose()

    # ------------------------------------------------------------------ build
    @staticmethod
    def _build(req: HarnessRequest) -> tuple[AgentHarness, list[Hook]]:
        """The task's harness and hooks; a mistake here is the task's fault."""
        try:
            harness = build_harness(req.task)
        except KeyError as exc:
            raise bad_task("unknown harness", exc) from exc
        except (ValidationError, ValueError, TypeError) as exc:
            raise agent_config_error(f"harness {req.task.harness.name} config", exc) from exc
        try:
            return harness, build_task_hooks(req.task)
        except KeyError as exc:
            raise bad_task("unknown hook", exc) from exc
        except (ValidationError, ValueError) as exc:
            raise bad_task("hook params", exc) from exc

    async def _attach(self, req: HarnessRequest) -> Sandbox:
        try:
            backend = self.backends.get(req.sandbox.backend)
        except KeyError as exc:
            raise bad_task("sandbox backend", exc) from exc
        handle = SandboxHandle.model_validate(req.sandbox.handle)
        try:
            return await backend.attach(handle)
        except SandboxNotFound as exc:
            raise ApplicationError(f"sandbox lost: {exc}", type="SandboxLost") from exc
        except SandboxError as exc:
            raise ApplicationError(f"sandbox attach: {exc}", type="SandboxError") from exc

    # ------------------------------------------------------------------ activity
    @activity.defn(name=RUN_HARNESS)
    async def run_harness(self, req: HarnessRequest) -> RunOutcome:
        harness, hooks = self._build(req)
        progress = Progress(req.sandbox.sandbox_id)
        beat = asyncio.ensure_future(self._heartbeat(req, progress))
        sandbox: Sandbox | None = None

        def on_phase(name: str) -> None:
            progress.phase = name

        try:
            sandbox = await self._attach(req)
            artifacts = self.artifacts_root / req.rollout_id / f"attempt-{req.attempt}"
            outcome = await run_in_sandbox(
                sandbox,
                req.task,
                req.session,
                req.rollout_id,
                artifacts,
                harness=harness,
                hooks=hooks,
                on_phase=on_phase,
            )
            outcome.llm_calls = await self.counter.count(
                req.session.gateway_url, req.session.session_id
            )
            return _for_history(outcome)
        except asyncio.CancelledError as exc:
            # run_in_sandbox has killed the agent and run the on_error hooks.
            details = activity.cancellation_details()
            if details is not None and details.not_found and sandbox is not None:
                # The workflow is gone (terminated/timed out): its finally will not run.
                with contextlib.suppress(Exception):
                    await asyncio.shield(sandbox.destroy())
            if activity.is_worker_shutdown():
                raise ApplicationError("worker shut down mid-run", type="WorkerShutdown") from exc
            raise
        except RuntimeFailure as exc:
            raise self._failure(exc) from exc
        finally:
            beat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beat

    @staticmethod
    def _failure(exc: RuntimeFailure) -> ApplicationError:
        """A setup problem is the task's (never retried); anything else is infra."""
        cause = exc.cause
        if isinstance(cause, HarnessSetupError):
            return agent_config_error("agent setup", cause)
        if isinstance(cause, HookError):
            return ApplicationError(str(cause), type="HookError")
        return ApplicationError(f"{exc.phase}: {cause!r}", type="SandboxError")

    async def _heartbeat(self, req: HarnessRequest, progress: Progress) -> None:
        interval = max(0.5, min(req.task.budget.heartbeat_s / 3, 20.0))
        next_count = time.monotonic() + self.counter.every_s
        while True:
            activity.heartbeat(progress.details())
            await asyncio.sleep(interval)
            if self.counter.every_s > 0 and time.monotonic() >= next_count:
                next_count = time.monotonic() + self.counter.every_s
                n = await self.counter.count(req.session.gateway_url, req.session.session_id)
                if n is not None:
                    progress.llm_calls = n


def _for_history(outcome: RunOutcome) -> RunOutcome:
    """Workflow history is not a log store: keep only the tails of the agent's output
    (the full logs are artifacts)."""
    if outcome.agent is not None:
        outcome.agent.stdout_tail = tail(outcome.agent.stdout_tail)
        outcome.agent.stderr_tail = tail(outcome.agent.stderr_tail)
    return outcome
