"""The group scheduling of `bridges.groups`, driven rollout by rollout.

The rollouts are `FakeRolloutSourceForTests` (tests/fixtures/fake_rollouts.py): a fake
standing in for Temporal and the workers so a test decides which rollout finishes when;
submission checks, planning, rows and the conversion are the real ones. "Not waited
for" is shown without clocks: the slow group's last rollout is only finished *after*
the batch it would have held back has been yielded, so a batcher that waited would hang
(the `wait_for` around it is a hang guard, not a threshold).
"""

import asyncio
import weakref
from collections.abc import AsyncIterator
from typing import Any

import pytest

from bridges.groups import GroupBatch, GroupBatcher, GroupTracker, stream_groups
from bridges.rollouts import ConversionRules
from rollout_client.client import RolloutOutcome
from rollout_client.training import TrainingInputError
from schemas.tasks import RolloutTask
from tests.fixtures.fake_rollouts import FakeRolloutSourceForTests

EVAL = {"checks": [{"kind": "file", "path": "answer.txt", "contains": ["42"]}]}
HANG = 10.0  # seconds: only a guard against a scheduler that waits forever


def tasks(*ids: str, **fields: Any) -> list[RolloutTask]:
    return [
        RolloutTask.model_validate(
            {"task_id": t, "prompt": t, "harness": {"name": "command"}, "evaluation": EVAL} | fields
        )
        for t in ids
    ]


def batcher(fake: FakeRolloutSourceForTests, **kw: Any) -> GroupBatcher:
    kw.setdefault("group_size", 2)
    kw.setdefault("groups_per_batch", 2)
    kw.setdefault("max_in_flight", 3)
    kw.setdefault("policy_version", "run-v0")
    return GroupBatcher(fake, "/unused", batch_prefix="t", poll_s=0, **kw)


async def next_batch(it: AsyncIterator[GroupBatch]) -> GroupBatch:
    return await asyncio.wait_for(anext(it), HANG)


def finish_group(
    fake: FakeRolloutSourceForTests, task_id: str, rewards: tuple = (1.0, 0.0)
) -> None:
    for rid, reward in zip(fake.rollouts_of(task_id), rewards, strict=True):
        fake.finish(rid, reward)


async def started(it: AsyncIterator[GroupBatch]) -> "asyncio.Task[GroupBatch]":
    """Ask for the next batch and let the batcher submit (its first step)."""
    pending = asyncio.ensure_future(anext(it))
    for _ in range(5):
        await asyncio.sleep(0)
    return pending


def task_ids(batch: GroupBatch) -> list[str]:
    return [g.task_id for g in batch.groups]


# ---------------------------------------------------------------------------- tracker


def test_tracker_completes_a_group_only_when_all_its_rollouts_are_in() -> None:
    tracker = GroupTracker()
    tracker.add({"g1": ["a", "b"], "g2": ["c"]})

    def out(rid: str) -> RolloutOutcome:
        return RolloutOutcome(rollout_id=rid, workflow_status="FAILED", error="x")

    assert tracker.record(out("a")) is None
    assert tracker.record(out("a")) is None  # a repeat counts once
    assert tracker.record(out("zz")) is None  # not ours
    done = tracker.record(out("c"))
    assert done is not None and done[0] == "g2"
    done = tracker.record(out("b"))
    assert done is not None and [o.rollout_id for o in done[1]] == ["a", "b"]
    assert tracker.open_groups == []


def test_tracker_forgets_a_dropped_group() -> None:
    tracker = GroupTracker()
    tracker.add({"g1": ["a", "b", "c"]})
    tracker.record(RolloutOutcome(rollout_id="a", workflow_status="FAILED"))
    assert tracker.forget("g1") == ["b", "c"]
    assert tracker.record(RolloutOutcome(rollout_id="b", workflow_status="CANCELED")) is None
    tracker.add({"g2": ["x"]})
    with pytest.raises(ValueError, match="already being followed"):
        tracker.add({"g2": ["y"]})


# ---------------------------------------------------------------------------- stream


async def test_stream_yields_each_group_when_its_last_rollout_finishes() -> None:
    fake = FakeRolloutSourceForTests()
    batch = await fake.submit_groups(tasks("a", "b"), "/unused", 3)
    stream = stream_groups(fake, batch, ConversionRules())
    pending = asyncio.ensure_future(anext(stream))
    a, b = fake.rollouts_of("a"), fake.rollouts_of("b")
    fake.finish(a[0], 1.0)
    fake.finish(b[0], 0.0)
    fake.finish(b[1], 1.0)
    fake.finish(a[1], 0.0)  # a still waits for its third
    fake.fail(b[2])  # b's third ends without a result: b is complete
    first = await asyncio.wait_for(pending, HANG)
    assert (first.task_id, first.failed) == ("b", 1)
    assert fake.loads == [[b[0], b[1], b[2]]]  # only the complete group's rows were read
    assert first.group is not None and len(first.group.rollouts) == 2
    fake.finish(a[2], 1.0)
    second = await asyncio.wait_for(anext(stream), HANG)
    assert second.task_id == "a" and second.failed == 0
    assert second.group is not None
    assert sorted(r.rollout_id for r in second.group.rollouts) == sorted(a)
    assert sorted(r.reward for r in second.group.rollouts) == [0.0, 1.0, 1.0]
    with pytest.raises(StopAsyncIteration):
        await asyncio.wait_for(anext(stream), HANG)


# ---------------------------------------------------------------------------- batches


async def test_a_slow_group_is_carried_into_the_next_batch_not_waited_for() -> None:
    fake = FakeRolloutSourceForTests()
    b = batcher(fake)
    it = b.batches(tasks("a", "slow", "c", "d", "e"))
    pending = await started(it)
    assert b.in_flight == 3  # a, slow, c: K groups running
    finish_group(fake, "a")
    slow = fake.rollouts_of("slow")
    fake.finish(slow[0], 1.0)  # its second rollout keeps running
    finish_group(fake, "c")
    first = await asyncio.wait_for(pending, HANG)
    assert task_ids(first) == ["a", "c"]
    assert slow[1] not in fake.closed  # the batch did not wait for it
    assert all(g.carried == 0 and g.lag == 0 for g in first.groups)
    assert {r.group_id for r in first.converted.rollouts} == {g.group_id for g in first.groups}

    b.set_policy("run-v1")  # the trainer trained on `first` and published v1
    pending = await started(it)
    assert b.in_flight == 3  # topped up: slow + d + e
    assert {fake.label_of(r) for t in "de" for r in fake.rollouts_of(t)} == {"run-v1"}
    fake.finish(slow[1], 0.0, versions=["run-v0", "run-v1"])  # spans the update
    finish_group(fake, "d")
    second = await asyncio.wait_for(pending, HANG)
    assert task_ids(second) == ["slow", "d"]
    carried = second.groups[0]
    assert (carried.carried, carried.lag, carried.policy_version) == (1, 1, "run-v0")
    assert (second.groups[1].carried, second.groups[1].lag) == (0, 0)

    finish_group(fake, "e")  # the tasks ran out: a last, short batch
    third = await next_batch(it)
    assert task_ids(third) == ["e"]
    with pytest.raises(StopAsyncIteration):
        await next_batch(it)


async def test_a_group_lagging_past_the_bound_is_cancelled_and_reported() -> None:
    fake = FakeRolloutSourceForTests()
    b = batcher(fake, max_group_lag=1)
    it = b.batches(tasks("a", "stuck", "c", "d", "e", "f", "g"))
    pending = await started(it)
    finish_group(fake, "a")
    finish_group(fake, "c")
    stuck = fake.rollouts_of("stuck")
    fake.finish(stuck[0], 1.0)
    first = await asyncio.wait_for(pending, HANG)
    assert task_ids(first) == ["a", "c"] and first.dropped == []

    b.set_policy("run-v1")  # lag 1: still allowed, carried
    pending = await started(it)
    finish_group(fake, "d")
    finish_group(fake, "e")
    second = await asyncio.wait_for(pending, HANG)
    assert task_ids(second) == ["d", "e"] and second.dropped == [] and fake.cancelled == []

    b.set_policy("run-v2")  # lag 2 > 1: cancelled, only its unfinished rollout
    pending = await started(it)
    assert fake.cancelled == [stuck[1]]
    finish_group(fake, "f")
    finish_group(fake, "g")
    third = await asyncio.wait_for(pending, HANG)
    assert task_ids(third) == ["f", "g"]
    assert [(g.task_id, g.lag, g.carried) for g in third.dropped] == [("stuck", 2, 2)]
    with pytest.raises(StopAsyncIteration):
        await next_batch(it)


async def test_staleness_is_measured_per_call_against_the_trainer_version() -> None:
    fake = FakeRolloutSourceForTests()
    b = batcher(fake, groups_per_batch=1, max_in_flight=2, max_group_lag=3)
    it = b.batches(tasks("a", "b", "c"))
    pending = await started(it)
    finish_group(fake, "a")
    await asyncio.wait_for(pending, HANG)
    b.set_policy("run-v2")
    pending = await started(it)
    b_ids = fake.rollouts_of("b")
    fake.finish(b_ids[0], 1.0, versions=["run-v0", "run-v2"])  # one call stale, one fresh
    fake.finish(b_ids[1], 0.0, versions=["run-v0", "run-v0"])
    batch = await asyncio.wait_for(pending, HANG)
    assert batch.groups[0].lag == 2 and batch.policy_version == "run-v2"
    assert batch.converted.stale_calls >= 1  # the conversion saw the v0 calls as stale
    finish_group(fake, "c")
    await next_batch(it)


async def test_never_more_than_one_batch_of_rows_in_memory() -> None:
    """Every round finishes all running groups at once: the batcher reads B of them,
    yields, and reads the others only when asked for the next batch. At each read, at
    most B-1 other tables are alive and no batch the trainer dropped survives (plain
    reference counting: no garbage collection needed to free them)."""
    fake = FakeRolloutSourceForTests()
    b = batcher(fake, groups_per_batch=2, max_in_flight=4)
    yielded: list[weakref.ref[Any]] = []
    peak = {"tables": 0, "old_batches": 0}

    def at_each_read() -> None:
        peak["tables"] = max(peak["tables"], fake.live_tables())
        peak["old_batches"] = max(peak["old_batches"], sum(1 for r in yielded if r() is not None))

    fake.on_load.append(at_each_read)
    names = [f"t{i}" for i in range(12)]
    it = b.batches(tasks(*names))
    pending = await started(it)
    got: list[str] = []
    for _ in range(6):
        for task_id in running_groups(fake):
            finish_group(fake, task_id)
        batch = await asyncio.wait_for(pending, HANG)
        del pending  # the finished future would keep the batch alive
        got += task_ids(batch)
        assert len(batch.converted.rollouts) == 2 * 2
        yielded.append(weakref.ref(batch.converted))
        del batch  # the trainer is done with it
        pending = await started(it)
    with pytest.raises(StopAsyncIteration):
        await asyncio.wait_for(pending, HANG)
    assert got == names  # completion order, every group once
    assert len(fake.loads) == 12 and fake.live_tables() == 0
    assert peak["tables"] <= 1  # B - 1 held while the B-th is read
    assert peak["old_batches"] == 0
    assert (b.stats.peak_held_groups, b.stats.peak_held_rows) == (2, 2 * 2)


def running_groups(fake: FakeRolloutSourceForTests) -> list[str]:
    """Task ids of the submitted groups with a rollout still running, oldest first."""
    return [
        group[len(batch.batch_id) + 1 :]
        for batch in fake.batches
        for group, rids in batch.groups.items()
        if any(rid not in fake.closed for rid in rids)
    ]


async def test_rows_are_read_when_a_group_completes_not_before() -> None:
    fake = FakeRolloutSourceForTests()
    b = batcher(fake)
    it = b.batches(tasks("a", "b", "c"))
    pending = await started(it)
    a = fake.rollouts_of("a")
    fake.finish(a[0])
    for _ in range(20):
        await asyncio.sleep(0)
    assert fake.loads == []  # half a group: nothing read
    fake.finish(a[1])
    finish_group(fake, "b")
    await asyncio.wait_for(pending, HANG)
    assert [sorted(ids) for ids in fake.loads] == [sorted(a), sorted(fake.rollouts_of("b"))]
    assert all(len(ids) == 2 for ids in fake.loads)
    await it.aclose()
    # closing cancels what is still running (group c)
    assert sorted(fake.cancelled) == sorted(fake.rollouts_of("c"))


async def test_bad_input_is_refused_naming_the_field() -> None:
    fake = FakeRolloutSourceForTests()
    with pytest.raises(ValueError, match=r"^max_in_flight"):
        batcher(fake, groups_per_batch=4, max_in_flight=2)
    with pytest.raises(TrainingInputError, match=r"^group_size"):
        await next_batch(batcher(fake, group_size=1).batches(tasks("a")))
    bare = [RolloutTask.model_validate({"task_id": "x", "prompt": "p", "harness": {"name": "c"}})]
    with pytest.raises(TrainingInputError, match=r"^tasks\[0\]\.evaluation"):
        await next_batch(batcher(fake).batches(bare))
    assert fake.batches == []  # nothing was submitted


async def test_a_task_drawn_twice_goes_to_two_waves() -> None:
    fake = FakeRolloutSourceForTests()
    b = batcher(fake, groups_per_batch=2, max_in_flight=2)
    it = b.batches(tasks("a", "a"))
    pending = await started(it)
    assert len(fake.batches) == 2 and b.in_flight == 2
    for batch in fake.batches:
        for rid, reward in zip(next(iter(batch.groups.values())), (1.0, 0.0), strict=True):
            fake.finish(rid, reward)
    batch = await asyncio.wait_for(pending, HANG)
    assert task_ids(batch) == ["a", "a"] and len({g.group_id for g in batch.groups}) == 2
    assert len(batch.converted.rollouts) == 2 * 2
