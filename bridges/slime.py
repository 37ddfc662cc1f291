"""slime bridge: our rollouts as slime's `Sample`s, through slime's rollout-function hook.

Three hooks for slime's arguments: :func:`generate_rollout` (`--rollout-function-path`:
each step's prompt groups submitted as our GRPO groups, every segment of a rollout one
`Sample`, sharing its `rollout_id`), :func:`post_process_rewards`
(`--custom-reward-post-process-path`: GRPO over rollouts, not segments; slime's default
normalisation assumes n samples per prompt) and :func:`publish_policy`
(`--custom-update-weight-post-write-path`: each checkpoint published through the Gateway).
Settings are slime `args` named `agentic_rollout_<field>` (:class:`SlimeBridgeConfig`).
slime's own `Sample` is used when `slime.utils.types` imports, else :class:`SampleShape`
(THUDM/slime is on no package index; `SLIME_IMPORTS` says which). The contract:
docs/trainers/slime.md. Only this module imports slime.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import ConfigDict, Field, ValidationError

from bridges.groups import collect_groups, merge
from bridges.policy import gateway_policy, publish, served_version
from bridges.rollouts import (
    ConversionError,
    ConversionRules,
    ConvertedBatch,
    TrainingRollout,
    TrainingSegment,
    aligned,
)
from bridges.runner import Connection, run_sync
from bridges.tasks import find_task, require_group_size, task_table
from rollout_client import RolloutOutcome
from schemas.outcome import RolloutStatus
from schemas.tasks import ID_PATTERN, RolloutTask, group_id_for, load_tasks
from schemas.training import policy_version_index

SLIME_COMMIT = "624b824a898ab0ec1fcb4d373004c7f3852bf515"
"""The slime commit whose `slime/utils/types.py` and rollout contract this bridge follows."""

META_KEY = "agentic_rollout"
"""`Sample.metadata[META_KEY]`: our ids, status and advantage for each slime sample."""


class SampleStatus(enum.Enum):
    """slime's `Sample.Status` values."""

    PENDING = "pending"
    COMPLETED = "completed"
    TRUNCATED = "truncated"
    ABORTED = "aborted"
    FAILED = "failed"


@dataclasses.dataclass
class SampleShape:
    """slime's `Sample` (`slime/utils/types.py` at :data:`SLIME_COMMIT`) as plain data:
    its fields with slime's names, annotations and defaults, used only where slime does
    not import. Left out: the SGLang statistics (`spec_info`, `prefix_cache_info`) and
    the `torch.Tensor` alternatives of the replay fields (this bridge sets none of them)."""

    Status = SampleStatus

    group_index: int | None = None
    index: int | None = None
    rollout_id: int | None = None
    prompt: str | list[dict[str, str]] = ""
    tokens: list[int] = dataclasses.field(default_factory=list)
    multimodal_inputs: dict[str, Any] | None = None
    multimodal_train_inputs: dict[str, Any] | None = None
    multimodal_train_input_id: str | None = None
    apply_chat_template_kwargs: dict = dataclasses.field(default_factory=dict)
    response: str = ""
    response_length: int = 0
    label: str | None = None
    reward: float | dict[str, Any] | None = None
    loss_mask: list[int] | None = None
    weight_versions: list[str] = dataclasses.field(default_factory=list)
    rollout_log_probs: list[float] | None = None
    rollout_top_p_token_ids: list[int] | None = None
    rollout_top_p_token_offsets: list[int] | None = None
    rollout_routed_experts: list[list[int]] | None = None
    remove_sample: bool = False
    teacher_log_probs: list[float] | None = None
    status: SampleStatus = SampleStatus.PENDING
    metadata: dict = dataclasses.field(default_factory=dict)
    generate_function_path: str | None = None
    custom_rm_path: str | None = None
    train_metadata: dict | None = None
    session_id: str | None = None
    non_generation_time: float = 0.0


@dataclasses.dataclass
class TrainOutputShape:
    """slime's `RolloutFnTrainOutput` (`slime/rollout/base_types.py`)."""

    samples: list[Any]
    metrics: dict[str, Any] | None = None


@dataclasses.dataclass
class EvalOutputShape:
    """slime's `RolloutFnEvalOutput`: dataset name → {"rewards", "truncated", "samples"}."""

    data: dict[str, dict[str, Any]]
    metrics: dict[str, Any] | None = None


try:
    from slime.rollout.base_types import RolloutFnEvalOutput, RolloutFnTrainOutput
    from slime.utils.types import Sample

    SLIME_IMPORTS = True
except ImportError:  # not THUDM/slime (absent, or PyPI's unrelated `slime`)
    Sample = SampleShape  # type: ignore[assignment,misc]
    RolloutFnTrainOutput = TrainOutputShape  # type: ignore[assignment,misc]
    RolloutFnEvalOutput = EvalOutputShape  # type: ignore[assignment,misc]
    SLIME_IMPORTS = False

_STATUS: dict[RolloutStatus, str] = {
    RolloutStatus.ok: "COMPLETED",
    RolloutStatus.truncated: "TRUNCATED",
    # The agent's failures: trained with reward 0. slime's FAILED is "a non-critical
    # failure during generation; may still contain partial valid output".
    RolloutStatus.agent_timeout: "FAILED",
    RolloutStatus.agent_broke_sandbox: "FAILED",
    # Ours: no loss (remove_sample), out of the baseline.
    RolloutStatus.eval_error: "ABORTED",
    RolloutStatus.infra_error: "ABORTED",
}


# --------------------------------------------------------------------------- config


class SlimeBridgeConfig(Connection):
    """The bridge's settings: slime `args` attributes `agentic_rollout_<field>`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    output: str | None = Field(
        default=None, description="where rollouts write samples: a directory or s3://…"
    )
    tasks: str | None = Field(
        default=None, description="JSONL of RolloutTask, for prompts that name a task_id"
    )
    run: str = Field(default="slime", pattern=ID_PATTERN, description="batch and version prefix")
    max_staleness: int = Field(default=1, ge=0)
    stale: Literal["drop", "mask"] = "drop"
    truncated: Literal["train", "mask"] = "train"
    poll_s: float = Field(default=1.0, gt=0)

    @classmethod
    def from_args(cls, args: Any) -> SlimeBridgeConfig:
        prefix = "agentic_rollout_"
        values = {
            name: getattr(args, prefix + name)
            for name in cls.model_fields
            if getattr(args, prefix + name, None) is not None
        }
        unknown = sorted(
            name
            for name in vars(args)
            if name.startswith(prefix) and name[len(prefix) :] not in cls.model_fields
        )
        if unknown:
            raise ValueError(
                f"unknown slime args {unknown}: known are {prefix}{list(cls.model_fields)}"
            )
        try:
            return cls(**values)
        except ValidationError as exc:
            problems = "; ".join(
                f"{prefix}{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()
            )
            raise ValueError(f"slime args: {problems}") from None

    def rules(self, current_version: int | None) -> ConversionRules:
        return ConversionRules(
            current_version=current_version,
            max_staleness=self.max_staleness,
            stale=self.stale,
            truncated=self.truncated,
        )


# --------------------------------------------------------------------------- conversion


def _sample_cls(sample_cls: type | None) -> type:
    return Sample if sample_cls is None else sample_cls


def _segment_sample(
    cls: type,
    statuses: Mapping[RolloutStatus, Any],
    rollout: TrainingRollout,
    segment: TrainingSegment,
    *,
    slime_rollout_id: int,
    advantage: float,
    baseline_mean: float | None,
    prompt: Any | None,
    group_index: int,
) -> Any:
    """One segment as a slime sample; raises ConversionError (rollout id, field) when its
    masks and ids disagree — slime would otherwise train on misaligned tokens."""
    n = len(aligned(rollout.rollout_id, segment).response_ids)
    if not segment.prompt_ids:
        raise ConversionError(rollout.rollout_id, "prompt_ids", "empty")
    trained = segment.trained and rollout.in_baseline
    metadata = dict(getattr(prompt, "metadata", None) or {})
    metadata[META_KEY] = {
        "rollout_id": rollout.rollout_id,
        "segment_id": segment.segment_id,
        "group_id": rollout.group_id,
        "task_id": rollout.task_id,
        "status": str(rollout.status),
        "in_baseline": rollout.in_baseline,
        "trained": trained,
        "advantage": advantage,
        "baseline_mean": baseline_mean,
        "staleness": segment.staleness,
        "num_segments": len(rollout.segments),
        "routing_missing": segment.routing_missing,
    }
    sample = cls(
        group_index=getattr(prompt, "group_index", None) if prompt is not None else group_index,
        index=getattr(prompt, "index", None) if prompt is not None else slime_rollout_id,
        rollout_id=slime_rollout_id,
        prompt=getattr(prompt, "prompt", "") if prompt is not None else "",
        label=getattr(prompt, "label", None) if prompt is not None else None,
        tokens=[*segment.prompt_ids, *segment.response_ids],
        response_length=n,
        loss_mask=list(segment.loss_mask),
        rollout_log_probs=list(segment.logprobs),
        weight_versions=list(segment.call_policy_versions),
        rollout_routed_experts=routed_experts(segment),
        reward=float(rollout.reward),
        remove_sample=not trained,
        metadata=metadata,
    )
    sample.status = statuses[rollout.status]
    return sample


def routed_experts(segment: TrainingSegment) -> np.ndarray | None:
    """slime's `rollout_routed_experts`: (len(tokens) - 1, layers, top_k) int32 expert ids,
    as slime reads SGLang's (None: not recorded)."""
    routing = segment.routed_experts
    return None if routing is None else routing.array().astype(np.int32)


def _routing_all_or_none(samples: Iterable[Any]) -> None:
    """slime takes routing for a batch only when its first sample has it, then for every
    sample: one without it, in a batch with it, is named rather than crash slime."""
    flat = list(samples)
    if not any(s.rollout_routed_experts is not None for s in flat):
        return
    for s in flat:
        if s.rollout_routed_experts is None:
            ours = s.metadata[META_KEY]
            raise ConversionError(
                ours["rollout_id"],
                "routed_experts",
                f"segment {ours['segment_id']} has no routing "
                f"({ours['routing_missing'] or 'not recorded'}) in a batch that has it",
            )


def to_slime_samples(
    batch: ConvertedBatch,
    prompt_groups: Mapping[str, Sequence[Any]] | None = None,
    *,
    sample_cls: type | None = None,
    first_rollout_id: int = 0,
    segments: Literal["all", "primary"] = "all",
) -> list[list[list[Any]]]:
    """Groups × rollouts × segments of slime samples (slime's compact shape).

    `prompt_groups`: our group id → slime's prompt samples of that group, in sample-index
    order; each rollout's samples take its prompt sample's `index` (also their shared
    `rollout_id`), `group_index`, `prompt`, `label` and `metadata`, and the groups come
    in its order; rollouts come in sample-index order. Without it (a batch
    not sampled through slime) indexes count from `first_rollout_id`. A group none of
    whose rollouts has rows is left out (slime has nothing to train on there).
    `segments="primary"`: one sample per rollout (its primary segment), for evaluation."""
    cls = _sample_cls(sample_cls)
    statuses = {ours: cls.Status[theirs] for ours, theirs in _STATUS.items()}
    out: list[list[list[Any]]] = []
    counter = first_rollout_id
    groups = batch.groups
    if prompt_groups is not None:  # slime's order, not the order rollouts finished in
        order = {group_id: position for position, group_id in enumerate(prompt_groups)}
        groups = sorted(groups, key=lambda g: order.get(g.group_id, len(order)))
    for group_index, group in enumerate(groups):
        prompts = prompt_groups.get(group.group_id) if prompt_groups is not None else None
        if prompt_groups is not None and prompts is None:
            raise ValueError(f"group {group.group_id!r}: not one of the submitted slime groups")
        advantages = group.advantages()
        stats = group.baseline()
        slime_group: list[list[Any]] = []
        for rollout in sorted(group.rollouts, key=lambda r: r.sample_index):
            prompt = None
            if prompts is not None:
                if not 0 <= rollout.sample_index < len(prompts):
                    raise ConversionError(
                        rollout.rollout_id,
                        "sample_index",
                        f"{rollout.sample_index} outside the slime group of {len(prompts)}",
                    )
                prompt = prompts[rollout.sample_index]
                slime_rollout_id = int(prompt.index)
            else:
                slime_rollout_id = counter
                counter += 1
            slime_group.append(
                [
                    _segment_sample(
                        cls,
                        statuses,
                        rollout,
                        segment,
                        slime_rollout_id=slime_rollout_id,
                        advantage=advantages[rollout.rollout_id],
                        baseline_mean=stats[0] if stats else None,
                        prompt=prompt,
                        group_index=group_index,
                    )
                    for segment in (rollout.segments if segments == "all" else [rollout.primary])
                ]
            )
        if slime_group:
            out.append(slime_group)
    _routing_all_or_none(s for group in out for siblings in group for s in siblings)
    return out


def convert_batch(batch: ConvertedBatch, **options: Any) -> list[list[list[Any]]]:
    """The pure conversion of one converted batch to slime's rollout output
    (`RolloutFnTrainOutput.samples`): see :func:`to_slime_samples` for the options."""
    return to_slime_samples(batch, **options)


_GROUP_ESTIMATORS = ("grpo", "gspo", "cispo", "reinforce_plus_plus_baseline")
"""The estimators slime normalises per group (the others take raw rewards)."""


def post_process_rewards(args: Any, samples: Sequence[Any]) -> tuple[list[float], list[float]]:
    """`--custom-reward-post-process-path bridges.slime.post_process_rewards`:
    (raw rewards, rewards slime trains on), aligned with the flat `samples`.

    Follows slime's own switches (`advantage_estimator`, `rewards_normalization`,
    `grpo_std_normalization`) but takes each rollout's baseline from our groups, so a
    rollout counts once in its group however many segments it has, and `infra_error`
    rollouts are in no baseline and get 0."""
    raw: list[float] = []
    out: list[float] = []
    estimator = getattr(args, "advantage_estimator", "grpo")
    normalize = getattr(args, "rewards_normalization", True)
    use_std = getattr(args, "grpo_std_normalization", True)
    for position, sample in enumerate(samples):
        ours = (sample.metadata or {}).get(META_KEY)
        if ours is None:
            raise ValueError(
                f"slime sample {position} (index {sample.index}): no metadata[{META_KEY!r}]; "
                "post_process_rewards takes only samples made by bridges.slime"
            )
        reward = float(sample.reward)
        raw.append(reward)
        if not normalize or estimator not in _GROUP_ESTIMATORS:
            out.append(reward)
        elif estimator != "reinforce_plus_plus_baseline" and use_std:
            out.append(float(ours["advantage"]))
        elif ours["trained"] and ours["baseline_mean"] is not None:
            out.append(reward - float(ours["baseline_mean"]))
        else:
            out.append(0.0)
    return raw, out


# --------------------------------------------------------------------------- tasks


def prompt_data_rows(tasks: Iterable[RolloutTask]) -> list[dict[str, Any]]:
    """slime `--prompt-data` lines for our tasks: `input` (slime's default `--input-key`)
    is the task's prompt, `metadata.rollout_task` the whole task."""
    return [
        {"input": task.prompt, "metadata": {"rollout_task": task.model_dump(mode="json")}}
        for task in tasks
    ]


def task_for_group(group: Sequence[Any], tasks: Mapping[str, RolloutTask] | None) -> RolloutTask:
    """Our task for one slime prompt group (all its samples copy one prompt)."""
    first = group[0]
    return find_task(
        first.metadata or {},
        tasks,
        where=f"slime prompt (group_index={first.group_index}, index={first.index}): metadata",
        tasks_name="agentic_rollout_tasks",
        need_reward=True,
    )


def waves(task_ids: Sequence[str]) -> list[list[int]]:
    """Group positions split so no task id repeats within one wave (one batch each):
    a batch names each group after its task, and slime may draw a prompt twice in a step
    when its dataset is smaller than the batch."""
    out: list[list[int]] = []
    seen: list[set[str]] = []
    for position, task_id in enumerate(task_ids):
        for wave, ids in zip(out, seen, strict=True):
            if task_id not in ids:
                wave.append(position)
                ids.add(task_id)
                break
        else:
            out.append([position])
            seen.append({task_id})
    return out


# --------------------------------------------------------------------------- the hooks


async def _sample_groups(
    config: SlimeBridgeConfig,
    batch_prefix: str,
    tasks: Sequence[RolloutTask],
    group_size: int,
    rules: ConversionRules,
    label: str | None = None,
) -> tuple[dict[str, int], list[RolloutOutcome], ConvertedBatch]:
    """Submit one GRPO group per task (in waves of distinct task ids, labelled `label`
    when given) and wait for all: (our group id → position in `tasks`, every rollout's
    outcome, the groups converted)."""
    if config.output is None:
        raise ValueError("slime args: agentic_rollout_output is required (samples dir or s3://…)")
    client = await config.connect()
    positions: dict[str, int] = {}
    runs = []
    for number, wave in enumerate(waves([t.task_id for t in tasks])):
        batch_id = batch_prefix if number == 0 else f"{batch_prefix}-w{number}"
        positions.update({group_id_for(batch_id, tasks[i].task_id): i for i in wave})
        runs.append(
            collect_groups(
                client,
                [tasks[i] for i in wave],
                config.output,
                group_size,
                batch_id=batch_id,
                rules=rules,
                policy_version=label,
                poll_s=config.poll_s,
            )
        )
    done = await asyncio.gather(*runs)
    outcomes = [o for got in done for o in got.outcomes]
    return positions, outcomes, merge(got.converted for got in done)


def _metrics(batch: ConvertedBatch, outcomes: Sequence[RolloutOutcome]) -> dict[str, Any]:
    failed = [o for o in outcomes if not o.ok]
    rollouts = batch.rollouts
    return {
        "agentic_rollout/rollouts": len(outcomes),
        "agentic_rollout/failed_rollouts": len(failed),
        "agentic_rollout/infra_error": batch.infra_error,
        "agentic_rollout/stale_rollouts": batch.stale,
        "agentic_rollout/stale_calls": batch.stale_calls,
        "agentic_rollout/segments": sum(len(r.segments) for r in rollouts),
        "agentic_rollout/num_turns_mean": (
            sum(r.num_turns for r in rollouts) / len(rollouts) if rollouts else 0.0
        ),
    }


def _no_samples(what: str, outcomes: Sequence[RolloutOutcome]) -> RuntimeError:
    failed = [o for o in outcomes if not o.ok]
    first = f"; first failure: {failed[0].rollout_id}: {failed[0].error}" if failed else ""
    return RuntimeError(
        f"{what}: none of {len(outcomes)} rollouts produced samples ({len(failed)} failed{first})"
    )


async def _train_step(
    args: Any, rollout_id: int, groups: Sequence[Sequence[Any]], config: SlimeBridgeConfig
) -> Any:
    sizes = {len(g) for g in groups}
    if not groups or sizes == {0}:
        raise ValueError(f"slime step {rollout_id}: the data source returned no prompts")
    if len(sizes) != 1:
        raise ValueError(
            f"slime step {rollout_id}: prompt groups of different sizes {sorted(sizes)}"
        )
    group_size = sizes.pop()
    require_group_size(group_size, "n_samples_per_prompt", hint="--n-samples-per-prompt")
    lookup = task_table(config.tasks)
    tasks = [task_for_group(group, lookup) for group in groups]
    version = None  # the step is labelled with the version served (staleness)
    if config.gateway is not None:
        version = await served_version(gateway_policy(config.gateway))
    current = policy_version_index(version) if version is not None else None
    positions, outcomes, converted = await _sample_groups(
        config, f"{config.run}-r{rollout_id}", tasks, group_size, config.rules(current), version
    )
    ordered = sorted(positions.items(), key=lambda item: item[1])
    prompt_groups = {group_id: groups[i] for group_id, i in ordered}
    samples = to_slime_samples(converted, prompt_groups)
    if not samples:
        raise _no_samples(f"slime step {rollout_id}", outcomes)
    return RolloutFnTrainOutput(samples=samples, metrics=_metrics(converted, outcomes))


def eval_tasks(dataset: Any) -> list[RolloutTask]:
    """The tasks of one of slime's eval datasets (`--eval-prompt-data NAME PATH`): a JSONL
    of prompt lines like `prompt_data_rows` writes, the task under the dataset's
    `metadata_key`."""
    path = Path(dataset.path)
    if path.suffix != ".jsonl":
        raise ValueError(f"eval dataset {dataset.name!r}: {path} is not a .jsonl of prompt lines")
    key = getattr(dataset, "metadata_key", None) or "metadata"
    tasks: list[RolloutTask] = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if line.strip():
            metadata = json.loads(line).get(key) or {}
            prompt = SampleShape(index=number - 1, group_index=number - 1, metadata=metadata)
            try:
                tasks.append(task_for_group([prompt], None))
            except ValueError as exc:
                raise ValueError(f"eval dataset {dataset.name!r}: {path}:{number}: {exc}") from None
    if not tasks:
        raise ValueError(f"eval dataset {dataset.name!r}: {path} holds no prompt line")
    return tasks


async def _eval_step(args: Any, rollout_id: int, config: SlimeBridgeConfig) -> Any:
    """slime's evaluation: every eval dataset's tasks, `n_samples_per_eval_prompt` rollouts
    each; one sample per rollout (its primary segment); infra errors left out (they say
    nothing of the policy)."""
    datasets = list(getattr(args, "eval_datasets", None) or [])
    if not datasets:
        raise ValueError("slime evaluation needs eval datasets (--eval-prompt-data NAME PATH)")
    data: dict[str, dict[str, Any]] = {}
    metrics: dict[str, Any] = {}
    for number, dataset in enumerate(datasets):
        tasks = eval_tasks(dataset)
        group_size = int(getattr(dataset, "n_samples_per_eval_prompt", None) or 1)
        batch_prefix = f"{config.run}-e{rollout_id}-d{number}"
        _, outcomes, converted = await _sample_groups(
            config, batch_prefix, tasks, group_size, config.rules(None)
        )
        samples = [
            rollout[0]
            for group in to_slime_samples(converted, segments="primary")
            for rollout in group
            if rollout[0].metadata[META_KEY]["in_baseline"]
        ]
        if not samples:
            raise _no_samples(f"slime eval {rollout_id}, dataset {dataset.name!r}", outcomes)
        data[dataset.name] = {
            "rewards": [s.reward for s in samples],
            "truncated": [s.status == s.Status.TRUNCATED for s in samples],
            "samples": samples,
        }
        metrics.update({f"{k}/{dataset.name}": v for k, v in _metrics(converted, outcomes).items()})
    return RolloutFnEvalOutput(data=data, metrics=metrics)


def generate_rollout(args: Any, rollout_id: int, data_source: Any, evaluation: bool = False) -> Any:
    """`--rollout-function-path bridges.slime.generate_rollout` (see the module doc)."""
    config = SlimeBridgeConfig.from_args(args)
    if evaluation:
        return run_sync(_eval_step(args, rollout_id, config))
    groups = data_source.get_samples(args.rollout_batch_size)
    return run_sync(_train_step(args, rollout_id, groups, config))


_WEIGHT_DIR_RE = re.compile(r"weight_v(\d+)$")


def policy_version_for(config: SlimeBridgeConfig, version_dir: str) -> str:
    """`<run>-v<N>` for slime's `<update_weight_disk_dir>/weight_v<N:06d>`."""
    match = _WEIGHT_DIR_RE.search(Path(version_dir).name)
    if match is None:
        raise ValueError(f"{version_dir}: not a slime weight directory (weight_v<N>)")
    return f"{config.run}-v{int(match.group(1))}"


def _is_rank_zero() -> bool:
    try:
        import torch.distributed as dist
    except ImportError:
        return True
    return not dist.is_initialized() or dist.get_rank() == 0


def publish_policy(args: Any, version_dir: str, rollout_engines: Sequence[Any]) -> None:
    """`--custom-update-weight-post-write-path bridges.slime.publish_policy` (with
    `--update-weight-transport disk`): after slime wrote the full HF checkpoint of a
    weight update, rank 0 publishes it as `<run>-v<N>` through the Gateway's
    `POST /policy` (pause, drain, every engine loads it, resume). slime calls the hook on
    every trainer rank, before its own engines reload; it returns when the Gateway's
    engines serve the new version."""
    if not _is_rank_zero():
        return
    config = SlimeBridgeConfig.from_args(args)
    if config.gateway is None:
        raise ValueError("publish_policy needs agentic_rollout_gateway (the Gateway's control URL)")
    version = policy_version_for(config, version_dir)
    run_sync(publish(gateway_policy(config.gateway), version, version_dir))


def main(argv: Sequence[str] | None = None) -> None:
    """`python -m bridges.slime TASKS.jsonl > prompts.jsonl`: slime `--prompt-data` lines
    (and `--eval-prompt-data` ones) for a JSONL of our tasks."""
    import sys

    paths = list(sys.argv[1:] if argv is None else argv)
    if len(paths) != 1:
        raise SystemExit("usage: python -m bridges.slime TASKS.jsonl > prompts.jsonl")
    for line in prompt_data_rows(load_tasks(paths[0])):
        print(json.dumps(line))


if __name__ == "__main__":
    main()
