"""What a trainer may submit for training, checked before anything starts.

A training submission differs from a plain `RolloutClient.submit` (held-out passes and
`rollout run` legitimately ask for one sample per task, without a Gateway in sight):
its rollouts are GRPO groups whose rewards must be able to differ and whose label must
name weights the engines really served. Each mistake below would otherwise run for
minutes and then train on nothing, or on the wrong thing, without a word:

- `group_size` 1: one rollout is its own baseline, so its advantage is always 0;
- a task without an evaluation (no `evaluation`, no `evaluate` hook with a `spec`):
  every reward is unknown, the same for the whole group, so nothing is learnt;
- a `policy_version` label the Gateway never served: per-call versions, staleness and
  agreement would all be measured against weights that never sampled a token.

Each check raises `TrainingInputError`, a `ValueError` whose `field` names the offending
field (and whose message says which task and what to do).
"""

from collections.abc import Sequence

from schemas.policy import UNKNOWN_WEIGHTS, PolicyState
from schemas.tasks import RolloutTask

#: GRPO's floor: a group's advantage is (reward - group mean), zero for a group of one.
MIN_GROUP_SIZE = 2


class TrainingInputError(ValueError):
    """A training submission that would learn nothing or learn from the wrong label."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


def check_group_size(group_size: int) -> None:
    if group_size < MIN_GROUP_SIZE:
        raise TrainingInputError(
            "group_size",
            f"GRPO needs at least {MIN_GROUP_SIZE} rollouts per group, got {group_size}: a "
            "group of one is its own baseline, so its advantage is always 0",
        )


def has_evaluation(task: RolloutTask) -> bool:
    """Whether the task's rollouts get a reward: an `evaluate` hook runs (the task's own
    hook list, or the defaults) and has a spec (its `spec` param or the task's
    `evaluation`). A custom hook that scores rollouts is invisible from here: hence
    `allow_unevaluated`."""
    for hook in task.hook_specs():
        if hook.name == "evaluate" and (hook.params.get("spec") or task.evaluation):
            return True
    return False


def check_evaluated(tasks: Sequence[RolloutTask], allow_unevaluated: bool = False) -> None:
    if allow_unevaluated:
        return
    for index, task in enumerate(tasks):
        if has_evaluation(task):
            continue
        why = (
            "it has no `evaluation`"
            if any(h.name == "evaluate" for h in task.hook_specs())
            else "its `hooks` leave out `evaluate`"
        )
        raise TrainingInputError(
            f"tasks[{index}].evaluation",
            f"task {task.task_id!r} cannot be trained on: {why}, so every rollout's reward "
            "is unknown and the same across its group (GRPO learns nothing from it); give "
            "it an `evaluation` (or an `evaluate` hook with a `spec`), or pass "
            "allow_unevaluated=True if one of your own hooks scores it",
        )


def served_versions(state: PolicyState) -> set[str]:
    """Every policy version the Gateway has served: the current one, each engine's, and
    every update's target and predecessor, checkpoint or external (the targets of failed
    updates and of external holds that expired excluded: no call is known to have been
    sampled by them)."""
    served: set[str] = set()
    if state.policy_version:
        served.add(state.policy_version)
    served.update(e.policy_version for e in state.engines if e.policy_version)
    for record in state.history:
        if record.status in ("ok", "unchanged"):
            served.add(record.policy_version)
        if record.previous_version:
            served.add(record.previous_version)
    served.discard(UNKNOWN_WEIGHTS)
    return served


def check_served(policy_version: str, state: PolicyState) -> None:
    """Refuse a batch label that names no weights the Gateway ever served.

    Before the first update the engines run the weights they were started with, whose
    name only the trainer knows: any label is taken then (a run starts from its `v0`
    without publishing it). From the first update on, the history says what was served.
    """
    served = served_versions(state)
    if policy_version in served or not served:
        return
    hint = f"it served {', '.join(sorted(served))}; publish this one first (`POST /policy`)"
    raise TrainingInputError(
        "policy_version", f"the Gateway never served {policy_version!r}: {hint}"
    )
