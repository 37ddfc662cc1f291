"""The SkyRL bridge's contract, in the project's environment where SkyRL is not installed:
`bridges.skyrl` then uses stand-ins with SkyRL's documented field shapes (TrajectoryID,
BatchMetadata, the GeneratorOutput keys of SkyRL 0.3.0), and these tests check the mapping
against those fields. SkyRL's own classes and its own checks of a generator's output run
in the trainer overlay (tests/integration/test_bridge_skyrl.py).

`generate` is driven through `ListedClient`, a stand-in for `RolloutClient` that answers
from rows given up front: the real client needs Temporal, workers and an engine, which
the integration tests of the client cover; here only the bridge's use of it is checked.
"""

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pytest

from bridges import skyrl as bridge
from bridges.rollouts import ConversionError, ConversionRules, to_training_rollouts
from examples.make_tasks import task as make_task
from rollout_client import Batch, RolloutClient, RolloutOutcome
from schemas.tasks import RolloutTask, group_id_for, rollout_id_for

#: The keys of SkyRL 0.3.0's `GeneratorOutput` (skyrl/train/generators/base.py).
GENERATOR_OUTPUT_KEYS = {
    "prompt_token_ids",
    "response_ids",
    "rewards",
    "loss_masks",
    "stop_reasons",
    "rollout_metrics",
    "rollout_logprobs",
    "trajectory_ids",
    "trajectory_generation_times",
    "rollout_expert_indices",
    "is_last_step",
    "env_metrics",
    "pixel_values",
    "image_grid_thw",
}

MUL = RolloutTask.model_validate(make_task("mul", "6 times 7?", "42"))
CAP = RolloutTask.model_validate(make_task("cap", "Capital of France?", "Paris"))


def tid(instance: str, rep: int) -> Any:
    return bridge.TrajectoryID(instance_id=instance, repetition_id=rep)


def skyrl_input(rows: list[tuple[str, int, dict[str, Any]]], phase: str = "train") -> dict:
    """A GeneratorInput as SkyRL's `prepare_generator_input` builds it."""
    return {
        "prompts": [[{"role": "user", "content": "…"}] for _ in rows],
        "env_classes": ["rollout"] * len(rows),
        "env_extras": [extras for _, _, extras in rows],
        "sampling_params": {"temperature": 1.0},
        "trajectory_ids": [tid(i, r) for i, r, _ in rows],
        "batch_metadata": bridge.BatchMetadata(global_step=3, training_phase=phase),
    }


def sample_row(
    batch_id: str,
    task_id: str,
    index: int,
    reward: float,
    *,
    status: str = "ok",
    mask: list[int] | None = None,
    starts: list[int] | None = None,
    step_rewards: list[float] | None = None,
    version: str = "run-v3",
) -> dict[str, Any]:
    """One Parquet row of our sample schema (the columns the conversion reads)."""
    mask = [1, 1, 0, 1] if mask is None else mask
    starts = starts or [0]
    return {
        "rollout_id": rollout_id_for(batch_id, task_id, index),
        "task_id": task_id,
        "group_id": group_id_for(batch_id, task_id),
        "sample_index": index,
        "segment_id": f"{task_id}-{index}-s0",
        "prompt_ids": [1, 2, 3 + index],
        "response_ids": [10 + index + k for k in range(len(mask))],
        "loss_mask": mask,
        "logprobs": [-0.25 if m else 0.0 for m in mask],
        "reward": reward,
        "step_rewards": step_rewards,
        "status": status,
        "policy_version": version,
        "call_policy_versions": [version] * len(starts),
        "call_starts": starts,
    }


def test_rows_of_an_instance_are_one_group_and_name_their_task_either_way() -> None:
    batch = skyrl_input(
        [
            ("u1", 0, {"task_id": "mul"}),
            ("u2", 0, {"rollout_task": CAP.model_dump_json()}),
            ("u1", 1, {"task_id": "mul"}),
            ("u2", 1, {"rollout_task": CAP.model_dump(mode="json")}),
        ]
    )
    groups = bridge.plan_groups(batch, {"mul": MUL})
    assert [(g.instance_id, g.task.task_id, g.rows) for g in groups] == [
        ("u1", "mul", {0: 0, 1: 2}),
        ("u2", "cap", {0: 1, 1: 3}),
    ]


@pytest.mark.parametrize(
    ("rows", "field"),
    [
        ([("u1", 0, {"task_id": "mul"})], "needs at least 2"),
        ([("u1", 0, {}), ("u1", 1, {})], "env_extras[0] has neither"),
        ([("u1", 0, {"task_id": "nope"}), ("u1", 1, {"task_id": "nope"})], "env_extras[0].task_id"),
        ([("u1", 0, {"rollout_task": "{}"}), ("u1", 1, {})], "env_extras[0].rollout_task"),
        ([("u1", 0, {"task_id": "mul"}), ("u1", 1, {"task_id": "cap"})], "env_extras[1]: task"),
        ([("u1", 0, {"task_id": "mul"}), ("u1", 0, {"task_id": "mul"})], "trajectory_ids[1]"),
        ([("u1", 0, {"task_id": "mul"}), ("u1", 2, {"task_id": "mul"})], "not 0..1"),
        (
            [(u, r, {"task_id": "mul"}) for u in ("u1", "u2") for r in (0, 1)],
            "asked for by instances 'u1' and 'u2'",
        ),
        (
            [("u1", r, {"task_id": "mul"}) for r in (0, 1)]
            + [("u2", r, {"task_id": "cap"}) for r in (0, 1, 2)],
            "different sizes [2, 3]",
        ),
    ],
)
def test_a_batch_the_bridge_cannot_map_is_refused_naming_the_field(
    rows: list[tuple[str, int, dict[str, Any]]], field: str
) -> None:
    with pytest.raises(bridge.SkyRLInputError) as err:
        bridge.plan_groups(skyrl_input(rows), {"mul": MUL, "cap": CAP})
    assert field in str(err.value)


def test_missing_trajectory_ids_are_refused() -> None:
    batch = skyrl_input([("u1", 0, {"task_id": "mul"}), ("u1", 1, {"task_id": "mul"})])
    batch["trajectory_ids"] = None
    with pytest.raises(bridge.SkyRLInputError, match="trajectory_ids: 0 entries for 2"):
        bridge.plan_groups(batch, {"mul": MUL})


def interleaved() -> dict:
    """Two instances, rows interleaved (SkyRL keeps an instance's rows together; the
    bridge must not rely on it)."""
    order = [("u2", 1), ("u1", 0), ("u1", 2), ("u2", 0), ("u1", 1), ("u2", 2)]
    task = {"u1": "mul", "u2": "cap"}
    return skyrl_input([(u, r, {"task_id": task[u]}) for u, r in order])


def test_each_row_gets_its_own_rollout_back_in_input_order() -> None:
    batch = interleaved()
    gen = bridge.RolloutGenerator(ListedClient([]), "/out", tasks=[MUL, CAP])
    groups = bridge.plan_groups(batch, gen.tasks)
    rows = [sample_row("b", t, i, float(i == 0)) for t in ("mul", "cap") for i in range(3)]
    out = gen.output_for(batch, groups, "b", to_training_rollouts(rows))
    assert set(out) == GENERATOR_OUTPUT_KEYS
    want = [("cap", 1), ("mul", 0), ("mul", 2), ("cap", 0), ("mul", 1), ("cap", 2)]
    assert [m["rollout_id"] for m in out["env_metrics"]] == [
        rollout_id_for("b", t, i) for t, i in want
    ]
    assert out["prompt_token_ids"] == [[1, 2, 3 + i] for _, i in want]
    assert out["response_ids"] == [[10 + i + k for k in range(4)] for _, i in want]
    assert out["loss_masks"] == [[1, 1, 0, 1]] * 6
    assert out["rollout_logprobs"] == [[-0.25, -0.25, 0.0, -0.25]] * 6
    assert out["rewards"] == [float(i == 0) for _, i in want]
    assert out["stop_reasons"] == ["stop"] * 6
    assert out["trajectory_ids"] == batch["trajectory_ids"]


def test_infra_error_and_missing_rollouts_are_masked_at_the_group_mean() -> None:
    """Group mul: rewards 1 and 0 in the baseline (mean .5), one infra_error; group cap:
    one rollout with no row at all (its workflow failed), the others 1 and 1."""
    batch = interleaved()
    gen = bridge.RolloutGenerator(ListedClient([]), "/out", tasks=[MUL, CAP], filler_token_id=7)
    groups = bridge.plan_groups(batch, gen.tasks)
    rows = [
        sample_row("b", "mul", 0, 1.0),
        sample_row("b", "mul", 1, 0.0),
        sample_row("b", "mul", 2, 0.0, status="infra_error"),
        sample_row("b", "cap", 0, 1.0),
        sample_row("b", "cap", 2, 1.0),
    ]
    out = gen.output_for(batch, groups, "b", to_training_rollouts(rows))
    # rows: cap1 (missing), mul0, mul2 (infra), cap0, mul1, cap2
    assert out["rewards"] == [1.0, 1.0, 0.5, 1.0, 0.0, 1.0]
    assert out["loss_masks"][2] == [0, 0, 0, 0] and out["stop_reasons"][2] == "error"
    assert out["response_ids"][2] == [12, 13, 14, 15]  # its tokens, no loss
    assert out["prompt_token_ids"][0] == [7] and out["response_ids"][0] == [7]
    assert out["loss_masks"][0] == [0] and out["rollout_logprobs"][0] == [0.0]
    assert out["env_metrics"][0] == {"rollout_id": None, "status": "no_rows"}
    assert out["rollout_metrics"]["rollout/infra_error"] == 1
    assert out["rollout_metrics"]["rollout/masked_samples"] == 2
    for ids, mask, lps in zip(
        out["response_ids"], out["loss_masks"], out["rollout_logprobs"], strict=True
    ):
        assert len(ids) == len(mask) == len(lps)


def test_truncated_stops_with_length_and_a_stale_masked_rollout_keeps_its_reward() -> None:
    batch = skyrl_input([("u1", 0, {"task_id": "mul"}), ("u1", 1, {"task_id": "mul"})])
    groups = bridge.plan_groups(batch, {"mul": MUL})
    rows = [
        sample_row("b", "mul", 0, 1.0, status="truncated"),
        sample_row("b", "mul", 1, 0.0, version="run-v0"),
    ]
    rules = ConversionRules(current_version=3, max_staleness=1, stale="mask")
    gen = bridge.RolloutGenerator(ListedClient([]), "/out", tasks=[MUL])
    out = gen.output_for(batch, groups, "b", to_training_rollouts(rows, rules))
    assert out["stop_reasons"] == ["length", "stop"]
    assert out["loss_masks"] == [[1, 1, 0, 1], [0, 0, 0, 0]]
    assert out["rewards"] == [1.0, 0.0]  # the stale one stays in the baseline
    assert out["rollout_metrics"]["rollout/stale"] == 1


def test_token_rewards_put_step_rewards_at_each_calls_last_sampled_token() -> None:
    """Two calls at 0 and 3 (tokens 0-1 sampled, 2 a tool token, 3-4 sampled)."""
    rows = [
        sample_row(
            "b", "mul", 0, 1.0, mask=[1, 1, 0, 1, 1], starts=[0, 3], step_rewards=[0.25, 0.75]
        ),
        sample_row("b", "mul", 1, 0.0, mask=[1, 0, 0]),
    ]
    out = bridge.convert_batch(to_training_rollouts(rows), reward_shape="token")
    assert out["rewards"] == [[0.0, 0.25, 0.0, 0.0, 0.75], [0.0, 0.0, 0.0]]
    # no step rewards: the reward sits on the last token the policy sampled
    out = bridge.convert_batch(to_training_rollouts(rows[1:] + rows[:1]), reward_shape="token")
    assert out["rewards"][0] == [0.0, 0.0, 0.0]
    rows[1]["reward"] = 2.0
    out = bridge.convert_batch(to_training_rollouts(rows[1:]), reward_shape="token")
    assert out["rewards"] == [[2.0, 0.0, 0.0]]


def test_convert_batch_is_one_sample_per_rollout_with_group_trajectory_ids() -> None:
    rows = [sample_row("b", t, i, 1.0) for t in ("mul", "cap") for i in range(2)]
    out = bridge.convert_batch(to_training_rollouts(rows))
    assert set(out) == GENERATOR_OUTPUT_KEYS
    assert [(t.instance_id, t.repetition_id) for t in out["trajectory_ids"]] == [
        ("b-mul", 0),
        ("b-mul", 1),
        ("b-cap", 0),
        ("b-cap", 1),
    ]
    assert len(out["response_ids"]) == 4 and out["rewards"] == [1.0] * 4


def test_a_segment_whose_mask_disagrees_with_its_ids_is_refused_with_its_rollout_id() -> None:
    converted = to_training_rollouts([sample_row("b", "mul", 0, 1.0)])
    converted.rollouts[0].segments[0].loss_mask = [1, 1]  # corrupted after conversion
    with pytest.raises(ConversionError, match=r"rollout 'b-mul-0': loss_mask: 2 entries for 4"):
        bridge.convert_batch(converted)


@dataclass
class ListedClient:
    """Stand-in for `RolloutClient` (see the module docstring): `submit` plans as the real
    client does and records the call; `results` yields an outcome per planned rollout;
    `load_samples` returns the given rows of the rollouts that have some."""

    rows: list[dict[str, Any]]
    task_queue: str = "rollouts"

    def __post_init__(self) -> None:
        self.submitted: list[tuple[list[str], int, str]] = []

    async def submit(
        self,
        tasks: list[RolloutTask],
        output: str,
        samples_per_task: int,
        batch_id: str,
        **_: Any,
    ) -> Batch:
        batch, _ = RolloutClient.plan(self, tasks, output, samples_per_task, batch_id)  # type: ignore[arg-type]
        self.submitted.append(([t.task_id for t in tasks], samples_per_task, batch_id))
        self.batch = batch
        return batch

    async def results(self, batch: Batch, poll_s: float = 1.0) -> Any:
        for rid in batch.rollout_ids:
            yield RolloutOutcome(rollout_id=rid, workflow_status="COMPLETED")

    def load_samples(self, outcomes: list[RolloutOutcome]) -> pa.Table:
        """The rows of these rollouts (the bridge reads one group at a time)."""
        ids = {o.rollout_id for o in outcomes}
        assert ids <= set(self.batch.rollout_ids)
        return pa.Table.from_pylist([r for r in self.rows if r["rollout_id"] in ids])


def connecting(client: ListedClient) -> Any:
    """The generator connects lazily, on its first `generate` (in SkyRL's event loop)."""

    async def connect() -> ListedClient:
        return client

    return connect


async def test_generate_submits_one_group_per_instance_and_labels_batches_per_call() -> None:
    client = ListedClient([])
    gen = bridge.RolloutGenerator(connecting(client), "/out", tasks=[MUL, CAP], run_id="r1")
    out = await gen.generate(interleaved())  # no rows: every sample masked
    assert client.submitted == [(["cap", "mul"], 3, "r1-t3-1")]
    assert out["loss_masks"] == [[0]] * 6 and out["rewards"] == [0.0] * 6
    eval_batch = skyrl_input([("u1", 0, {"task_id": "mul"})], phase="eval")
    await gen.generate(eval_batch)  # eval asks for one sample per prompt: allowed
    assert client.submitted[-1] == (["mul"], 1, "r1-e3-2")


async def test_generate_converts_with_the_trainers_version() -> None:
    """`version_index` gives the trainer's policy for the batch: v3 at step 3, so a call
    by v1 lags 2 > max_staleness 1 and is dropped (its row masked at the group mean)."""

    class Rows(ListedClient):
        def load_samples(self, outcomes: list[RolloutOutcome]) -> pa.Table:
            bid = self.batch.batch_id
            return pa.Table.from_pylist(
                [
                    sample_row(bid, "mul", 0, 1.0, version="r-v3"),
                    sample_row(bid, "mul", 1, 0.0, version="r-v1"),
                ]
            )

    gen = bridge.RolloutGenerator(
        connecting(Rows([])), "/out", tasks=[MUL], version_index=lambda meta: meta.global_step
    )
    batch = skyrl_input([("u1", 0, {"task_id": "mul"}), ("u1", 1, {"task_id": "mul"})])
    out = await gen.generate(batch)
    assert out["loss_masks"][0] == [1, 1, 0, 1]
    assert out["loss_masks"][1] == [0] and out["rewards"] == [1.0, 1.0]
    assert out["rollout_metrics"]["rollout/stale"] == 1


def test_a_run_id_that_makes_no_batch_id_is_refused() -> None:
    gen = bridge.RolloutGenerator(ListedClient([]), "/out", run_id="bad id")
    with pytest.raises(bridge.SkyRLInputError, match="run_id 'bad id'"):
        gen.batch_id(None)


class HoldRecorder:
    """Stand-in for `GatewayPolicyClient.external_update` (the Gateway's hold/release
    pair): records the versions it was asked to label; the Gateway side has its own
    integration tests."""

    def __init__(self) -> None:
        self.released: list[str] = []

    @contextlib.asynccontextmanager
    async def external_update(self, policy_version: str) -> AsyncIterator[None]:
        yield
        self.released.append(policy_version)


async def test_with_skyrl_syncing_weights_the_gateway_is_told_once_per_version() -> None:
    """Training step k samples the weights after k-1 updates (`<run>-v<k-1>`), eval at
    step k those after k. The Gateway is told once per version (dynamic sampling asks
    again within a step); the tasks carry it, and training batches measure staleness
    against it (a call by v0 at step 3 lags 2 > 1), eval batches do not."""

    class Rows(ListedClient):
        def load_samples(self, outcomes: list[RolloutOutcome]) -> pa.Table:
            bid = self.batch.batch_id
            return pa.Table.from_pylist(
                [
                    sample_row(bid, "mul", 0, 1.0, version="r1-v2"),
                    sample_row(bid, "mul", 1, 0.0, version="r1-v0"),
                ]
            )

    client, policy = Rows([]), HoldRecorder()
    gen = bridge.RolloutGenerator(
        connecting(client), "/out", tasks=[MUL], run_id="r1", policy=policy
    )
    batch = skyrl_input([("u1", 0, {"task_id": "mul"}), ("u1", 1, {"task_id": "mul"})])
    out = await gen.generate(batch)
    await gen.generate(batch)
    assert policy.released == ["r1-v2"]
    assert client.submitted[0][2] == "r1-t3-1"
    assert out["loss_masks"][0] == [1, 1, 0, 1] and out["loss_masks"][1] == [0]
    batch["batch_metadata"] = bridge.BatchMetadata(global_step=3, training_phase="eval")
    out = await gen.generate(batch)
    assert policy.released == ["r1-v2", "r1-v3"]
    assert out["loss_masks"][1] == [1, 1, 0, 1] and out["rewards"] == [1.0, 0.0]
    batch["batch_metadata"] = bridge.BatchMetadata(global_step=4, training_phase="train")
    await gen.generate(batch)
    assert policy.released == ["r1-v2", "r1-v3"]  # step 4 trains on v3: already told


async def test_submitted_tasks_carry_the_served_version() -> None:
    seen: list[str] = []

    class Tasks(ListedClient):
        async def submit(self, tasks: list[RolloutTask], *args: Any, **kw: Any) -> Batch:
            seen.extend(t.policy_version for t in tasks)
            return await super().submit(tasks, *args, **kw)

    gen = bridge.RolloutGenerator(
        connecting(Tasks([])), "/out", tasks=[MUL], run_id="r1", policy=HoldRecorder()
    )
    await gen.generate(skyrl_input([("u1", 0, {"task_id": "mul"}), ("u1", 1, {"task_id": "mul"})]))
    assert seen == ["r1-v2"] and MUL.policy_version == "tiny-random-v0"
