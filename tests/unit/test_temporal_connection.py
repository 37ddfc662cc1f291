"""`TemporalTLS`: the TLS / API key settings of workers and trainer clients, read from
the `temporal` CLI's environment variables, an option winning over its variable, and
checked before any connection is tried."""

from pathlib import Path

import pytest
import typer
from pydantic import ValidationError

from rollout_client.temporal_connection import TemporalTLS, connect_failure
from workers.temporal_options import tls_settings


def pem(tmp_path: Path, name: str) -> Path:
    path = tmp_path / name
    path.write_text("-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n")
    return path


def test_default_is_plain_tcp_for_the_dev_server() -> None:
    tls = TemporalTLS.from_env({})
    assert (tls.enabled, tls.connect_kwargs()) == (False, {"tls": False})


def test_reads_the_temporal_cli_variables_and_options_win(tmp_path: Path) -> None:
    ca, other_ca = pem(tmp_path, "ca.pem"), pem(tmp_path, "other.pem")
    cert, key = pem(tmp_path, "c.pem"), pem(tmp_path, "c.key")
    env = {
        "TEMPORAL_TLS_SERVER_CA_CERT_PATH": str(ca),
        "TEMPORAL_TLS_CLIENT_CERT_PATH": str(cert),
        "TEMPORAL_TLS_CLIENT_KEY_PATH": str(key),
        "TEMPORAL_TLS_SERVER_NAME": "temporal.internal",
        "TEMPORAL_API_KEY": "k-env",
    }
    tls = TemporalTLS.from_env(env, tls_ca=other_ca, api_key="k-option")
    assert (tls.tls_ca, tls.tls_cert, tls.tls_key) == (other_ca, cert, key)
    assert tls.tls_server_name == "temporal.internal"
    kwargs = tls.connect_kwargs()
    assert kwargs["api_key"] == "k-option"
    assert kwargs["tls"].server_root_ca_cert == other_ca.read_bytes()
    assert kwargs["tls"].client_cert == cert.read_bytes()
    assert kwargs["tls"].domain == "temporal.internal"
    assert "k-option" not in tls.describe() and "k-option" not in repr(tls)


def test_an_api_key_alone_means_tls_with_the_system_cas() -> None:
    tls = TemporalTLS.from_env({"TEMPORAL_API_KEY": "k"})
    kwargs = tls.connect_kwargs()
    assert kwargs["api_key"] == "k"
    assert kwargs["tls"].server_root_ca_cert is None
    assert tls.describe() == "TLS with system CAs, API key"


def test_a_client_cert_needs_its_key(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="tls_cert and tls_key go together"):
        TemporalTLS(tls_cert=pem(tmp_path, "c.pem"))


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match=r"tls_ca: no such file: .*nope\.pem"):
        TemporalTLS.from_env({"TEMPORAL_TLS_SERVER_CA_CERT_PATH": str(tmp_path / "nope.pem")})


def test_the_cli_turns_a_bad_combination_into_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(typer.BadParameter, match=r"^tls_cert and tls_key go together"):
        tls_settings(False, None, pem(tmp_path, "c.pem"), None, None, None)


def test_an_unknown_issuer_names_the_ca_option(tmp_path: Path) -> None:
    ca = pem(tmp_path, "ca.pem")
    raw = RuntimeError("Failed client connect: … InvalidCertificate(UnknownIssuer) …")
    text = connect_failure("temporal:7233", TemporalTLS(tls_ca=ca), raw)
    assert text.startswith(
        f"cannot connect to Temporal at temporal:7233 with TLS with CA {ca}: the server's "
        f"TLS certificate is not signed by the CA in {ca} (--temporal-tls-ca / "
        "TEMPORAL_TLS_SERVER_CA_CERT_PATH). Cause: Failed client connect"
    )


def test_a_reset_right_after_the_handshake_asks_for_a_client_certificate(tmp_path: Path) -> None:
    """An mTLS server refuses a client without a cert after the TLS 1.3 handshake: the
    client sees its alert (close_notify / UnexpectedEof) or, when the reset or the close
    wins, a reset, a broken pipe or a cancelled call on a closed connection."""
    tls = TemporalTLS(tls_ca=pem(tmp_path, "ca.pem"))
    for raw in (
        "Failed client connect: `get_system_info` call error after connection: Status { "
        'code: Unknown, message: "transport error", source: Some(tonic::transport::Error('
        "Transport, hyper::Error(Io, Kind(ConnectionReset)))) }",
        "Failed client connect: … peer closed connection without sending TLS close_notify",
        "Failed client connect: `get_system_info` call error after connection: Status { "
        'code: Unknown, message: "transport error", source: Some(tonic::transport::Error('
        'Transport, hyper::Error(Io, Custom { kind: BrokenPipe, error: "stream closed '
        'because of a broken pipe" }))) }',
        "Failed client connect: `get_system_info` call error after connection: Status { "
        'code: Cancelled, message: "operation was canceled", source: Some(tonic::transport::'
        'Error(Transport, hyper::Error(Canceled, "connection closed"))) }',
    ):
        text = connect_failure("temporal:7233", tls, RuntimeError(raw))
        assert "it wants a client certificate it trusts" in text, text
    refused = connect_failure(
        "temporal:7233", tls, RuntimeError("tcp connect error: ConnectionReset")
    )
    assert "client certificate" not in refused
