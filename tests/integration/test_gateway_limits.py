"""One agent cannot starve or fill the Gateway: each per-session limit and read deadline,
hit through the real Gateway over HTTP with the official openai and anthropic SDKs (raw
sockets for the slow clients), answers in the caller's protocol shape (OpenAI Chat
Completions, Responses, Anthropic Messages) naming its limit, is counted by that name, and
leaves the session working and its records as they were.

The engine is the scripted engine (a FAKE LLM: the limits are the Gateway's, whatever
samples), behind `RecordingProxy`, which can hold a call in flight.
"""

import hashlib
import json
import os
import secrets
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pydantic_core
import pytest

from devstack.background_server import BackgroundServer
from devstack.ports import consecutive_free_ports
from devstack.scripted_engine import Script, ScriptedEngine
from gateway.calls.pipeline import Gateway
from gateway.capture.store import CallEntry
from gateway.errors import LIMIT_HEADER
from gateway.http.app import GatewayApp, error_responder_for
from gateway.http.owner_forwarding import OwnerForwarder
from tests.fixtures.gateway import ForwardClock, RecordingProxy
from tests.integration.test_gateway_processes import wait_healthy
from workers.gateway_server import GatewaySettings, build_gateway, http_protocol
from workers.local_stack import InProcessGateway, start_gateway

pytestmark = pytest.mark.integration

MAX_BODY = 64 * 1024
READ_TIMEOUT_S = 2.0
"""Head and body deadlines of the Gateway under test: short, so a slow client's cut comes
soon; whole bodies from the SDKs arrive in milliseconds."""


@pytest.fixture(scope="module")
def proxied(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[RecordingProxy, InProcessGateway]]:
    engine = ScriptedEngine(
        tiny_model_dir / "tokenizer.json", Script(default_reply="Hello there."), model="tiny-qwen3"
    )
    with BackgroundServer(engine.app()) as engine_server:
        proxy = RecordingProxy(engine_server.url)
        with BackgroundServer(proxy.app()) as proxy_server:
            gw = start_gateway(
                proxy_server.url,
                tiny_model_dir,
                tmp_path_factory.mktemp("limits-gw"),
                "tiny-qwen3",
                max_body_bytes=MAX_BODY,
                header_timeout_s=READ_TIMEOUT_S,
                body_timeout_s=READ_TIMEOUT_S,
            )
            try:
                yield proxy, gw
            finally:
                proxy.release()
                gw.server.stop()


@pytest.fixture
def gw(proxied: tuple[RecordingProxy, InProcessGateway]) -> InProcessGateway:
    return proxied[1]


def refusals(gw: InProcessGateway, limit: str) -> float:
    value = gw.gateway.metrics.registry.get_sample_value(
        "rollout_gateway_limit_refusals_total", {"limit": limit}
    )
    return value or 0.0


def clients(session: dict[str, Any]) -> tuple[openai.OpenAI, anthropic.Anthropic]:
    token = session["token"]
    return (
        openai.OpenAI(base_url=session["openai_base_url"], api_key=token, max_retries=0),
        anthropic.Anthropic(base_url=session["anthropic_base_url"], api_key=token, max_retries=0),
    )


def each_protocol(session: dict[str, Any], text: str = "hi") -> dict[str, Callable[..., Any]]:
    """One call per protocol, through its official SDK; `extra_body` goes along."""
    oai, claude = clients(session)
    user = [{"role": "user", "content": text}]
    return {
        "chat": lambda **kw: oai.chat.completions.create(model="m", messages=user, **kw),
        "responses": lambda **kw: oai.responses.create(model="m", input=text, **kw),
        "messages": lambda **kw: claude.messages.create(
            model="m", max_tokens=16, messages=user, **kw
        ),
    }


def assert_refused(exc: BaseException, protocol: str, status: int, limit: str) -> None:
    """The SDK's error for `status`, in the protocol's shape, naming `limit`."""
    assert isinstance(exc, openai.APIStatusError | anthropic.APIStatusError), exc
    assert exc.status_code == status
    assert exc.response.headers[LIMIT_HEADER] == limit
    body = exc.response.json()
    if protocol == "messages":
        assert body["type"] == "error" and limit in body["error"]["message"]
        expected = {429: "rate_limit_error", 413: "request_too_large", 408: "invalid_request_error"}
        assert body["error"]["type"] == expected[status]
    else:
        assert limit in body["error"]["message"]
        assert body["error"]["code"] == {429: "rate_limited", 413: "too_large"}[status]


def calls_of(gw: InProcessGateway, session: dict[str, Any]) -> list[dict[str, Any]]:
    return list(gw.trajectory(session["session_id"])["calls"])


def wait_for(what: str, condition: Callable[[], bool], timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"gave up waiting for: {what}"
        time.sleep(0.02)


def test_a_call_past_max_concurrent_calls_is_a_429_in_each_protocol(
    proxied: tuple[RecordingProxy, InProcessGateway],
) -> None:
    proxy, gw = proxied
    session = gw.create_session(limits={"max_concurrent_calls": 1})
    live = gw.gateway.sessions[session["session_id"]]
    before = refusals(gw, "max_concurrent_calls")
    proxy.hold()
    with ThreadPoolExecutor(1) as pool:
        held = pool.submit(each_protocol(session, "the held call")["chat"])
        wait_for("the held call in flight", lambda: bool(proxy.exchanges) and live.inflight == 1)
        for protocol, ask in each_protocol(session).items():
            with pytest.raises((openai.RateLimitError, anthropic.RateLimitError)) as refused:
                ask()
            assert_refused(refused.value, protocol, 429, "max_concurrent_calls")
            assert refused.value.response.headers["retry-after"] == "1"
        oai, _ = clients(session)
        with pytest.raises(openai.RateLimitError) as refused_stream:
            oai.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "s"}], stream=True
            )
        assert_refused(refused_stream.value, "chat", 429, "max_concurrent_calls")
        assert calls_of(gw, session) == [], "nothing recorded for a refusal"
        proxy.release()
        assert held.result(timeout=120).choices[0].message.content
    for ask in each_protocol(session, "after").values():
        ask()  # the session works again once its call finished
    assert [c["status"] for c in calls_of(gw, session)] == ["ok"] * 4
    assert refusals(gw, "max_concurrent_calls") == before + 4
    assert live.inflight == 0
    assert gw.trajectory(session["session_id"])["limit_refusals"] == {"max_concurrent_calls": 4}


def test_a_request_past_max_body_bytes_is_a_413_in_each_protocol(gw: InProcessGateway) -> None:
    session = gw.create_session()
    each_protocol(session)["chat"]()
    recorded = calls_of(gw, session)
    before = refusals(gw, "max_body_bytes")
    for protocol, ask in each_protocol(session).items():
        with pytest.raises((openai.APIStatusError, anthropic.APIStatusError)) as refused:
            ask(extra_body={"padding": "x" * MAX_BODY})
        assert_refused(refused.value, protocol, 413, "max_body_bytes")
    assert calls_of(gw, session) == recorded
    assert refusals(gw, "max_body_bytes") == before + 3
    each_protocol(session)["messages"]()
    assert len(calls_of(gw, session)) == 2
    assert gw.trajectory(session["session_id"])["limit_refusals"] == {"max_body_bytes": 3}


def test_a_session_whose_records_are_full_gets_a_413_in_each_protocol_and_keeps_them(
    gw: InProcessGateway,
) -> None:
    """Its records hold one call and room for a small one more: a request that would not
    fit is refused in every protocol, and a small one is still served."""
    probe = gw.create_session()
    each_protocol(probe)["chat"]()
    one_call = gw.gateway.store.records_size(probe["session_id"])
    session = gw.create_session(limits={"max_stored_bytes": one_call + 8000})
    each_protocol(session)["chat"]()
    recorded = calls_of(gw, session)
    before = refusals(gw, "max_stored_bytes")
    for protocol, ask in each_protocol(session).items():
        with pytest.raises((openai.APIStatusError, anthropic.APIStatusError)) as refused:
            ask(extra_body={"padding": "x" * 20_000})  # under max_body_bytes, over the room
        assert_refused(refused.value, protocol, 413, "max_stored_bytes")
    assert calls_of(gw, session) == recorded
    assert refusals(gw, "max_stored_bytes") == before + 3
    each_protocol(session, "a small one")["messages"]()
    assert len(calls_of(gw, session)) == 2
    trajectory = gw.trajectory(session["session_id"])
    assert trajectory["limit_refusals"] == {"max_stored_bytes": 3}
    assert gw.trajectory(probe["session_id"])["limit_refusals"] == {}, "counted per session"


def test_a_raw_request_past_max_stored_request_bytes_is_kept_cut_with_its_size_and_hash(
    gw: InProcessGateway,
) -> None:
    session = gw.create_session(limits={"max_stored_request_bytes": 400})
    truncated = gw.gateway.metrics.requests_stored_truncated
    before = truncated._value.get()
    sent: list[bytes] = []
    hook = httpx.Client(event_hooks={"request": [lambda r: sent.append(r.read())]})
    oai = openai.OpenAI(
        base_url=session["openai_base_url"], api_key=session["token"], http_client=hook
    )
    first = [{"role": "user", "content": "hi"}]
    reply = oai.chat.completions.create(model="m", messages=first, extra_body={"junk": "y" * 5000})
    again = [*first, {"role": "assistant", "content": reply.choices[0].message.content}]
    oai.chat.completions.create(model="m", messages=[*again, {"role": "user", "content": "more"}])
    records = [
        r for r in gw.gateway.store.load_records(session["session_id"]) if isinstance(r, CallEntry)
    ]
    cut, whole = records
    assert cut.request_omitted is not None and "junk" in cut.request_omitted.fields
    assert "junk" not in cut.request and cut.request["model"] == "m"
    assert len(pydantic_core.to_json(cut.request)) <= 400
    raw_json = pydantic_core.to_json(json.loads(sent[0]))
    assert cut.request_omitted.size_bytes == len(raw_json)
    assert cut.request_omitted.sha256 == hashlib.sha256(raw_json).hexdigest()
    assert whole.request_omitted is None, "a request within the cap is kept whole"
    assert truncated._value.get() == before + 1
    # The record keeps what the trajectory needs: the next call extended the held one.
    first_call, second_call = calls_of(gw, session)
    assert second_call["match"] != "fork"
    assert second_call["segment_id"] == first_call["segment_id"]


# --- bodies: capped and budgeted before they are read -------------------------------------

PATHS = {"chat": "/v1/chat/completions", "responses": "/v1/responses", "messages": "/v1/messages"}
SESSION_BODY = 20_000
"""The sessions' own `max_body_bytes` here: under the process's MAX_BODY, so it is the cap."""


def head(path: str, token: str, length: int | None) -> bytes:
    """A POST's head: `length` as Content-Length, or None: a chunked body."""
    size = f"Content-Length: {length}" if length is not None else "Transfer-Encoding: chunked"
    return (
        f"POST {path} HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
        f"x-api-key: {token}\r\n{size}\r\n\r\n"
    ).encode()


def read_reply(sock: socket.socket) -> bytes:
    """One whole reply with a Content-Length off a connection that stays open."""
    data = b""
    while True:
        _, ended, rest = data.partition(b"\r\n\r\n")
        if ended and len(rest) >= int(reply_of(data, body=False)[1]["content-length"]):
            return data
        chunk = sock.recv(65536)
        assert chunk, f"the connection closed mid-reply: {data!r}"
        data += chunk


def reply_of(raw: bytes, body: bool = True) -> tuple[int, dict[str, str], dict[str, Any]]:
    """(status, lower-cased headers, JSON body) of one HTTP/1.1 reply with a Content-Length."""
    head_bytes, _, rest = raw.partition(b"\r\n\r\n")
    status_line, *lines = head_bytes.decode().split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
    length = int(headers["content-length"])
    return int(status_line.split()[1]), headers, json.loads(rest[:length]) if body else {}


def assert_shape(protocol: str, status: int, body: dict[str, Any], *named: str) -> None:
    """The protocol's error shape for `status`, its message naming each of `named`."""
    if protocol == "messages":
        assert body["type"] == "error", body
        kinds = {413: "request_too_large", 429: "rate_limit_error", 401: "authentication_error"}
        assert body["error"]["type"] == kinds[status]
    else:
        codes = {413: "too_large", 429: "rate_limited", 401: "authentication"}
        assert body["error"]["code"] == codes[status], body
    for name in named:
        assert name in body["error"]["message"]


def padded(protocol: str, size: int) -> bytes:
    """A valid request of the protocol, padded to exactly `size` bytes of JSON."""
    user = [{"role": "user", "content": "hi"}]
    request: dict[str, Any] = {
        "chat": {"model": "m", "messages": user},
        "responses": {"model": "m", "input": "hi"},
        "messages": {"model": "m", "max_tokens": 16, "messages": user},
    }[protocol]
    bare = json.dumps({**request, "padding": ""}).encode()
    body = json.dumps({**request, "padding": "x" * (size - len(bare))}).encode()
    assert len(body) == size
    return body


@pytest.mark.parametrize("protocol", list(PATHS))
def test_a_content_length_past_the_sessions_cap_is_a_413_before_any_body_byte(
    gw: InProcessGateway, protocol: str
) -> None:
    """Only the head is sent: the 413 (in the protocol's shape, naming the limit, closing
    the connection) can only come from the head. The control: one byte under the cap, the
    same head waits for its body, which is then served."""
    session = gw.create_session(limits={"max_body_bytes": SESSION_BODY})
    before = refusals(gw, "max_body_bytes")
    with raw_connection(gw) as client:
        client.sendall(head(PATHS[protocol], session["token"], SESSION_BODY + 1))
        status, headers, body = reply_of(read_to_eof(client))
    assert status == 413 and headers[LIMIT_HEADER.lower()] == "max_body_bytes"
    assert headers["connection"] == "close"
    assert_shape(protocol, 413, body, f"max_body_bytes={SESSION_BODY}", str(SESSION_BODY + 1))
    assert refusals(gw, "max_body_bytes") == before + 1
    with raw_connection(gw) as client:
        client.sendall(head(PATHS[protocol], session["token"], SESSION_BODY))
        client.sendall(padded(protocol, SESSION_BODY))
        status, _, _ = reply_of(read_reply(client))
    assert status == 200
    trajectory = gw.trajectory(session["session_id"])
    assert [c["status"] for c in trajectory["calls"]] == ["ok"]
    assert trajectory["limit_refusals"] == {"max_body_bytes": 1}


def test_a_chunked_body_is_cut_with_a_413_as_soon_as_it_passes_the_cap(
    gw: InProcessGateway,
) -> None:
    """No end of the body is ever sent: the 413 comes once the bytes pass the cap. The
    control: a chunked body under the cap is read to its end and served."""
    session = gw.create_session(limits={"max_body_bytes": SESSION_BODY})
    body = padded("messages", SESSION_BODY)
    with raw_connection(gw) as client:
        client.sendall(head("/v1/messages", session["token"], None))
        for start in range(0, SESSION_BODY, 4096):
            piece = body[start : start + 4096]
            client.sendall(b"%x\r\n%s\r\n" % (len(piece), piece))
        client.sendall(b"1\r\n \r\n")  # one byte past the cap; no end follows
        status, headers, error = reply_of(until_cut(client))
    assert status == 413 and headers["connection"] == "close"
    assert_shape("messages", 413, error, f"max_body_bytes={SESSION_BODY}")
    with raw_connection(gw) as client:
        client.sendall(head("/v1/messages", session["token"], None))
        client.sendall(b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body))
        status, _, _ = reply_of(read_reply(client))
    assert status == 200
    assert [c["status"] for c in calls_of(gw, session)] == ["ok"]


@pytest.mark.parametrize("protocol", list(PATHS))
def test_a_bad_token_with_a_big_body_is_a_401_before_any_body_byte(
    gw: InProcessGateway, protocol: str
) -> None:
    """The session is authenticated from the head: a wrong secret declaring a body within
    the cap gets its 401, and the connection closed, before one byte of it is sent; the
    session's records and budget are untouched. The control: the right token with the
    same head has its body read and served."""
    session = gw.create_session()
    session_id = session["session_id"]
    with raw_connection(gw) as client:
        client.sendall(head(PATHS[protocol], f"{session_id}.wrong-secret", MAX_BODY))
        status, headers, body = reply_of(read_to_eof(client))
    assert status == 401 and headers["connection"] == "close"
    assert_shape(protocol, 401, body)
    assert gw.gateway.sessions[session_id].body_bytes == 0
    assert calls_of(gw, session) == []
    with raw_connection(gw) as client:
        client.sendall(head(PATHS[protocol], session["token"], MAX_BODY))
        client.sendall(padded(protocol, MAX_BODY))
        status, _, _ = reply_of(read_reply(client))
    assert status == 200
    assert [c["status"] for c in calls_of(gw, session)] == ["ok"]


def test_a_sessions_bodies_read_at_once_share_its_budget_and_one_past_it_is_a_429(
    gw: InProcessGateway,
) -> None:
    """A body of 15,000 bytes is on its way (its head and one byte sent): the session's
    budget of 20,000 has no room for a second body of 10,000 (429 naming the limit, in
    each protocol, with Retry-After, its body never read), room for a small one, and
    another session's budget is its own. Once the first body arrives, both are served,
    and every call served is recorded."""
    session = gw.create_session(limits={"max_body_bytes": SESSION_BODY})
    other = gw.create_session(limits={"max_body_bytes": SESSION_BODY})
    live = gw.gateway.sessions[session["session_id"]]
    first = padded("chat", 15_000)
    before = refusals(gw, "max_body_bytes")
    with raw_connection(gw) as slow:
        slow.sendall(head("/v1/chat/completions", session["token"], len(first)) + first[:1])
        wait_for("the first body reserved", lambda: live.body_bytes == len(first))
        for protocol, ask in each_protocol(session).items():
            with pytest.raises((openai.RateLimitError, anthropic.RateLimitError)) as refused:
                ask(extra_body={"padding": "x" * 10_000})
            assert_refused(refused.value, protocol, 429, "max_body_bytes")
            assert refused.value.response.headers["retry-after"] == "1"
            assert refused.value.response.headers["connection"] == "close"
        each_protocol(session, "a small one fits")["messages"]()
        each_protocol(other)["chat"](extra_body={"padding": "x" * 10_000})
        assert live.body_bytes == len(first)
        slow.sendall(first[1:])
        status, _, reply = reply_of(read_reply(slow))
    assert status == 200 and reply["choices"][0]["message"]["content"]
    assert live.body_bytes == 0
    each_protocol(session, "now it fits")["responses"](extra_body={"padding": "x" * 10_000})
    assert [c["status"] for c in calls_of(gw, session)] == ["ok"] * 3
    assert len(calls_of(gw, other)) == 1
    assert refusals(gw, "max_body_bytes") == before + 3
    assert gw.trajectory(session["session_id"])["limit_refusals"] == {"max_body_bytes": 3}


def test_a_session_sending_bodies_faster_than_its_rate_gets_a_429_until_the_bucket_refills(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """`session_body_bytes_per_s`: a session's bucket holds one body cap; once spent, the
    next body is a 429 before it is read (in each protocol, naming the limit, with the
    wait in Retry-After, nothing recorded), while another session sends as it likes; once
    the (injected) clock has passed the wait, the body is served."""
    engine = ScriptedEngine(tiny_model_dir / "tokenizer.json", Script(default_reply="ok"))
    clock = ForwardClock()
    with BackgroundServer(engine.app()) as engine_server:
        rated = start_gateway(
            engine_server.url,
            tiny_model_dir,
            tmp_path / "gw",
            "tiny-qwen3",
            clock=clock,
            session_max_body_bytes=SESSION_BODY,
            session_body_bytes_per_s=1000,
        )
        try:
            session, other = rated.create_session(), rated.create_session()
            pad = {"padding": "x" * (SESSION_BODY - 400)}
            each_protocol(session)["chat"](extra_body=pad)  # the whole bucket at once
            for protocol, ask in each_protocol(session).items():
                with pytest.raises((openai.RateLimitError, anthropic.RateLimitError)) as refused:
                    ask(extra_body=pad)
                assert_refused(refused.value, protocol, 429, "session_body_bytes_per_s")
                assert "session_body_bytes_per_s=1000" in refused.value.response.text
                assert int(refused.value.response.headers["retry-after"]) >= 1
            each_protocol(other)["messages"](extra_body=pad)
            each_protocol(other)["responses"]()  # its own bucket: still room
            clock.advance(SESSION_BODY / 1000)
            each_protocol(session)["messages"](extra_body=pad)
            assert [c["status"] for c in calls_of(rated, session)] == ["ok", "ok"]
            assert refusals(rated, "session_body_bytes_per_s") == 3
            limited = rated.trajectory(session["session_id"])["limit_refusals"]
            assert limited == {"session_body_bytes_per_s": 3}
        finally:
            rated.server.stop()


# --- slow clients ------------------------------------------------------------------------


def raw_connection(gw: InProcessGateway) -> socket.socket:
    host, port = gw.url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)))
    sock.settimeout(60)
    return sock


def read_to_eof(sock: socket.socket) -> bytes:
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def until_cut(sock: socket.socket) -> bytes:
    """What the server sent until it hung up. A client that keeps sending to a closed
    socket gets a reset, which may drop what was sent before it: the cut is what counts."""
    try:
        return read_to_eof(sock)
    except ConnectionResetError:
        return b""


def trickle(sock: socket.socket, stop: threading.Event) -> None:
    """One byte every half second until the server hangs up or `stop` is set."""
    while not stop.wait(0.5):
        try:
            sock.sendall(b"x")
        except OSError:
            return


def post_head(path: str, token: str) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
        f"Authorization: Bearer {token}\r\nContent-Length: 1000\r\n\r\n"
    ).encode()


def assert_408(reply: bytes, protocol: str) -> None:
    """A 408 in the protocol's shape that names `body_timeout_s` and closes."""
    status, _, rest = reply.partition(b"\r\n")
    headers, _, body = rest.partition(b"\r\n\r\n")
    assert status.startswith(b"HTTP/1.1 408"), reply
    assert b"connection: close" in headers.lower()
    assert f"{LIMIT_HEADER.lower()}: body_timeout_s".encode() in headers.lower()
    error = json.loads(body)
    if protocol == "messages":
        assert error["type"] == "error" and "body_timeout_s" in error["error"]["message"]
    else:
        assert error["error"]["code"] == "request_timeout"
        assert "body_timeout_s" in error["error"]["message"]


@pytest.mark.parametrize(
    ("path", "protocol"),
    [("/v1/chat/completions", "chat"), ("/v1/messages", "messages")],
)
def test_a_body_that_stops_coming_gets_a_408_in_its_protocol_and_the_listener_serves_others(
    gw: InProcessGateway, path: str, protocol: str
) -> None:
    session = gw.create_session()
    before = refusals(gw, "body_timeout_s")
    with raw_connection(gw) as slow:
        slow.sendall(post_head(path, session["token"]) + b'{"model": "m"')
        served = each_protocol(session)[protocol]()  # while the slow client holds on
        reply = read_to_eof(slow)
    assert_408(reply, protocol)
    assert served is not None and [c["status"] for c in calls_of(gw, session)] == ["ok"]
    assert refusals(gw, "body_timeout_s") == before + 1
    assert gw.trajectory(session["session_id"])["limit_refusals"] == {"body_timeout_s": 1}


def test_clients_trickling_a_head_or_a_body_are_cut_and_the_listener_serves_others(
    gw: InProcessGateway,
) -> None:
    """Bytes that keep coming do not put a deadline off: each slow client is cut (the head
    without a reply), while a whole call is served."""
    session = gw.create_session()
    before = refusals(gw, "header_timeout_s"), refusals(gw, "body_timeout_s")
    stop = threading.Event()
    with raw_connection(gw) as slow_head, raw_connection(gw) as slow_body:
        slow_head.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nX-A: ")
        slow_body.sendall(post_head("/v1/responses", session["token"]) + b'{"model": "m"')
        senders = [threading.Thread(target=trickle, args=(s, stop)) for s in (slow_head, slow_body)]
        for sender in senders:
            sender.start()
        each_protocol(session)["responses"]()  # while the slow clients hold on
        assert until_cut(slow_head) == b"", "a head is cut without a reply"
        until_cut(slow_body)
        stop.set()
        for sender in senders:
            sender.join()
    after = refusals(gw, "header_timeout_s"), refusals(gw, "body_timeout_s")
    assert after == (before[0] + 1, before[1] + 1)
    assert len(calls_of(gw, session)) == 1


@contextmanager
def relaying_process(
    gw: InProcessGateway, tiny_model_dir: Path
) -> Iterator[tuple[OwnerForwarder, Gateway, BackgroundServer]]:
    """A second gateway process on `gw`'s data dir serving the shared port's app
    (`OwnerForwarder`): every session of `gw` is relayed to it."""
    settings = GatewaySettings(
        engine_urls=gw.gateway.engine.urls,
        model="tiny-qwen3",
        tokenizer=tiny_model_dir,
        data_dir=gw.gateway.options.data_dir,
        public_url="http://127.0.0.1:9",  # not the owner: every session here is relayed
        admin_token=gw.admin_token,
        max_body_bytes=MAX_BODY,
        body_timeout_s=READ_TIMEOUT_S,
        tokenize_offload_chars=0,
    )
    relaying = build_gateway(settings)
    agent = GatewayApp(relaying, gw.admin_token, MAX_BODY).build("agent")
    forwarder = OwnerForwarder(agent, relaying, error_responder_for, MAX_BODY)
    with BackgroundServer(forwarder, http=http_protocol(settings, relaying.metrics)) as shared:
        yield forwarder, relaying, shared


def relayed_refusals(relaying: Gateway, limit: str) -> float | None:
    return relaying.metrics.registry.get_sample_value(
        "rollout_gateway_limit_refusals_total", {"limit": limit}
    )


def test_a_trickled_body_on_the_shared_port_gets_a_408_from_the_relaying_process(
    gw: InProcessGateway, tiny_model_dir: Path
) -> None:
    """The relaying process reads the body before relaying it, under the same deadline;
    a whole call it relays is served by the owner."""
    session = gw.create_session()
    with relaying_process(gw, tiny_model_dir) as (forwarder, relaying, shared):
        relayed = {**session, "anthropic_base_url": shared.url}
        with socket.create_connection((shared.host, shared.port)) as slow:
            slow.settimeout(60)
            slow.sendall(head("/v1/messages", session["token"], 1000) + b'{"model"')
            each_protocol(relayed)["messages"]()  # relayed to the owner meanwhile
            reply = read_to_eof(slow)
        assert_408(reply, "messages")
        assert forwarder.forwarded._value.get() == 1
        assert relayed_refusals(relaying, "body_timeout_s") == 1
    assert [c["status"] for c in calls_of(gw, session)] == ["ok"], "recorded by the owner"


def test_the_relaying_process_refuses_a_body_past_the_sessions_cap_before_reading_it(
    gw: InProcessGateway, tiny_model_dir: Path
) -> None:
    """The shared port applies the session's own body cap (its `limits`, under the
    process's): a Content-Length past it is a 413 in the protocol's shape, the connection
    closed, before one byte of the body is sent and without contacting the owner; a
    chunked body is cut once it passes the cap. The control: a body at the cap is relayed
    and served by the owner."""
    session = gw.create_session(limits={"max_body_bytes": SESSION_BODY})
    body = padded("chat", SESSION_BODY)
    with relaying_process(gw, tiny_model_dir) as (forwarder, relaying, shared):
        with socket.create_connection((shared.host, shared.port)) as client:
            client.settimeout(60)
            client.sendall(head("/v1/chat/completions", session["token"], SESSION_BODY + 1))
            status, headers, error = reply_of(read_to_eof(client))
        assert status == 413 and headers["connection"] == "close"
        assert headers[LIMIT_HEADER.lower()] == "max_body_bytes"
        assert_shape("chat", 413, error, f"max_body_bytes={SESSION_BODY}", str(SESSION_BODY + 1))
        with socket.create_connection((shared.host, shared.port)) as client:
            client.settimeout(60)
            client.sendall(head("/v1/chat/completions", session["token"], None))
            client.sendall(b"%x\r\n%s\r\n" % (len(body), body) + b"1\r\n \r\n")
            status, headers, error = reply_of(until_cut(client))
        assert status == 413 and headers["connection"] == "close"
        assert_shape("chat", 413, error, f"max_body_bytes={SESSION_BODY}")
        assert forwarder.forwarded._value.get() == 0
        assert relayed_refusals(relaying, "max_body_bytes") == 2
        with socket.create_connection((shared.host, shared.port)) as client:
            client.settimeout(60)
            client.sendall(head("/v1/chat/completions", session["token"], SESSION_BODY) + body)
            status, _, reply = reply_of(read_reply(client))
        assert status == 200 and reply["choices"][0]["message"]["content"]
        assert forwarder.forwarded._value.get() == 1
    assert [c["status"] for c in calls_of(gw, session)] == ["ok"], "recorded by the owner"


def test_the_demos_in_process_gateway_cuts_a_trickled_head_on_both_listeners(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """`rollout demo` (and the benches) serve the Gateway in a thread of their own process
    (`workers.local_stack.start_gateway`): its agent and control listeners cut a client that
    trickles its head, as `rollout gateway`'s do, and serve whole requests meanwhile.
    Without the deadlines uvicorn keeps such a client open (the control in
    tests/unit/test_gateway_limits.py), and `read_to_eof` would time out here."""
    engine = ScriptedEngine(tiny_model_dir / "tokenizer.json", Script(default_reply="ok"))
    with BackgroundServer(engine.app()) as engine_server:
        gateway = start_gateway(
            engine_server.url,
            tiny_model_dir,
            tmp_path / "gw",
            "tiny-qwen3",
            header_timeout_s=READ_TIMEOUT_S,
            tokenize_offload_chars=0,
        )
        server, control_url, admin = gateway.server, gateway.control_url, gateway.admin_token
        try:
            for url in (server.url, control_url):
                host, port = url.removeprefix("http://").split(":")
                with socket.create_connection((host, int(port))) as slow:
                    slow.settimeout(60)
                    slow.sendall(b"GET /health HTTP/1.1\r\nHost: gw\r\nX-Slow: ")
                    health = httpx.get(f"{control_url}/health")  # served meanwhile
                    assert until_cut(slow) == b"", f"{url}: a head is cut without a reply"
                assert health.status_code == 200
            session = httpx.post(
                f"{control_url}/sessions",
                json={"rollout_id": "r-demo"},
                headers={"Authorization": f"Bearer {admin}"},
            ).json()
            assert each_protocol(session)["chat"]().choices[0].message.content == "ok"
        finally:
            server.stop()


def test_rollout_gateway_flags_set_the_limits(tiny_model_dir: Path, tmp_path: Path) -> None:
    """The flags reach the serving process: the body cap and the head deadline, and the
    session defaults, which a session's own `limits` override (its body cap up to the
    process's)."""
    engine = ScriptedEngine(tiny_model_dir / "tokenizer.json", Script(default_reply="ok"))
    admin = secrets.token_urlsafe(12)
    with BackgroundServer(engine.app()) as engine_server:
        port = consecutive_free_ports(2)
        cmd = [
            sys.executable, "-m", "workers.cli", "gateway",
            "--engine", engine_server.url, "--model", "tiny-qwen3",
            "--tokenizer", str(tiny_model_dir), "--port", str(port),
            "--control-port", str(port + 1), "--data-dir", str(tmp_path / "gw"),
            "--tokenize-offload-chars", "0",
            "--max-body-bytes", "20000", "--header-timeout-s", "1", "--body-timeout-s", "30",
            "--session-max-concurrent-calls", "3", "--session-max-stored-request-bytes", "0",
            "--session-max-stored-bytes", "1", "--session-max-body-bytes", "15000",
        ]  # fmt: skip
        proc = subprocess.Popen(cmd, env=dict(os.environ, ROLLOUT_ADMIN_TOKEN=admin))
        try:
            control = f"http://127.0.0.1:{port + 1}"
            wait_healthy(control, proc)
            auth = {"Authorization": f"Bearer {admin}"}

            def create(**config: Any) -> dict[str, Any]:
                reply = httpx.post(
                    f"{control}/sessions", json={"rollout_id": "r", **config}, headers=auth
                )
                assert reply.status_code == 201, reply.text
                return dict(reply.json())

            default = create()
            own = create(limits={"max_stored_bytes": 10**9, "max_body_bytes": 10**6})
            with pytest.raises(openai.APIStatusError) as full:
                each_protocol(default)["chat"]()
            assert "max_stored_bytes=1;" in full.value.response.json()["error"]["message"]
            with pytest.raises(openai.APIStatusError) as session_cap:
                each_protocol(default)["chat"](extra_body={"padding": "x" * 16_000})
            message = session_cap.value.response.json()["error"]["message"]
            assert "max_body_bytes=15000" in message, "the session default"
            each_protocol(own)["chat"]()  # its own limit has room
            with pytest.raises(openai.APIStatusError) as big:
                each_protocol(own)["chat"](extra_body={"padding": "x" * 20_000})
            message = big.value.response.json()["error"]["message"]
            assert "max_body_bytes=20000" in message, "a session's own, under the process's"
            with socket.create_connection(("127.0.0.1", port)) as silent:
                silent.settimeout(60)
                assert read_to_eof(silent) == b"", "cut by the 1 s head deadline"
            records = tmp_path / "gw" / "sessions" / own["session_id"] / "records.jsonl"
            entry = json.loads(records.read_text().splitlines()[-1])
            assert entry["request"] == {} and "messages" in entry["request_omitted"]["fields"]
        finally:
            proc.terminate()
            assert proc.wait(timeout=30) is not None
