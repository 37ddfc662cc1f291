"""`rollout demo` — the embedded default.

The demo starts everything on loopback (Temporal dev server with UI, a Gateway, an
engine, local sandboxes, a worker), runs the example tasks with a real agent (a small
Python program inside each sandbox that talks to the Gateway over the OpenAI API),
writes samples and prints where to look. `--temporal` (with the rest of the Temporal
option group) runs it on an existing Temporal instead of its own dev server. With a TTY
it keeps the stack up until Ctrl-C; without one it exits 0 after the summary. Either way
it stops all it started. The stand-ins it runs (Temporal dev server, tiny model, vLLM
CPU or scripted engine) come from `devstack`.
"""

import asyncio
import logging
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from workers.demo_setup import (
    DemoSetupError,
    ensure_engine_python,
    ensure_policy_model,
    ensure_trainer_python,
)
from workers.demo_train import TrainDemoOptions, run_train_demo
from workers.model_options import model_options
from workers.task_source_cmd import TaskSourceArgs, prebuild_images, task_source_options
from workers.temporal_options import DemoTemporalOptions, TemporalOptions, UnusableTemporal

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

    from schemas.tasks import RolloutTask

DEMO_SCRIPT_RULES = [
    ("6 times 7", "42"),
    ("capital of France", "Paris"),
    ("prints hello", "print('hello')"),
]


def repo_root() -> Path:
    return Path(__file__).resolve().parent.parent


def _sample_rows_table(uris: list[str], limit: int = 5) -> "Table":
    from rich.table import Table

    from rollout_client.storage import read_many

    table = Table(title="a few sample rows")
    for col in ("rollout_id", "scene", "status", "reward", "prompt", "response", "trained"):
        table.add_column(col)
    data = read_many(uris).slice(0, limit).to_pylist()
    for row in data:
        table.add_row(
            row["rollout_id"],
            row["scene"],
            row["status"],
            f"{row['reward']:.1f}",
            f"{len(row['prompt_ids'])} tok",
            f"{len(row['response_ids'])} tok",
            f"{sum(row['loss_mask'])} tok",
        )
    return table


async def run_demo(
    data_dir: Path,
    engine: str,
    samples_per_task: int,
    keep: bool | None,
    console: "Console",
    tasks_file: Path | None = None,
    model_dir: Path | None = None,
    tasks: "list[RolloutTask] | None" = None,
    temporal: "TemporalOptions | None" = None,
    metrics_port: int | None = None,
) -> int:
    """Run `tasks` (read already), else `tasks_file` (default: the example tasks) on a
    fresh embedded stack (on the Temporal `temporal` names, if it names one); the exit code.

    `model_dir` (engine vllm): the model to serve instead of the tiny random one."""
    from rollout_client.client import RolloutClient
    from schemas.tasks import load_tasks
    from workers.local_stack import LocalStack
    from workers.run_cmd import print_show_line, print_summary, run_batch

    data_dir = data_dir.resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    main = asyncio.current_task()
    if main is not None:  # SIGTERM (CI timeouts, `kill`) must still stop everything
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, main.cancel)
    if tasks is None:
        tasks = load_tasks(tasks_file or repo_root() / "examples" / "tasks.jsonl")
    tasks = prebuild_images(tasks, console)
    stack = LocalStack(data_dir, console, temporal, metrics_port)
    try:
        temporal = await stack.start_temporal()
        engine_url, model, tokenizer = await asyncio.to_thread(
            stack.start_engine, engine, model_dir, DEMO_SCRIPT_RULES
        )
        gateway = stack.start_gateway(engine_url, model, tokenizer)
        console.print(f"gateway control API: {gateway.control_url}  (data: {data_dir / 'gateway'})")
        await stack.start_worker(gateway.control_url, gateway.admin_token)
        console.print("worker: role=all, local bubblewrap sandboxes")
        client = await RolloutClient.connect(
            temporal.address, temporal.namespace, task_queue="rollouts", tls=temporal.tls
        )
        report = await run_batch(
            client, tasks, str(data_dir / "samples"), samples_per_task, console=console
        )
        print_summary(console, report)
        uris = [o.result.samples_uri for o in report.completed if o.result and o.result.samples_uri]
        if uris:
            console.print(_sample_rows_table(uris))
        query = f'RolloutBatchId="{report.batch.batch_id}"'
        # Plain, unwrapped lines: scripts grep for them.
        ui_link = temporal.ui_link(query)
        console.print(f"engine: {stack.engine_label}", soft_wrap=True, highlight=False)
        console.print(f"UI: {ui_link or query}", soft_wrap=True, highlight=False)
        console.print(f"samples: {report.batch.output}", soft_wrap=True, highlight=False)
        print_show_line(console, report, artifacts=data_dir / "worker")
        code = 0 if not report.failed else 1
        interactive = sys.stdin.isatty() and sys.stdout.isatty() if keep is None else keep
        if interactive:
            console.print("[bold]stack is up[/] — explore the UI; Ctrl-C stops everything.")
            await asyncio.Event().wait()
        return code
    finally:
        await stack.stop()
        temporal_part = ", Temporal dev server" if stack.temporal is not None else ""
        console.print(f"stopped: worker, gateway, engine{temporal_part}; no sandbox left.")


_TRAIN = TrainDemoOptions()


@model_options("temporal")
@task_source_options(backend="local", backend_help="datasets: sandbox backend (local, docker, e2b)")
def demo_cmd(
    data_dir: Annotated[Path, typer.Option(help="where Temporal DB, gateway data, samples go")] = (
        Path("./data/demo")
    ),
    engine: Annotated[
        str, typer.Option(help="vllm (set up on first use) | scripted (fixed replies, no vLLM)")
    ] = "vllm",
    samples_per_task: Annotated[int, typer.Option(min=1)] = 2,
    keep: Annotated[
        bool | None, typer.Option("--keep/--no-keep", help="default: keep running if a TTY")
    ] = None,
    tasks: Annotated[
        Path | None,
        typer.Option(
            help="tasks JSONL, a Harbor task directory or SWE-bench instances (--format "
            "swebench); default: examples/tasks.jsonl"
        ),
    ] = None,
    metrics_port: Annotated[
        int | None, typer.Option(help="serve the worker's fleet metrics on this loopback port")
    ] = None,
    *,
    source: TaskSourceArgs,
    temporal: DemoTemporalOptions,
    train: Annotated[
        bool, typer.Option("--train", help="a short GRPO run on the tiny task family instead")
    ] = False,
    model: Annotated[
        str, typer.Option(help="--train: starting policy: warm | random | a model dir")
    ] = "warm",
    steps: Annotated[int, typer.Option(min=1, help="--train: GRPO steps")] = _TRAIN.steps,
    group_size: Annotated[
        int, typer.Option(min=2, help="--train: rollouts per task")
    ] = _TRAIN.group_size,
    tasks_per_step: Annotated[
        int, typer.Option(min=1, help="--train: training tasks")
    ] = _TRAIN.tasks_per_step,
    heldout_tasks: Annotated[
        int, typer.Option(min=1, max=64, help="--train: held-out tasks")
    ] = _TRAIN.heldout_tasks,
    heldout_samples: Annotated[
        int, typer.Option(min=1, help="--train: rollouts per held-out task")
    ] = _TRAIN.heldout_samples,
    heldout_every: Annotated[
        int, typer.Option(min=0, help="--train: held-out at step 1, every N-th step and the end")
    ] = _TRAIN.heldout_every,
    lr: Annotated[float, typer.Option(help="--train: AdamW learning rate")] = _TRAIN.lr,
    updates_per_step: Annotated[
        int, typer.Option(min=1, help="--train: optimiser steps per step")
    ] = _TRAIN.updates_per_step,
    seed: Annotated[int, typer.Option(help="--train: trainer seed")] = _TRAIN.seed,
    trainer: Annotated[
        str,
        typer.Option(help="--train: reference (our GRPO trainer) | trl (TRL's GRPOTrainer)"),
    ] = _TRAIN.trainer,
    out: Annotated[
        Path | None, typer.Option(help="--train: output dir (default DATA_DIR/train-<time>)")
    ] = None,
) -> None:
    """Run the example tasks end to end on an embedded local stack (--train: learn on it)."""
    from rich.console import Console

    if engine not in ("vllm", "scripted"):
        raise typer.BadParameter("engine must be vllm or scripted")
    if train and engine != "vllm":
        raise typer.BadParameter("--train needs the vLLM engine")
    if trainer not in ("reference", "trl"):
        raise typer.BadParameter("trainer must be reference or trl")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    console = Console()
    try:
        if train:
            opts = TrainDemoOptions(
                steps=steps,
                group_size=group_size,
                tasks_per_step=tasks_per_step,
                heldout_tasks=heldout_tasks,
                heldout_samples=heldout_samples,
                heldout_every=heldout_every,
                lr=lr,
                updates_per_step=updates_per_step,
                seed=seed,
                trainer=trainer,
                out=out,
            )
            from workers.local_stack import LocalStack

            python = ensure_trainer_python(console, opts.trainer)
            policy = ensure_policy_model(model, console)
            data_dir = data_dir.resolve()
            data_dir.mkdir(parents=True, exist_ok=True)
            stack = LocalStack(data_dir, console, temporal, metrics_port)
            code = asyncio.run(run_train_demo(stack, data_dir, policy, python, opts, console))
        else:
            task_list = None
            if tasks is not None:
                task_list = source.read(tasks, console)
            if engine == "vllm":
                ensure_engine_python(console)
            code = asyncio.run(
                run_demo(
                    data_dir,
                    engine,
                    samples_per_task,
                    keep,
                    console,
                    tasks=task_list,
                    temporal=temporal,
                    metrics_port=metrics_port,
                )
            )
    except (DemoSetupError, UnusableTemporal) as exc:
        console.print(f"set-up failed: {exc}", markup=False, highlight=False, soft_wrap=True)
        code = 1
    except (KeyboardInterrupt, asyncio.CancelledError):
        code = 0
    raise typer.Exit(code=code)


if __name__ == "__main__":
    typer.run(demo_cmd)
