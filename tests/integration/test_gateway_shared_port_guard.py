"""The shared port (`OwnerForwarder`) is not a proxy: a request target that names another
authority, or a token with a wrong secret, is refused there in the caller's protocol, and
nothing reaches any other address — nor the session's owner.

Raw sockets send the targets (the SDKs cannot). Traps are real listeners on loopback
(127.0.0.2 and a second 127.0.0.1 port) that record every connection; each attack has a
control that shows where the concatenating relay (`owner + raw_path`) would have sent it.
The owner is a real Gateway over the scripted engine (a FAKE LLM), the relaying process a
second Gateway core on the same data dir behind the forwarder, as `--shared-port` runs them.
"""

import json
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from devstack.background_server import BackgroundServer
from devstack.scripted_engine import Script, ScriptedEngine
from gateway.http.app import GatewayApp, error_responder_for
from gateway.http.owner_forwarding import OwnerForwarder
from schemas.session import SessionConfig
from workers.gateway_server import GatewaySettings, build_gateway, http_protocol
from workers.local_stack import InProcessGateway, start_gateway

pytestmark = pytest.mark.integration

MAX_BODY = 64 * 1024
CHAT = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()
MESSAGES = json.dumps(
    {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
).encode()


@dataclass
class Trap:
    """A loopback listener that records the head of every connection and answers 200."""

    host: str
    sock: socket.socket = field(init=False)
    hits: list[bytes] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.sock = socket.create_server((self.host, 0))
        threading.Thread(target=self._serve, daemon=True).start()

    @property
    def port(self) -> int:
        return int(self.sock.getsockname()[1])

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return  # closed
            with conn:
                conn.settimeout(10)
                head = b""
                while b"\r\n\r\n" not in head and (chunk := conn.recv(65536)):
                    head += chunk
                self.hits.append(head)
                conn.sendall(
                    b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\nConnection: close\r\n\r\ntrap"
                )

    def close(self) -> None:
        self.sock.close()


@dataclass
class Stack:
    owner: InProcessGateway
    forwarder: OwnerForwarder
    shared: BackgroundServer
    #: A session of `owner` (relayed by the shared port).
    session: dict[str, Any]
    #: A session whose owner is `owner_trap` (its meta names the trap's address).
    trapped_session: str
    owner_trap: Trap
    other_host: Trap


@pytest.fixture(scope="module")
def stack(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    engine = ScriptedEngine(tiny_model_dir / "tokenizer.json", Script(default_reply="ok"))
    data_dir = tmp_path_factory.mktemp("shared-guard")
    owner_trap, other_host = Trap("127.0.0.1"), Trap("127.0.0.2")
    with BackgroundServer(engine.app()) as engine_server:
        owner = start_gateway(engine_server.url, tiny_model_dir, data_dir, "tiny-qwen3")

        def core(public_url: str) -> tuple[GatewaySettings, Any]:
            settings = GatewaySettings(
                engine_urls=[engine_server.url],
                model="tiny-qwen3",
                tokenizer=tiny_model_dir,
                data_dir=data_dir,
                public_url=public_url,
                admin_token=owner.admin_token,
                max_body_bytes=MAX_BODY,
                tokenize_offload_chars=0,
            )
            return settings, build_gateway(settings)

        settings, relaying = core("http://127.0.0.1:9")  # owns nothing: every session relays
        _, trap_core = core(owner_trap.url)
        created, _ = trap_core.create_session(SessionConfig(rollout_id="r-trapped"))
        agent = GatewayApp(relaying, owner.admin_token, MAX_BODY).build("agent")
        forwarder = OwnerForwarder(agent, relaying, error_responder_for, MAX_BODY)
        try:
            with BackgroundServer(forwarder, http=http_protocol(settings, relaying.metrics)) as sh:
                yield Stack(
                    owner,
                    forwarder,
                    sh,
                    owner.create_session(),
                    created.token,
                    owner_trap,
                    other_host,
                )
        finally:
            owner.server.stop()
            owner_trap.close()
            other_host.close()


def raw_post(server: BackgroundServer, target: str, auth: str, body: bytes) -> tuple[int, bytes]:
    """One HTTP/1.1 POST with `target` sent as is; the reply's status and body."""
    head = (
        f"POST {target} HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n{auth}\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode()
    with socket.create_connection((server.host, server.port), timeout=30) as sock:
        sock.sendall(head + body)
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
    status_line, _, rest = reply.partition(b"\r\n")
    return int(status_line.split()[1]), rest.partition(b"\r\n\r\n")[2]


def refused(server: BackgroundServer, target: str, auth: str, body: bytes) -> tuple[int, Any]:
    """`raw_post`, the reply's body read as the JSON error it must be."""
    status, reply = raw_post(server, target, auth, body)
    assert reply.startswith(b"{"), (status, reply)  # not some other server's answer
    return status, json.loads(reply)


def forwarded(stack: Stack) -> float:
    return stack.forwarder.forwarded._value.get()


def test_an_honest_call_on_the_shared_port_is_relayed_to_its_owner(stack: Stack) -> None:
    """The baseline the refusals below are measured against: a whole SDK call for a
    session owned elsewhere is relayed and answered by its owner."""
    before = forwarded(stack)
    client = openai.OpenAI(
        base_url=f"{stack.shared.url}/v1", api_key=stack.session["token"], max_retries=0
    )
    done = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert done.choices[0].message.content == "ok"
    assert forwarded(stack) == before + 1


def test_an_at_host_target_is_refused_and_reaches_no_other_address(stack: Stack) -> None:
    trap = stack.other_host
    target = f"@{trap.host}:{trap.port}/v1/chat/completions"
    before = forwarded(stack)
    status, body = refused(
        stack.shared, target, f"Authorization: Bearer {stack.session['token']}", CHAT
    )
    assert status == 400
    assert body["error"]["type"] == "invalid_request_error"  # OpenAI's shape
    assert "request target" in body["error"]["message"]
    assert trap.hits == [] and forwarded(stack) == before
    # Control: the concatenating relay would have sent this call, the agent's token in
    # it, to the trap — which records what reaches it.
    old = httpx.URL(stack.owner.url + target)
    assert (old.host, old.port) == (trap.host, trap.port)
    assert httpx.post(str(old), content=CHAT).text == "trap"
    assert len(trap.hits) == 1


def test_an_absolute_form_target_is_refused_in_the_callers_protocol(stack: Stack) -> None:
    trap = stack.other_host
    hits = len(trap.hits)
    target = f"{trap.url}/v1/messages"
    before = forwarded(stack)
    status, body = refused(stack.shared, target, f"x-api-key: {stack.session['token']}", MESSAGES)
    assert status == 400
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert len(trap.hits) == hits and forwarded(stack) == before
    # Control: the concatenating relay read the owner's port as `<port>http:` — a URL
    # httpx refuses, so the old relay crashed with a bare 500 for this target; the
    # target itself names the trap.
    with pytest.raises(httpx.InvalidURL, match="Invalid port"):
        httpx.URL(stack.owner.url + target)
    assert (httpx.URL(target).host, httpx.URL(target).port) == (trap.host, trap.port)


@pytest.mark.parametrize("target", ["//127.0.0.2/v1/chat/completions", "/v1\\chat", "/v1#x"])
def test_other_targets_that_are_not_a_plain_path_are_refused(stack: Stack, target: str) -> None:
    before = forwarded(stack)
    status, body = refused(
        stack.shared, target, f"Authorization: Bearer {stack.session['token']}", CHAT
    )
    assert status == 400 and body["error"]["type"] == "invalid_request_error"
    assert forwarded(stack) == before


def test_a_wrong_secret_gets_the_owners_401_without_contacting_the_owner(stack: Stack) -> None:
    trap = stack.owner_trap
    session_id = stack.trapped_session.partition(".")[0]
    forged = f"{session_id}.not-the-secret"
    status, body = refused(stack.shared, "/v1/chat/completions", f"x-api-key: {forged}", CHAT)
    assert status == 401
    assert trap.hits == []
    # As the owner would answer it: a real owner's reply to a wrong secret, same shape.
    owner_forged = f"{stack.session['session_id']}.not-the-secret"
    direct = httpx.post(
        f"{stack.owner.url}/v1/chat/completions",
        content=CHAT,
        headers={"Authorization": f"Bearer {owner_forged}", "Content-Type": "application/json"},
    )
    assert direct.status_code == 401 and direct.json() == body
    # Control: the same call with the session's real token is relayed to the address the
    # session's meta names (the trap), as every call with that session id was before.
    relayed = raw_post(
        stack.shared, "/v1/chat/completions", f"x-api-key: {stack.trapped_session}", CHAT
    )
    assert relayed == (200, b"trap")
    assert len(trap.hits) == 1 and trap.hits[0].startswith(b"POST /v1/chat/completions ")
