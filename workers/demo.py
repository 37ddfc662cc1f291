"""`rollout demo` — the embedded default.

The demo starts everything on loopback (Temporal dev server with UI, a Gateway, an
engine, local sandboxes, a worker), runs the example tasks with a real agent (a small
Python program inside each sandbox that talks to the Gateway over the OpenAI API),
writes samples and prints where to look. With a TTY it keeps the stack up until Ctrl-C;
without one it exits 0 after the summary. Either way it stops all it started. The
stand-ins it runs (Temporal dev server, tiny model, vLLM CPU or scripted engine) come
from `devstack`.
"""

import asyncio
import contextlib
import logging
import secrets
import shutil
import signal
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from devstack.ports import free_port
from devstack.temporal_dev_server import TemporalDevServer
from workers.demo_setup import (
    DemoSetupError,
    ensure_engine_python,
    ensure_policy_model,
    ensure_trainer_python,
)
from workers.demo_train import TrainDemoOptions, run_train_demo
from workers.task_source_cmd import TaskSourceArgs, prebuild_images, task_source_options

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

    from devstack.background_server import BackgroundServer
    from schemas.tasks import RolloutTask

DEMO_SCRIPT_RULES = [
    ("6 times 7", "42"),
    ("capital of France", "Paris"),
    ("prints hello", "print('hello')"),
]


def repo_root() -> Path:
    return Path(__file__).resolve().parent.parent


ORPHAN_REASON = "left running by a previous demo process; its gateway and sandboxes are gone"


async def end_orphaned_rollouts(temporal_address: str) -> int:
    """Terminate the workflows still running in a demo's persisted Temporal DB.

    Everything the demo starts dies with its process, but the DB (kept for the UI's
    history) holds the workflows it had in flight; the next demo's worker would pick them
    up and spend minutes on rollouts whose sessions lived on a gateway that is gone (a
    killed training demo left 512 here). At start nothing of this demo runs yet, so every
    running workflow is such an orphan."""
    from temporalio.client import Client
    from temporalio.service import RPCError

    client = await Client.connect(temporal_address)
    ended = 0
    async for execution in client.list_workflows('ExecutionStatus="Running"'):
        handle = client.get_workflow_handle(execution.id, run_id=execution.run_id)
        try:
            await handle.terminate(reason=ORPHAN_REASON)
        except RPCError:  # ended meanwhile (it cannot have been ours)
            continue
        ended += 1
    return ended


def serve_gateway(
    engine_url: str,
    model: str,
    tokenizer: Path,
    data_dir: Path,
    checkpoint_roots: list[Path] | None = None,
    settings: Mapping[str, Any] | None = None,
) -> tuple["BackgroundServer", str, str]:
    """A Gateway in front of `engine_url`, both listeners on loopback in a background
    thread of this process, with a fresh admin token: (server, control API URL, token).
    The agent API is `server.url`; `server.stop()` stops both. `checkpoint_roots`: where
    policy updates may load from (none: no updates); `settings`: other `GatewaySettings`
    fields (the read deadlines, the limits), else `rollout gateway`'s defaults."""
    from devstack.background_server import BackgroundServer
    from workers.gateway_server import GatewaySettings, build_apps

    token = secrets.token_urlsafe(24)
    port = free_port()
    settings = GatewaySettings(
        engine_urls=[engine_url],
        model=model,
        tokenizer=tokenizer,
        port=port,
        public_url=f"http://127.0.0.1:{port}",
        data_dir=data_dir,
        admin_token=token,
        checkpoint_roots=checkpoint_roots or [],
        **(settings or {}),
    )
    agent_app, control_app, http = build_apps(settings)
    server = BackgroundServer(agent_app, port=port, http=http)  # read deadlines: both apps
    control_url = server.add(control_app)
    return server.start(), control_url, token


class DemoStack:
    """Everything the demo starts, so `stop()` can take all of it down again."""

    def __init__(self, data_dir: Path, console: "Console") -> None:
        self.data_dir = data_dir
        self.console = console
        self.temporal: TemporalDevServer | None = None
        self.engine_stop: list[object] = []
        self.engine_label = ""
        self.gateway_server: object | None = None
        self.worker: object | None = None
        self.worker_task: asyncio.Task[None] | None = None
        self.sandbox_state = Path(tempfile.mkdtemp(prefix="rollout-demo-sandboxes-", dir="/tmp"))
        self.sandbox_state.chmod(0o755)  # the sandbox uid must traverse it

    async def start_temporal(self) -> TemporalDevServer:
        from schemas.rollout import SEARCH_ATTRIBUTES

        server = TemporalDevServer(
            self.data_dir / "temporal", ui=True, search_attributes=SEARCH_ATTRIBUTES
        )
        self.temporal = await server.start()
        orphans = await end_orphaned_rollouts(self.temporal.address)
        if orphans:
            self.console.print(
                f"terminated {orphans} rollout(s) a previous demo left running in "
                f"{self.data_dir / 'temporal'}: their gateway sessions and sandboxes stopped "
                "with it (a rerun of a training run with the same --out runs them again)",
                highlight=False,
                soft_wrap=True,
            )
        return self.temporal

    def start_engine(self, engine: str, model_dir: Path | None = None) -> tuple[str, str, Path]:
        """(engine URL, served model name, tokenizer dir); says clearly which engine.

        `model_dir` (vLLM only): serve that model in float32 instead of the tiny random one."""
        from devstack.tiny_model import ensure_tiny_model

        if engine == "vllm" and model_dir is not None:
            url, model = self.start_vllm(model_dir, trainable=True)
            self.engine_label = f"vLLM CPU float32, model {model_dir.name}"
            return url, model, model_dir
        model_dir = ensure_tiny_model()
        if engine == "vllm":
            self.console.print("engine: [bold]vLLM CPU[/] serving the tiny random model (~30 s)…")
            url, model = self.start_vllm(model_dir)
            self.engine_label = "vLLM CPU (tiny random model: real sampling, random text)"
            return url, model, model_dir
        from devstack.background_server import BackgroundServer
        from devstack.scripted_engine import Script, ScriptedEngine, ScriptRule

        rules = [ScriptRule(when_contains=k, reply=v, repeat=True) for k, v in DEMO_SCRIPT_RULES]
        scripted = ScriptedEngine(
            model_dir / "tokenizer.json", Script(rules=rules, default_reply="I am not sure.")
        )
        server = BackgroundServer(scripted.app()).start()
        self.engine_stop.append(server.stop)
        self.engine_label = "SCRIPTED engine (requested): fixed replies, real tokenizer"
        self.console.print(f"engine: [bold yellow]{self.engine_label}[/]")
        return server.url, scripted.model, model_dir

    def start_vllm(self, model_dir: Path, trainable: bool = False) -> tuple[str, str]:
        """vLLM CPU serving `model_dir`; (URL, served model name). `trainable`: float32
        (its log-probs then agree with a float32 trainer) and the dev endpoints that load
        new weights in place."""
        from devstack.vllm_server import VllmServer, VllmServerConfig

        log_path = self.data_dir / "vllm.log"
        config = (
            VllmServerConfig.trainable(model_dir, log_path=log_path)
            if trainable
            else VllmServerConfig(
                model_dir=model_dir, extra_args=["--enforce-eager"], log_path=log_path
            )
        )
        server = VllmServer(config)
        server.start()
        self.engine_stop.append(server.stop)
        return server.url, server.model

    def start_gateway(
        self,
        engine_url: str,
        model: str,
        tokenizer: Path,
        checkpoint_roots: list[Path] | None = None,
    ) -> tuple[str, str]:
        """Both listeners on loopback; returns (control API URL, admin token)."""
        server, control_url, token = serve_gateway(
            engine_url, model, tokenizer, self.data_dir / "gateway", checkpoint_roots
        )
        self.gateway_server = server
        return control_url, token

    async def start_worker(self, gateway_url: str, admin_token: str) -> None:
        from workers.worker import RolloutWorker, WorkerSettings

        assert self.temporal is not None
        settings = WorkerSettings(
            role="all",
            temporal=self.temporal.address,
            task_queue="rollouts",
            host_id="demo",
            gateway_urls=[gateway_url],
            gateway_admin_token=admin_token,
            backend_config={"local": {"state_dir": str(self.sandbox_state)}},
            data_dir=self.data_dir / "worker",
            max_sandboxes=16,
            graceful_shutdown_s=5,
            reaper_interval_s=0,
        )
        worker = RolloutWorker(settings)
        self.worker = worker
        self.worker_task = asyncio.ensure_future(worker.run())
        ready = asyncio.ensure_future(worker.ready.wait())
        await asyncio.wait([ready, self.worker_task], return_when=asyncio.FIRST_COMPLETED)
        if self.worker_task.done():
            self.worker_task.result()  # raises the start-up error

    async def stop(self) -> None:
        """Stop everything this demo started, newest first; never raises."""
        if self.worker is not None and self.worker_task is not None:
            self.worker.stop()  # type: ignore[attr-defined]
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(self.worker_task, 30)
        if self.gateway_server is not None:
            with contextlib.suppress(Exception):
                self.gateway_server.stop()  # type: ignore[attr-defined]
        for stop in reversed(self.engine_stop):
            with contextlib.suppress(Exception):
                stop()  # type: ignore[operator]
        if self.temporal is not None:
            self.temporal.stop()
        with contextlib.suppress(Exception):
            from sandboxes.backends.local import LocalBackend

            leftovers = await LocalBackend(state_dir=self.sandbox_state).reap(frozenset())
            if leftovers:
                self.console.print(f"reaped {len(leftovers)} leftover sandbox(es)")
        shutil.rmtree(self.sandbox_state, ignore_errors=True)


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
) -> int:
    """Run `tasks` (read already), else `tasks_file` (default: the example tasks) on a
    fresh embedded stack; the exit code.

    `model_dir` (engine vllm): the model to serve instead of the tiny random one."""
    from rollout_client.client import RolloutClient
    from schemas.tasks import load_tasks
    from workers.run_cmd import print_show_line, print_summary, run_batch

    data_dir = data_dir.resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    main = asyncio.current_task()
    if main is not None:  # SIGTERM (CI timeouts, `kill`) must still stop everything
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, main.cancel)
    if tasks is None:
        tasks = load_tasks(tasks_file or repo_root() / "examples" / "tasks.jsonl")
    tasks = prebuild_images(tasks, console)
    stack = DemoStack(data_dir, console)
    try:
        temporal = await stack.start_temporal()
        console.print(
            f"Temporal dev server: {temporal.address}  UI: [bold]{temporal.ui_url}[/]",
            soft_wrap=True,
        )
        engine_url, model, tokenizer = await asyncio.to_thread(
            stack.start_engine, engine, model_dir
        )
        gateway_url, token = stack.start_gateway(engine_url, model, tokenizer)
        console.print(f"gateway control API: {gateway_url}  (data: {data_dir / 'gateway'})")
        await stack.start_worker(gateway_url, token)
        console.print("worker: role=all, local bubblewrap sandboxes")
        client = await RolloutClient.connect(temporal.address, task_queue="rollouts")
        report = await run_batch(
            client, tasks, str(data_dir / "samples"), samples_per_task, console=console
        )
        print_summary(console, report)
        uris = [o.result.samples_uri for o in report.completed if o.result and o.result.samples_uri]
        if uris:
            console.print(_sample_rows_table(uris))
        query = f'RolloutBatchId="{report.batch.batch_id}"'
        # Plain, unwrapped lines: scripts grep for them.
        ui_link = f"{temporal.ui_url}/namespaces/default/workflows?query={query}"
        console.print(f"engine: {stack.engine_label}", soft_wrap=True, highlight=False)
        console.print(f"UI: {ui_link}", soft_wrap=True, highlight=False)
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
        console.print("stopped: worker, gateway, engine, Temporal dev server; no sandbox left.")


_TRAIN = TrainDemoOptions()


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
    *,
    source: TaskSourceArgs,
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
            python = ensure_trainer_python(console, opts.trainer)
            policy = ensure_policy_model(model, console)
            data_dir = data_dir.resolve()
            data_dir.mkdir(parents=True, exist_ok=True)
            stack = DemoStack(data_dir, console)
            code = asyncio.run(run_train_demo(stack, data_dir, policy, python, opts, console))
        else:
            task_list = None
            if tasks is not None:
                task_list = source.read(tasks, console)
            if engine == "vllm":
                ensure_engine_python(console)
            code = asyncio.run(
                run_demo(data_dir, engine, samples_per_task, keep, console, tasks=task_list)
            )
    except DemoSetupError as exc:
        console.print(f"set-up failed: {exc}", markup=False, highlight=False, soft_wrap=True)
        code = 1
    except (KeyboardInterrupt, asyncio.CancelledError):
        code = 0
    raise typer.Exit(code=code)


if __name__ == "__main__":
    typer.run(demo_cmd)
