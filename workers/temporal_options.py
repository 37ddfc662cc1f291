"""The Temporal TLS / API key options shared by the commands that connect a client
(`rollout worker`, `rollout run`): each also read from the environment variable the
`temporal` CLI uses, an option winning over its variable."""

from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError

from rollout_client.temporal_connection import ENV_VARS, TemporalTLS

TlsFlag = Annotated[
    bool,
    typer.Option(
        "--temporal-tls", help=f"TLS with the system's CAs (${ENV_VARS['tls']}); implied below"
    ),
]
TlsCa = Annotated[
    Path | None,
    typer.Option(help=f"PEM CA of the Temporal server's cert (${ENV_VARS['tls_ca']})"),
]
TlsCert = Annotated[
    Path | None,
    typer.Option(help=f"PEM client certificate for mTLS (${ENV_VARS['tls_cert']})"),
]
TlsKey = Annotated[
    Path | None, typer.Option(help=f"PEM key of the client certificate (${ENV_VARS['tls_key']})")
]
TlsServerName = Annotated[
    str | None,
    typer.Option(help=f"name the server cert must carry (${ENV_VARS['tls_server_name']})"),
]
ApiKey = Annotated[
    str | None,
    typer.Option(
        help=f"Temporal API key, sent as a bearer token (prefer ${ENV_VARS['api_key']}: "
        "options show in `ps`)"
    ),
]


def tls_settings(
    tls: bool,
    ca: Path | None,
    cert: Path | None,
    key: Path | None,
    server_name: str | None,
    api_key: str | None,
) -> TemporalTLS:
    """Options over environment; a bad combination or a missing file is a usage error."""
    try:
        return TemporalTLS.from_env(
            tls=True if tls else None,
            tls_ca=ca,
            tls_cert=cert,
            tls_key=key,
            tls_server_name=server_name,
            api_key=api_key,
        )
    except ValidationError as exc:
        problems = "; ".join(e["msg"].removeprefix("Value error, ") for e in exc.errors())
        raise typer.BadParameter(problems) from exc
