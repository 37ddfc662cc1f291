"""Trainer client: submit batches of rollouts, stream results, cancel, load samples.

The trainer talks to the rollout workflows with the ordinary Temporal client — this module is
a thin, typed layer over it. It refers to the workflow by name, so a trainer needs only
`rollout_client` and `schemas` (+ temporalio, pyarrow, boto3), never the runtime.

Why the shapes:
- Rollout id = workflow id = `<batch>-<task>-<sample>`: resubmitting a batch is
  idempotent (a running rollout is reused, a finished one is not re-run).
- Results are found through visibility (`RolloutBatchId = …` and closed) and then
  fetched, so they arrive in completion order with a bounded number of RPCs, and the
  client never parks thousands of long-polls on one connection (that stalls it).
- The trainer should use its *own* `Client`, not a worker's (`RolloutClient.connect`).
"""

import asyncio
import hashlib
import logging
import re
import secrets
import time
from collections.abc import AsyncIterator, Sequence
from datetime import datetime, timedelta
from typing import Any

import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field
from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import (
    AddSearchAttributesRequest,
    ListSearchAttributesRequest,
)
from temporalio.client import (
    Client,
    WorkflowExecutionStatus,
    WorkflowFailureError,
    WorkflowHandle,
)
from temporalio.common import (
    SearchAttributeKey,
    SearchAttributePair,
    TypedSearchAttributes,
    WorkflowIDConflictPolicy,
    WorkflowIDReusePolicy,
)
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from rollout_client.codec import data_converter, load_keys
from rollout_client.policy import GatewayPolicyClient
from rollout_client.storage import read_many
from rollout_client.temporal_connection import TemporalConnectError, TemporalTLS, connect_failure
from rollout_client.training import check_evaluated, check_group_size, check_served
from schemas.rollout import SEARCH_ATTRIBUTES, RolloutResult
from schemas.tasks import (
    ID_PATTERN,
    RolloutRequest,
    RolloutTask,
    group_id_for,
    rollout_id_for,
    seed_for,
)

log = logging.getLogger("rollout.client")

WORKFLOW_NAME = "RolloutWorkflow"
DEFAULT_TASK_QUEUE = "rollouts"

_INDEXED = {
    "Keyword": IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD,
    "Double": IndexedValueType.INDEXED_VALUE_TYPE_DOUBLE,
    "Int": IndexedValueType.INDEXED_VALUE_TYPE_INT,
    "Bool": IndexedValueType.INDEXED_VALUE_TYPE_BOOL,
    "Text": IndexedValueType.INDEXED_VALUE_TYPE_TEXT,
}


async def ensure_search_attributes(client: Client) -> list[str]:
    """Register any missing custom search attribute (idempotent); returns those added.

    Without them every rollout's first workflow task would fail ("not defined").
    """
    ns = client.namespace
    have = await client.operator_service.list_search_attributes(
        ListSearchAttributesRequest(namespace=ns)
    )
    missing = {
        name: _INDEXED[kind]
        for name, kind in SEARCH_ATTRIBUTES.items()
        if name not in have.custom_attributes
    }
    if missing:
        await client.operator_service.add_search_attributes(
            AddSearchAttributesRequest(namespace=ns, search_attributes=missing)
        )
    return sorted(missing)


async def connect(
    address: str,
    namespace: str = "default",
    payload_keys: Sequence[bytes] | None = None,
    tls: TemporalTLS | None = None,
    **kwargs: Any,
) -> Client:
    """A Temporal client with the converter every part of the system uses: pydantic JSON,
    encrypted with `payload_keys` (default: `ROLLOUT_PAYLOAD_KEY`, see `rollout_client.codec`)
    — the workers' keys, or results cannot be read — and the TLS / API key settings
    `tls` (default: the `TEMPORAL_TLS_*` / `TEMPORAL_API_KEY` environment)."""
    keys = load_keys() if payload_keys is None else list(payload_keys)
    tls = TemporalTLS.from_env() if tls is None else tls
    try:
        return await Client.connect(
            address,
            namespace=namespace,
            data_converter=data_converter(keys),
            **tls.connect_kwargs(),
            **kwargs,
        )
    except RuntimeError as exc:
        raise TemporalConnectError(connect_failure(address, tls, exc)) from exc


class Batch(BaseModel):
    """What `submit` started: enough to follow, cancel or resume the batch later."""

    model_config = ConfigDict(extra="forbid")

    batch_id: str
    output: str
    rollout_ids: list[str]
    groups: dict[str, list[str]] = Field(description="group_id → rollout ids")
    task_queue: str = DEFAULT_TASK_QUEUE


class RolloutOutcome(BaseModel):
    """One finished rollout: its result, or why it has none (failed/cancelled/…)."""

    model_config = ConfigDict(extra="forbid")

    rollout_id: str
    workflow_status: str
    result: RolloutResult | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.result is not None


def _kw(name: str) -> SearchAttributeKey[str]:
    return SearchAttributeKey.for_keyword(name)


def _start_attributes(req: RolloutRequest) -> TypedSearchAttributes:
    task = req.task
    pairs: list[SearchAttributePair[Any]] = [
        SearchAttributePair(_kw("RolloutBatchId"), req.batch_id),
        SearchAttributePair(_kw("RolloutGroupId"), req.group_id),
        SearchAttributePair(_kw("RolloutTaskId"), task.task_id),
        SearchAttributePair(_kw("RolloutPhase"), "queued"),
        SearchAttributePair(_kw("RolloutStatus"), "running"),
        SearchAttributePair(_kw("RolloutHarness"), task.harness.name),
        SearchAttributePair(_kw("RolloutBackend"), task.sandbox.backend),
        SearchAttributePair(_kw("RolloutPolicyVersion"), task.policy_version),
    ]
    return TypedSearchAttributes(pairs)


def _failure_text(err: BaseException) -> str:
    parts: list[str] = []
    cur: BaseException | None = err
    while cur is not None and len(parts) < 5:
        msg = getattr(cur, "message", None) or str(cur)
        if msg and msg not in parts:
            parts.append(msg)
        cur = getattr(cur, "cause", None) or cur.__cause__
    return " ← ".join(parts) or type(err).__name__


class RolloutClient:
    """Submit / follow / cancel / load. One instance per trainer process."""

    def __init__(self, client: Client, task_queue: str = DEFAULT_TASK_QUEUE) -> None:
        self.client = client
        self.task_queue = task_queue

    @classmethod
    async def connect(
        cls,
        address: str,
        namespace: str = "default",
        task_queue: str = DEFAULT_TASK_QUEUE,
        payload_keys: Sequence[bytes] | None = None,
        tls: TemporalTLS | None = None,
    ) -> "RolloutClient":
        """`tls`: TLS and API key for a real cluster (default: the `TEMPORAL_TLS_*` /
        `TEMPORAL_API_KEY` environment, as the `temporal` CLI reads it)."""
        return cls(await connect(address, namespace, payload_keys, tls), task_queue)

    # ------------------------------------------------------------------ submit
    def plan(
        self,
        tasks: Sequence[RolloutTask],
        output: str,
        samples_per_task: int = 1,
        batch_id: str | None = None,
        seed: int | None = None,
    ) -> tuple[Batch, list[RolloutRequest]]:
        """The requests a submit would start (pure; useful to inspect or persist)."""
        if samples_per_task < 1:
            raise ValueError("samples_per_task must be >= 1")
        batch_id = batch_id or f"b{time.strftime('%Y%m%d%H%M%S')}{secrets.token_hex(3)}"
        if not re.match(ID_PATTERN, batch_id):
            raise ValueError(f"batch_id {batch_id!r} must match {ID_PATTERN}")
        if seed is None:  # reproducible by default: every sample gets a recorded seed
            seed = int.from_bytes(hashlib.sha256(batch_id.encode()).digest()[:4], "big") >> 1
        requests: list[RolloutRequest] = []
        groups: dict[str, list[str]] = {}
        for t_index, task in enumerate(tasks):
            group = group_id_for(batch_id, task.task_id)
            for i in range(samples_per_task):
                rid = rollout_id_for(batch_id, task.task_id, i)
                requests.append(
                    RolloutRequest(
                        rollout_id=rid,
                        batch_id=batch_id,
                        group_id=group,
                        sample_index=i,
                        seed=seed_for(seed, t_index, i),
                        task=task,
                        output=output,
                    )
                )
                groups.setdefault(group, []).append(rid)
        batch = Batch(
            batch_id=batch_id,
            output=output,
            rollout_ids=[r.rollout_id for r in requests],
            groups=groups,
            task_queue=self.task_queue,
        )
        return batch, requests

    async def start(
        self, req: RolloutRequest, rerun_failed: bool = False
    ) -> WorkflowHandle[Any, RolloutResult]:
        """Start one rollout; an existing one (running or finished) is left as it is,
        except a failed/cancelled one when `rerun_failed` is set."""
        task = req.task
        reuse = (
            WorkflowIDReusePolicy.ALLOW_DUPLICATE_FAILED_ONLY
            if rerun_failed
            else WorkflowIDReusePolicy.REJECT_DUPLICATE
        )
        try:
            return await self.client.start_workflow(
                WORKFLOW_NAME,
                req,
                id=req.rollout_id,
                task_queue=self.task_queue,
                result_type=RolloutResult,
                id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
                id_reuse_policy=reuse,
                search_attributes=_start_attributes(req),
                static_summary=(
                    f"{task.task_id} #{req.sample_index} · {task.harness.name} on "
                    f"{task.sandbox.backend} · policy {task.policy_version}"
                ),
                task_timeout=timedelta(seconds=30),
            )
        except WorkflowAlreadyStartedError:
            return self.client.get_workflow_handle(req.rollout_id, result_type=RolloutResult)

    async def submit(
        self,
        tasks: Sequence[RolloutTask],
        output: str,
        samples_per_task: int = 1,
        batch_id: str | None = None,
        seed: int | None = None,
        max_concurrent_starts: int = 64,
        rerun_failed: bool = False,
    ) -> Batch:
        """Start `samples_per_task` rollouts per task (one GRPO group per task).

        Idempotent per batch id; `rerun_failed` re-runs the rollouts that failed."""
        batch, requests = self.plan(tasks, output, samples_per_task, batch_id, seed)
        gate = asyncio.Semaphore(max_concurrent_starts)

        async def one(req: RolloutRequest) -> None:
            async with gate:
                for delay in (0.5, 1, 2, 4, 8, None):
                    try:
                        await self.start(req, rerun_failed)
                        return
                    except RPCError as exc:
                        if exc.status != RPCStatusCode.RESOURCE_EXHAUSTED or delay is None:
                            raise
                        await asyncio.sleep(delay)

        await asyncio.gather(*(one(r) for r in requests))
        return batch

    async def submit_groups(
        self,
        tasks: Sequence[RolloutTask],
        output: str,
        group_size: int,
        *,
        policy_version: str | None = None,
        gateway: GatewayPolicyClient | None = None,
        allow_unevaluated: bool = False,
        batch_id: str | None = None,
        seed: int | None = None,
        max_concurrent_starts: int = 64,
        rerun_failed: bool = False,
    ) -> Batch:
        """A training submission: one GRPO group of `group_size` rollouts per task,
        checked before anything starts (`rollout_client.training`): `group_size` >= 2,
        every task evaluated (unless `allow_unevaluated`), and — with `gateway` — the
        label (`policy_version`, else each task's own) one the Gateway has served.
        `policy_version` relabels every task. Raises `TrainingInputError` naming the
        field; otherwise the same as `submit`."""
        check_group_size(group_size)
        check_evaluated(tasks, allow_unevaluated)
        if policy_version is not None:
            tasks = [
                RolloutTask.model_validate({**t.model_dump(), "policy_version": policy_version})
                for t in tasks
            ]
        if gateway is not None:
            state = await gateway.state()
            for label in sorted({t.policy_version for t in tasks}):
                check_served(label, state)
        return await self.submit(
            tasks,
            output,
            samples_per_task=group_size,
            batch_id=batch_id,
            seed=seed,
            max_concurrent_starts=max_concurrent_starts,
            rerun_failed=rerun_failed,
        )

    # ------------------------------------------------------------------ follow
    async def outcome(self, rollout_id: str) -> RolloutOutcome:
        """Result of a *finished* rollout (waits if it is still running)."""
        handle = self.client.get_workflow_handle(rollout_id, result_type=RolloutResult)
        try:
            result = await handle.result()
            return RolloutOutcome(rollout_id=rollout_id, workflow_status="COMPLETED", result=result)
        except WorkflowFailureError as exc:
            desc = await handle.describe()
            status = desc.status.name if desc.status else "FAILED"
            return RolloutOutcome(
                rollout_id=rollout_id, workflow_status=status, error=_failure_text(exc.cause)
            )

    async def results(
        self, batch: Batch, poll_s: float = 1.0, max_fetch: int = 32
    ) -> AsyncIterator[RolloutOutcome]:
        """Yield each rollout of the batch once, in the order they finish.

        Polls visibility for closed rollouts of the batch; after the first scan only
        those closed recently (with a margin for visibility lag, plus a full rescan now
        and then), so a poll costs O(new results), not O(batch).
        """
        pending = set(batch.rollout_ids)
        gate = asyncio.Semaphore(max_fetch)
        base = f"RolloutBatchId = '{batch.batch_id}' AND ExecutionStatus != 'Running'"
        newest: datetime | None = None
        last_full = time.monotonic()

        async def fetch(rid: str) -> RolloutOutcome:
            async with gate:
                return await self.outcome(rid)

        while pending:
            query = base
            if newest is not None and time.monotonic() - last_full < 30:
                since = (newest - timedelta(seconds=10)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
                query += f" AND CloseTime >= '{since}'"
            else:
                last_full = time.monotonic()
            closed: list[str] = []
            async for wf in self.client.list_workflows(query):
                if wf.close_time is not None and (newest is None or wf.close_time > newest):
                    newest = wf.close_time
                if wf.id in pending:
                    pending.discard(wf.id)
                    closed.append(wf.id)
            for next_done in asyncio.as_completed([fetch(rid) for rid in closed]):
                yield await next_done
            if pending:
                await asyncio.sleep(poll_s)

    async def counts(self, batch: Batch) -> dict[str, int]:
        """Rollouts of the batch per workflow status (visibility; eventually consistent)."""
        out: dict[str, int] = {}
        for status in ("Running", "Completed", "Failed", "Canceled", "Terminated", "TimedOut"):
            q = f"RolloutBatchId = '{batch.batch_id}' AND ExecutionStatus = '{status}'"
            n = (await self.client.count_workflows(q)).count
            if n:
                out[status.lower()] = n
        return out

    # ------------------------------------------------------------------ cancel
    async def cancel(self, batch: Batch | str, reason: str = "cancelled by trainer") -> int:
        """Cancel every running rollout of the batch (cleanup still runs in each)."""
        batch_id = batch.batch_id if isinstance(batch, Batch) else batch
        query = f"RolloutBatchId = '{batch_id}' AND ExecutionStatus = 'Running'"
        ids = [wf.id async for wf in self.client.list_workflows(query)]
        await self.cancel_rollouts(ids)
        log.info("cancelled %d rollout(s) of %s: %s", len(ids), batch_id, reason)
        return len(ids)

    async def cancel_rollouts(self, rollout_ids: Sequence[str]) -> None:
        """Cancel these rollouts (one group of a batch, say); finished or unknown ones
        are left alone. Each cancelled one still cleans up and closes as cancelled."""

        async def one(rid: str) -> None:
            try:
                await self.client.get_workflow_handle(rid).cancel()
            except RPCError as exc:
                if exc.status != RPCStatusCode.NOT_FOUND:
                    raise

        await asyncio.gather(*(one(r) for r in rollout_ids))

    # ------------------------------------------------------------------ samples
    @staticmethod
    def load_samples(outcomes: Sequence[RolloutOutcome | RolloutResult]) -> pa.Table:
        """Samples of the finished rollouts as one Arrow table (schema-version checked)."""
        uris: list[str] = []
        for item in outcomes:
            result = item.result if isinstance(item, RolloutOutcome) else item
            if result is not None and result.samples_uri:
                uris.append(result.samples_uri)
        return read_many(uris)

    async def status_of(self, rollout_id: str) -> WorkflowExecutionStatus | None:
        desc = await self.client.get_workflow_handle(rollout_id).describe()
        return desc.status
