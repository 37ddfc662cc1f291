"""`rollout train TASKS.jsonl`: run the reference GRPO trainer against a running service.

The trainer needs torch and transformers, which must stay out of this process (and of
the gateway and workers). So this command only validates the options into a
`schemas.training.TrainConfig`, makes sure the trainer environment exists
(`environments.trainer`: the vLLM CPU venv plus a small overlay, created once), and
runs `python -m trainer CONFIG.json` with that interpreter, passing its output through.
A rerun with the same `--out` resumes from the last complete policy.
"""

import subprocess
import sys
from pathlib import Path
from typing import Annotated

import typer

import schemas
from rollout_client.temporal_connection import TemporalTLS
from schemas.training import TrainConfig
from workers.model_options import model_options
from workers.temporal_options import TemporalOptions, tls_environment


def trainer_process(
    cfg: TrainConfig,
    python: Path | None = None,
    admin_token: str | None = None,
    tls: TemporalTLS | None = None,
) -> tuple[list[str], dict[str, str]]:
    """Write `cfg` into OUT and return the trainer's (argv, environment); `tls`: how it
    reaches Temporal (default: the environment it inherits)."""
    from environments.trainer import (
        TRAINER_EXTRAS,
        trainer_environment,
        trainer_python,
        trainer_pythonpath,
    )

    out = Path(cfg.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    config_path = out / "train_config.json"
    config_path.write_text(cfg.model_dump_json(indent=2) + "\n")
    interpreter = python or trainer_python(extras=TRAINER_EXTRAS[cfg.trainer])
    link_dir = trainer_pythonpath(
        Path(schemas.__file__).resolve().parent.parent, out / ".trainer-pythonpath"
    )
    env = trainer_environment(link_dir)
    if admin_token:  # by environment: the config file is written to disk
        env["ROLLOUT_ADMIN_TOKEN"] = admin_token
    if tls is not None:  # so is the API key
        env.update(tls_environment(tls))
    return [str(interpreter), "-m", "trainer", str(config_path)], env


def launch_trainer(
    cfg: TrainConfig,
    python: Path | None = None,
    admin_token: str | None = None,
    tls: TemporalTLS | None = None,
) -> int:
    """Run the trainer process for `cfg` to completion; returns its exit code."""
    argv, env = trainer_process(cfg, python, admin_token, tls)
    return subprocess.run(argv, env=env, stdin=subprocess.DEVNULL).returncode


@model_options("temporal")
def train_cmd(
    tasks: Annotated[Path, typer.Argument(help="training tasks (JSONL)")],
    init_policy: Annotated[Path, typer.Option(help="model dir of the starting policy")],
    gateway: Annotated[
        str | None,
        typer.Option(help="Gateway control URL: new policies go through its POST /policy"),
    ] = None,
    admin_token: Annotated[
        str | None, typer.Option(envvar="ROLLOUT_ADMIN_TOKEN", help="the Gateway's admin token")
    ] = None,
    engine: Annotated[
        list[str] | None,
        typer.Option(help="without --gateway: vLLM URL the trainer loads policies into"),
    ] = None,
    out: Annotated[Path, typer.Option(help="policies/, samples/, metrics.jsonl, curve")] = Path(
        "./data/train"
    ),
    task_queue: str = "rollouts",
    steps: Annotated[int, typer.Option(min=1)] = 2,
    group_size: Annotated[int, typer.Option(min=2)] = 4,
    tasks_per_step: Annotated[
        int | None, typer.Option(min=1, help="fresh slice of the tasks each step (default: all)")
    ] = None,
    heldout: Annotated[Path | None, typer.Option(help="held-out tasks (JSONL)")] = None,
    heldout_samples: Annotated[int, typer.Option(min=1, help="rollouts per held-out task")] = 1,
    heldout_every: Annotated[
        int, typer.Option(min=0, help="held-out at step 1 and every N-th step (0: step 1 only)")
    ] = 1,
    lr: float = 5e-5,
    adam_eps: Annotated[
        float, typer.Option(min=1e-12, help="AdamW eps (larger: noise-only gradients move less)")
    ] = 1e-8,
    updates_per_step: Annotated[int, typer.Option(min=1)] = 1,
    max_staleness: Annotated[int, typer.Option(min=0)] = 1,
    overlap: Annotated[
        bool, typer.Option(help="one-step off-policy: next rollouts run while a step trains")
    ] = True,
    seed: int = 0,
    trainer: Annotated[
        str, typer.Option(help="reference (trainer.loop) | trl (TRL's GRPOTrainer, --gateway only)")
    ] = "reference",
    *,
    temporal: TemporalOptions,
) -> None:
    """Train the policy with GRPO on rollouts from the service (resumes a previous --out)."""
    if trainer not in ("reference", "trl"):
        raise typer.BadParameter("--trainer must be reference or trl")
    if trainer == "trl" and gateway is None:
        raise typer.BadParameter("--trainer trl publishes through the Gateway: give --gateway")
    for path in (tasks, init_policy, *([heldout] if heldout else [])):
        if not path.exists():
            raise typer.BadParameter(f"{path} does not exist")
    cfg = TrainConfig(
        tasks=str(tasks.resolve()),
        out=str(out.resolve()),
        init_policy=str(init_policy.resolve()),
        temporal=temporal.temporal,
        namespace=temporal.namespace,
        task_queue=task_queue,
        gateway=gateway,
        engines=list(engine or []),
        steps=steps,
        group_size=group_size,
        tasks_per_step=tasks_per_step,
        heldout=str(heldout.resolve()) if heldout else None,
        heldout_samples=heldout_samples,
        heldout_every=heldout_every,
        lr=lr,
        adam_eps=adam_eps,
        updates_per_step=updates_per_step,
        max_staleness=max_staleness,
        overlap=overlap,
        seed=seed,
        trainer=trainer,
    )
    if gateway is None and not engine:
        raise typer.BadParameter("give --gateway (its control URL) or --engine")
    code = launch_trainer(cfg, admin_token=admin_token, tls=temporal.tls())
    raise typer.Exit(code=code)


if __name__ == "__main__":
    typer.run(train_cmd)
    sys.exit(0)
