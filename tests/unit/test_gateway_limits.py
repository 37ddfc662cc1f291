"""Per-session limits and read deadlines, piece by piece: how a session's limits are
resolved, the call slots, the room check, a raw request cut to its cap, the refusals'
protocol shapes, and the connection deadlines against a real uvicorn server on loopback
(a raw socket plays the slow client). The whole Gateway under each limit, with the
official SDKs, is `tests/integration/test_gateway_limits.py`."""

from __future__ import annotations

import hashlib
import json
import socket
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pydantic_core
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from devstack.background_server import BackgroundServer
from gateway.capture.recording import StoredRequest
from gateway.capture.store import SessionMeta
from gateway.errors import LIMIT_HEADER, GatewayError, body_timed_out
from gateway.http.read_deadlines import MAX_HEAD_BYTES, deadline_protocol
from gateway.options import GatewayOptions
from gateway.protocols.anthropic_messages.reply import anthropic_error_response
from gateway.protocols.opaque_token import TokenSeal
from gateway.protocols.openai_chat.reply import openai_error_response
from gateway.sessions.limits import Limits, body_budget, call_slot, check_room, limits_of
from gateway.sessions.live import LiveSession
from schemas.session import SessionConfig, SessionLimits


def options(**kw: Any) -> GatewayOptions:
    return GatewayOptions(
        model_name="m", public_url="http://x", data_dir="/nonexistent", context_window=64, **kw
    )


def live(limits: SessionLimits | None = None) -> LiveSession:
    config = SessionConfig(rollout_id="r", limits=limits or SessionLimits())
    meta = SessionMeta(
        session_id="s1",
        config=config,
        token_sha256="0",
        engine_url="http://e",
        prompt_template_version="t",
        created_at=datetime.now(UTC),
    )
    return LiveSession(meta, 0.0, TokenSeal.for_session(b"test-secret", "s1"))


# --- resolving and enforcing -------------------------------------------------------------


def test_a_session_takes_its_own_limits_and_the_process_defaults_for_the_rest() -> None:
    opts = options(
        session_max_concurrent_calls=3,
        session_max_stored_request_bytes=100,
        session_max_stored_bytes=1000,
        session_max_body_bytes=5000,
    )
    assert limits_of(SessionConfig(rollout_id="r"), opts) == Limits(3, 100, 1000, 5000)
    own = SessionConfig(
        rollout_id="r",
        limits=SessionLimits(
            max_concurrent_calls=50, max_stored_request_bytes=0, max_body_bytes=70
        ),
    )
    assert limits_of(own, opts) == Limits(50, 0, 1000, 70)  # 0 is a limit, not "unset"


def test_a_call_past_the_sessions_slots_is_a_429_naming_the_limit_and_slots_come_back() -> None:
    session = live()
    limits = Limits(2, max_stored_request_bytes=0, max_stored_bytes=1, max_body_bytes=1)
    with call_slot(session, limits), call_slot(session, limits):
        with pytest.raises(GatewayError) as refused, call_slot(session, limits):
            pass
        assert session.inflight == 2
    err = refused.value
    assert (err.status, err.kind, err.limit) == (429, "rate_limited", "max_concurrent_calls")
    assert "max_concurrent_calls=2" in err.message and err.retry_after
    assert session.inflight == 0
    with pytest.raises(RuntimeError), call_slot(session, limits):
        raise RuntimeError("a call that fails gives its slot back")
    assert session.inflight == 0


def test_bodies_read_at_once_share_the_sessions_budget_and_give_it_back() -> None:
    """Declared sizes are reserved whole; a chunked body reserves what has come so far;
    one byte past the budget is a 429 naming `max_body_bytes`, and nothing stays held."""
    session, other = live(), live()
    with body_budget(session, 100) as first:
        first(60)  # a Content-Length
        first(60)  # its bytes as they come: no more than declared
        with body_budget(session, 100) as chunked:
            chunked(30)
            chunked(40)  # 60 + 40: exactly full
            assert session.body_bytes == 100
            with pytest.raises(GatewayError) as refused, body_budget(session, 100) as third:
                third(1)
            assert session.body_bytes == 100, "a refused body holds nothing"
            with body_budget(other, 100) as elsewhere:
                elsewhere(100)  # another session's budget is its own
        assert session.body_bytes == 60
    assert session.body_bytes == 0 and other.body_bytes == 0
    err = refused.value
    assert (err.status, err.kind, err.limit) == (429, "rate_limited", "max_body_bytes")
    assert "max_body_bytes=100" in err.message and err.retry_after == 1.0
    with pytest.raises(RuntimeError), body_budget(session, 100) as failing:
        failing(80)
        raise RuntimeError("a body that fails to parse gives its bytes back")
    assert session.body_bytes == 0


class Clock:
    """Time that the test moves."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_sessions_body_bytes_are_bounded_per_second_in_bursts_of_its_cap() -> None:
    """The bucket starts full (one cap's worth at once), refills at `per_s` up to the cap
    (or one second's worth, if more),
    and a body past what it holds is a 429 naming `session_body_bytes_per_s` with the
    wait until it fits; a refused body spends nothing, another session's bucket is its
    own, and with no rate (0) nothing is refused."""
    session, other, clock = live(), live(), Clock()

    def send(who: LiveSession, size: int, per_s: int = 10) -> None:
        with body_budget(who, 100, per_s, clock) as take:
            take(size)

    send(session, 100)  # a whole burst at once
    with pytest.raises(GatewayError) as refused:
        send(session, 30)
    err = refused.value
    assert (err.status, err.kind, err.limit) == (429, "rate_limited", "session_body_bytes_per_s")
    assert "session_body_bytes_per_s=10" in err.message and err.retry_after == 3.0
    assert err.headers()["Retry-After"] == "3"
    send(other, 100)
    clock.now = 1002.5
    with pytest.raises(GatewayError):
        send(session, 30)  # 25 bytes refilled: not yet
    clock.now = 1003.0
    send(session, 30)  # now it fits, and the bucket is empty again
    with pytest.raises(GatewayError):
        send(session, 1)
    clock.now += 1000
    send(session, 100)  # refilled to the cap, no more
    with pytest.raises(GatewayError):
        send(session, 1)
    for _ in range(3):
        send(session, 100, per_s=0)
    clock.now += 1000
    for _ in range(10):  # a rate past the cap: bursts of one second's worth
        send(other, 100, per_s=1000)
    with pytest.raises(GatewayError):
        send(other, 100, per_s=1000)
    assert session.body_bytes == 0


def test_a_request_the_sessions_records_have_no_room_for_is_a_413() -> None:
    limits = Limits(1, max_stored_request_bytes=0, max_stored_bytes=100, max_body_bytes=1)
    check_room("s1", 60, 40, limits)  # exactly full still fits
    with pytest.raises(GatewayError) as refused:
        check_room("s1", 60, 41, limits)
    err = refused.value
    assert (err.status, err.kind, err.limit) == (413, "too_large", "max_stored_bytes")
    assert "max_stored_bytes=100" in err.message


# --- the raw request a record keeps ------------------------------------------------------


def test_a_raw_request_within_its_cap_is_kept_whole() -> None:
    raw = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    stored = StoredRequest.of(raw, {"n": 1}, cap=10_000)
    assert stored.raw == raw and stored.omitted is None
    assert stored.size_bytes == len(pydantic_core.to_json(raw)) + len(b'{"n":1}')


def test_a_raw_request_past_its_cap_keeps_its_smallest_fields_and_counts_the_rest() -> None:
    raw = {
        "model": "m",
        "messages": [{"role": "user", "content": "x" * 500}],
        "junk": "y" * 5000,
        "stream": False,
    }
    whole = pydantic_core.to_json(raw)
    stored = StoredRequest.of(raw, {}, cap=600)
    assert list(stored.raw) == ["model", "messages", "stream"]  # original order
    assert len(pydantic_core.to_json(stored.raw)) <= 600
    assert stored.omitted is not None
    assert stored.omitted.fields == ["junk"]
    assert stored.omitted.size_bytes == len(whole)
    assert stored.omitted.sha256 == hashlib.sha256(whole).hexdigest()
    assert stored.size_bytes == len(pydantic_core.to_json(stored.raw)) + 2
    tight = StoredRequest.of(raw, {}, cap=30)
    assert list(tight.raw) == ["model", "stream"]
    assert StoredRequest.of(raw, {}, cap=0).raw == {}


# --- refusals in each protocol's shape ---------------------------------------------------


def test_limit_refusals_name_their_limit_in_both_error_shapes() -> None:
    slots = GatewayError("rate_limited", "too many", retry_after=1.0, limit="max_concurrent_calls")
    openai = openai_error_response(slots)
    assert openai.status_code == 429
    assert openai.headers[LIMIT_HEADER] == "max_concurrent_calls"
    assert openai.headers["retry-after"] == "1"
    assert b'"type":"rate_limit_error"' in openai.body and b'"code":"rate_limited"' in openai.body
    anthropic = anthropic_error_response(slots)
    assert anthropic.status_code == 429 and b'"type":"rate_limit_error"' in anthropic.body
    late = body_timed_out(2.0, 17)
    for response in (openai_error_response(late), anthropic_error_response(late)):
        assert response.status_code == 408
        assert response.headers["connection"] == "close"
        assert response.headers[LIMIT_HEADER] == "body_timeout_s"
        assert b"body_timeout_s=2" in response.body


# --- read deadlines at the connection ----------------------------------------------------


class Cuts:
    def __init__(self) -> None:
        self.names: list[str] = []
        self.event = threading.Event()

    def __call__(self, name: str) -> None:
        self.names.append(name)
        self.event.set()


async def early(request: Request) -> JSONResponse:
    """Answers without reading the body (as an early 401 does)."""
    return JSONResponse({"ok": True})


@pytest.fixture
def served() -> Iterator[tuple[BackgroundServer, Cuts]]:
    cuts = Cuts()
    app = Starlette(routes=[Route("/", early, methods=["GET", "POST"])])
    http = deadline_protocol(0.3, 0.3, cuts, body_grace_s=0.0)
    with BackgroundServer(app, http=http) as server:
        yield server, cuts


def connect(server: BackgroundServer) -> socket.socket:
    sock = socket.create_connection((server.host, server.port))
    sock.settimeout(30)
    return sock


def read_to_eof(sock: socket.socket) -> bytes:
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


GET = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"


def read_response(sock: socket.socket) -> bytes:
    """One whole response (head and its Content-Length body), however it was split."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"closed after {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, f"closed after {head!r} and {body!r}"
        body += chunk
    return head + b"\r\n\r\n" + body


def test_a_request_head_that_stops_coming_is_cut_and_the_server_serves_others(
    served: tuple[BackgroundServer, Cuts],
) -> None:
    server, cuts = served
    slow = connect(server)
    slow.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nX-Slow: ")
    assert read_to_eof(slow) == b"", "cut without a reply"
    assert cuts.names == ["header_timeout_s"]
    with connect(server) as other:
        other.sendall(GET)
        assert read_response(other).startswith(b"HTTP/1.1 200")


def test_a_connection_that_never_sends_a_byte_is_cut(
    served: tuple[BackgroundServer, Cuts],
) -> None:
    server, cuts = served
    with connect(server) as silent:
        assert read_to_eof(silent) == b""
    assert cuts.names == ["header_timeout_s"]


def test_a_body_nobody_reads_is_cut_once_the_body_deadline_passed(
    served: tuple[BackgroundServer, Cuts],
) -> None:
    server, cuts = served
    with connect(server) as slow:
        slow.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
        reply = read_to_eof(slow)
    assert reply.startswith(b"HTTP/1.1 200"), "the early reply went out, then the cut"
    assert cuts.names == ["body_timeout_s"]


def test_a_kept_alive_connection_is_not_cut_between_requests(
    served: tuple[BackgroundServer, Cuts],
) -> None:
    """Control: the head deadline starts at a request's first byte, not when the previous
    reply ended, so a pooled connection idle past it still serves its next request (its
    idle time is uvicorn's keep-alive timer's, 30 s here)."""
    server, cuts = served
    with connect(server) as pooled:
        pooled.sendall(GET)
        assert read_response(pooled).startswith(b"HTTP/1.1 200")
        threading.Event().wait(1.0)  # idle for more than the 0.3 s head deadline
        pooled.sendall(GET)
        assert read_response(pooled).startswith(b"HTTP/1.1 200")
    assert cuts.names == []


def test_a_request_the_parser_rejects_is_answered_in_json_and_closed(
    served: tuple[BackgroundServer, Cuts],
) -> None:
    server, cuts = served
    with connect(server) as bad:
        bad.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nBad Header: y\r\n\r\n")
        reply = read_to_eof(bad)
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400")
    assert b"content-type: application/json" in head.lower()
    error = json.loads(body)["error"]
    assert error["code"] == "invalid_request" and "header is malformed" in error["message"]
    assert cuts.names == []


def test_a_head_past_its_size_limit_is_refused_and_a_large_body_is_not(
    served: tuple[BackgroundServer, Cuts],
) -> None:
    server, _ = served
    with connect(server) as big:
        big.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * MAX_HEAD_BYTES)
        reply = read_to_eof(big)
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 431")
    assert f"exceeds {MAX_HEAD_BYTES} bytes" in json.loads(body)["error"]["message"]
    # Control: a head just under the limit, and a body four times its size sent with its
    # head in one write, are served.
    near = b"X-Big: " + b"a" * (MAX_HEAD_BYTES - 100) + b"\r\n"
    body = b"{" + b" " * (4 * MAX_HEAD_BYTES) + b"}"
    with connect(server) as ok:
        ok.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n" + near + b"\r\n")
        assert read_response(ok).startswith(b"HTTP/1.1 200")
        length = f"Content-Length: {len(body)}\r\n".encode()
        ok.sendall(b"POST / HTTP/1.1\r\nHost: x\r\n" + length + b"\r\n" + body)
        assert read_response(ok).startswith(b"HTTP/1.1 200")


def test_without_the_deadlines_uvicorn_keeps_a_trickled_head_open() -> None:
    """Control: uvicorn's stock protocol holds the same trickling client past the time in
    which the deadline protocol cut it (so the cuts above are the deadlines' doing)."""
    app = Starlette(routes=[Route("/", early, methods=["GET"])])
    with BackgroundServer(app) as server, connect(server) as slow:
        slow.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        slow.settimeout(1.0)
        with pytest.raises(TimeoutError):
            slow.recv(1)
