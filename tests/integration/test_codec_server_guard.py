"""`rollout codec-server` guards the payload key: a token, the Host header, the Origin.

Real parts: the `rollout codec-server` command as its own process, on a free loopback
port, called over HTTP. Each refusal has its control: the same request with the one
thing fixed is answered, so a refusal is about that thing and not a broken server.
"""

from __future__ import annotations

import asyncio
import base64
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from google.protobuf import json_format
from temporalio.api.common.v1 import Payload, Payloads

from devstack.ports import free_port
from rollout_client.codec import EncryptionCodec, new_key, parse_key
from workers.codec_server import COOKIE

UI = "http://127.0.0.1:8233"
ROLLOUT = shutil.which("rollout") or str(Path(sys.executable).parent / "rollout")


@dataclass
class Server:
    url: str
    token: str
    key: bytes


def _run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [ROLLOUT, "codec-server", *args], env=env, capture_output=True, text=True, timeout=60
    )


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("codec")
    (d / "payload.key").write_text(new_key() + "\n")
    (d / "codec.token").write_text(new_key() + "\n")
    return d / "payload.key", d / "codec.token"


@pytest.fixture(scope="module")
def server(files: tuple[Path, Path]) -> Iterator[Server]:
    key_file, token_file = files
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROLLOUT_")}
    args = ["--payload-key-file", str(key_file), "--token-file", str(token_file)]
    args += ["--port", str(port), "--ui-origin", UI]
    proc = subprocess.Popen([ROLLOUT, "codec-server", *args], env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, "codec server exited"
            try:
                httpx.get(f"{url}/login", timeout=1)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "codec server did not start"
                time.sleep(0.1)
        key = parse_key(key_file.read_text())
        yield Server(url, token_file.read_text().strip(), key)
    finally:
        proc.terminate()
        proc.wait(10)


def _sealed_body(key: bytes) -> dict[str, object]:
    plain = Payload(metadata={"encoding": b"json/plain"}, data=b'{"secret": 1}')
    sealed = asyncio.run(EncryptionCodec([key]).encode([plain]))
    return json_format.MessageToDict(Payloads(payloads=sealed))


def _decoded_data(reply: httpx.Response) -> bytes:
    assert reply.status_code == 200, reply.text
    return base64.b64decode(reply.json()["payloads"][0]["data"])


def test_refuses_to_start_without_a_token(files: tuple[Path, Path]) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROLLOUT_")}
    key = ["--payload-key-file", str(files[0]), "--port", str(free_port())]
    missing = _run(key, env)
    assert missing.returncode != 0 and "--token-file" in missing.stderr
    wide = _run([*key, "--insecure-no-token", "--host", "0.0.0.0"], env)
    assert wide.returncode != 0 and "loopback" in wide.stderr


def test_token_required_and_right_token_decodes(server: Server) -> None:
    body = _sealed_body(server.key)
    assert httpx.post(f"{server.url}/decode", json=body).status_code == 401
    wrong = {"Authorization": "Bearer not-the-token"}
    assert httpx.post(f"{server.url}/decode", json=body, headers=wrong).status_code == 401
    right = {"Authorization": f"Bearer {server.token}"}
    reply = httpx.post(f"{server.url}/decode", json=body, headers=right)
    assert _decoded_data(reply) == b'{"secret": 1}'


def test_foreign_host_refused_even_with_the_token(server: Server) -> None:
    """DNS rebinding: a page on attacker.example whose name now resolves to loopback
    sends `Host: attacker.example`; the same request by a loopback name is answered."""
    body, auth = _sealed_body(server.key), f"Bearer {server.token}"
    port = server.url.rsplit(":", 1)[1]
    rebound = {"Authorization": auth, "Host": f"attacker.example:{port}"}
    refused = httpx.post(f"{server.url}/decode", json=body, headers=rebound)
    assert refused.status_code == 421, refused.text
    control = {"Authorization": auth, "Host": f"localhost:{port}"}
    assert _decoded_data(httpx.post(f"{server.url}/decode", json=body, headers=control))


def test_temporal_ui_signs_in_once_and_decodes_cross_origin(server: Server) -> None:
    """What the UI does with "include cross-origin credentials": a CORS preflight, then a
    POST with the cookie this server's /login page set. Another origin is refused."""
    preflight = httpx.options(
        f"{server.url}/decode",
        headers={
            "Origin": UI,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "content-type,x-namespace",
        },
    )
    assert preflight.status_code == 200
    assert preflight.headers["access-control-allow-origin"] == UI
    assert preflight.headers["access-control-allow-credentials"] == "true"

    with httpx.Client(base_url=server.url) as browser:
        bad = browser.post("/login", data={"token": "guess"}, headers={"Origin": server.url})
        assert bad.status_code == 401 and COOKIE not in browser.cookies
        good = browser.post("/login", data={"token": server.token}, headers={"Origin": server.url})
        assert good.status_code == 200 and COOKIE in browser.cookies
        assert browser.cookies[COOKIE] != server.token  # derived, not the token itself
        body = _sealed_body(server.key)
        reply = browser.post("/decode", json=body, headers={"Origin": UI, "X-Namespace": "default"})
        assert _decoded_data(reply) == b'{"secret": 1}'
        assert reply.headers["access-control-allow-origin"] == UI
        cross = browser.post("/decode", json=body, headers={"Origin": "http://127.0.0.1:9999"})
        assert cross.status_code == 403
    # Without the cookie the UI's call is refused like any other.
    alone = httpx.post(f"{server.url}/decode", json=body, headers={"Origin": UI})
    assert alone.status_code == 401
