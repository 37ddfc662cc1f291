"""The `rollout` command line."""

import os
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from workers.images_cmd import images_app
from workers.tiny_model_cmd import make_tiny_model, templates_app


class Fsync(StrEnum):
    group = "group"
    off = "off"


class Routing(StrEnum):
    sticky = "sticky"
    round_robin = "round-robin"


class EngineApiChoice(StrEnum):
    completions = "completions"
    generate = "generate"
    sglang = "sglang"


app = typer.Typer(add_completion=False, no_args_is_help=True, help="Agentic Rollout")
app.add_typer(templates_app, name="templates")
app.add_typer(images_app, name="images")
app.command("make-tiny-model")(make_tiny_model)


@app.command("gateway")
def gateway(
    engine: Annotated[str, typer.Option(help="engine base URL(s), comma-separated")],
    model: Annotated[str, typer.Option(help="model name served by the engine")],
    tokenizer: Annotated[Path, typer.Option(help="model dir with tokenizer.json")],
    host: Annotated[str, typer.Option(help="agent API listener address")] = "127.0.0.1",
    port: Annotated[
        int, typer.Option(help="agent API port: what sandboxes reach (process i: port+i)")
    ] = 8700,
    control_host: Annotated[
        str, typer.Option(help="control API + /metrics listener address")
    ] = "127.0.0.1",
    control_port: Annotated[
        int, typer.Option(help="control API port: workers, trainers (process i: port+i)")
    ] = 8800,
    shared_port: Annotated[
        int | None,
        typer.Option(help="one agent port for all processes; calls reach their session's owner"),
    ] = None,
    processes: Annotated[
        int, typer.Option(min=1, help="gateway processes, one agent + one control port each")
    ] = 1,
    data_dir: Path = Path("./data/gateway"),
    admin_token: Annotated[
        str | None, typer.Option(envvar="ROLLOUT_ADMIN_TOKEN", help="bearer for the control API")
    ] = None,
    insecure_dev: Annotated[
        bool, typer.Option(help="no admin token; the control listener must be on loopback")
    ] = False,
    chat_template: Annotated[Path | None, typer.Option(help="override the chat template")] = None,
    family: Annotated[
        str | None,
        typer.Option(
            help="model family (a chat template name); default: detected from the template"
        ),
    ] = None,
    tool_call_parser: Annotated[
        str | None, typer.Option(help="vLLM tool-call parser name (hermes, qwen3_coder, glm47…)")
    ] = None,
    reasoning_parser: Annotated[
        str | None, typer.Option(help="vLLM reasoning parser name (qwen3, deepseek_r1…)")
    ] = None,
    public_url: Annotated[str | None, typer.Option(help="URL agents reach us at")] = None,
    context_window: Annotated[int | None, typer.Option(help="override max context")] = None,
    fsync: Annotated[
        Fsync, typer.Option(help="group: answer a call once its record is fsynced; off: no fsync")
    ] = Fsync.group,
    fsync_interval_ms: Annotated[
        float, typer.Option(min=0.001, max=1000, help="group commit: ms between fsync batches")
    ] = 5.0,
    session_reaper_interval_s: Annotated[
        float, typer.Option(min=0, help="s between closing sessions past their TTL (0: off)")
    ] = 30.0,
    stream_abort_grace_s: Annotated[
        float, typer.Option(min=0, help="s a stream whose client left keeps sampling for a retry")
    ] = 2.0,
    max_body_bytes: Annotated[
        int, typer.Option(min=1, help="any request body: 413 past it, before it is read")
    ] = 32 * 2**20,
    header_timeout_s: Annotated[
        float, typer.Option(min=0.001, help="s a request head may take; then the connection is cut")
    ] = 10.0,
    body_timeout_s: Annotated[
        float, typer.Option(min=0.001, help="s a request body may take after its head; then 408")
    ] = 60.0,
    session_max_concurrent_calls: Annotated[
        int, typer.Option(min=1, help="per-session default: calls in flight; one more is a 429")
    ] = 16,
    session_max_stored_request_bytes: Annotated[
        int,
        typer.Option(min=0, help="per-session default: raw request bytes a call's record keeps"),
    ] = 2**20,
    session_max_stored_bytes: Annotated[
        int, typer.Option(min=1, help="per-session default: bytes of records; past them 413")
    ] = 2**30,
    session_max_body_bytes: Annotated[
        int,
        typer.Option(
            min=1, help="per-session default: an agent request's body, and the bodies read at once"
        ),
    ] = 8 * 2**20,
    session_body_bytes_per_s: Annotated[
        int,
        typer.Option(min=0, help="per-session: body bytes a second (bursts: 1 s of it, or a cap)"),
    ] = 4 * 2**20,
    tokenize_offload_chars: Annotated[
        int, typer.Option(min=0, help="tokenize new text this long in a worker process (0: off)")
    ] = 16384,
    max_prompt_messages: Annotated[
        int, typer.Option(min=0, help="refuse (413) a request with more messages (0: no cap)")
    ] = 10_000,
    max_prompt_chars: Annotated[
        int, typer.Option(min=0, help="refuse (413) a prompt of more characters (0: no cap)")
    ] = 4 * 2**20,
    engine_routing: Annotated[
        Routing, typer.Option(help="sticky: a session keeps its engine; round-robin: compare")
    ] = Routing.sticky,
    engine_api: Annotated[
        EngineApiChoice,
        typer.Option(
            help="completions: /v1/completions; generate: vLLM's token-in/token-out "
            "/inference/v1/generate (vLLM >= 0.32 with --enable-scale-out; leaner); "
            "sglang: SGLang's native /generate (e.g. a trainer's own SGLang engines)"
        ),
    ] = EngineApiChoice.completions,
    checkpoint_root: Annotated[
        list[Path] | None,
        typer.Option(
            help="directory policy-update checkpoints must resolve under (repeatable); "
            "none: POST /policy is refused"
        ),
    ] = None,
) -> None:
    """Serve the Gateway: the agent-facing protocols on --port, the control API, /metrics
    and /health on --control-port."""
    from workers.gateway_server import GatewaySettings, serve

    settings = GatewaySettings(
        engine_urls=[u.strip() for u in engine.split(",") if u.strip()],
        model=model,
        tokenizer=tokenizer,
        chat_template=chat_template,
        family=family,
        tool_call_parser=tool_call_parser,
        reasoning_parser=reasoning_parser,
        host=host,
        port=port,
        control_host=control_host,
        control_port=control_port,
        shared_port=shared_port,
        public_url=public_url,
        data_dir=data_dir,
        admin_token=admin_token or os.environ.get("ROLLOUT_ADMIN_TOKEN"),
        insecure_dev=insecure_dev,
        context_window=context_window,
        fsync=fsync.value,
        fsync_interval_ms=fsync_interval_ms,
        session_reaper_interval_s=session_reaper_interval_s,
        stream_abort_grace_s=stream_abort_grace_s,
        max_body_bytes=max_body_bytes,
        header_timeout_s=header_timeout_s,
        body_timeout_s=body_timeout_s,
        session_max_concurrent_calls=session_max_concurrent_calls,
        session_max_stored_request_bytes=session_max_stored_request_bytes,
        session_max_stored_bytes=session_max_stored_bytes,
        session_max_body_bytes=session_max_body_bytes,
        session_body_bytes_per_s=session_body_bytes_per_s,
        tokenize_offload_chars=tokenize_offload_chars,
        max_prompt_messages=max_prompt_messages,
        max_prompt_chars=max_prompt_chars,
        engine_routing=engine_routing.value.replace("-", "_"),
        engine_api=engine_api.value,
        checkpoint_roots=[root.resolve() for root in checkpoint_root or []],
    )
    serve(settings, processes=processes)


@app.command("engine-check")
def engine_check(
    engine: Annotated[str, typer.Option(help="engine base URL(s), comma-separated")],
    model: Annotated[str, typer.Option(help="model name served by the engine")],
    engine_api: Annotated[
        EngineApiChoice, typer.Option(help="the endpoint `rollout gateway` will use")
    ] = EngineApiChoice.completions,
) -> None:
    """Check that an engine (a trainer's own inference server too) offers what `rollout
    gateway --engine URL` needs; exit 1 when a required capability is missing."""
    import asyncio

    from gateway.engines.engine_check import check_engine

    missing = False
    for url in [u.strip() for u in engine.split(",") if u.strip()]:
        typer.echo(url)
        for found in asyncio.run(check_engine(url, model, api=engine_api.value)):
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
    from workers.train_cmd import train_cmd
    from workers.worker import worker_cmd

    app.command("worker")(worker_cmd)
    app.command("run")(run_cmd)
    app.command("demo")(demo_cmd)
    app.command("train")(train_cmd)


_register_temporal_commands()

if __name__ == "__main__":
    app()
