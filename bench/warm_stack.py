"""Held-out reward of the warm tiny model through the real stack.

The same held-out tasks as ``bench/warm_heldout.py``, but each one a ``RolloutTask`` run by
the demo's stack: Temporal dev server, a worker, local bubblewrap sandboxes with the task
agent inside, the Gateway (its template, parser and incremental tokenization) and vLLM
CPU serving the warm model in float32; rewards come from the ``evaluate`` hook.

Run: ``python -m bench.warm_stack [--tasks 32] [--samples 2]``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
from collections import Counter, defaultdict
from pathlib import Path

from rich.console import Console

import workers.demo as demo
from devstack.tiny_model.tasks import HELDOUT_SEED, write_task_files
from devstack.tiny_model.warm import ensure_warm_model
from environments.vllm_cpu import ensure_vllm_venv, venv_python
from rollout_client.storage import read_table
from schemas.tasks import load_tasks


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=32, help="first N held-out tasks")
    ap.add_argument("--samples", type=int, default=2)
    ap.add_argument("--model", type=Path, default=None, help="default: the cached warm model")
    args = ap.parse_args()
    model_dir = args.model or ensure_warm_model(venv_python(ensure_vllm_venv()))
    data = Path(tempfile.mkdtemp(prefix="rollout-warm-stack-"))
    _, heldout = write_task_files(data / "tasks", seed=HELDOUT_SEED, n_heldout=args.tasks)

    console = Console()
    code = asyncio.run(
        demo.run_demo(
            data,
            "vllm",
            args.samples,
            keep=False,
            console=console,
            tasks_file=heldout,
            model_dir=model_dir,
        )
    )
    kinds = {t.task_id: t.metadata["kind"] for t in load_tasks(heldout)}
    rows = read_table(str(data / "samples")).to_pylist()
    by_rollout = {r["rollout_id"]: r for r in rows}  # a rollout's segments share its reward
    by_kind: dict[str, list[float]] = defaultdict(list)
    for r in by_rollout.values():
        by_kind[kinds[r["task_id"]]].append(r["reward"])
    print("statuses:", dict(Counter(r["status"] for r in rows)), "data:", data)
    rewards = [x for v in by_kind.values() for x in v]
    print(f"exit {code}; rollouts {len(rewards)}; heldout reward {statistics.fmean(rewards):.3f}")
    print({k: round(statistics.fmean(v), 3) for k, v in sorted(by_kind.items())})


if __name__ == "__main__":
    main()
