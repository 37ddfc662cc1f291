"""The `rollout` command line."""

import os
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer


class Fsync(StrEnum):
    group = "group"
    off = "off"


app = typer.Typer(add_completion=False, no_args_is_help=True, help="Agentic Rollout")


@app.command("make-tiny-model")
def make_tiny_model(out_dir: Annotated[Path, typer.Argument(help="output directory")]) -> None:
    """Build the deterministic tiny test/demo model (tokenizer, chat template, weights)."""
    from devstack.tiny_model import build_tiny_model

    info = build_tiny_model(out_dir)
    typer.echo(info.model_dump_json(indent=2))


@app.command("gateway")
def gateway(
    engine: Annotated[str, typer.Option(help="engine base URL(s), comma-separated")],
    model: Annotated[str, typer.Option(help="model name served by the engine")],
    tokenizer: Annotated[Path, typer.Option(help="model dir with tokenizer.json")],
    host: str = "127.0.0.1",
    port: int = 8700,
    processes: Annotated[int, typer.Option(min=1, help="gateway processes, one port each")] = 1,
    data_dir: Path = Path("./data/gateway"),
    admin_token: Annotated[
        str | None, typer.Option(envvar="ROLLOUT_ADMIN_TOKEN", help="bearer for the control API")
    ] = None,
    insecure_dev: Annotated[bool, typer.Option(help="allow no admin token on loopback")] = False,
    chat_template: Annotated[Path | None, typer.Option(help="override the chat template")] = None,
    parser: Annotated[str, typer.Option(help="output parser family")] = "qwen3",
    public_url: Annotated[str | None, typer.Option(help="URL agents reach us at")] = None,
    context_window: Annotated[int | None, typer.Option(help="override max context")] = None,
    fsync: Annotated[
        Fsync, typer.Option(help="group: answer a call once its record is fsynced; off: no fsync")
    ] = Fsync.group,
    fsync_interval_ms: Annotated[
        float, typer.Option(min=0.001, max=1000, help="group commit: ms between fsync batches")
    ] = 5.0,
) -> None:
    """Serve the Gateway (control API + agent-facing protocols)."""
    from workers.gateway_server import GatewaySettings, serve

    settings = GatewaySettings(
        engine_urls=[u.strip() for u in engine.split(",") if u.strip()],
        model=model,
        tokenizer=tokenizer,
        chat_template=chat_template,
        parser=parser,
        host=host,
        port=port,
        public_url=public_url,
        data_dir=data_dir,
        admin_token=admin_token or os.environ.get("ROLLOUT_ADMIN_TOKEN"),
        insecure_dev=insecure_dev,
        context_window=context_window,
        fsync=fsync.value,
        fsync_interval_ms=fsync_interval_ms,
    )
    serve(settings, processes=processes)


def _register_temporal_commands() -> None:
    """The Temporal-backed commands live in their own modules (each also runs standalone)."""
    from workers.demo import demo_cmd
    from workers.run_cmd import run_cmd
    from workers.train_cmd import train_cmd
    from workers.worker import worker_cmd

    app.command("worker")(worker_cmd)
    app.command("run")(run_cmd)
    app.command("demo")(demo_cmd)
    app.command("train")(train_cmd)


_register_temporal_commands()

if __name__ == "__main__":
    app()
