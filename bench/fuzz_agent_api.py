"""Fuzz the Gateway's agent and control APIs with generated malformed requests.

A real Gateway (in-process on loopback, the scripted engine behind it) gets N requests per
protocol (Chat Completions, Responses, Anthropic Messages, the control API), each a valid
request mutated by `hypothesis` (`stress/malformed_requests.py`: fields replaced by
arbitrary JSON, lone surrogates, NaN, deep nesting, reserved `chat_template_kwargs`, odd
encodings, content types, methods, paths and credentials). Prints the count of each status
per protocol, the number of 5xx replies and of errors not in the protocol's error shape
(both must be 0), and whether a witness session's recorded calls stayed exactly as they were.

Run: `python -m bench.fuzz_agent_api [--examples 10000] [--seed 0]`; exits 1 on any failure.
"""

from __future__ import annotations

import argparse
import secrets
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from devstack.background_server import BackgroundServer
from devstack.scripted_engine import ScriptedEngine
from devstack.tiny_model import ensure_tiny_model
from stress.fuzz import LiveTarget, Tally, admin_get, fuzz, open_witness
from stress.malformed_requests import MODEL, PROTOCOLS, engine_script
from workers.local_stack import start_gateway


@contextmanager
def gateway_target(
    model_dir: Path, data_dir: Path
) -> Iterator[tuple[LiveTarget, Callable[[], dict[str, Any]]]]:
    """The scripted engine and a real Gateway in-process on loopback; yields the target
    (a session for the fuzzer's requests) and a reader of the witness session's calls."""
    engine = ScriptedEngine(model_dir / "tokenizer.json", engine_script(), model=MODEL)
    with BackgroundServer(engine.app()) as engine_server:
        gateway = start_gateway(engine_server.url, model_dir, data_dir, MODEL)
        admin, control_url = gateway.admin_token, gateway.control_url
        try:
            tag = secrets.token_hex(3)
            witness = open_witness(gateway.url, control_url, admin, rollout_id=f"witness-{tag}")
            created = httpx.post(
                f"{control_url}/sessions",
                json={"rollout_id": f"fuzz-{tag}"},
                headers={"Authorization": f"Bearer {admin}"},
                timeout=30,
            )
            created.raise_for_status()
            target = LiveTarget(gateway.url, control_url, admin, created.json()["token"])
            yield target, lambda: admin_get(f"{control_url}/sessions/{witness}/trajectory", admin)
        finally:
            gateway.server.stop()


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
        gateway_target(model_dir, Path(data_dir)) as (target, witness_trajectory),
    ):
        before = witness_trajectory()
        for name in args.protocols:
            started = time.perf_counter()
            tally = fuzz(target, PROTOCOLS[name], args.examples, args.seed)
            results[name] = (tally, time.perf_counter() - started)
        witness_unchanged = witness_trajectory() == before

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
