"""Send generated malformed requests to a Gateway and tally its replies per protocol.

`fuzz` drives `hypothesis` over `fuzz_request(protocol)` and hands each request to the
target's `send`; the tally counts statuses, 5xx replies and errors not in the protocol's
error shape (both must stay 0).
"""

from __future__ import annotations

import collections
from typing import Protocol as Interface

import httpx
from hypothesis import HealthCheck, Phase, given, seed, settings

from stress.malformed_requests import FuzzRequest, Protocol, error_shape_problem, fuzz_request


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


def fuzz(target: Target, protocol: Protocol, examples: int, run_seed: int) -> Tally:
    tally = Tally()

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
