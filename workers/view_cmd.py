"""`rollout view PATH`: the web viewer over a batch's samples directory.

Loopback by default; bound elsewhere it requires a token (ROLLOUT_VIEW_TOKEN, or one it
makes and prints in the URL), since the pages show agents' conversations and logs.
"""

import os
import secrets
from pathlib import Path
from typing import Annotated

import typer

LOOPBACK = ("127.0.0.1", "localhost", "::1")


def view_cmd(
    path: Annotated[
        str,
        typer.Argument(
            help="samples: a batch's dir (<out>/<batch_id>), the --out above, or s3://…"
        ),
    ],
    artifacts: Annotated[
        Path | None,
        typer.Option(help="a worker's data dir (its artifacts/<rollout>/attempt-N/)"),
    ] = None,
    tokenizer: Annotated[
        Path | None,
        typer.Option(help="the policy's tokenizer.json (or model dir) to show token text"),
    ] = None,
    host: Annotated[str, typer.Option(help="address to bind (loopback by default)")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="port (0: any free one)")] = 8090,
) -> None:
    """Serve the rollout viewer: Batch, Rollout, Evaluation and Lineage pages."""
    import socket
    import threading

    import uvicorn

    from rollout_client.samples_reader import SamplesReader
    from viewer.app import viewer_app
    from viewer.tokens import load_tokenizer

    try:
        reader = SamplesReader(path, artifacts)
        tok = load_tokenizer(tokenizer) if tokenizer else None
    except ValueError as exc:
        typer.echo(f"view: {exc}", err=True)
        raise typer.Exit(2) from None
    token = None
    allowed = [*LOOPBACK]
    if host not in LOOPBACK:
        token = os.environ.get("ROLLOUT_VIEW_TOKEN") or secrets.token_urlsafe(24)
        allowed = ["*"] if host in ("0.0.0.0", "::", "") else [*LOOPBACK, host]
    app = viewer_app(reader, tokenizer=tok, token=token, allowed_hosts=allowed)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)  # connections wait in the backlog until the server takes them
    shown = "localhost" if host in LOOPBACK else host
    if ":" in shown:
        shown = f"[{shown}]"
    url = f"http://{shown}:{sock.getsockname()[1]}/"
    typer.echo(f"view: {url}" + (f"?token={token}" if token else ""))
    threading.Thread(target=app.warm, name="view-warm", daemon=True).start()
    config = uvicorn.Config(app, log_level="warning")
    uvicorn.Server(config).run(sockets=[sock])
