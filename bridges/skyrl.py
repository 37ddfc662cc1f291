"""SkyRL bridge: a `GeneratorInterface` whose rollouts are ours.

SkyRL asks its generator for one batch at a time (`generate(GeneratorInput)`). Each row
names one of our tasks in `env_extras` (`bridges.tasks`); the rows sharing a
`TrajectoryID.instance_id` become one GRPO group, and each row gets back one sample, its
rollout's primary segment. SkyRL's GRPO cannot leave a row out of a group, so a row
without a trainable rollout gets loss mask 0 and its group's baseline mean as reward.
The contract: docs/trainers/skyrl.md. Only this module imports SkyRL; where it does not
import, stand-ins with SkyRL's documented field shapes take its types' place.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from bridges.groups import collect_groups
from bridges.rollouts import (
    ConversionError,
    ConversionRules,
    ConvertedBatch,
    TrainingRollout,
    TrainingSegment,
    aligned,
)
from bridges.runner import PerLoop
from bridges.tasks import TASK_ID_KEY, TASK_KEY, find_task, require_group_size, task_table
from rollout_client import RolloutClient
from schemas.tasks import ID_PATTERN, RolloutTask, group_id_for, rollout_id_for
from schemas.training import policy_version_name

try:  # SkyRL's own types where it is installed (Python 3.12 in practice; see the doc)
    from skyrl.train.generators.base import (
        BatchMetadata,
        GeneratorInput,
        GeneratorInterface,
        GeneratorOutput,
        TrajectoryID,
    )

    SKYRL_IMPORTED = True
except ImportError:  # documented shapes: GeneratorOutput/Input are plain dicts anyway
    SKYRL_IMPORTED = False
    GeneratorInput = dict  # type: ignore[misc,assignment]
    GeneratorOutput = dict  # type: ignore[misc,assignment]

    @dataclass
    class TrajectoryID:  # type: ignore[no-redef]
        """Stand-in with SkyRL's fields: the dataset row and the repetition in its group."""

        instance_id: str
        repetition_id: int

        def to_string(self) -> str:
            return f"{self.instance_id}_{self.repetition_id}"

    @dataclass
    class BatchMetadata:  # type: ignore[no-redef]
        global_step: int
        training_phase: str

    class GeneratorInterface:  # type: ignore[no-redef]
        """Stand-in for SkyRL's abstract generator (one async `generate`)."""

        async def generate(self, input_batch: Any) -> Any:
            raise NotImplementedError


FINISHED = "stop"
"""SkyRL's stop reason for a finished sample; anything else is masked by SkyRL's
`apply_overlong_filtering` when that is on."""

RewardShape = Literal["sample", "token"]


class SkyRLInputError(ValueError):
    """A `GeneratorInput` this bridge cannot map; the message names the field and row."""


@dataclass(frozen=True)
class _Group:
    """One SkyRL instance = one of our GRPO groups."""

    instance_id: str
    task: RolloutTask
    rows: dict[int, int]  # repetition id -> input row


def plan_groups(
    input_batch: Mapping[str, Any],
    tasks: Mapping[str, RolloutTask] | None = None,
    min_group_size: int = 2,
) -> list[_Group]:
    """The GRPO groups a SkyRL batch asks for, checked: every row has a task, the rows of
    one instance share it and number their repetitions 0..n-1, every group has the same
    size n >= `min_group_size`, and no task is asked for by two instances (their rollout
    ids would collide)."""
    prompts = input_batch.get("prompts")
    if not isinstance(prompts, Sequence) or not prompts:
        raise SkyRLInputError("prompts: an empty batch")
    n_rows = len(prompts)
    extras = input_batch.get("env_extras")
    if extras is None or len(extras) != n_rows:
        raise SkyRLInputError(
            f"env_extras: {0 if extras is None else len(extras)} entries for {n_rows} prompts; "
            f"each row names its task in env_extras"
        )
    traj = input_batch.get("trajectory_ids")
    if traj is None or len(traj) != n_rows:
        raise SkyRLInputError(
            f"trajectory_ids: {0 if traj is None else len(traj)} entries for {n_rows} prompts; "
            "the instance id groups rows into GRPO groups"
        )
    groups: dict[str, _Group] = {}
    for row, (tid, extra) in enumerate(zip(traj, extras, strict=True)):
        if not isinstance(extra, Mapping):
            raise SkyRLInputError(
                f"env_extras[{row}]: expected a dict with {TASK_KEY!r} or {TASK_ID_KEY!r}, "
                f"got {type(extra).__name__}"
            )
        task = find_task(
            extra,
            tasks or {},
            where=f"env_extras[{row}]",
            tasks_name="the generator's tasks",
            error=SkyRLInputError,
        )
        group = groups.get(tid.instance_id)
        if group is None:
            group = groups[tid.instance_id] = _Group(tid.instance_id, task, {})
        elif group.task.task_id != task.task_id:
            raise SkyRLInputError(
                f"env_extras[{row}]: task {task.task_id!r}, but instance {tid.instance_id!r} "
                f"asked for task {group.task.task_id!r}; one instance is one task"
            )
        if tid.repetition_id in group.rows:
            raise SkyRLInputError(
                f"trajectory_ids[{row}]: repetition {tid.repetition_id} of instance "
                f"{tid.instance_id!r} appears twice"
            )
        group.rows[tid.repetition_id] = row
    by_task: dict[str, str] = {}
    sizes = {len(g.rows) for g in groups.values()}
    for g in groups.values():
        n = len(g.rows)
        if sorted(g.rows) != list(range(n)):
            raise SkyRLInputError(
                f"trajectory_ids: instance {g.instance_id!r} has repetitions {sorted(g.rows)}, "
                f"not 0..{n - 1}"
            )
        require_group_size(
            n,
            f"trajectory_ids: samples of instance {g.instance_id!r}",
            minimum=min_group_size,
            hint="generator.n_samples_per_prompt",
            error=SkyRLInputError,
        )
        other = by_task.setdefault(g.task.task_id, g.instance_id)
        if other != g.instance_id:
            raise SkyRLInputError(
                f"env_extras: task {g.task.task_id!r} is asked for by instances {other!r} and "
                f"{g.instance_id!r}; one group per task per batch"
            )
    if len(sizes) > 1:
        raise SkyRLInputError(f"trajectory_ids: groups of different sizes {sorted(sizes)}")
    return list(groups.values())


def _checked(rollout: TrainingRollout) -> TrainingSegment:
    """The primary segment, never one whose masks and ids disagree in length."""
    seg = aligned(rollout.rollout_id, rollout.primary)
    if not seg.response_ids:
        raise ConversionError(
            rollout.rollout_id, "response_ids", f"empty (segment {seg.segment_id})"
        )
    return seg


def _token_rewards(rollout: TrainingRollout, reward: float) -> list[float]:
    """Per-token rewards: one step reward at the last sampled token of each LLM call when
    the evaluation gave one per call of the primary segment, else the reward at the last
    sampled token (where the policy last acted; SkyRL's own per-sample conversion puts it
    on the last response token, which may be a tool token)."""
    seg = rollout.primary
    out = [0.0] * len(seg.response_ids)
    sampled = [i for i, m in enumerate(seg.loss_mask) if m]
    steps = rollout.step_rewards
    if steps is not None and rollout.in_baseline and len(steps) == seg.num_calls and sampled:
        bounds = [*seg.call_starts[1:], len(seg.response_ids)]
        for value, start, end in zip(steps, seg.call_starts, bounds, strict=True):
            mine = [i for i in range(start, end) if seg.loss_mask[i]]
            out[(mine or [end - 1])[-1]] += float(value)
        return out
    out[sampled[-1] if sampled else len(out) - 1] = reward
    return out


@dataclass(frozen=True)
class _Slot:
    trajectory_id: Any
    group_id: str
    rollout: TrainingRollout | None


def _assemble(
    slots: Sequence[_Slot],
    batch: ConvertedBatch,
    reward_shape: RewardShape,
    filler_token_id: int,
) -> dict[str, Any]:
    baseline = {group.group_id: group.fill_reward() for group in batch.groups}
    prompt_ids: list[list[int]] = []
    response_ids: list[list[int]] = []
    loss_masks: list[list[int]] = []
    logprobs: list[list[float]] = []
    rewards: list[Any] = []
    stop_reasons: list[str] = []
    env_metrics: list[dict[str, Any]] = []
    masked = 0
    for slot in slots:
        r = slot.rollout
        trained = r is not None and r.in_baseline and r.trained
        if r is None:
            prompt_ids.append([filler_token_id])
            response_ids.append([filler_token_id])
            loss_masks.append([0])
            logprobs.append([0.0])
            reward = baseline.get(slot.group_id, 0.0)
            rewards.append([reward] if reward_shape == "token" else reward)
            stop_reasons.append("error")
            env_metrics.append({"rollout_id": None, "status": "no_rows"})
            masked += 1
            continue
        seg = _checked(r)
        reward = r.reward if r.in_baseline else baseline.get(slot.group_id, 0.0)
        # the segment's own lists, not copies: the converted batch is SkyRL's from here
        prompt_ids.append(seg.prompt_ids)
        response_ids.append(seg.response_ids)
        loss_masks.append(seg.loss_mask if trained else [0] * len(seg.loss_mask))
        logprobs.append(seg.logprobs)
        rewards.append(_token_rewards(r, reward) if reward_shape == "token" else reward)
        stop_reasons.append("length" if r.truncated else FINISHED if r.in_baseline else "error")
        masked += not trained
        env_metrics.append(
            {
                "rollout_id": r.rollout_id,
                "status": str(r.status),
                "num_turns": r.num_turns,
                "segments": len(r.segments),
                "staleness": seg.staleness,
                "step_rewards": r.step_rewards,
            }
        )
    n = max(len(slots), 1)
    metrics = {
        "rollout/infra_error": batch.infra_error,
        "rollout/stale": batch.stale,
        "rollout/stale_calls": batch.stale_calls,
        "rollout/masked_samples": masked,
        "rollout/truncated": sum(s.rollout is not None and s.rollout.truncated for s in slots),
        "rollout/avg_num_turns": sum(s.rollout.num_turns for s in slots if s.rollout) / n,
        "rollout/max_staleness": max(batch.staleness, default=0),
    }
    return {
        "prompt_token_ids": prompt_ids,
        "response_ids": response_ids,
        "rewards": rewards,
        "loss_masks": loss_masks,
        "stop_reasons": stop_reasons,
        "rollout_metrics": metrics,
        "rollout_logprobs": logprobs,
        "trajectory_ids": [s.trajectory_id for s in slots],
        "trajectory_generation_times": None,
        "rollout_expert_indices": None,
        "is_last_step": None,
        "env_metrics": env_metrics,
        "pixel_values": None,
        "image_grid_thw": None,
    }


def convert_batch(
    batch: ConvertedBatch,
    reward_shape: RewardShape = "sample",
    filler_token_id: int = 0,
) -> GeneratorOutput:
    """One converted batch as SkyRL's `GeneratorOutput`: one sample per rollout, in group
    order, each with `TrajectoryID(instance_id=group_id, repetition_id=sample_index)`.
    Pure: no I/O."""
    slots = [
        _Slot(TrajectoryID(instance_id=r.group_id, repetition_id=r.sample_index), r.group_id, r)
        for r in batch.rollouts
    ]
    return _assemble(slots, batch, reward_shape, filler_token_id)  # type: ignore[return-value]


ClientSource = RolloutClient | Callable[[], Awaitable[RolloutClient]]


class RolloutGenerator(GeneratorInterface):
    """SkyRL's generator backed by our rollout service.

    `client`: a connected `RolloutClient`, or an async factory called on the first
    `generate` (SkyRL builds the generator in a Ray actor before its event loop runs).
    `version_index`: the trainer's policy index for a batch (staleness), from SkyRL's
    `BatchMetadata`. `policy`: the Gateway's policy client when SkyRL syncs weights into
    the engines itself: before a batch the Gateway has not been told of, the generator
    holds and releases it with `<run_id>-v<index>` and labels the batch with that
    (docs/trainers/skyrl.md, "Weight updates: who pauses whom").
    """

    def __init__(
        self,
        client: ClientSource,
        output: str,
        tasks: Sequence[RolloutTask] | Mapping[str, RolloutTask] | None = None,
        rules: ConversionRules | None = None,
        run_id: str | None = None,
        reward_shape: RewardShape = "sample",
        filler_token_id: int = 0,
        min_group_size: int = 2,
        version_index: Callable[[Any], int | None] | None = None,
        policy: Any | None = None,
    ) -> None:
        self.tasks = task_table(tasks) or {}
        self._client = client if isinstance(client, RolloutClient) else None
        self._connect = None if self._client is not None else PerLoop(client)  # type: ignore[arg-type]
        self.output = output
        self.rules = rules or ConversionRules()
        self.run_id = run_id or f"skyrl{secrets.token_hex(3)}"
        self.reward_shape: RewardShape = reward_shape
        self.filler_token_id = filler_token_id
        self.min_group_size = min_group_size
        self.version_index = version_index
        self.policy = policy
        self.labelled: int | None = None
        """The policy index the Gateway was last told its engines serve."""
        self.calls = 0

    async def client(self) -> RolloutClient:
        if self._client is not None:
            return self._client
        assert self._connect is not None
        return await self._connect.get()

    def batch_id(self, meta: Any) -> str:
        """`<run>-<phase><step>-<call>`: distinct per call (dynamic sampling asks again
        within one step), stable across a restart only with a fixed `run_id`."""
        phase = "e" if meta is not None and meta.training_phase == "eval" else "t"
        step = meta.global_step if meta is not None else 0
        self.calls += 1
        bid = f"{self.run_id}-{phase}{step}-{self.calls}"
        if not re.match(ID_PATTERN, bid):
            raise SkyRLInputError(
                f"run_id {self.run_id!r}: batch id {bid!r} must match {ID_PATTERN}"
            )
        return bid

    async def generate(self, input_batch: GeneratorInput) -> GeneratorOutput:  # type: ignore[override]
        meta = input_batch.get("batch_metadata")
        min_size = 1 if meta is not None and meta.training_phase == "eval" else self.min_group_size
        groups = plan_groups(input_batch, self.tasks, min_size)
        tasks = [g.task for g in groups]
        rules = self.rules
        served = await self.label_served(meta)
        if served is not None:
            name = policy_version_name(self.run_id, served)
            tasks = [t.model_copy(update={"policy_version": name}) for t in tasks]
            if meta.training_phase == "train":  # eval rewards are reported, never masked
                rules = rules.model_copy(update={"current_version": served})
        if self.version_index is not None:
            rules = rules.model_copy(update={"current_version": self.version_index(meta)})
        got = await collect_groups(
            await self.client(),
            tasks,
            self.output,
            len(groups[0].rows),
            batch_id=self.batch_id(meta),
            rules=rules,
        )
        return self.output_for(input_batch, groups, got.batch.batch_id, got.converted)

    async def label_served(self, meta: Any) -> int | None:
        """With `policy`: the index of the weights the engines serve for this batch (the
        Gateway told first if it does not know it yet), else None. SkyRL trains step k on
        the weights after k-1 updates and evaluates at step k after k updates (step 0:
        before training)."""
        if self.policy is None or meta is None:
            return None
        train = meta.training_phase == "train"
        served = max(meta.global_step - 1, 0) if train else meta.global_step
        if served != self.labelled:
            name = policy_version_name(self.run_id, served)
            async with self.policy.external_update(name):
                pass  # SkyRL's sync is done; the hold drains nothing, the release labels
            self.labelled = served
        return served

    def output_for(
        self,
        input_batch: Mapping[str, Any],
        groups: Sequence[_Group],
        batch_id: str,
        converted: ConvertedBatch,
    ) -> GeneratorOutput:
        """Put each rollout back on the input row that asked for it (a row whose rollout
        has no trainable row gets a masked sample, its group's baseline mean as reward)."""
        by_id = {r.rollout_id: r for r in converted.rollouts}
        slots: list[_Slot] = []
        rows: dict[int, _Slot] = {}
        traj = input_batch["trajectory_ids"]
        for g in groups:
            gid = group_id_for(batch_id, g.task.task_id)
            for rep, row in g.rows.items():
                rid = rollout_id_for(batch_id, g.task.task_id, rep)
                rows[row] = _Slot(traj[row], gid, by_id.get(rid))
        slots = [rows[i] for i in range(len(input_batch["prompts"]))]
        out = _assemble(slots, converted, self.reward_shape, self.filler_token_id)
        return out  # type: ignore[return-value]


def rollout_ppo_exp(make_generator: Callable[[Any, Any], RolloutGenerator]) -> type:
    """A `BasePPOExp` subclass whose `get_generator` is `make_generator(cfg, tokenizer)`.

    SkyRL still builds its inference client (the engines it syncs weights into); the
    generator does not use it: our workers reach the engines through the Gateway."""
    from skyrl.train.entrypoints.main_base import BasePPOExp

    class RolloutPPOExp(BasePPOExp):  # type: ignore[misc,valid-type]
        def get_generator(self, cfg: Any, tokenizer: Any, inference_engine_client: Any) -> Any:
            return make_generator(cfg, tokenizer)

    return RolloutPPOExp
