"""How a worker or a trainer reaches the Temporal frontend: TLS (server CA, client
certificate for mTLS, server name) and an API key.

Why a model of its own: the workers (`rollout worker`) and the trainer client
(`rollout_client.client.RolloutClient`) must use the same settings, read from the same
environment variables as the `temporal` CLI (`TEMPORAL_TLS_SERVER_CA_CERT_PATH`, …), so
one environment file configures all three on a host. Files are read and checked here,
before connecting, so a typo is a precise error rather than a handshake failure.
"""

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

#: setting → environment variable (the names the `temporal` CLI reads).
ENV_VARS = {
    "tls": "TEMPORAL_TLS",
    "tls_ca": "TEMPORAL_TLS_SERVER_CA_CERT_PATH",
    "tls_cert": "TEMPORAL_TLS_CLIENT_CERT_PATH",
    "tls_key": "TEMPORAL_TLS_CLIENT_KEY_PATH",
    "tls_server_name": "TEMPORAL_TLS_SERVER_NAME",
    "api_key": "TEMPORAL_API_KEY",
}
_TRUE = {"1", "true", "yes", "on"}


class TemporalConnectError(RuntimeError):
    """The Temporal frontend could not be reached with these settings (the message says
    which: address, TLS verification, client certificate, API key)."""


class TemporalTLS(BaseModel):
    """TLS and authentication for the Temporal client. Empty (the default): plain TCP, as
    the dev server wants. Any file, a server name or an API key turns TLS on."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tls: bool = Field(default=False, description="TLS with the system's CAs, if nothing else")
    tls_ca: Path | None = Field(default=None, description="PEM CA that signed the server cert")
    tls_cert: Path | None = Field(default=None, description="PEM client certificate (mTLS)")
    tls_key: Path | None = Field(default=None, description="PEM key of tls_cert")
    tls_server_name: str | None = Field(
        default=None, description="name to verify in the server certificate (default: host)"
    )
    api_key: SecretStr | None = Field(
        default=None, description="sent as `Authorization: Bearer …` on every call"
    )

    @model_validator(mode="after")
    def _pairs(self) -> "TemporalTLS":
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError(
                "tls_cert and tls_key go together (--temporal-tls-cert/--temporal-tls-key, "
                f"{ENV_VARS['tls_cert']}/{ENV_VARS['tls_key']})"
            )
        for name in ("tls_ca", "tls_cert", "tls_key"):
            path = getattr(self, name)
            if path is not None and not path.is_file():
                raise ValueError(f"{name}: no such file: {path}")
        if self.api_key is not None and not self.api_key.get_secret_value().strip():
            raise ValueError("api_key is empty")
        return self

    @property
    def enabled(self) -> bool:
        return (
            self.tls
            or any(p is not None for p in (self.tls_ca, self.tls_cert, self.tls_server_name))
            or self.api_key is not None
        )

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> "TemporalTLS":
        """The settings from the environment, each overridden by a non-None keyword
        (the command-line option)."""
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        for name, var in ENV_VARS.items():
            raw = env.get(var, "").strip()
            if raw:
                values[name] = raw.lower() in _TRUE if name == "tls" else raw
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls.model_validate(values)

    def connect_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for `temporalio.client.Client.connect`."""
        from temporalio.client import TLSConfig

        if not self.enabled:
            return {"tls": False}
        tls = TLSConfig(
            server_root_ca_cert=self.tls_ca.read_bytes() if self.tls_ca else None,
            domain=self.tls_server_name,
            client_cert=self.tls_cert.read_bytes() if self.tls_cert else None,
            client_private_key=self.tls_key.read_bytes() if self.tls_key else None,
        )
        kwargs: dict[str, Any] = {"tls": tls}
        if self.api_key is not None:
            kwargs["api_key"] = self.api_key.get_secret_value()
        return kwargs

    def describe(self) -> str:
        """The settings in a log line or an error (never the key itself)."""
        if not self.enabled:
            return "plain TCP (no TLS)"
        parts = [f"CA {self.tls_ca}" if self.tls_ca else "system CAs"]
        if self.tls_cert:
            parts.append(f"client cert {self.tls_cert}")
        if self.tls_server_name:
            parts.append(f"server name {self.tls_server_name}")
        if self.api_key is not None:
            parts.append("API key")
        return "TLS with " + ", ".join(parts)


_HANG_UPS = ("ConnectionReset", "connection closed", "BrokenPipe", "broken pipe")
"""How the SDK words a peer that hung up on an established connection."""


def connect_failure(address: str, tls: TemporalTLS, exc: BaseException) -> str:
    """Why a connect failed, in the settings' own terms, followed by the SDK's text."""
    raw = str(exc)
    ca = f"the CA in {tls.tls_ca}" if tls.tls_ca else "the system's CAs"
    if "UnknownIssuer" in raw:
        why = (
            f"the server's TLS certificate is not signed by {ca} "
            "(--temporal-tls-ca / TEMPORAL_TLS_SERVER_CA_CERT_PATH)"
        )
    elif "NotValidForName" in raw:
        name = tls.tls_server_name or address.rsplit(":", 1)[0]
        why = (
            f"the server's TLS certificate is not valid for {name!r} "
            "(--temporal-tls-server-name / TEMPORAL_TLS_SERVER_NAME)"
        )
    elif tls.enabled and (
        "close_notify" in raw
        or "UnexpectedEof" in raw
        # the same refusal when the server's reset, close or a write into the closed
        # socket overtakes its TLS alert
        or ("after connection" in raw and any(s in raw for s in _HANG_UPS))
    ):
        why = (
            "the server ended the TLS session right after the handshake: it wants a client "
            "certificate it trusts (--temporal-tls-cert / --temporal-tls-key)"
        )
    elif tls.enabled and ("InvalidContentType" in raw or "corrupt message" in raw):
        why = "the server does not speak TLS (drop the TLS settings for a dev server)"
    elif not tls.enabled and ("BrokenPipe" in raw or "broken pipe" in raw):
        why = "the server closed the plain-TCP connection: it may require TLS (--temporal-tls)"
    elif "Connection refused" in raw or "ConnectionRefused" in raw:
        why = "nothing listens at that address"
    elif "Unauthenticated" in raw or "PermissionDenied" in raw:
        why = "the server refused the credentials (--temporal-api-key / TEMPORAL_API_KEY)"
    else:
        why = "see the cause below"
    return f"cannot connect to Temporal at {address} with {tls.describe()}: {why}. Cause: {raw}"
