"""The Temporal connection options, one group shared by the commands that reach Temporal
(`rollout run`, `worker`, `train`, `demo`): a command declares `temporal: TemporalOptions` and
gets `--temporal`, `--namespace` and the TLS / API key options there
(`workers.model_options`). The TLS ones are also read from the environment variables
the `temporal` CLI uses, an option winning over its variable."""

from pathlib import Path
from typing import Annotated

import typer
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gateway.options import OptionSpec
from rollout_client.temporal_connection import ENV_VARS, TemporalTLS


class TemporalOptions(BaseModel):
    """Where a command reaches Temporal, and how (TLS, API key)."""

    model_config = ConfigDict(extra="forbid")

    temporal: str = Field(default="127.0.0.1:7233", description="Temporal frontend host:port")
    temporal_tls: Annotated[bool, OptionSpec(name="--temporal-tls")] = Field(
        default=False, description=f"TLS with the system's CAs (${ENV_VARS['tls']}); implied below"
    )
    temporal_tls_ca: Path | None = Field(
        default=None, description=f"PEM CA of the Temporal server's cert (${ENV_VARS['tls_ca']})"
    )
    temporal_tls_cert: Path | None = Field(
        default=None, description=f"PEM client certificate for mTLS (${ENV_VARS['tls_cert']})"
    )
    temporal_tls_key: Path | None = Field(
        default=None, description=f"PEM key of the client certificate (${ENV_VARS['tls_key']})"
    )
    temporal_tls_server_name: str | None = Field(
        default=None,
        description=f"name the server cert must carry (${ENV_VARS['tls_server_name']})",
    )
    temporal_api_key: str | None = Field(
        default=None,
        description=f"Temporal API key, sent as a bearer token (prefer ${ENV_VARS['api_key']}: "
        "options show in `ps`)",
    )
    namespace: str = "default"

    def tls(self) -> TemporalTLS:
        """The TLS settings, options over environment; a bad one is a usage error."""
        return tls_settings(
            self.temporal_tls,
            self.temporal_tls_ca,
            self.temporal_tls_cert,
            self.temporal_tls_key,
            self.temporal_tls_server_name,
            self.temporal_api_key,
        )


class UnusableTemporal(RuntimeError):
    """The Temporal a command was given cannot be reached or lacks what the workflows need."""


class DemoTemporalOptions(TemporalOptions):
    """The group for `rollout demo`, whose default is a Temporal dev server of its own."""

    temporal: str | None = Field(  # type: ignore[assignment]
        default=None,
        description="Temporal frontend host:port to use instead of starting a dev server in "
        "DATA_DIR (its search attributes must exist)",
    )


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


def tls_environment(tls: TemporalTLS) -> dict[str, str]:
    """`tls` as the environment variables `TemporalTLS.from_env` reads: how a process we
    start (the trainer) connects as we do, without the key on its command line or in a
    file."""
    env: dict[str, str] = {}
    for name, var in ENV_VARS.items():
        value = getattr(tls, name)
        if name == "api_key" and value is not None:
            value = value.get_secret_value()
        if value not in (None, False):
            env[var] = "1" if value is True else str(value)
    return env
