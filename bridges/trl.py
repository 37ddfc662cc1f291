"""TRL's `GRPOTrainer` learning from our rollouts: its `rollout_func`, a reward function
and a callback that publishes each new policy through the Gateway.

TRL calls `rollout_func(prompts, trainer)` with each prompt repeated `num_generations`
times in a run; a run is one of our GRPO groups (the prompt is a task id) and each
rollout comes back as one TRL sample, its primary segment. TRL has no per-sample loss
switch, so a failed rollout gets an all-0 `env_mask` and reward None (TRL leaves it out
of its group's mean and std). Fields and rules: docs/trainers/trl.md. `trl` is imported
only inside the functions that need it, so `convert_batch` runs without it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bridges.groups import collect_groups
from bridges.policy import publish
from bridges.rollouts import ConversionRules, ConvertedBatch, TrainingRollout, aligned
from bridges.runner import EventLoopThread
from bridges.tasks import require_group_size
from rollout_client import GatewayPolicyClient, RolloutClient, RolloutOutcome
from schemas.policy import PolicyUpdateRecord
from schemas.tasks import RolloutTask
from schemas.training import policy_version_index

#: Keys of the `rollout_func` output TRL reads itself.
TRL_FIELDS = ("prompt_ids", "completion_ids", "logprobs", "env_mask")
#: Extra keys: TRL passes them to the reward functions (one value per sample).
EXTRA_FIELDS = ("rollout_id", "rollout_reward", "rollout_status", "policy_versions")


class TrlBridgeError(ValueError):
    """A batch TRL asked for that the bridge cannot serve; names the field."""


# --------------------------------------------------------------------------- fields


def _sample(rollout: TrainingRollout | None, placeholder_id: int) -> dict[str, Any]:
    """One TRL sample. A rollout that trains nothing (our failure, all calls stale or
    masked, or absent: `None`) still needs non-empty ids — TRL reads the last completion
    id to detect truncation — so it gets one placeholder token with `env_mask` 0."""
    if rollout is None:
        return {
            "prompt_ids": [placeholder_id],
            "completion_ids": [placeholder_id],
            "logprobs": [0.0],
            "env_mask": [0],
            "rollout_id": None,
            "rollout_reward": None,
            "rollout_status": "missing",
            "policy_versions": [],
        }
    seg = aligned(rollout.rollout_id, rollout.primary)
    if rollout.trained and seg.response_ids and seg.prompt_ids:
        tokens = {
            "prompt_ids": list(seg.prompt_ids),
            "completion_ids": list(seg.response_ids),
            "logprobs": list(seg.logprobs),
            "env_mask": list(seg.loss_mask),
        }
    else:
        tokens = {
            "prompt_ids": list(seg.prompt_ids) or [placeholder_id],
            "completion_ids": [placeholder_id],
            "logprobs": [0.0],
            "env_mask": [0],
        }
    return {
        **tokens,
        "rollout_id": rollout.rollout_id,
        # None = unscorable for TRL: out of its group's baseline, advantage 0. A rollout
        # in the baseline that trains nothing (stale or truncated under "mask") keeps it.
        "rollout_reward": rollout.reward if rollout.in_baseline else None,
        "rollout_status": rollout.status.value,
        "policy_versions": rollout.policy_versions,
    }


def convert_batch(
    batch: ConvertedBatch,
    *,
    slots: Sequence[tuple[str, int]] | None = None,
    placeholder_id: int = 0,
) -> dict[str, list[Any]]:
    """`rollout_func`'s return value for `batch`: TRL's fields plus :data:`EXTRA_FIELDS`,
    one entry per rollout in group order, or per slot `(task_id, sample_index)` when
    `slots` is given (a slot whose rollout is absent gets an untrained placeholder).

    TRL's own type for this is a plain dict of per-sample lists, so this is it; pure
    (no I/O, no trl import)."""
    if slots is None:
        samples = [_sample(r, placeholder_id) for r in batch.rollouts]
    else:
        by_slot = {(r.task_id, r.sample_index): r for r in batch.rollouts}
        samples = [_sample(by_slot.get(slot), placeholder_id) for slot in slots]
    return {key: [s[key] for s in samples] for key in (*TRL_FIELDS, *EXTRA_FIELDS)}


def rollout_reward(
    prompts: Sequence[Any],
    completions: Sequence[Any],
    rollout_reward: Sequence[float | None] | None = None,
    **_: Any,
) -> list[float | None]:
    """TRL reward function: our reward per sample (None: out of the baseline)."""
    if rollout_reward is None:
        raise TrlBridgeError(
            "rollout_reward: missing from the reward function's inputs; pass the bridge's "
            "rollout_func to GRPOTrainer (it returns each rollout's reward under that key)"
        )
    if len(rollout_reward) != len(completions):
        raise TrlBridgeError(
            f"rollout_reward: {len(rollout_reward)} rewards for {len(completions)} completions"
        )
    return list(rollout_reward)


def group_runs(prompts: Sequence[Any], group_size: int) -> list[str]:
    """The task id of each run of `group_size` equal prompts (TRL's repeat sampler puts
    a prompt's `num_generations` copies next to each other)."""
    require_group_size(group_size, "num_generations", error=TrlBridgeError)
    if len(prompts) % group_size:
        raise TrlBridgeError(
            f"num_generations: {len(prompts)} prompts are not runs of {group_size}"
        )
    runs: list[str] = []
    for start in range(0, len(prompts), group_size):
        run = prompts[start : start + group_size]
        if any(p != run[0] for p in run):
            raise TrlBridgeError(
                f"num_generations: prompts {start}..{start + group_size - 1} are not one "
                f"task repeated {group_size} times"
            )
        if not isinstance(run[0], str):
            raise TrlBridgeError(f"prompt: expected a task id (str), got {type(run[0]).__name__}")
        runs.append(run[0])
    if len(set(runs)) != len(runs):
        raise TrlBridgeError(
            "prompt: a task appears twice in one generation batch; make the dataset at least "
            "one batch long"
        )
    return runs


# --------------------------------------------------------------------------- the loop


@dataclass
class PolicyLabel:
    """The version the engines serve now: what the next batch is labelled with."""

    version: str


@dataclass
class GenerationRecord:
    """What one `rollout_func` call did (read by the runner for its metrics)."""

    step: int
    label: str
    batch_id: str
    outcomes: list[RolloutOutcome]
    converted: ConvertedBatch
    rows: int
    started: float
    finished: float


@dataclass
class TrlRolloutSource:
    """TRL's `rollout_func`: each call submits its prompt runs as GRPO groups, waits
    for them and returns TRL's fields. `tasks` maps the dataset's prompt (a task id) to
    its task; samples go to `samples_dir/<batch_id>`."""

    client: RolloutClient
    runner: EventLoopThread
    tasks: Mapping[str, RolloutTask]
    samples_dir: Path
    label: PolicyLabel
    group_size: int
    run_seed: int = 0
    max_staleness: int = 1
    batch_prefix: str = "trl"
    placeholder_id: int = 0
    on_generation: Callable[[GenerationRecord], None] | None = None
    calls: int = field(default=0, init=False)

    def __call__(self, prompts: list[Any], trainer: Any = None) -> dict[str, list[Any]]:
        self.calls += 1
        runs = group_runs(prompts, self.group_size)
        for task_id in runs:
            if task_id not in self.tasks:
                raise TrlBridgeError(f"prompt: {task_id!r} is not a task id of this run")
        label = self.label.version
        step = self.calls if trainer is None else int(trainer.state.global_step) + 1
        batch_id = f"{label}-{self.batch_prefix}{step}"
        rules = ConversionRules(
            current_version=policy_version_index(label),
            max_staleness=self.max_staleness,
            stale="mask",  # TRL needs a sample per slot: a stale one stays, untrained
        )
        started = time.monotonic()
        got = self.runner.run(
            collect_groups(
                self.client,
                [self.tasks[t] for t in runs],
                str(self.samples_dir / f"step-{step:04d}"),
                self.group_size,
                batch_id=batch_id,
                rules=rules,
                policy_version=label,
                seed=self.run_seed + step,
                rerun_failed=True,
                poll_s=0.5,
            )
        )
        finished = time.monotonic()
        converted = got.converted
        slots = [(t, i) for t in runs for i in range(self.group_size)]
        fields = convert_batch(converted, slots=slots, placeholder_id=self.placeholder_id)
        if not any(any(m) for m in fields["env_mask"]):
            raise TrlBridgeError(
                f"env_mask: no rollout of batch {batch_id} has a trained token "
                f"({converted.infra_error} infra_error, {len(got.outcomes)} rollouts); "
                "nothing to learn from"
            )
        if self.on_generation is not None:
            self.on_generation(
                GenerationRecord(
                    step=step,
                    label=label,
                    batch_id=batch_id,
                    outcomes=got.outcomes,
                    converted=converted,
                    rows=got.rows,
                    started=started,
                    finished=finished,
                )
            )
        return fields


# --------------------------------------------------------------------------- publishing


SaveFn = Callable[[Any, Path, str], None]
"""save(model, directory, version): write a checkpoint the engines can load."""


@dataclass
class PolicyPublisher:
    """After each optimizer step: save the policy and publish it through the Gateway's
    `POST /policy` (the Gateway pauses new calls, drains running ones, has every engine
    load the checkpoint, resumes), then relabel what follows."""

    gateway: GatewayPolicyClient
    runner: EventLoopThread
    label: PolicyLabel
    policies_dir: Path
    version_name: Callable[[int], str]
    save: SaveFn
    last: PolicyUpdateRecord | None = None
    last_s: float = 0.0

    def publish(self, model: Any, step: int) -> str:
        version = self.version_name(step)
        started = time.monotonic()
        checkpoint = self.policies_dir / version
        if not checkpoint.is_dir():
            self.save(model, checkpoint, version)
        self.last = self.runner.run(publish(self.gateway, version, checkpoint, unless_served=True))
        self.label.version = version
        self.last_s = time.monotonic() - started
        return version


def publish_callback(publisher: PolicyPublisher) -> Any:
    """A `transformers.TrainerCallback` publishing the policy after every optimizer
    step (`on_step_end`: TRL has applied the update, the next generation has not begun)."""
    from transformers import TrainerCallback

    class PublishPolicy(TrainerCallback):  # type: ignore[misc]
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
            publisher.publish(kwargs["model"], int(state.global_step))
            return control

    return PublishPolicy()


def grpo_trainer_class() -> type:
    """TRL's `GRPOTrainer` (imported here: the only module that imports `trl`, with the
    TRL runner)."""
    from trl import GRPOTrainer

    return GRPOTrainer
