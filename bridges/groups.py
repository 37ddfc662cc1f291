"""Groups and throughput: GRPO groups reach the trainer as soon as they finish, a slow
group does not hold back a batch, and no more than one batch of samples is in memory.

`stream_groups` yields each group of a submitted batch once all its rollouts finished;
`collect_groups` submits one batch and returns it whole (a trainer that asks for one
batch per call); `GroupBatcher` keeps up to K groups running and yields batches of the
first B to complete, cancelling groups that lag too far behind the policy. The
scheduling policy and the memory bound: docs/trainers.md, "Groups and throughput".
Only `schemas`, `rollout_client` and `bridges.rollouts` are imported: no trainer.
"""

import asyncio
import contextlib
import itertools
import secrets
import time
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field

from bridges.rollouts import ConversionRules, ConvertedBatch, TrainingGroup, to_training_rollouts
from rollout_client.client import Batch, RolloutOutcome
from rollout_client.policy import GatewayPolicyClient
from schemas.tasks import RolloutTask
from schemas.training import policy_version_index


class RolloutSource(Protocol):
    """What the batcher and `collect_groups` use of `RolloutClient` (a `RolloutClient` is
    one)."""

    async def submit(
        self, tasks: Sequence[RolloutTask], output: str, *, samples_per_task: int,
        batch_id: str | None, seed: int | None, rerun_failed: bool,
    ) -> Batch: ...  # fmt: skip

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
    ) -> Batch: ...

    def results(self, batch: Batch, poll_s: float = 1.0) -> AsyncIterator[RolloutOutcome]: ...

    async def cancel_rollouts(self, rollout_ids: Sequence[str]) -> None: ...

    def load_samples(self, outcomes: Sequence[RolloutOutcome]) -> pa.Table: ...


# ---------------------------------------------------------------------------- tracking


class GroupTracker:
    """Which rollouts each group still waits for; says when a group is complete.

    Pure bookkeeping: outcomes of unknown or forgotten groups (a cancelled group's
    rollouts closing later) are ignored, and each rollout counts once."""

    def __init__(self) -> None:
        self._waiting: dict[str, set[str]] = {}
        self._group_of: dict[str, str] = {}
        self._done: dict[str, list[RolloutOutcome]] = {}

    def add(self, groups: Mapping[str, Sequence[str]]) -> None:
        for group_id, rollout_ids in groups.items():
            if group_id in self._waiting:
                raise ValueError(f"group_id {group_id!r} is already being followed")
            self._waiting[group_id] = set(rollout_ids)
            self._done[group_id] = []
            self._group_of.update((rid, group_id) for rid in rollout_ids)

    def record(self, outcome: RolloutOutcome) -> tuple[str, list[RolloutOutcome]] | None:
        """The group and its outcomes (finishing order) if `outcome` completed it."""
        group_id = self._group_of.pop(outcome.rollout_id, None)
        if group_id is None:
            return None
        self._waiting[group_id].discard(outcome.rollout_id)
        self._done[group_id].append(outcome)
        if self._waiting[group_id]:
            return None
        del self._waiting[group_id]
        return group_id, self._done.pop(group_id)

    def forget(self, group_id: str) -> list[str]:
        """Stop following a group; returns its rollouts that had not finished."""
        left = sorted(self._waiting.pop(group_id, set()))
        self._done.pop(group_id, None)
        for rid in left:
            self._group_of.pop(rid, None)
        return left

    @property
    def open_groups(self) -> list[str]:
        return list(self._waiting)


def _rows(table: pa.Table) -> list[dict[str, Any]]:
    return table.to_pylist()


async def _read(client: RolloutSource, outcomes: Sequence[RolloutOutcome]) -> pa.Table:
    """`client.load_samples` off the event loop. The table comes back through a list,
    not as the thread's result: the executor's future and its asyncio twin form a
    reference cycle that would keep a returned table alive until the next garbage
    collection, past the point where the batch released it."""
    box: list[pa.Table] = []
    await asyncio.to_thread(lambda: box.append(client.load_samples(outcomes)))
    return box.pop()


async def convert_outcomes(
    client: RolloutSource, outcomes: Sequence[RolloutOutcome], rules: ConversionRules
) -> tuple[ConvertedBatch, int]:
    """The finished rollouts' rows, read off the event loop and converted; and how many
    rows they wrote (a rollout that failed before writing has none)."""
    table = await _read(client, outcomes)
    rows = table.num_rows
    converted = to_training_rollouts(_rows(table), rules)
    del table
    return converted, rows


def _task_of(batch: Batch, group_id: str) -> str:
    prefix = f"{batch.batch_id}-"
    return group_id[len(prefix) :] if group_id.startswith(prefix) else group_id


# ---------------------------------------------------------------------------- one batch


@dataclass
class CompletedGroup:
    """One GRPO group whose rollouts have all finished."""

    group_id: str
    task_id: str
    outcomes: list[RolloutOutcome]
    converted: ConvertedBatch
    rows: int = 0
    """Sample rows its rollouts wrote (one per segment)."""

    @property
    def group(self) -> TrainingGroup | None:
        """The converted group; None when no rollout of it left a trainable row (every
        rollout failed before writing samples, or all were dropped as stale)."""
        return self.converted.groups[0] if self.converted.groups else None

    @property
    def failed(self) -> int:
        """Rollouts that ended without a result (workflow failed, cancelled, timed out)."""
        return sum(1 for o in self.outcomes if not o.ok)


async def stream_groups(
    client: RolloutSource,
    batch: Batch,
    rules: ConversionRules | None = None,
    poll_s: float = 1.0,
) -> AsyncIterator[CompletedGroup]:
    """Yield each group of `batch` as soon as all of its rollouts finished; its rows are
    read then, converted, and not kept here."""
    rules = rules or ConversionRules()
    tracker = GroupTracker()
    tracker.add(batch.groups)
    async for outcome in client.results(batch, poll_s=poll_s):
        done = tracker.record(outcome)
        if done is None:
            continue
        group_id, outcomes = done
        converted, rows = await convert_outcomes(client, outcomes, rules)
        yield CompletedGroup(group_id, _task_of(batch, group_id), outcomes, converted, rows)


# ---------------------------------------------------------------------------- whole batches


@dataclass
class Collected:
    """Every group of one submitted batch, finished and converted."""

    batch: Batch
    outcomes: list[RolloutOutcome]
    converted: ConvertedBatch
    rows: int


def merge(parts: Iterable[ConvertedBatch]) -> ConvertedBatch:
    """Converted batches of distinct groups as one (groups in the order given)."""
    out = ConvertedBatch()
    for part in parts:
        out.groups.extend(part.groups)
        out.infra_error += part.infra_error
        out.stale += part.stale
        out.stale_calls += part.stale_calls
        out.staleness.extend(part.staleness)
    return out


async def collect(
    client: RolloutSource, batch: Batch, rules: ConversionRules | None = None, poll_s: float = 1.0
) -> Collected:
    """Wait for every group of `batch` (`stream_groups`: each read off the event loop and
    converted as it completes) and return them as one converted batch."""
    outcomes: list[RolloutOutcome] = []
    parts: list[ConvertedBatch] = []
    rows = 0
    async for done in stream_groups(client, batch, rules, poll_s):
        outcomes.extend(done.outcomes)
        parts.append(done.converted)
        rows += done.rows
    return Collected(batch, outcomes, merge(parts), rows)


async def collect_groups(
    client: RolloutSource,
    tasks: Sequence[RolloutTask],
    output: str,
    group_size: int,
    *,
    batch_id: str | None = None,
    rules: ConversionRules | None = None,
    policy_version: str | None = None,
    seed: int | None = None,
    rerun_failed: bool = False,
    poll_s: float = 1.0,
) -> Collected:
    """Submit one group of `group_size` rollouts per task (relabelled with
    `policy_version` when given) and :func:`collect` them: what a bridge whose trainer
    asks for one batch at a time does per call. Checks are the bridge's: a group of one
    is allowed (evaluation)."""
    if policy_version is not None:
        tasks = [t.model_copy(update={"policy_version": policy_version}) for t in tasks]
    batch = await client.submit(
        tasks,
        output,
        samples_per_task=group_size,
        batch_id=batch_id,
        seed=seed,
        rerun_failed=rerun_failed,
    )
    return await collect(client, batch, rules, poll_s)


# ---------------------------------------------------------------------------- batches


class GroupInfo(BaseModel):
    """How one group fared in the schedule."""

    model_config = ConfigDict(extra="forbid")

    group_id: str
    task_id: str
    policy_version: str = Field(description="the label it was submitted with")
    lag: int | None = Field(
        description="trainer's policy index − the label's index when the group was batched "
        "(or dropped); None when a version has no trailing vN"
    )
    carried: int = Field(description="batches yielded while it was still running")
    failed: int = Field(default=0, description="its rollouts that ended without a result")
    rollouts: int = Field(description="rollouts submitted for it")


@dataclass
class GroupBatch:
    """One training batch: B complete groups (fewer at the very end)."""

    converted: ConvertedBatch
    groups: list[GroupInfo]
    dropped: list[GroupInfo]
    outcomes: list[RolloutOutcome]
    policy_version: str
    """The trainer's policy when the batch was converted (staleness is against it)."""


@dataclass
class _Flight:
    info: GroupInfo
    label_index: int | None
    batch_no: int


@dataclass
class _Ready:
    flight: _Flight
    outcomes: list[RolloutOutcome]
    table: pa.Table | None
    carried: int


@dataclass
class BatcherStats:
    """What the batcher did so far (for logs and tests)."""

    submitted_groups: int = 0
    batches: int = 0
    dropped_groups: int = 0
    loaded_groups: int = 0
    peak_held_groups: int = 0
    peak_held_rows: int = 0
    waves: list[str] = field(default_factory=list)


_DONE = object()


class GroupBatcher:
    """Submit groups, keep up to `max_in_flight` running, yield batches of
    `groups_per_batch` complete groups (the policy: docs/trainers.md)."""

    def __init__(
        self,
        client: RolloutSource,
        output: str,
        *,
        group_size: int,
        groups_per_batch: int,
        max_in_flight: int,
        policy_version: str,
        rules: ConversionRules | None = None,
        max_group_lag: int = 1,
        gateway: GatewayPolicyClient | None = None,
        allow_unevaluated: bool = False,
        batch_prefix: str | None = None,
        poll_s: float = 1.0,
        cancel_on_close: bool = True,
    ) -> None:
        if groups_per_batch < 1:
            raise ValueError(f"groups_per_batch: must be >= 1, got {groups_per_batch}")
        if max_in_flight < groups_per_batch:
            raise ValueError(
                f"max_in_flight: must be >= groups_per_batch ({groups_per_batch}), got "
                f"{max_in_flight}: fewer groups running than a batch needs never fill it"
            )
        if max_group_lag < 0:
            raise ValueError(f"max_group_lag: must be >= 0, got {max_group_lag}")
        self.client = client
        self.output = output
        self.group_size = group_size
        self.groups_per_batch = groups_per_batch
        self.max_in_flight = max_in_flight
        self.max_group_lag = max_group_lag
        self.gateway = gateway
        self.allow_unevaluated = allow_unevaluated
        self.poll_s = poll_s
        self.cancel_on_close = cancel_on_close
        self.prefix = batch_prefix or f"g{time.strftime('%H%M%S')}{secrets.token_hex(3)}"
        self._base_rules = rules or ConversionRules()
        self.policy_version = policy_version
        self.rules = self._base_rules
        self.set_policy(policy_version)
        self.stats = BatcherStats()
        self._tracker = GroupTracker()
        self._flights: dict[str, _Flight] = {}
        self._ready: list[_Ready] = []
        self._dropped: list[GroupInfo] = []
        self._to_cancel: list[str] = []
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self._pumps: set[asyncio.Task[None]] = set()
        self._wave = itertools.count()

    # -------------------------------------------------------------- the trainer's calls
    def set_policy(self, policy_version: str) -> None:
        """The policy now serving: later groups are labelled with it, and lags and the
        conversion's staleness are measured against its index."""
        self.policy_version = policy_version
        index = policy_version_index(policy_version)
        self.rules = self._base_rules.model_copy(update={"current_version": index})

    @property
    def in_flight(self) -> int:
        return len(self._flights)

    async def batches(self, tasks: Iterable[RolloutTask]) -> AsyncIterator[GroupBatch]:
        """Yield batches until `tasks` runs out and every group in flight has finished.
        `tasks` may be endless (`itertools.cycle`); one group per task drawn."""
        source = iter(tasks)
        try:
            await self._top_up(source)
            while self._flights or self._ready:
                if len(self._ready) >= self.groups_per_batch or (self._ready and not self._flights):
                    yield self._take_batch()
                    self._drop_stale()
                    await self._cancel_dropped()
                    await self._top_up(source)
                    continue
                await self._receive()
        finally:
            await self._close()

    # -------------------------------------------------------------- internals
    async def _top_up(self, source: Iterator[RolloutTask]) -> None:
        want = self.max_in_flight - len(self._flights)
        drawn = list(itertools.islice(source, max(0, want)))
        wave: list[RolloutTask] = []
        for task in drawn:
            if any(t.task_id == task.task_id for t in wave):
                await self._submit(wave)
                wave = []
            wave.append(task)
        if wave:
            await self._submit(wave)

    async def _submit(self, tasks: list[RolloutTask]) -> None:
        batch_id = f"{self.prefix}-w{next(self._wave)}"
        batch = await self.client.submit_groups(
            tasks,
            self.output,
            self.group_size,
            policy_version=self.policy_version,
            gateway=self.gateway,
            allow_unevaluated=self.allow_unevaluated,
            batch_id=batch_id,
        )
        self.stats.waves.append(batch_id)
        label_index = policy_version_index(self.policy_version)
        self._tracker.add(batch.groups)
        for group_id, rollout_ids in batch.groups.items():
            self._flights[group_id] = _Flight(
                GroupInfo(
                    group_id=group_id,
                    task_id=_task_of(batch, group_id),
                    policy_version=self.policy_version,
                    lag=None,
                    carried=0,
                    rollouts=len(rollout_ids),
                ),
                label_index,
                self.stats.batches,
            )
        self.stats.submitted_groups += len(batch.groups)
        pump = asyncio.ensure_future(self._pump(batch))
        self._pumps.add(pump)
        pump.add_done_callback(self._pumps.discard)

    async def _pump(self, batch: Batch) -> None:
        try:
            async for outcome in self.client.results(batch, poll_s=self.poll_s):
                self._queue.put_nowait(outcome)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # surfaced in the batcher's own task
            self._queue.put_nowait(exc)

    async def _receive(self) -> None:
        item = await self._queue.get()
        if isinstance(item, BaseException):
            raise item
        done = self._tracker.record(item)
        if done is None:
            return
        group_id, outcomes = done
        flight = self._flights.pop(group_id)
        table = await _read(self.client, outcomes)
        self.stats.loaded_groups += 1
        self._ready.append(
            _Ready(flight, outcomes, table, carried=self.stats.batches - flight.batch_no)
        )
        held = [r.table.num_rows for r in self._ready if r.table is not None]
        self.stats.peak_held_groups = max(self.stats.peak_held_groups, len(held))
        self.stats.peak_held_rows = max(self.stats.peak_held_rows, sum(held))

    def _lag(self, flight: _Flight) -> int | None:
        current = self.rules.current_version
        if current is None or flight.label_index is None:
            return None
        return current - flight.label_index

    def _take_batch(self) -> GroupBatch:
        ready, self._ready = (
            self._ready[: self.groups_per_batch],
            self._ready[self.groups_per_batch :],
        )
        rows: list[dict[str, Any]] = []
        for item in ready:
            if item.table is not None:
                rows.extend(_rows(item.table))
            item.table = None  # released: the rows live on only in the converted batch
        converted = to_training_rollouts(rows, self.rules)
        del rows
        infos = [
            item.flight.info.model_copy(
                update={
                    "lag": self._lag(item.flight),
                    "carried": item.carried,
                    "failed": sum(1 for o in item.outcomes if not o.ok),
                }
            )
            for item in ready
        ]
        dropped, self._dropped = self._dropped, []
        self.stats.batches += 1
        return GroupBatch(
            converted=converted,
            groups=infos,
            dropped=dropped,
            outcomes=[o for item in ready for o in item.outcomes],
            policy_version=self.policy_version,
        )

    def _drop_stale(self) -> None:
        """Forget in-flight groups whose label lags more than `max_group_lag`."""
        for group_id, flight in list(self._flights.items()):
            lag = self._lag(flight)
            if lag is None or lag <= self.max_group_lag:
                continue
            del self._flights[group_id]
            left = self._tracker.forget(group_id)
            self._dropped.append(
                flight.info.model_copy(
                    update={"lag": lag, "carried": self.stats.batches - flight.batch_no}
                )
            )
            self._to_cancel.extend(left)
            self.stats.dropped_groups += 1

    async def _cancel_dropped(self) -> None:
        if not self._to_cancel:
            return
        ids, self._to_cancel = self._to_cancel, []
        await self.client.cancel_rollouts(ids)

    async def _close(self) -> None:
        for pump in list(self._pumps):
            pump.cancel()
        for pump in list(self._pumps):
            with contextlib.suppress(asyncio.CancelledError):
                await pump
        left = [rid for group_id in self._flights for rid in self._tracker.forget(group_id)]
        self._flights.clear()
        if self.cancel_on_close and left:
            await self.client.cancel_rollouts(left)
        for item in self._ready:
            item.table = None
        self._ready.clear()
