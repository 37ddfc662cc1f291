"""Fuzz the Gateway's agent and control APIs with generated malformed requests.

A real Gateway (in-process on loopback, the scripted engine behind it) gets N requests per
protocol (Chat Completions, Responses, Anthropic Messages, the control API), each a valid
request mutated by `hypothesis` (`tests/fixtures/malformed_requests.py`: fields replaced by
arbitrary JSON, lone surrogates, NaN, deep nesting, reserved `chat_template_kwargs`, odd
encodings, content types, methods, paths and credentials). Prints the count of each status
per protocol, the number of 5xx replies and of errors not in the protocol's error shape
(both must be 0), and whether a witness session's recorded calls stayed exactly as they were.

Run: `python -m bench.fuzz_agent_api [--examples 10000] [--seed 0]`; exits 1 on any failure.
"""

from __future__ import annotations

import argparse
import collections
import tempfile
import time
from pathlib import Path

from hypothesis import HealthCheck, Phase, given, seed, settings

from devstack.tiny_model import ensure_tiny_model
from tests.fixtures.malformed_requests import (
    PROTOCOLS,
    FuzzRequest,
    FuzzTarget,
    Protocol,
    error_shape_problem,
    fuzz_request,
    fuzz_target,
)


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


def fuzz(target: FuzzTarget, protocol: Protocol, examples: int, run_seed: int) -> Tally:
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=10_000, help="requests per protocol")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--protocols", nargs="*", default=sorted(PROTOCOLS))
    args = parser.parse_args()

    model_dir = ensure_tiny_model()
    results: dict[str, tuple[Tally, float]] = {}
    with (
        tempfile.TemporaryDirectory() as data_dir,
        fuzz_target(model_dir, Path(data_dir)) as target,
    ):
        before = target.witness_trajectory()
        for name in args.protocols:
            started = time.perf_counter()
            tally = fuzz(target, PROTOCOLS[name], args.examples, args.seed)
            results[name] = (tally, time.perf_counter() - started)
        witness_unchanged = target.witness_trajectory() == before

    statuses = sorted({s for tally, _ in results.values() for s in tally.statuses})
    header = ["protocol", "requests", *map(str, statuses), "5xx", "bad shape", "seconds"]
    rows = [header]
    for name, (tally, seconds) in results.items():
        row = [name, str(sum(tally.statuses.values()))]
        row += [str(tally.statuses.get(s, 0)) for s in statuses]
        row += [str(tally.server_errors), str(tally.bad_shape), f"{seconds:.0f}"]
        rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    for row in rows:
        print("  ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True)))
    server_errors = sum(t.server_errors for t, _ in results.values())
    bad_shape = sum(t.bad_shape for t, _ in results.values())
    print(f"5xx replies: {server_errors}; errors not in the protocol's shape: {bad_shape}")
    print(f"witness session's recorded calls unchanged: {witness_unchanged}")
    for name, (tally, _) in results.items():
        for line in tally.examples:
            print(f"  {name}: {line}")
    if server_errors or bad_shape or not witness_unchanged:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
