"""Send generated malformed requests to a Gateway and tally its replies per protocol.

`fuzz` drives `hypothesis` over `fuzz_request(protocol)` and hands each request to the
target's `send`; the tally counts statuses, 5xx replies and errors not in the protocol's
error shape (both must stay 0). `LiveTarget` sends to a Gateway by its URLs and notes
every 5xx; `open_witness` opens the session whose recorded calls must not change.
"""

from __future__ import annotations

import collections
import contextlib
import threading
import time
from dataclasses import dataclass
from typing import Any
from typing import Protocol as Interface

import httpx
from hypothesis import HealthCheck, Phase, given, seed, settings

from stress.malformed_requests import (
    PROTOCOLS,
    FuzzRequest,
    Protocol,
    error_shape_problem,
    fuzz_request,
)

#: How long the fuzzer reuses an idle connection: well under the gateway's keep-alive.
KEEPALIVE_S = 2.0


class Target(Interface):
    """What `fuzz` sends through: a Gateway in-process or a live one by URL."""

    def send(self, protocol: Protocol, request: FuzzRequest) -> httpx.Response: ...


class Tally:
    """Statuses seen for one protocol, and the first few bad replies for the report."""

    def __init__(self) -> None:
        self.statuses: collections.Counter[int] = collections.Counter()
        self.bad_shape = 0
        self.examples: list[str] = []

    @property
    def server_errors(self) -> int:
        return sum(n for status, n in self.statuses.items() if status >= 500)

    def note(self, what: str) -> None:
        if len(self.examples) < 5:
            self.examples.append(what)


def fuzz(
    target: Target, protocol: Protocol, examples: int, run_seed: int, tally: Tally | None = None
) -> Tally:
    """`examples` generated requests through `target`, counted into `tally` (or a new one)."""
    tally = tally if tally is not None else Tally()

    @seed(run_seed)
    @settings(
        max_examples=examples,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(request=fuzz_request(protocol))
    def one(request: FuzzRequest) -> None:
        reply = target.send(protocol, request)
        tally.statuses[reply.status_code] += 1
        if reply.status_code >= 500:
            tally.note(f"{reply.status_code} for {request!r:.300}: {reply.text[:300]}")
        elif reply.status_code >= 400:
            problem = error_shape_problem(protocol.shape, reply)
            if problem is not None:
                tally.bad_shape += 1
                tally.note(f"{reply.status_code} for {request!r:.300}: {problem}")

    one()
    return tally


@dataclass
class ServerError:
    at: float
    protocol: str
    status: int
    code: str | None
    text: str


class LiveTarget:
    """Sends `stress.fuzz`'s generated requests to a gateway by URL (the
    `send` the `fuzz` loop calls), noting every 5xx with its error code and time."""

    def __init__(self, agent_url: str, control_url: str, admin: str, token: str) -> None:
        self.agent_url = agent_url
        self.control_url = control_url
        self.admin = admin
        self.token = token
        self._local = threading.local()
        self.server_errors: list[ServerError] = []
        self.transport_errors = 0
        self.sent_at: list[float] = []

    def _client(self) -> httpx.Client:
        """One client per sending thread: the fuzz loops of several protocols send at once,
        and with one pool shared by all of them a request once failed on the client side
        with EBADF (counted as a server error) long after every fault had passed."""
        client = getattr(self._local, "client", None)
        if client is None:
            # A connection idle for as long as the server keeps one (uvicorn: 5 s, the
            # same as httpx's default) may be closed by it just as it is reused: a
            # "disconnected without a response" that is no reply of the server's.
            limits = httpx.Limits(keepalive_expiry=KEEPALIVE_S)
            client = self._local.client = httpx.Client(timeout=60, limits=limits)
        return client

    def send(self, protocol: Protocol, request: FuzzRequest) -> httpx.Response:
        headers = request.headers(self.admin if protocol.control else self.token)
        base = self.control_url if protocol.control else self.agent_url
        self.sent_at.append(time.monotonic())
        try:
            reply = self._client().request(
                request.method, base + request.path, content=request.content, headers=headers
            )
        except httpx.HTTPError as exc:
            self.transport_errors += 1
            reply = httpx.Response(599, json={"error": {"message": repr(exc)}})
        if reply.status_code >= 500:
            code = None
            with contextlib.suppress(Exception):
                body = reply.json()
                error = body.get("error") if isinstance(body, dict) else None
                code = error.get("code") or error.get("type") if isinstance(error, dict) else None
            self.server_errors.append(
                ServerError(time.monotonic(), protocol.name, reply.status_code, code, reply.text)
            )
        return reply


def admin_get(url: str, admin: str) -> dict[str, Any]:
    reply = httpx.get(url, headers={"Authorization": f"Bearer {admin}"}, timeout=30)
    reply.raise_for_status()
    return reply.json()


def open_witness(agent_url: str, control_url: str, admin: str, **session: Any) -> str:
    """A new session (`session`: its control API fields) with one good call per protocol;
    its id. A fuzzer's requests must leave its recorded calls exactly as they are."""
    auth = {"Authorization": f"Bearer {admin}"}
    created = httpx.post(control_url + "/sessions", json=session, headers=auth, timeout=30)
    created.raise_for_status()
    opened = created.json()
    for protocol in PROTOCOLS.values():
        if protocol.control:
            continue
        reply = httpx.post(
            agent_url + protocol.paths[0],
            json=protocol.body,
            headers={"Authorization": f"Bearer {opened['token']}"},
            timeout=60,
        )
        reply.raise_for_status()
    return str(opened["session_id"])
