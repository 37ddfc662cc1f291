"""RolloutWorkflow: one rollout, task → training samples, durably.

Steps (each an activity, by name): create_session → provision_sandbox (returns the
owning host's queue) → run_harness on that queue (hooks + agent + evaluation) →
collect_trajectory (writes Parquet, returns a reference) ‖ destroy_sandbox; any session
or sandbox still open is released in `finally`, also on failure and cancellation.

Why the shapes below:
- A *whole attempt* (new session + new sandbox) is the unit of retry after an infra
  failure (dead worker or host, crashed sandbox): samples must come from one clean agent
  run, so run_harness itself is never retried in place.
- The total budget is a deadline kept here, not a workflow execution timeout: those skip
  `finally`, and cleanup must always run.
- About 5 activities and ~45 history events per rollout: the dev server is one SQLite
  shard, so Temporal work per rollout is the scarce resource.
"""

import asyncio
import contextlib
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy, SearchAttributeKey
from temporalio.exceptions import ActivityError, ApplicationError, TimeoutType
from temporalio.exceptions import TimeoutError as TemporalTimeout

with workflow.unsafe.imports_passed_through():
    from schemas.outcome import RolloutStatus, RunOutcome, final_status
    from schemas.rollout import (
        CLOSE_SESSION,
        COLLECT_TRAJECTORY,
        CREATE_SESSION,
        DESTROY_SANDBOX,
        FATAL_ERROR_TYPES,
        PROVISION_SANDBOX,
        PROVISIONED_SANDBOXES,
        ROLLOUT_INFRA_ERROR,
        RUN_HARNESS,
        CloseSessionRequest,
        CollectRequest,
        DestroyRequest,
        HarnessRequest,
        Phase,
        ProvisionRequest,
        QueueNames,
        RolloutProgress,
        RolloutResult,
        SamplesSummary,
        SandboxClaim,
        SandboxRef,
        SessionRef,
        SessionRequest,
    )
    from schemas.tasks import RolloutRequest

PHASE = SearchAttributeKey.for_keyword("RolloutPhase")
STATUS = SearchAttributeKey.for_keyword("RolloutStatus")
SANDBOX_HOST = SearchAttributeKey.for_keyword("RolloutSandboxHost")
REWARD = SearchAttributeKey.for_float("RolloutReward")

CLEANUP_RETRY = RetryPolicy(maximum_attempts=10, maximum_interval=timedelta(seconds=30))


def _retry(attempts: int) -> RetryPolicy:
    """Retry infra errors in place; a bad task is never retried."""
    return RetryPolicy(maximum_attempts=attempts, non_retryable_error_types=list(FATAL_ERROR_TYPES))


class AttemptFailed(Exception):
    """An attempt hit an infra failure worth a fresh session + sandbox."""


def _fatal_cause(err: ActivityError) -> ApplicationError | None:
    """The non-retryable application error behind an activity failure, if any."""
    cause = err.cause
    if isinstance(cause, ApplicationError) and (
        cause.non_retryable or cause.type in FATAL_ERROR_TYPES
    ):
        return cause
    return None


def _sandboxes_left_by(err: BaseException | None) -> list[SandboxClaim]:
    """Sandboxes a failed provision claimed (heartbeat details of a timed-out attempt,
    or the details its last attempt's error carries): maybe created, never returned."""
    if not isinstance(err, ActivityError):
        return []
    cause = err.cause
    if isinstance(cause, TemporalTimeout):
        details: Any = cause.last_heartbeat_details
    elif isinstance(cause, ApplicationError):
        details = cause.details
    else:
        return []
    out: list[SandboxClaim] = []
    for item in details or ():
        if isinstance(item, dict) and isinstance(item.get(PROVISIONED_SANDBOXES), list):
            out += [SandboxClaim.model_validate(raw) for raw in item[PROVISIONED_SANDBOXES]]
    return out


def _describe(err: BaseException) -> str:
    parts: list[str] = []
    cur: BaseException | None = err
    while cur is not None and len(parts) < 4:
        if isinstance(cur, TemporalTimeout):
            parts.append(f"timeout {cur.type.name if cur.type else ''}".strip())
        elif isinstance(cur, ApplicationError):
            parts.append(f"{cur.type}: {cur.message}" if cur.type else cur.message)
        else:
            parts.append(str(cur) or type(cur).__name__)
        cur = cur.cause if hasattr(cur, "cause") else None
    return " ← ".join(p for p in parts if p)


@workflow.defn(name="RolloutWorkflow")
class RolloutWorkflow:
    def __init__(self) -> None:
        self._phase = Phase.queued
        self._attempt = 0
        self._session: SessionRef | None = None
        self._sandbox: SandboxRef | None = None
        self._last_error: str | None = None
        self._open_sessions: list[SessionRef] = []
        self._open_sandboxes: list[SandboxRef] = []
        self._released_claims: list[SandboxClaim] = []
        self._releases: list[asyncio.Task[Any]] = []
        self._cleanup_wait = timedelta(minutes=2)
        self._heartbeat = timedelta(minutes=1)

    # ------------------------------------------------------------------ visibility
    @workflow.query
    def phase(self) -> str:
        return self._phase.value

    @workflow.query
    def progress(self) -> RolloutProgress:
        return RolloutProgress(
            phase=self._phase,
            attempt=self._attempt,
            session_id=self._session.session_id if self._session else None,
            sandbox_id=self._sandbox.sandbox_id if self._sandbox else None,
            sandbox_host=self._sandbox.host if self._sandbox else None,
            last_error=self._last_error,
        )

    def _set_phase(self, phase: Phase, *extra: Any) -> None:
        """One history event per change (search attributes), details are free."""
        self._phase = phase
        workflow.upsert_search_attributes([PHASE.value_set(phase.value), *extra])
        self._details()

    def _details(self) -> None:
        lines = [f"**phase**: {self._phase.value}", f"**attempt**: {self._attempt}"]
        if self._session:
            lines.append(f"**session**: `{self._session.session_id}`")
        if self._sandbox:
            lines.append(
                f"**sandbox**: `{self._sandbox.sandbox_id}` on `{self._sandbox.host}` "
                f"(queue `{self._sandbox.host_queue}`)"
            )
        if self._last_error:
            lines.append(f"**last error**: {self._last_error}")
        workflow.set_current_details("\n\n".join(lines))

    # ------------------------------------------------------------------ main
    @workflow.run
    async def run(self, req: RolloutRequest) -> RolloutResult:
        task = req.task
        queues = QueueNames(base=workflow.info().task_queue)
        started = workflow.now()
        deadline = started + timedelta(seconds=task.budget.total_s)
        # A host that does not pick up its queue within this is gone: its reaper reaps.
        self._cleanup_wait = timedelta(seconds=task.budget.host_queue_wait_s)
        # Every step heartbeats: a worker that dies mid-step is seen within this, not
        # after the step's whole start-to-close timeout (minutes for collect and destroy).
        self._heartbeat = timedelta(seconds=task.budget.heartbeat_s)
        final = Phase.failed
        result: RolloutResult | None = None
        try:
            outcome, session, sandbox = await self._attempts(req, queues, deadline)
            summary = SamplesSummary(uri=None)
            if session is not None and sandbox is not None:
                self._set_phase(Phase.collecting)
                destroy = self._release_sandbox(sandbox)
                summary = await self._collect(req, session, sandbox, outcome)
                if summary.session_closed and session in self._open_sessions:
                    self._open_sessions.remove(session)
                if destroy is not None:
                    # shield: a cancel arriving now must not cancel the destroy itself
                    await asyncio.shield(destroy)
            result = RolloutResult(
                rollout_id=req.rollout_id,
                batch_id=req.batch_id,
                task_id=task.task_id,
                group_id=req.group_id,
                sample_index=req.sample_index,
                status=final_status(outcome.status, summary.statuses),
                reward=outcome.reward,
                rewards=outcome.rewards,
                verdict=outcome.verdict,
                samples_uri=summary.uri,
                num_samples=summary.num_samples,
                num_calls=summary.num_calls,
                trainable_tokens=summary.trainable_tokens,
                session_id=session.session_id if session else None,
                sandbox_id=sandbox.sandbox_id if sandbox else None,
                attempts=self._attempt,
                duration_s=(workflow.now() - started).total_seconds(),
                agent_exit_code=outcome.agent.exit_code if outcome.agent else None,
                harness=outcome.harness,
                harness_version=outcome.harness_version,
                policy_version=task.policy_version,
                env_version=task.env_version(sandbox.env_version) if sandbox else None,
                task_source=task.source_label(),
                image_digest=sandbox.env_version if sandbox else None,
                reward_metrics=outcome.reward_metrics,
                limit_refusals=summary.limit_refusals,
                error=outcome.problem,
            )
            final = Phase.done
            return result
        except AttemptFailed as exc:  # defensive: never fail the workflow *task*
            raise ApplicationError(str(exc), type=ROLLOUT_INFRA_ERROR, non_retryable=True) from exc
        except asyncio.CancelledError:
            final = Phase.cancelled
            raise
        finally:
            await self._cleanup(final, result)

    async def _attempts(
        self, req: RolloutRequest, queues: QueueNames, deadline: Any
    ) -> tuple[RunOutcome, SessionRef | None, SandboxRef | None]:
        """Up to `max_attempts` of session + sandbox + agent; returns the one that ran."""
        task = req.task
        for attempt in range(1, task.max_attempts + 1):
            self._attempt = attempt
            self._set_phase(Phase.provisioning)
            try:
                session = await self._create_session(req, queues, attempt)
                remaining = (deadline - workflow.now()).total_seconds()
                if remaining <= 0:
                    why = "budget spent before provisioning"
                    return self._budget_outcome(req, why), session, None
                sandbox = await self._provision(req, queues, session, attempt, remaining)
                self._set_phase(Phase.running, SANDBOX_HOST.value_set(sandbox.host))
                remaining = (deadline - workflow.now()).total_seconds()
                if remaining <= 0:
                    why = "budget spent while provisioning"
                    return self._budget_outcome(req, why), session, None
                outcome = await self._run_harness(req, session, sandbox, attempt, remaining)
                return outcome, session, sandbox
            except AttemptFailed as exc:
                self._last_error = str(exc)
                workflow.logger.warning("rollout attempt %d failed: %s", attempt, exc)
                self._release_session(self._session)
                self._release_sandbox(self._sandbox)
                self._session = self._sandbox = None
                self._details()
                if workflow.now() >= deadline:
                    return self._budget_outcome(req, f"budget spent; last: {exc}"), None, None
        raise ApplicationError(
            f"rollout failed after {task.max_attempts} attempt(s): {self._last_error}",
            type=ROLLOUT_INFRA_ERROR,
            non_retryable=True,
        )

    # ------------------------------------------------------------------ steps
    async def _create_session(
        self, req: RolloutRequest, queues: QueueNames, attempt: int
    ) -> SessionRef:
        task = req.task
        sampling = task.sampling
        if req.seed is not None and sampling.seed is None:
            sampling = sampling.model_copy(update={"seed": req.seed})
        session_req = SessionRequest(
            rollout_id=req.rollout_id,
            attempt=attempt,
            policy_version=task.policy_version,
            sampling=sampling,
            sampling_control=task.sampling_control,
            scenes=task.scenes,
            harness=task.harness,
            budget=task.budget,
            metadata={
                "batch_id": req.batch_id,
                "task_id": task.task_id,
                "group_id": req.group_id,
                "sample_index": req.sample_index,
                "attempt": attempt,
            },
        )
        session = await self._execute(
            CREATE_SESSION,
            session_req,
            result_type=SessionRef,
            task_queue=queues.gateway,
            start_to_close_timeout=timedelta(seconds=30),
            retry_policy=_retry(5),
            summary=f"create session (attempt {attempt})",
        )
        self._session = session
        self._open_sessions.append(session)
        self._details()
        return session

    async def _provision(
        self,
        req: RolloutRequest,
        queues: QueueNames,
        session: SessionRef,
        attempt: int,
        remaining_s: float,
    ) -> SandboxRef:
        task = req.task
        budget = task.budget
        provision = ProvisionRequest(
            rollout_id=req.rollout_id,
            attempt=attempt,
            task=task,
            session=session,
            timeout_s=budget.total_s + budget.grace_s + 600,
        )
        try:
            sandbox = await self._execute(
                PROVISION_SANDBOX,
                provision,
                result_type=SandboxRef,
                task_queue=queues.sandbox,
                start_to_close_timeout=timedelta(seconds=budget.provision_s),
                schedule_to_close_timeout=timedelta(seconds=max(remaining_s, 1.0)),
                heartbeat_timeout=timedelta(seconds=budget.heartbeat_s),
                retry_policy=_retry(3),
                summary=f"provision {task.sandbox.backend} sandbox (attempt {attempt})",
            )
        except (AttemptFailed, ApplicationError) as exc:
            self._release_earlier(_sandboxes_left_by(exc.__cause__))
            raise
        self._release_earlier(sandbox.earlier)
        sandbox = sandbox.model_copy(update={"earlier": []})
        self._sandbox = sandbox
        self._open_sandboxes.append(sandbox)
        self._details()
        return sandbox

    async def _run_harness(
        self,
        req: RolloutRequest,
        session: SessionRef,
        sandbox: SandboxRef,
        attempt: int,
        remaining_s: float,
    ) -> RunOutcome:
        task = req.task
        budget = task.budget
        agent_budget = min(task.harness.budget_s, remaining_s)
        harness = task.harness.model_copy(update={"budget_s": agent_budget})
        run = HarnessRequest(
            rollout_id=req.rollout_id,
            attempt=attempt,
            task=task.model_copy(update={"harness": harness}),
            sandbox=sandbox,
            session=session,
        )
        activity = workflow.execute_activity(
            RUN_HARNESS,
            run,
            result_type=RunOutcome,
            task_queue=sandbox.host_queue,
            schedule_to_start_timeout=timedelta(seconds=budget.host_queue_wait_s),
            # longer than the backstop timer below, so the timer (→ agent_timeout) wins
            start_to_close_timeout=timedelta(seconds=agent_budget + 2 * budget.grace_s + 60),
            heartbeat_timeout=timedelta(seconds=budget.heartbeat_s),
            retry_policy=RetryPolicy(maximum_attempts=1),
            cancellation_type=workflow.ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
            summary=f"run {task.harness.name} (attempt {attempt})",
        )
        # Backstop: the activity enforces the agent budget itself; this timer catches an
        # activity that does not come back (cancelling it kills the agent).
        run_task = asyncio.ensure_future(activity)
        try:
            done, _ = await workflow.wait([run_task], timeout=agent_budget + budget.grace_s)
        except asyncio.CancelledError:
            # Rollout cancelled: stop the agent (and wait for it) before cleanup starts.
            run_task.cancel()
            with contextlib.suppress(BaseException):
                await run_task
            raise
        if not done:
            run_task.cancel()
            with contextlib.suppress(ActivityError, asyncio.CancelledError):
                await run_task
            return self._budget_outcome(req, "agent exceeded the rollout budget (cancelled)")
        try:
            return run_task.result()
        except ActivityError as err:
            raise self._fatal_or(err, "run_harness") from err

    async def _collect(
        self,
        req: RolloutRequest,
        session: SessionRef,
        sandbox: SandboxRef | None,
        outcome: RunOutcome,
    ) -> SamplesSummary:
        task = req.task
        collect = CollectRequest(
            rollout_id=req.rollout_id,
            batch_id=req.batch_id,
            task_id=task.task_id,
            group_id=req.group_id,
            sample_index=req.sample_index,
            seed=req.seed,
            session=session,
            env_version=task.env_version(sandbox.env_version if sandbox else "none"),
            task_source=task.source_label(),
            image_digest=sandbox.env_version if sandbox else "none",
            sandbox_facts=sandbox.facts if sandbox else {},
            outcome=outcome,
            sampling=task.sampling,
            output=req.output,
            trainable_scenes=[str(s) for s in task.scenes.trainable] if task.scenes else None,
        )
        try:
            return await workflow.execute_activity(
                COLLECT_TRAJECTORY,
                collect,
                result_type=SamplesSummary,
                task_queue=session.owner_queue,
                schedule_to_start_timeout=timedelta(seconds=task.budget.host_queue_wait_s),
                start_to_close_timeout=timedelta(seconds=task.budget.collect_s),
                heartbeat_timeout=self._heartbeat,
                retry_policy=_retry(5),
                summary="collect trajectory → samples",
            )
        except ActivityError as err:
            fatal = _fatal_cause(err)
            raise ApplicationError(
                f"collect_trajectory failed: {_describe(err)}",
                type=fatal.type if fatal else ROLLOUT_INFRA_ERROR,
                non_retryable=True,
            ) from err

    # ------------------------------------------------------------------ helpers
    def _fatal_or(self, err: ActivityError, step: str) -> BaseException:
        """Bad task → fail the rollout now (no retry); anything else → new attempt."""
        if workflow.cancellation_reason() is not None:
            return asyncio.CancelledError()  # the rollout is being cancelled: no new attempt
        fatal = _fatal_cause(err)
        if fatal is not None:
            return ApplicationError(
                f"{step}: {fatal.message}", *fatal.details, type=fatal.type, non_retryable=True
            )
        cause = err.cause
        if isinstance(cause, TemporalTimeout) and cause.type == TimeoutType.SCHEDULE_TO_START:
            return AttemptFailed(f"{step}: host queue not served (host gone?)")
        return AttemptFailed(f"{step}: {_describe(err)}")

    async def _execute(self, activity: str, arg: Any, **options: Any) -> Any:
        """Run one step of an attempt; its failure becomes a fatal error or a new attempt."""
        try:
            return await workflow.execute_activity(activity, arg, **options)
        except ActivityError as err:
            raise self._fatal_or(err, activity) from err

    def _budget_outcome(self, req: RolloutRequest, why: str) -> RunOutcome:
        task = req.task
        return RunOutcome(
            status=RolloutStatus.agent_timeout,
            harness=task.harness.name,
            harness_version=task.harness.version or "unknown",
            reward_fn_version=task.reward_fn_id(),
            error=why,
        )

    def _release_session(self, session: SessionRef | None) -> asyncio.Task[Any] | None:
        if session is None or session not in self._open_sessions:
            return None
        self._open_sessions.remove(session)
        return self._start_release(
            CLOSE_SESSION,
            CloseSessionRequest(session=session),
            task_queue=session.owner_queue,
            timeout=timedelta(seconds=30),
            summary="close session",
        )

    def _release_sandbox(self, sandbox: SandboxRef | None) -> asyncio.Task[Any] | None:
        if sandbox is None or sandbox not in self._open_sandboxes:
            return None
        self._open_sandboxes.remove(sandbox)
        return self._start_release(
            DESTROY_SANDBOX,
            DestroyRequest(sandbox=sandbox),
            task_queue=sandbox.host_queue,
            timeout=timedelta(seconds=120),
            summary="destroy sandbox",
        )

    def _release_earlier(self, claims: list[SandboxClaim]) -> None:
        """Destroy, on their own hosts, what failed provision attempts claimed (found
        there by rollout id + attempt: the attempt died before it could say which)."""
        for claim in claims:
            if claim not in self._released_claims:
                self._released_claims.append(claim)
                self._start_release(
                    DESTROY_SANDBOX,
                    DestroyRequest(claim=claim),
                    task_queue=claim.host_queue,
                    timeout=timedelta(seconds=120),
                    summary="destroy sandbox of a failed provision attempt",
                )

    def _start_release(
        self, activity: str, arg: Any, *, task_queue: str, timeout: timedelta, summary: str
    ) -> asyncio.Task[Any]:
        """Start a cleanup activity in the background; `_cleanup` waits for all of them."""
        task = asyncio.ensure_future(
            workflow.execute_activity(
                activity,
                arg,
                task_queue=task_queue,
                start_to_close_timeout=timeout,
                schedule_to_start_timeout=self._cleanup_wait,
                heartbeat_timeout=self._heartbeat,
                retry_policy=CLEANUP_RETRY,
                summary=summary,
            )
        )
        self._releases.append(task)
        return task

    async def _cleanup(self, final: Phase, result: RolloutResult | None) -> None:
        """Release everything still open; a cancel arriving now must not abort it."""
        if self._open_sessions or self._open_sandboxes or not all(t.done() for t in self._releases):
            self._set_phase(Phase.cleanup)  # findable in the UI if cleanup gets stuck
        for session in list(self._open_sessions):
            self._release_session(session)
        for sandbox in list(self._open_sandboxes):
            self._release_sandbox(sandbox)
        cancelled = False
        for task in self._releases:
            while not task.done():
                try:
                    await asyncio.shield(task)
                except asyncio.CancelledError:
                    cancelled = True
                except ActivityError:
                    break
        leaked = [
            _describe(t.exception())  # type: ignore[arg-type]
            for t in self._releases
            if not t.cancelled() and t.exception() is not None
        ]
        if leaked:
            self._last_error = "cleanup failed (reaper will reap): " + "; ".join(leaked)
            workflow.logger.error(self._last_error)
        status = result.status.value if result else final.value
        extra = [STATUS.value_set(status)]
        if result is not None and result.reward is not None:
            extra.append(REWARD.value_set(result.reward))
        self._set_phase(final, *extra)
        if cancelled:
            raise asyncio.CancelledError()
