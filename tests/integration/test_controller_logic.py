"""RolloutWorkflow's control logic on the real Temporal dev server, with scripted
stand-in activities (same names, same queues) so each failure mode is exact and fast:
dead host → re-provision, attempts exhausted, fatal agent config, evaluator error,
the workflow's own budget timer, cancellation arriving during cleanup, phases and
search attributes. The real activities are covered by test_controller.py.
"""

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest
from temporalio import activity
from temporalio.client import WorkflowExecutionStatus, WorkflowFailureError
from temporalio.common import SearchAttributeKey
from temporalio.exceptions import ApplicationError, CancelledError
from temporalio.worker import Worker

from devstack.temporal_dev_server import TemporalDevServer
from rollout_client.client import RolloutClient
from schemas.evaluation import EvaluationResult
from schemas.outcome import AgentResult, RolloutStatus, RunOutcome
from schemas.rollout import (
    CLOSE_SESSION,
    COLLECT_TRAJECTORY,
    CREATE_SESSION,
    DESTROY_SANDBOX,
    PROVISION_SANDBOX,
    ROLLOUT_INFRA_ERROR,
    RUN_HARNESS,
    CloseSessionRequest,
    CollectRequest,
    DestroyRequest,
    HarnessRequest,
    ProvisionRequest,
    QueueNames,
    SamplesSummary,
    SandboxRef,
    SessionRef,
    SessionRequest,
)
from schemas.sampling import SamplingControl, SamplingParams
from schemas.tasks import RolloutTask, TaskSource
from workflows.rollout import RolloutWorkflow

# One dev server for the whole test session, shared by every module that asks.

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]

LIVE, DEAD = "live", "dead"


@dataclass
class Fakes:
    """Stand-in activities; `on_run` decides what run_harness does per attempt."""

    queues: QueueNames
    hosts_for_attempt: dict[int, str] = field(default_factory=dict)
    on_run: Callable[[HarnessRequest], Any] | None = None
    destroy_delay_s: float = 0.0
    log: list[tuple[str, Any]] = field(default_factory=list)
    collected: list[CollectRequest] = field(default_factory=list)
    sessions: list[SessionRequest] = field(default_factory=list)
    limit_refusals: dict[str, int] = field(default_factory=dict)
    """What collect reports the Gateway refused of the session's calls."""

    def names(self, kind: str) -> list[Any]:
        return [v for k, v in self.log if k == kind]

    @activity.defn(name=CREATE_SESSION)
    async def create_session(self, req: SessionRequest) -> SessionRef:
        sid = f"s-{req.rollout_id}-{req.attempt}"
        self.log.append(("session", sid))
        self.sessions.append(req)
        return SessionRef(
            session_id=sid,
            token="t",
            openai_base_url="http://gw/v1",
            anthropic_base_url="http://gw",
            gateway_url="http://gw",
            owner_queue=self.queues.gateway_owner("gw"),
        )

    @activity.defn(name=PROVISION_SANDBOX)
    async def provision_sandbox(self, req: ProvisionRequest) -> SandboxRef:
        host = self.hosts_for_attempt.get(req.attempt, LIVE)
        sid = f"sb-{req.attempt}-{host}"
        self.log.append(("provision", sid))
        return SandboxRef(
            backend="fake",
            sandbox_id=sid,
            host=host,
            host_queue=self.queues.host(host),
            env_version="sha256:fake",
            handle={},
        )

    @activity.defn(name=RUN_HARNESS)
    async def run_harness(self, req: HarnessRequest) -> RunOutcome:
        self.log.append(("run", req.sandbox.sandbox_id))
        if self.on_run is not None:
            value = self.on_run(req)
            if asyncio.iscoroutine(value):
                value = await value
            if value is not None:
                return value
        return RunOutcome(
            status=RolloutStatus.ok,
            agent=AgentResult(harness=req.task.harness.name, harness_version="1.0", exit_code=0),
            evaluation=EvaluationResult(
                status="ok", reward=1.0, verdict="pass", reward_fn_version="r1"
            ),
            harness=req.task.harness.name,
            harness_version="1.0",
            reward_fn_version="r1",
        )

    @activity.defn(name=COLLECT_TRAJECTORY)
    async def collect_trajectory(self, req: CollectRequest) -> SamplesSummary:
        self.collected.append(req)
        return SamplesSummary(
            uri=None, num_samples=0, session_closed=True, limit_refusals=self.limit_refusals
        )

    @activity.defn(name=CLOSE_SESSION)
    async def close_session(self, req: CloseSessionRequest) -> None:
        self.log.append(("close", req.session.session_id))

    @activity.defn(name=DESTROY_SANDBOX)
    async def destroy_sandbox(self, req: DestroyRequest) -> None:
        self.log.append(("destroy-start", req.sandbox.sandbox_id))
        end = asyncio.get_running_loop().time() + self.destroy_delay_s
        while asyncio.get_running_loop().time() < end:
            activity.heartbeat()
            try:
                await asyncio.sleep(0.1)
            except asyncio.CancelledError:
                self.log.append(("destroy-cancelled", req.sandbox.sandbox_id))
                raise
        self.log.append(("destroy", req.sandbox.sandbox_id))


@pytest.fixture
async def env(temporal_server: TemporalDevServer) -> AsyncIterator[tuple[RolloutClient, Fakes]]:
    base = f"logic-{uuid.uuid4().hex[:8]}"
    client = await RolloutClient.connect(temporal_server.address, task_queue=base)
    q = QueueNames(base=base)
    fakes = Fakes(q)
    c = client.client
    workers = [
        Worker(c, task_queue=q.base, workflows=[RolloutWorkflow]),
        Worker(c, task_queue=q.sandbox, activities=[fakes.provision_sandbox]),
        Worker(c, task_queue=q.host(LIVE), activities=[fakes.run_harness, fakes.destroy_sandbox]),
        Worker(c, task_queue=q.gateway, activities=[fakes.create_session]),
        Worker(
            c,
            task_queue=q.gateway_owner("gw"),
            activities=[fakes.collect_trajectory, fakes.close_session],
        ),
    ]
    runs = [asyncio.ensure_future(w.run()) for w in workers]
    try:
        yield client, fakes
    finally:
        await asyncio.gather(*(w.shutdown() for w in workers))
        await asyncio.gather(*runs, return_exceptions=True)


def task(**budget: float) -> RolloutTask:
    return RolloutTask.model_validate(
        {
            "task_id": "t",
            "prompt": "p",
            "harness": {"name": "command", "config": {"command": "true"}, "budget_s": 60},
            "budget": {"heartbeat_s": 2, "host_queue_wait_s": 1, **budget},
            "max_attempts": 3,
        }
    )


async def start(client: RolloutClient, t: RolloutTask) -> Any:
    _, [req] = client.plan([t], "/tmp/unused", 1)
    return await client.start(req)


def sa(desc: Any, name: str) -> Any:
    key = (
        SearchAttributeKey.for_float(name)
        if name == "RolloutReward"
        else SearchAttributeKey.for_keyword(name)
    )
    return desc.typed_search_attributes.get(key)


async def test_the_tasks_sampling_and_its_control_reach_the_session(
    env: tuple[RolloutClient, Fakes],
) -> None:
    """What the session pins is what the task said, with the sample's seed added."""
    client, fakes = env
    t = task().model_copy(
        update={
            "sampling": SamplingParams(temperature=0.8, max_tokens=64),
            "sampling_control": SamplingControl(top_p="agent", on_conflict="refuse"),
        }
    )
    _, [req] = client.plan([t], "/tmp/unused", 1, seed=5)
    await asyncio.wait_for((await client.start(req)).result(), 30)
    [session] = fakes.sessions
    assert session.sampling_control == t.sampling_control
    assert session.sampling == t.sampling.model_copy(update={"seed": req.seed})
    assert req.seed is not None


async def test_the_limits_that_refused_the_agent_reach_the_result(
    env: tuple[RolloutClient, Fakes],
) -> None:
    """Refused calls are not in the samples; the result says which limits refused how
    many, so a rollout whose agent hit its session's record cap shows it."""
    client, fakes = env
    fakes.limit_refusals = {"max_stored_bytes": 3}
    result = await asyncio.wait_for((await start(client, task())).result(), 30)
    assert result.limit_refusals == {"max_stored_bytes": 3}
    fakes.limit_refusals = {}
    plain = await asyncio.wait_for((await start(client, task())).result(), 30)
    assert plain.limit_refusals == {}


async def test_lineage_reaches_collect_and_the_result(env: tuple[RolloutClient, Fakes]) -> None:
    """A task with a source: the samples' env_version is its content hash, the image the
    sandbox ran is kept beside it, and the verifier's metrics reach collect and the
    result; a task without one is named by its id and versioned by its image."""
    client, fakes = env
    digest = "sha256:" + "ab" * 32
    source = TaskSource(format="harbor", ref="tasks/hello", content_hash=digest)

    def measured(req: HarnessRequest) -> RunOutcome:
        return RunOutcome(
            status=RolloutStatus.ok,
            evaluation=EvaluationResult(
                status="ok",
                reward=0.5,
                verdict="fail",
                reward_fn_version="r1",
                metrics={"tests_passed": 3.0, "tests_total": 6.0},
            ),
            harness=req.task.harness.name,
            reward_fn_version="r1",
        )

    fakes.on_run = measured
    sourced = await asyncio.wait_for(
        (await start(client, task().model_copy(update={"source": source}))).result(), 30
    )
    plain = await asyncio.wait_for((await start(client, task())).result(), 30)
    first, second = fakes.collected
    assert (first.env_version, first.image_digest, first.task_source) == (
        digest,
        "sha256:fake",
        "harbor:tasks/hello",
    )
    assert first.outcome.reward_metrics == {"tests_passed": 3.0, "tests_total": 6.0}
    assert (sourced.env_version, sourced.image_digest, sourced.task_source) == (
        digest,
        "sha256:fake",
        "harbor:tasks/hello",
    )
    assert sourced.reward_metrics == {"tests_passed": 3.0, "tests_total": 6.0}
    assert (second.env_version, second.image_digest, second.task_source) == (
        "sha256:fake",
        "sha256:fake",
        "jsonl:t",
    )
    assert (plain.env_version, plain.task_source) == ("sha256:fake", "jsonl:t")


async def test_dead_host_reprovisions_on_a_live_one(env: tuple[RolloutClient, Fakes]) -> None:
    """Attempt 1's sandbox lands on a host nobody serves: run_harness times out on
    SCHEDULE_TO_START (non-retryable by design), the workflow closes that session,
    re-provisions and finishes on the live host; the dead sandbox's destroy also times
    out (left to that host's reaper) without blocking the result for long."""
    client, fakes = env
    fakes.hosts_for_attempt = {1: DEAD}
    handle = await start(client, task())
    result = await asyncio.wait_for(handle.result(), 30)
    assert result.attempts == 2 and result.reward == 1.0
    assert fakes.names("run") == ["sb-2-live"]
    assert sorted(fakes.names("close")) == [f"s-{result.rollout_id}-1"]
    assert fakes.names("destroy") == ["sb-2-live"]
    progress = await handle.query("progress")
    assert "cleanup failed" in progress["last_error"]


async def test_attempts_exhausted_fail_and_clean_up(env: tuple[RolloutClient, Fakes]) -> None:
    """An infra error on every attempt: exactly max_attempts fresh attempts, then the
    rollout fails as RolloutInfraError; every session closed, every sandbox destroyed."""
    client, fakes = env

    def boom(req: HarnessRequest) -> None:
        raise ApplicationError("sandbox vanished", type="SandboxLost")

    fakes.on_run = boom
    handle = await start(client, task())
    with pytest.raises(WorkflowFailureError) as err:
        await asyncio.wait_for(handle.result(), 30)
    assert isinstance(err.value.cause, ApplicationError)
    assert err.value.cause.type == ROLLOUT_INFRA_ERROR and "SandboxLost" in err.value.cause.message
    assert len(fakes.names("run")) == 3
    assert sorted(fakes.names("close")) == sorted(fakes.names("session"))
    assert sorted(fakes.names("destroy")) == sorted(fakes.names("provision"))
    assert sa(await handle.describe(), "RolloutStatus") == "failed"


async def test_fatal_agent_config_is_not_retried(env: tuple[RolloutClient, Fakes]) -> None:
    """A non-retryable AgentConfigError fails the rollout on the first attempt, with
    the error type preserved for the UI, and cleanup still runs."""
    client, fakes = env

    def bad(req: HarnessRequest) -> None:
        raise ApplicationError(
            "codex: binary not found", type="AgentConfigError", non_retryable=True
        )

    fakes.on_run = bad
    handle = await start(client, task())
    with pytest.raises(WorkflowFailureError) as err:
        await asyncio.wait_for(handle.result(), 30)
    assert err.value.cause.type == "AgentConfigError"
    assert "binary not found" in err.value.cause.message
    assert len(fakes.names("run")) == 1
    assert fakes.names("destroy") == fakes.names("provision") and fakes.names("close")


async def test_evaluator_error_gives_no_reward(env: tuple[RolloutClient, Fakes]) -> None:
    """A broken evaluator is not a wrong answer: status eval_error, reward None, and
    collect is told so (its rows get masked)."""
    client, fakes = env
    fakes.on_run = lambda req: RunOutcome(
        status=RolloutStatus.eval_error,
        evaluation=EvaluationResult(
            status="eval_error",
            reward=None,
            verdict="error",
            reward_fn_version="r1",
            error="pytest: command not found",
        ),
        harness="command",
        harness_version="1",
        reward_fn_version="r1",
    )
    result = await asyncio.wait_for((await start(client, task())).result(), 30)
    assert result.status == RolloutStatus.eval_error and result.reward is None
    assert result.error == "pytest: command not found"
    assert fakes.collected[0].outcome.status == RolloutStatus.eval_error


async def test_budget_timer_cancels_a_stuck_agent(env: tuple[RolloutClient, Fakes]) -> None:
    """The activity ignores its budget: the workflow's own timer (total budget) cancels
    it — the activity sees the cancel through its heartbeat — and the rollout completes
    as agent_timeout with reward 0, its trajectory still collected."""
    client, fakes = env

    async def stuck(req: HarnessRequest) -> None:
        try:
            while True:
                activity.heartbeat()
                await asyncio.sleep(0.2)
        except asyncio.CancelledError:
            fakes.log.append(("agent-killed", req.sandbox.sandbox_id))
            raise

    fakes.on_run = stuck
    handle = await start(client, task(total_s=2, grace_s=1))
    result = await asyncio.wait_for(handle.result(), 40)
    assert result.status == RolloutStatus.agent_timeout and result.reward == 0.0
    assert fakes.names("agent-killed") == ["sb-1-live"]
    assert fakes.collected and fakes.collected[0].outcome.status == RolloutStatus.agent_timeout
    assert fakes.names("destroy") == ["sb-1-live"]


async def test_cancel_during_cleanup_still_destroys(env: tuple[RolloutClient, Fakes]) -> None:
    """A cancel that arrives while the sandbox is being destroyed must not abort the
    destroy: it completes, then the workflow ends Canceled."""
    client, fakes = env
    fakes.destroy_delay_s = 2.0
    handle = await start(client, task())

    async def destroying() -> None:
        while not fakes.names("destroy-start"):
            await asyncio.sleep(0.05)

    await asyncio.wait_for(destroying(), 20)
    await handle.cancel()
    with pytest.raises(WorkflowFailureError) as err:
        await asyncio.wait_for(handle.result(), 30)
    assert isinstance(err.value.cause, CancelledError)
    assert fakes.names("destroy") == ["sb-1-live"] and not fakes.names("destroy-cancelled")
    assert (await handle.describe()).status == WorkflowExecutionStatus.CANCELED


async def test_phase_query_and_search_attributes(env: tuple[RolloutClient, Fakes]) -> None:
    """While the agent runs, the `phase` query and the RolloutPhase / RolloutSandboxHost
    search attributes say so (what an operator filters on in the UI); at the end
    RolloutPhase=done, RolloutStatus=ok, RolloutReward=1.0, in a compact history."""
    client, fakes = env
    release = asyncio.Event()

    async def wait(req: HarnessRequest) -> None:
        while not release.is_set():
            activity.heartbeat()
            await asyncio.sleep(0.1)

    fakes.on_run = wait
    handle = await start(client, task())

    async def running() -> None:
        while await handle.query("phase") != "running":
            await asyncio.sleep(0.1)

    await asyncio.wait_for(running(), 20)
    desc = await handle.describe()
    assert sa(desc, "RolloutPhase") == "running"
    assert sa(desc, "RolloutSandboxHost") == LIVE
    assert sa(desc, "RolloutTaskId") == "t" and sa(desc, "RolloutHarness") == "command"
    release.set()
    await asyncio.wait_for(handle.result(), 20)
    desc = await handle.describe()
    assert sa(desc, "RolloutPhase") == "done" and sa(desc, "RolloutStatus") == "ok"
    assert sa(desc, "RolloutReward") == 1.0
    history = await handle.fetch_history()
    assert len(history.events) <= 60, len(history.events)
    assert timedelta(0) < desc.close_time - desc.start_time < timedelta(seconds=20)
