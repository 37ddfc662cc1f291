"""verl: our rollouts as verl's own agent loop outputs.

:class:`AgenticRolloutLoop` is a verl agent loop (registered as `agentic_rollout`): each
`run` submits the row's task as one rollout, waits for it and returns its primary segment
as verl's `AgentLoopOutput`. The n copies of a row share verl's `uid`, our batch id is made
from it, so our group and verl's GRPO baseline are the same set. verl needs one output per
row and keeps every row in the baseline, so a failed rollout is run again
(`infra_retries`) and, still failing, returned untrained with `infra_error_reward`. The
contract, its fields and limits: docs/trainers/verl.md. Only this module imports verl.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
import secrets
import time
import uuid
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from verl.experimental.agent_loop.agent_loop import (
    AgentLoopBase,
    AgentLoopMetrics,
    AgentLoopOutput,
    register,
)

from bridges.groups import convert_outcomes
from bridges.policy import gateway_policy, served_index
from bridges.rollouts import (
    ConversionError,
    ConversionRules,
    ConvertedBatch,
    TrainingRollout,
    aligned,
)
from bridges.runner import PerLoop
from bridges.tasks import TASK_ID_KEY, TASK_KEY, find_task, task_table
from rollout_client import RolloutClient, RolloutOutcome
from rollout_client.client import DEFAULT_TASK_QUEUE
from schemas.outcome import RolloutStatus
from schemas.tasks import RolloutRequest, RolloutTask, group_id_for, rollout_id_for

AGENT_NAME = "agentic_rollout"
"""The name a dataset row's `agent_name` (or `rollout.agent.default_agent_loop`) gives."""

TASK_FIELD = TASK_KEY
"""Dataset column (or `extra_info` key) holding the row's `RolloutTask` as JSON."""

TASK_ID_FIELD = TASK_ID_KEY
"""`extra_info` key naming a task of the loop's `tasks_path` instead."""

EXTRA_PREFIX = "rollout_"
"""Our keys in `extra_fields`: verl merges them into the batch's non-tensor fields, where a
name it already uses (`uid`, `index`, ...) would clash."""


class VerlOptions(BaseModel):
    """The keys the agent loop config gives the loop besides `name` and `_target_`."""

    model_config = ConfigDict(extra="forbid")

    temporal_address: str = "localhost:7233"
    namespace: str = "default"
    task_queue: str = DEFAULT_TASK_QUEUE
    output: str = Field(min_length=1, description="samples dir or s3://bucket/prefix")
    tasks_path: str | None = Field(
        default=None, description="JSONL of RolloutTask; rows then name a task by task_id"
    )
    gateway_url: str | None = Field(
        default=None,
        description="the Gateway's control URL: its served policy version is the trainer's "
        "current version for the staleness rule (None: no staleness check)",
    )
    gateway_admin_token: str | None = None
    max_staleness: int = Field(default=1, ge=0)
    truncated: Literal["train", "mask"] = "train"
    infra_retries: int = Field(default=1, ge=0, description="re-runs of an infra_error rollout")
    infra_error_reward: float = 0.0
    filler_token_id: int = Field(default=0, ge=0, description="the one token of an empty row")
    use_verl_sampling: bool = Field(
        default=True,
        description="temperature/top_p/top_k of verl's sampling params (greedy in validation) "
        "override the task's",
    )
    max_waiters: int = Field(default=256, ge=1, description="rollouts awaited at once per process")


class VerlLimits(BaseModel):
    """verl's padded widths (`rollout.prompt_length`, `rollout.response_length`)."""

    prompt_length: int | None = None
    response_length: int | None = None


def _extra(rollout: TrainingRollout, **more: Any) -> dict[str, Any]:
    primary = rollout.primary if rollout.segments else None
    fields = {
        "id": rollout.rollout_id,
        "group_id": rollout.group_id,
        "task_id": rollout.task_id,
        "status": str(rollout.status.value),
        "in_baseline": rollout.in_baseline,
        "trained": rollout.trained,
        "policy_versions": rollout.policy_versions,
        "staleness": primary.staleness if primary else None,
        "segments": len(rollout.segments),
        "step_rewards": rollout.step_rewards,
        **more,
    }
    return {f"{EXTRA_PREFIX}{k}": v for k, v in fields.items()}


def to_agent_loop_output(
    rollout: TrainingRollout,
    limits: VerlLimits | None = None,
    *,
    reward: float | None = None,
    filler_token_id: int = 0,
    metrics: AgentLoopMetrics | None = None,
) -> AgentLoopOutput:
    """One rollout as verl's `AgentLoopOutput` (its primary segment).

    `reward`: the reward_score to give a rollout out of the baseline (its own otherwise).
    Raises :class:`ConversionError` (rollout id, field) when ids, mask and logprobs disagree
    in length or the prompt is longer than verl's `prompt_length`."""
    limits = limits or VerlLimits()
    rid = rollout.rollout_id
    metrics = metrics or AgentLoopMetrics()
    if not rollout.in_baseline or not rollout.segments:
        # No loss, and one token each side so verl's padding, position ids and reward
        # placement (last response token) work as for any row.
        seg = rollout.primary if rollout.segments else None
        prompt = list(seg.prompt_ids) if seg and seg.prompt_ids else [filler_token_id]
        _check_prompt(rid, prompt, limits)
        return AgentLoopOutput(
            prompt_ids=prompt,
            response_ids=[filler_token_id],
            response_mask=[0],
            response_logprobs=[0.0],
            reward_score=rollout.reward if reward is None else reward,
            num_turns=rollout.num_turns,
            metrics=metrics,
            extra_fields=_extra(rollout, cut=False),
        )
    seg = aligned(rid, rollout.primary)
    n = len(seg.response_ids)
    _check_prompt(rid, seg.prompt_ids, limits)
    # no copies here: verl's model validates each list into a new one
    response, mask, logprobs = seg.response_ids, seg.loss_mask, seg.logprobs
    cut = limits.response_length is not None and n > limits.response_length
    if cut:
        keep = limits.response_length or 0
        response, mask, logprobs = response[:keep], mask[:keep], logprobs[:keep]
    experts = None
    if not response:  # verl places the reward on the last response token
        response, mask, logprobs = [filler_token_id], [0], [0.0]
    elif seg.routed_experts is not None:
        # verl's own shape: (prompt + response - 1, layers, top_k) from the prompt's start
        experts = seg.routed_experts.array()[: len(seg.prompt_ids) + len(response) - 1]
    return AgentLoopOutput(
        prompt_ids=seg.prompt_ids,
        response_ids=response,
        response_mask=mask,
        response_logprobs=logprobs,
        reward_score=rollout.reward if reward is None else reward,
        num_turns=rollout.num_turns,
        metrics=metrics,
        routed_experts=experts,
        extra_fields=_extra(rollout, cut=cut, routing_missing=seg.routing_missing),
    )


def _check_prompt(rollout_id: str, prompt: list[int], limits: VerlLimits) -> None:
    if limits.prompt_length is not None and len(prompt) > limits.prompt_length:
        raise ConversionError(
            rollout_id,
            "prompt_ids",
            f"{len(prompt)} tokens exceed verl's rollout.prompt_length={limits.prompt_length}",
        )


def convert_batch(
    batch: ConvertedBatch,
    *,
    prompt_length: int | None = None,
    response_length: int | None = None,
    filler_token_id: int = 0,
    infra_error_reward: float = 0.0,
) -> list[AgentLoopOutput]:
    """A converted batch as verl's agent loop outputs, in group order (pure, no I/O).

    A rollout out of its group's baseline gets that baseline's mean as reward_score (or
    `infra_error_reward` when none of its group is in the baseline) and no loss."""
    limits = VerlLimits(prompt_length=prompt_length, response_length=response_length)
    out: list[AgentLoopOutput] = []
    for group in batch.groups:
        fill = group.fill_reward(default=infra_error_reward)
        for rollout in group.rollouts:
            reward = None if rollout.in_baseline else fill
            out.append(
                to_agent_loop_output(
                    rollout, limits, reward=reward, filler_token_id=filler_token_id
                )
            )
    return out


# ----------------------------------------------------------------------------- the loop


def task_of_row(row: Mapping[str, Any], tasks: Mapping[str, RolloutTask] | None) -> RolloutTask:
    """The row's task: its `rollout_task` column (or `extra_info.rollout_task`), JSON or a
    mapping; else `extra_info.task_id` looked up in the loop's `tasks_path`."""
    extra = row.get("extra_info")
    fields = dict(extra) if isinstance(extra, Mapping) else {}
    fields.update({k: row[k] for k in (TASK_KEY, TASK_ID_KEY) if row.get(k) is not None})
    return find_task(fields, tasks, where="dataset row", tasks_name="the loop's tasks_path")


SAMPLE_INDEX_LIMIT = 2**31
"""Sample indexes are int32 in the sample table (`schemas.samples`)."""

_sample_counter = itertools.count(secrets.randbelow(SAMPLE_INDEX_LIMIT // 2))


def _next_sample_index() -> int:
    """A sample index unique in this process and, from a random start, across processes:
    the n copies of a row may run in different verl workers that do not coordinate. Two
    copies of one row (one batch id) in different processes collide only when the starts
    differ by exactly the difference of their counters: odds ~ 1 / 2**30 per pair."""
    return next(_sample_counter) % SAMPLE_INDEX_LIMIT


def plan_request(
    task: RolloutTask,
    uid: str,
    output: str,
    sample_index: int,
    sampling: Mapping[str, Any] | None = None,
) -> RolloutRequest:
    """One rollout of `task` for the verl row whose GRPO key is `uid`. The batch id is made
    from the uid, so every copy of the row shares one group id."""
    batch_id = "verl-" + hashlib.sha256(uid.encode()).hexdigest()[:16]
    if sampling:
        keep = {k: sampling[k] for k in ("temperature", "top_p", "top_k") if k in sampling}
        if keep.get("top_k") == -1:
            keep["top_k"] = None  # verl's "no top-k"; ours is None
        task = task.model_copy(update={"sampling": task.sampling.model_copy(update=keep)})
    rollout_id = rollout_id_for(batch_id, task.task_id, sample_index)
    seed = int.from_bytes(hashlib.sha256(rollout_id.encode()).digest()[:4], "big") >> 1
    return RolloutRequest(
        rollout_id=rollout_id,
        batch_id=batch_id,
        group_id=group_id_for(batch_id, task.task_id),
        sample_index=sample_index,
        seed=seed,
        task=task,
        output=output,
    )


_clients: dict[tuple[str, str, str], PerLoop[RolloutClient]] = {}
_waiters: dict[int, PerLoop[asyncio.Semaphore]] = {}


async def _client(options: VerlOptions) -> RolloutClient:
    """One Temporal client per event loop and address: verl makes a loop object per row
    and runs them all on its worker's event loop."""
    key = (options.temporal_address, options.namespace, options.task_queue)
    if key not in _clients:
        _clients[key] = PerLoop(lambda: RolloutClient.connect(*key))
    return await _clients[key].get()


async def _waiter(options: VerlOptions) -> asyncio.Semaphore:
    """At most `max_waiters` rollouts awaited at once per event loop."""
    n = options.max_waiters
    if n not in _waiters:

        async def make() -> asyncio.Semaphore:
            return asyncio.Semaphore(n)

        _waiters[n] = PerLoop(make)
    return await _waiters[n].get()


def _failed(request: RolloutRequest, outcome: RolloutOutcome) -> tuple[TrainingRollout, str]:
    """A rollout whose workflow ended without a result: our failure, out of the baseline."""
    status = RolloutStatus.infra_error
    error = outcome.error or f"workflow {outcome.workflow_status}"
    if outcome.result is not None:
        status = outcome.result.status
        error = outcome.result.error or f"{status.value} without sample rows"
    rollout = TrainingRollout(
        rollout_id=request.rollout_id,
        group_id=request.group_id,
        task_id=request.task.task_id,
        sample_index=request.sample_index,
        status=status,
        reward=0.0,
        step_rewards=None,
        segments=[],
        in_baseline=False,
    )
    return rollout, error


@register(AGENT_NAME)
class AgenticRolloutLoop(AgentLoopBase):
    """verl agent loop that runs each row's task as one agentic rollout of ours.

    Config (agent loop YAML entry): `name: agentic_rollout`, `_target_:
    bridges.verl.AgenticRolloutLoop`, then the :class:`VerlOptions` keys."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        own = {k: kwargs.pop(k) for k in list(kwargs) if k in VerlOptions.model_fields}
        kwargs.pop("name", None)  # the YAML entry's own key, passed on by hydra
        super().__init__(*args, **kwargs)
        self.options = VerlOptions.model_validate(own)
        rollout = self.rollout_config
        self.limits = VerlLimits(
            prompt_length=rollout.get("prompt_length"),
            response_length=rollout.get("response_length"),
        )
        self.tasks = task_table(self.options.tasks_path)

    async def current_version(self) -> int | None:
        """The trainer's policy index for the staleness rule: the Gateway's served version."""
        if self.options.gateway_url is None:
            return None
        return await served_index(
            gateway_policy(self.options.gateway_url, self.options.gateway_admin_token)
        )

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        started = time.monotonic()
        task = task_of_row(kwargs, self.tasks)
        uid = str(kwargs.get("uid") or uuid.uuid4())
        sampling = sampling_params if self.options.use_verl_sampling else None
        client = await _client(self.options)
        errors: list[str] = []
        for _attempt in range(self.options.infra_retries + 1):
            request = plan_request(task, uid, self.options.output, _next_sample_index(), sampling)
            rollout, error = await self._one(client, request)
            if error is not None:
                errors.append(f"{request.rollout_id}: {error}")
            if rollout.in_baseline:
                break
        metrics = AgentLoopMetrics(generate_sequences=time.monotonic() - started)
        reward = None if rollout.in_baseline else self.options.infra_error_reward
        out = to_agent_loop_output(
            rollout,
            self.limits,
            reward=reward,
            filler_token_id=self.options.filler_token_id,
            metrics=metrics,
        )
        out.extra_fields[f"{EXTRA_PREFIX}errors"] = errors  # failed attempts, for the logs
        return out

    async def _one(
        self, client: RolloutClient, request: RolloutRequest
    ) -> tuple[TrainingRollout, str | None]:
        """The rollout converted, and why it failed (None: it did not)."""
        await client.start(request)
        async with await _waiter(self.options):
            outcome = await client.outcome(request.rollout_id)
        if not outcome.ok:
            return _failed(request, outcome)
        rules = ConversionRules(
            current_version=await self.current_version(),
            max_staleness=self.options.max_staleness,
            stale="mask",  # verl needs an output for every row
            truncated=self.options.truncated,
        )
        converted, _ = await convert_outcomes(client, [outcome], rules)
        rollouts = converted.rollouts
        if not rollouts:  # a result without sample rows (e.g. failed before any call)
            return _failed(request, outcome)
        if len(rollouts) != 1 or rollouts[0].rollout_id != request.rollout_id:
            raise ConversionError(
                request.rollout_id,
                "rollout_id",
                f"samples hold {[r.rollout_id for r in rollouts]}, not this rollout",
            )
        rollout = rollouts[0]
        failed = outcome.result.error if outcome.result and not rollout.in_baseline else None
        return rollout, failed or (None if rollout.in_baseline else rollout.status.value)


def agent_loop_config(options: VerlOptions) -> list[dict[str, Any]]:
    """The YAML document (as data) `agent_loop_config_path` points at for this loop."""
    entry = {"name": AGENT_NAME, "_target_": f"{__name__}.{AgenticRolloutLoop.__qualname__}"}
    return [{**entry, **json.loads(options.model_dump_json(exclude_defaults=True))}]
