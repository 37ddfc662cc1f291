"""Held-out passes and reward means, shared by every trainer runner (the reference
loop and the TRL runner), so "held-out reward" means the same draws and the same mean
whichever trainer did the update.

Every pass of a run draws the same seeds (common random numbers): two policies'
held-out rewards then differ by the policies, not by the draws.
"""

import statistics
from collections.abc import Sequence
from pathlib import Path

from rollout_client import Batch, RolloutClient, RolloutOutcome
from schemas.tasks import RolloutTask

#: Offset of the held-out seeds from a run's seed base (`seed * 100_003`).
HELDOUT_SEED_OFFSET = 50_000


def run_seed(seed: int) -> int:
    """The seed base of a run: step k's rollouts draw `run_seed + k`."""
    return seed * 100_003


def versioned(tasks: Sequence[RolloutTask], version: str) -> list[RolloutTask]:
    return [t.model_copy(update={"policy_version": version}) for t in tasks]


async def submit_heldout(
    client: RolloutClient,
    tasks: Sequence[RolloutTask],
    label: str,
    samples_dir: Path,
    step: int,
    samples_per_task: int,
    seed: int,
) -> Batch:
    """Start the held-out rollouts of the policy `label` serving step `step` (its
    samples in `samples_dir/heldout-000N`); the label is in the batch id, so a rerun
    serving the same version reuses those already run."""
    return await client.submit(
        versioned(tasks, label),
        str(samples_dir / f"heldout-{step:04d}"),
        samples_per_task=samples_per_task,
        batch_id=f"{label}-h{step}",
        seed=run_seed(seed) + HELDOUT_SEED_OFFSET,
        rerun_failed=True,
    )


async def collect(client: RolloutClient, batch: Batch) -> list[RolloutOutcome]:
    """Every outcome of `batch`, as they finish."""
    return [o async for o in client.results(batch, poll_s=0.5)]


def rewards(outcomes: Sequence[RolloutOutcome]) -> list[float]:
    return [o.result.reward for o in outcomes if o.result and o.result.reward is not None]


def mean_reward(outcomes: Sequence[RolloutOutcome]) -> float | None:
    """Mean reward of the scored outcomes; None when none was scored."""
    values = rewards(outcomes)
    return statistics.fmean(values) if values else None
