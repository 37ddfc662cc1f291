"""An example trainer loop: submit GRPO groups, stream results, compute advantages.

    python examples/trainer_loop.py examples/tasks.jsonl --temporal 127.0.0.1:7233 \
        --group-size 4 --steps 2 --out ./data/train

Each step submits every task `group-size` times (one group per task), consumes the
results as they finish, loads the samples of the finished rollouts as one Arrow table
and computes group-relative advantages: (reward − group mean) / (group std + eps),
with statistics over *rollouts* (a rollout may have several segments/rows).
Rows marked `infra_error` are masked (loss mask 0) and their rollouts left out of the
statistics. A real trainer would now feed prompt_ids / response_ids / loss_mask /
logprobs / advantage to its optimizer and bump `policy_version`.
"""

import argparse
import asyncio
import statistics
from collections import defaultdict

import pyarrow as pa

from rollout_client import RolloutClient
from schemas.tasks import load_tasks


def grpo_advantages(table: pa.Table, eps: float = 1e-6) -> pa.Table:
    """The samples table plus an `advantage` column (GRPO, per group_id)."""
    rows = table.select(["group_id", "rollout_id", "reward", "status"]).to_pylist()
    per_group: dict[str, dict[str, float]] = defaultdict(dict)
    for r in rows:
        if r["status"] != "infra_error":
            per_group[r["group_id"]][r["rollout_id"]] = r["reward"]
    stats: dict[str, tuple[float, float]] = {}
    for group, rewards in per_group.items():
        values = list(rewards.values())
        mean = statistics.fmean(values)
        std = statistics.pstdev(values) if len(values) > 1 else 0.0
        stats[group] = (mean, std)
    advantages = []
    for r in rows:
        if r["status"] == "infra_error" or r["group_id"] not in stats:
            advantages.append(0.0)
            continue
        mean, std = stats[r["group_id"]]
        advantages.append((r["reward"] - mean) / (std + eps))
    return table.append_column("advantage", pa.array(advantages, type=pa.float64()))


async def train(args: argparse.Namespace) -> None:
    client = await RolloutClient.connect(args.temporal, task_queue=args.task_queue)
    tasks = load_tasks(args.tasks)
    for step in range(args.steps):
        batch = await client.submit(tasks, args.out, samples_per_task=args.group_size)
        print(f"step {step}: batch {batch.batch_id}, {len(batch.rollout_ids)} rollouts")
        outcomes = []
        async for outcome in client.results(batch):
            outcomes.append(outcome)
            status = outcome.result.status if outcome.result else outcome.workflow_status
            print(f"  {outcome.rollout_id}: {status}")
        table = grpo_advantages(client.load_samples(outcomes))
        trained = sum(sum(m) for m in table.column("loss_mask").to_pylist())
        print(f"  samples: {table.num_rows} rows, {trained} trainable tokens")
        for group, rids in batch.groups.items():
            sub = [r for r in table.to_pylist() if r["group_id"] == group]
            if sub:
                mean = statistics.fmean(r["reward"] for r in sub)
                advs = ", ".join(f"{r['advantage']:+.2f}" for r in sub)
                print(f"  {group}: {len(rids)} rollouts, mean reward {mean:.2f}, adv [{advs}]")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tasks")
    parser.add_argument("--temporal", default="127.0.0.1:7233")
    parser.add_argument("--task-queue", default="rollouts")
    parser.add_argument("--out", default="./data/train")
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--steps", type=int, default=1)
    asyncio.run(train(parser.parse_args()))


if __name__ == "__main__":
    main()
