"""The `rollout` command line."""

import os
from pathlib import Path
from typing import Annotated

import typer

from gateway.engines.registry import EngineName
from workers.gateway_settings import GatewaySettings
from workers.images_cmd import images_app
from workers.model_options import model_options
from workers.tiny_model_cmd import make_tiny_model, templates_app

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Agentic Rollout")
app.add_typer(templates_app, name="templates")
app.add_typer(images_app, name="images")
app.command("make-tiny-model")(make_tiny_model)


@app.command("gateway")
@model_options("settings")
def gateway(*, settings: GatewaySettings) -> None:
    """Serve the Gateway: the agent-facing protocols on --port, the control API, /metrics
    and /health on --control-port."""
    from workers.gateway_server import serve

    serve(settings)


@app.command("engine-check")
def engine_check(
    engine: Annotated[str, typer.Option(help="engine base URL(s), comma-separated")],
    model: Annotated[str, typer.Option(help="model name served by the engine")],
    engine_api: Annotated[
        EngineName, typer.Option(help="the endpoint `rollout gateway` will use")
    ] = "completions",
) -> None:
    """Check that an engine (a trainer's own inference server too) offers what `rollout
    gateway --engine URL` needs; exit 1 when a required capability is missing."""
    import asyncio

    from gateway.engines.engine_check import check_engine

    missing = False
    for url in [u.strip() for u in engine.split(",") if u.strip()]:
        typer.echo(url)
        for found in asyncio.run(check_engine(url, model, api=engine_api)):
            mark = "ok  " if found.ok else ("FAIL" if found.required else "no  ")
            typer.echo(f"  {mark} {found.name}: {found.detail}")
            missing |= found.required and not found.ok
    raise typer.Exit(1 if missing else 0)


@app.command("keygen")
def keygen(
    out: Annotated[Path, typer.Argument(help="key file to create (mode 0600)")],
) -> None:
    """Create a key file for the Temporal payload codec (`--payload-key-file`)."""
    from rollout_client.codec import new_key

    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(new_key() + "\n")
    typer.echo(f"wrote {out}; give it to every worker and trainer client (and keep it safe)")


@app.command("codec-server")
def codec_server(
    payload_key_file: Annotated[
        Path, typer.Option(envvar="ROLLOUT_PAYLOAD_KEY_FILE", help="the workers' key file")
    ],
    host: str = "127.0.0.1",
    port: int = 8081,
    ui_origin: Annotated[
        list[str] | None, typer.Option(help="Temporal UI origin allowed by CORS (repeatable)")
    ] = None,
    token_file: Annotated[
        Path | None,
        typer.Option(
            envvar="ROLLOUT_CODEC_TOKEN_FILE",
            help="file holding the token clients must send (`rollout keygen FILE` makes one); "
            "or the token itself in ROLLOUT_CODEC_TOKEN",
        ),
    ] = None,
    allowed_host: Annotated[
        list[str] | None,
        typer.Option(
            help="a name clients reach this server by (the Host header; repeatable); "
            "default: the loopback names and --host"
        ),
    ] = None,
    insecure_no_token: Annotated[
        bool,
        typer.Option(
            "--insecure-no-token", help="serve without a token (development, loopback only)"
        ),
    ] = False,
) -> None:
    """Decode encrypted payloads for the Temporal UI / CLI (their codec endpoint)."""
    import uvicorn

    from rollout_client.codec import load_keys
    from workers.codec_server import LOOPBACK_HOSTS, codec_app, host_name

    token = os.environ.get("ROLLOUT_CODEC_TOKEN") or None
    if token_file is not None:
        token = token_file.read_text().strip() or None
    if token is None and not insecure_no_token:
        raise typer.BadParameter(
            "the codec server holds the payload key: give --token-file (or "
            "ROLLOUT_CODEC_TOKEN), or --insecure-no-token on loopback",
            param_hint="--token-file",
        )
    if token is None and host_name(host) not in LOOPBACK_HOSTS:
        raise typer.BadParameter("--insecure-no-token serves on loopback only", param_hint="--host")
    hosts = list(allowed_host or LOOPBACK_HOSTS)
    if not allowed_host and host not in ("0.0.0.0", "::", ""):
        hosts.append(host)
    app_ = codec_app(
        load_keys(payload_key_file),
        ui_origin or ["http://localhost:8233"],
        token=token,
        allowed_hosts=hosts,
    )
    uvicorn.run(app_, host=host, port=port, log_level="warning")


def _register_temporal_commands() -> None:
    """The Temporal-backed commands live in their own modules (each also runs standalone)."""
    from workers.demo import demo_cmd
    from workers.run_cmd import run_cmd
    from workers.show_cmd import show_cmd
    from workers.train_cmd import train_cmd
    from workers.worker import worker_cmd

    app.command("worker")(worker_cmd)
    app.command("run")(run_cmd)
    app.command("show")(show_cmd)
    app.command("demo")(demo_cmd)
    app.command("train")(train_cmd)


_register_temporal_commands()

if __name__ == "__main__":
    app()
