"""Training submissions refused before anything starts, each with the field named:
a group of one, a task nobody evaluates, a label the Gateway never served. The checks
are pure over our own models (`RolloutTask`, `PolicyState`); `submit_groups` is checked
to refuse before it reaches Temporal (its client is never called)."""

from datetime import UTC, datetime
from typing import Any

import pytest

from rollout_client.client import RolloutClient
from rollout_client.training import (
    TrainingInputError,
    check_evaluated,
    check_group_size,
    check_served,
    served_versions,
)
from schemas.policy import UNKNOWN_WEIGHTS, EngineServing, PolicyState, PolicyUpdateRecord
from schemas.tasks import RolloutTask

EVAL = {"checks": [{"kind": "file", "path": "answer.txt", "contains": ["42"]}]}


def task(task_id: str = "t", **fields: Any) -> RolloutTask:
    data: dict[str, Any] = {"task_id": task_id, "prompt": "p", "harness": {"name": "command"}}
    data.update(fields)
    return RolloutTask.model_validate(data)


def record(version: str, previous: str | None, status: str = "ok") -> PolicyUpdateRecord:
    return PolicyUpdateRecord(
        update_id=f"u-{version}",
        policy_version=version,
        checkpoint=f"/ckpt/{version}",
        previous_version=previous,
        status=status,  # type: ignore[arg-type]
        started_at=datetime(2026, 1, 1, tzinfo=UTC),
        processes=1,
        drained_calls=0,
        held_calls=0,
        drain_s=0.0,
        load_s=0.0,
        total_s=0.0,
    )


def state(current: str | None, *history: PolicyUpdateRecord, engines: Any = ()) -> PolicyState:
    return PolicyState(
        policy_version=current,
        checkpoint=None,
        updating=False,
        engines=list(engines),
        history=list(history),
    )


def test_group_size_one_is_refused_naming_the_field() -> None:
    with pytest.raises(TrainingInputError, match=r"^group_size: GRPO needs at least 2") as err:
        check_group_size(1)
    assert err.value.field == "group_size"
    check_group_size(2)


def test_a_task_without_evaluation_is_refused_unless_allowed() -> None:
    tasks = [task("good", evaluation=EVAL), task("bare")]
    with pytest.raises(TrainingInputError) as err:
        check_evaluated(tasks)
    assert err.value.field == "tasks[1].evaluation"
    assert "'bare'" in str(err.value) and "allow_unevaluated" in str(err.value)
    check_evaluated(tasks, allow_unevaluated=True)


def test_evaluation_counts_only_where_an_evaluate_hook_runs() -> None:
    # the spec given to the evaluate hook itself is an evaluation
    check_evaluated([task(hooks=[{"name": "evaluate", "params": {"spec": EVAL}}])])
    # a task evaluation whose hook list leaves out `evaluate` is never run
    no_hook = task("nohook", evaluation=EVAL, hooks=[{"name": "collect_logs"}])
    with pytest.raises(TrainingInputError, match="leave out `evaluate`"):
        check_evaluated([no_hook])


def test_served_versions_come_from_state_engines_and_history() -> None:
    st = state(
        "run-v2",
        record("run-v1", None),
        record("run-v2", "run-v1"),
        record("run-v3", "run-v2", status="failed"),
        record("run-v4", "run-v2", status="expired"),  # an external hold that ran out
        engines=[
            EngineServing(engine="http://e1", policy_version="run-v2"),
            EngineServing(engine="http://e2", policy_version=UNKNOWN_WEIGHTS),
        ],
    )
    assert served_versions(st) == {"run-v1", "run-v2"}
    check_served("run-v1", st)
    with pytest.raises(TrainingInputError, match=r"^policy_version: .*'run-v3'.*run-v1, run-v2"):
        check_served("run-v3", st)  # its update failed: those weights never sampled
    with pytest.raises(TrainingInputError):
        check_served("run-v4", st)  # nobody knows what the engines got
    with pytest.raises(TrainingInputError) as err:
        check_served(UNKNOWN_WEIGHTS, st)
    assert err.value.field == "policy_version"


def test_before_the_first_update_the_trainer_names_the_start_weights() -> None:
    """The engines run the weights they started with; only the trainer knows their name,
    so a run's `v0` is taken without a publish (the reference trainer starts that way)."""
    check_served("run-v0", state(None))


class NeverCalled:
    """Stands where the Temporal client would be: any use of it fails the test."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"submit_groups reached Temporal ({name}) despite bad input")


async def test_submit_groups_refuses_before_starting_anything() -> None:
    client = RolloutClient(NeverCalled())  # type: ignore[arg-type]
    with pytest.raises(TrainingInputError, match=r"^group_size"):
        await client.submit_groups([task(evaluation=EVAL)], "/tmp/out", group_size=1)
    with pytest.raises(TrainingInputError, match=r"^tasks\[0\]\.evaluation"):
        await client.submit_groups([task()], "/tmp/out", group_size=4)
