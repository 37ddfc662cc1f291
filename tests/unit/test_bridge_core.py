"""The bridges' shared core: the task behind a row, the baseline fill, the runners, one
batch collected through `stream_groups`, policy publishing and the trainers' pins.

The rollouts are `FakeRolloutSourceForTests` (tests/fixtures/fake_rollouts.py: a fake for
Temporal and the workers; planning, rows and the conversion are the real ones)."""

import asyncio
import json
import statistics
import threading
from pathlib import Path
from typing import Any

import pytest

from bridges.groups import collect_groups
from bridges.policy import publish, served_index
from bridges.rollouts import ConversionRules, TrainingGroup, TrainingRollout
from bridges.runner import EventLoopThread, PerLoop, run_sync
from bridges.tasks import find_task, require_group_size, task_table
from environments.trainer import NO_DEPS, trainer_extras
from schemas.outcome import RolloutStatus
from schemas.policy import PolicyState, PolicyUpdate, PolicyUpdateRecord
from schemas.tasks import RolloutTask
from tests.fixtures.fake_rollouts import FakeRolloutSourceForTests

EVAL = {"checks": [{"kind": "file", "path": "answer.txt", "contains": ["42"]}]}


def task(task_id: str, evaluation: bool = True) -> RolloutTask:
    fields: dict[str, Any] = {"task_id": task_id, "prompt": "p", "harness": {"name": "command"}}
    return RolloutTask.model_validate(fields | ({"evaluation": EVAL} if evaluation else {}))


# ---------------------------------------------------------------------------- tasks


def test_a_row_carries_its_task_as_json_or_a_mapping_or_names_it() -> None:
    t = task("mul")
    known = {"mul": t}
    kw: dict[str, Any] = {"where": "row 3", "tasks_name": "the tasks"}
    assert find_task({"rollout_task": t.model_dump_json()}, None, **kw) == t
    assert find_task({"rollout_task": t.model_dump(mode="json")}, None, **kw) == t
    assert find_task({"task_id": "mul"}, known, **kw) is t
    # a whole task wins over an id naming another one
    assert find_task({"rollout_task": t.model_dump(), "task_id": "x"}, {}, **kw) == t


class RowError(ValueError):
    """A bridge's own error type."""


@pytest.mark.parametrize(
    ("fields", "known", "message"),
    [
        ({}, {}, r"^row 3 has neither 'rollout_task' nor 'task_id'$"),
        ({"rollout_task": "{}"}, None, r"^row 3\.rollout_task is not a RolloutTask"),
        ({"rollout_task": "not json"}, None, r"^row 3\.rollout_task is not a RolloutTask"),
        ({"task_id": "mul"}, None, r"^row 3\.task_id needs the tasks$"),
        ({"task_id": "nope"}, {"mul": task("mul")}, r"^row 3\.task_id 'nope' is not in the tasks"),
        ({"task_id": "bare"}, {"bare": task("bare", False)}, r"^row 3: task 'bare': evaluation"),
    ],
)
def test_a_row_without_a_usable_task_is_refused_naming_row_and_field(
    fields: dict[str, Any], known: dict[str, RolloutTask] | None, message: str
) -> None:
    with pytest.raises(RowError, match=message):
        find_task(
            fields, known, where="row 3", tasks_name="the tasks", error=RowError, need_reward=True
        )


def test_an_unevaluated_task_passes_when_no_reward_is_needed() -> None:
    found = find_task({"task_id": "bare"}, {"bare": task("bare", False)}, where="r", tasks_name="t")
    assert found.evaluation is None


def test_the_configured_tasks_come_from_a_path_a_list_or_a_mapping(tmp_path: Path) -> None:
    a, b = task("a"), task("b")
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(t.model_dump_json() + "\n" for t in (a, b)))
    assert task_table(None) is None
    assert task_table([a, b]) == {"a": a, "b": b}
    assert task_table({"a": a}) == {"a": a}
    assert task_table(str(path)) == {"a": a, "b": b}
    assert task_table(path) == {"a": a, "b": b}


class Refused(ValueError):
    """A bridge's own error type."""


def test_a_group_too_small_for_a_baseline_is_refused_naming_the_setting() -> None:
    require_group_size(2, "num_generations")  # the smallest group with a baseline
    require_group_size(1, "eval", minimum=1)
    with pytest.raises(Refused, match=r"^n: 1; a GRPO group needs at least 2 rollouts \(--n\)$"):
        require_group_size(1, "n", hint="--n", error=Refused)


# ---------------------------------------------------------------------------- baseline fill


def rollout(index: int, reward: float, in_baseline: bool = True) -> TrainingRollout:
    return TrainingRollout(
        rollout_id=f"r{index}",
        group_id="g",
        task_id="t",
        sample_index=index,
        status=RolloutStatus.ok if in_baseline else RolloutStatus.infra_error,
        reward=reward,
        step_rewards=None,
        segments=[],
        in_baseline=in_baseline,
    )


def test_the_fill_keeps_the_group_mean_of_the_rollouts_that_count() -> None:
    group = TrainingGroup(
        group_id="g",
        task_id="t",
        rollouts=[rollout(0, 1.0), rollout(1, 0.25), rollout(2, 0.0), rollout(3, 9.0, False)],
    )
    fill = group.fill_reward()
    counted = [1.0, 0.25, 0.0]
    assert fill == pytest.approx(statistics.fmean(counted))
    # a trainer averaging over every sample, the masked one given the fill, sees the same mean
    assert statistics.fmean([*counted, fill]) == pytest.approx(statistics.fmean(counted))


def test_a_group_with_no_rollout_in_the_baseline_gets_the_default() -> None:
    group = TrainingGroup(group_id="g", task_id="t", rollouts=[rollout(0, 5.0, False)])
    assert group.fill_reward() == 0.0
    assert group.fill_reward(default=-1.0) == -1.0


# ---------------------------------------------------------------------------- runners


async def loop_identity() -> int:
    return id(asyncio.get_running_loop())


def test_the_loop_thread_runs_coroutines_on_one_loop_from_any_thread() -> None:
    runner = EventLoopThread()
    try:
        first = runner.run(loop_identity())
        seen: list[int] = []
        other = threading.Thread(target=lambda: seen.append(runner.run(loop_identity())))
        other.start()
        other.join()
        assert seen == [first] == [id(runner.loop)]
    finally:
        runner.close()


def test_run_sync_works_inside_a_running_loop_and_keeps_its_loop() -> None:
    async def caller() -> tuple[int, int, int]:
        # a trainer hook called synchronously from code that runs a loop of its own
        return run_sync(loop_identity()), run_sync(loop_identity()), id(asyncio.get_running_loop())

    first, second, callers = asyncio.run(caller())
    assert first == second != callers


async def test_per_loop_makes_one_value_per_loop_even_when_callers_race() -> None:
    made: list[int] = []
    gate = asyncio.Event()

    async def make() -> object:
        made.append(1)
        await gate.wait()
        return object()

    per_loop: PerLoop[object] = PerLoop(make)
    racing = [asyncio.ensure_future(per_loop.get()) for _ in range(5)]
    await asyncio.sleep(0)
    gate.set()
    values = await asyncio.gather(*racing)
    assert len(made) == 1 and all(v is values[0] for v in values)
    assert await per_loop.get() is values[0]
    other = EventLoopThread()  # another loop gets its own
    try:
        assert other.run(per_loop.get()) is not values[0]
    finally:
        other.close()
    assert len(made) == 2


async def test_per_loop_forgets_a_failed_making() -> None:
    attempts: list[int] = []

    async def make() -> str:
        attempts.append(1)
        if len(attempts) == 1:
            raise ConnectionError("temporal down")
        return "client"

    per_loop: PerLoop[str] = PerLoop(make)
    with pytest.raises(ConnectionError):
        await per_loop.get()
    assert await per_loop.get() == "client"
    assert len(attempts) == 2


# ---------------------------------------------------------------------------- collecting


async def test_collect_groups_submits_relabelled_groups_and_converts_every_one() -> None:
    fake = FakeRolloutSourceForTests()
    rules = ConversionRules(current_version=3, max_staleness=1)
    pending = asyncio.ensure_future(
        collect_groups(
            fake, [task("a"), task("b")], "/unused", 2, batch_id="b1", rules=rules,
            policy_version="run-v3", poll_s=0,
        )
    )  # fmt: skip
    while not fake.batches:
        await asyncio.sleep(0)
    a, b = fake.rollouts_of("a"), fake.rollouts_of("b")
    assert {fake.label_of(rid) for rid in a + b} == {"run-v3"}
    fake.finish(b[0], 1.0)
    fake.finish(b[1], 0.0, versions=["run-v1"])  # two behind: stale, dropped
    fake.finish(a[0], 0.5)
    fake.fail(a[1])
    got = await asyncio.wait_for(pending, 10)
    assert sorted(o.rollout_id for o in got.outcomes) == sorted(a + b)
    assert [g.task_id for g in got.converted.groups] == ["b", "a"]  # in completion order
    assert [r.rollout_id for r in got.converted.rollouts] == [b[0], a[0]]
    assert (got.converted.stale, got.rows) == (1, 3)
    assert sorted(got.converted.staleness) == [0, 0, 2]
    assert sorted(fake.loads) == sorted([[a[0], a[1]], [b[0], b[1]]])  # group by group


# ---------------------------------------------------------------------------- publishing


class GatewayStandIn:
    """STAND-IN for `GatewayPolicyClient` (the real one against a Gateway:
    tests/integration/test_trl_loop.py and the slime/OpenRLHF stack tests)."""

    def __init__(self, serving: str | None) -> None:
        self.serving = serving
        self.updates: list[PolicyUpdate] = []

    async def state(self) -> PolicyState:
        return PolicyState.model_validate(
            {"policy_version": self.serving, "checkpoint": None, "updating": False, "history": []}
        )

    async def update(self, update: PolicyUpdate) -> PolicyUpdateRecord:
        self.updates.append(update)
        self.serving = update.policy_version
        # the Gateway's record, only the fields a bridge reads
        return PolicyUpdateRecord.model_construct(
            policy_version=update.policy_version, checkpoint=update.checkpoint
        )


async def test_publish_hands_the_gateway_an_absolute_checkpoint_unless_it_serves_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    gateway: Any = GatewayStandIn("run-v1")
    assert await served_index(gateway) == 1
    record = await publish(gateway, "run-v2", Path("ckpt"))
    assert record is not None and gateway.updates[0].checkpoint == str(tmp_path / "ckpt")
    assert await publish(gateway, "run-v2", "ckpt", unless_served=True) is None
    assert len(gateway.updates) == 1 and await served_index(gateway) == 2
    assert await served_index(GatewayStandIn(None)) is None  # type: ignore[arg-type]


# ---------------------------------------------------------------------------- pins


def test_trainer_pins_come_from_the_pyproject_extras(tmp_path: Path) -> None:
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text(
        '[project.optional-dependencies]\ndev = ["pytest"]\n'
        'fw = ["fw==1.0", "ray==2.0", "fw-extra>=1"]\n'
        '[tool.rollout.trainer-envs]\ntrainers = ["fw"]\nno-deps = ["fw"]\n'
    )
    assert trainer_extras(pyproject) == {
        "reference": (),
        "fw": (f"{NO_DEPS}fw==1.0", "ray==2.0", "fw-extra>=1"),
    }
    pyproject.write_text(
        pyproject.read_text().replace('trainers = ["fw"]', 'trainers = ["fw", "gone"]')
    )
    with pytest.raises(ValueError, match=r"'gone' has no \[project.optional-dependencies\]"):
        trainer_extras(pyproject)


def test_the_repository_declares_an_extra_per_trainer_environment() -> None:
    extras = trainer_extras()
    assert set(extras) == {"reference", "trl", "skyrl", "openrlhf", "verl"}
    assert json.dumps(extras["verl"]).count(NO_DEPS) == 1  # verl itself, not its listed deps
