"""The control listener under a saturated agent listener: `/health`, `GET /policy` and a
`POST /policy` the gateway refuses at once (a no-op that still runs on the agent loop,
where policy updates live), timed idle and while K agent streams (default 500) run back
to back, with the control listener on its own thread and loop (the default) and on the
agent loop (`control_own_loop` off, as before), side by side in one run.

The engine is `devstack.fixed_latency_engine` (a FAKE answering every call after
`--engine-latency-ms`, streamed token by token over that delay when the call streams, in
its own process): the load is the Gateway's. The agents are `bench.gateway_load`'s raw
keep-alive clients with no think time, every call a streamed Chat Completions call
(`--no-stream`: whole replies, as before), in a child process so their event loop cannot
delay the probes; the probes are sequential, one every `--probe-interval-ms`, from this
process.

Run: `python -m bench.control_listener [--agents 500] [--seconds 30] [--modes shared,own]
[--no-stream]`.

`--flood`: instead, one session's agent posts `--posters` (200) maximum-size bodies at once
and back to back (each exactly the session's body cap, a long tool-call conversation in
Chat Completions, new connection each, from a child process, to loopback only), while
another session's agent makes one small call after another and `/health` is probed; both
timed idle and flooded in turns, in one run. The flood goes to the other session's gateway
process, then (the control) to another gateway process on the same machine: what the
machine alone takes. `--parse-offload-bytes 1048576,0` compares large bodies parsed in
the gateway's worker process with bodies parsed in the gateway process:
`python -m bench.control_listener --flood [--posters 200] [--flood-to same,apart]`.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import functools
import json
import multiprocessing
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from bench.common import (
    fixed_latency_engine,
    percentile,
    process_ticks,
    stop_process,
    wait_healthy,
)
from bench.gateway_load import (
    Results,
    agent,
    create_sessions,
    lag_quantiles,
    parse_metrics,
    scrape,
)
from devstack.ports import consecutive_free_ports
from devstack.tiny_model import ensure_tiny_model
from gateway.options import GatewayOptions

PROBES = ("GET /health", "GET /policy", "POST /policy (refused)")


def _agents(sessions: list[dict[str, Any]], seconds: float, stream: bool, out: Any) -> None:
    """Child process: every agent calls back to back until the deadline."""
    args = argparse.Namespace(
        turns=10**6, warmup_s=1.0, think_s=0.0, large_every=0, large_chars=0,
        engine_latency_ms=0.0, stream=stream,
    )  # fmt: skip
    results = Results()
    deadline = time.monotonic() + seconds

    async def run() -> None:
        await asyncio.gather(*(agent(s, args, results, deadline) for s in sessions))

    asyncio.run(run())
    out.put({"calls": len(results.latencies), "errors": results.errors,
             "content_types": results.content_types,
             "events_p50": percentile([float(n) for n in results.stream_events], 0.5)})  # fmt: skip


def probe(client: httpx.Client, control: str, what: str) -> float:
    started = time.perf_counter()
    if what == "GET /health":
        reply = client.get(f"{control}/health")
    elif what == "GET /policy":
        reply = client.get(f"{control}/policy")
    else:  # validated, handed to the agent loop, refused there: a relative checkpoint
        reply = client.post(
            f"{control}/policy", json={"policy_version": "noop", "checkpoint": "not/absolute"}
        )
    elapsed = time.perf_counter() - started
    expected = 200 if what.startswith("GET") else reply.status_code
    if reply.status_code != expected or reply.status_code >= 500:
        raise SystemExit(f"{what}: HTTP {reply.status_code} {reply.text[:200]}")
    return elapsed


def probe_for(control: str, seconds: float, interval_s: float) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {p: [] for p in PROBES}
    deadline = time.monotonic() + seconds
    with httpx.Client(timeout=60) as client:
        while time.monotonic() < deadline:
            for what in PROBES:
                times[what].append(probe(client, control, what))
                time.sleep(interval_s)
    return times


@contextlib.contextmanager
def _gateway(model: Path, engine_url: str, **extra: Any) -> Iterator[tuple[str, int]]:
    """A gateway process on loopback with `extra` settings: (its control URL, its pid)."""
    port = consecutive_free_ports(2)
    with tempfile.TemporaryDirectory(prefix="gw-control-") as data_dir:
        settings = {
            "engine_urls": [engine_url], "model": "tiny", "tokenizer": str(model),
            "insecure_dev": True, "port": port, "control_port": port + 1,
            "data_dir": data_dir, "context_window": 1048576, **extra,
        }  # fmt: skip
        env = dict(os.environ, ROLLOUT_GATEWAY_SETTINGS=json.dumps(settings))
        proc = subprocess.Popen(
            [sys.executable, "-m", "workers.gateway_server"], env=env, stdout=subprocess.DEVNULL
        )
        control = f"http://127.0.0.1:{port + 1}"
        try:
            wait_healthy(control, proc)
            yield control, proc.pid
        finally:
            stop_process(proc)


def run_mode(args: argparse.Namespace, model: Path, engine_url: str, own_loop: bool) -> dict:
    with _gateway(model, engine_url, control_own_loop=own_loop) as (control, _):
        sessions = asyncio.run(create_sessions([control], args.agents))
        idle = probe_for(control, args.idle_seconds, args.probe_interval_ms / 1000)
        out: Any = multiprocessing.get_context("spawn").Queue()
        load_s = args.warmup_s + args.seconds
        child = multiprocessing.get_context("spawn").Process(
            target=_agents, args=(sessions, load_s, args.stream, out)
        )
        child.start()
        time.sleep(args.warmup_s)
        before = asyncio.run(_scrape(control))
        loaded = probe_for(control, args.seconds, args.probe_interval_ms / 1000)
        after = asyncio.run(_scrape(control))
        load = out.get(timeout=load_s + 600)
        child.join()
    lag50, lag99, _ = lag_quantiles(before, after)
    return {"own_loop": own_loop, "idle": idle, "loaded": loaded, "load": load,
            "lag_p50_ms": 1000 * lag50, "lag_p99_ms": 1000 * lag99,
            "calls_per_s": load["calls"] / (args.warmup_s + args.seconds)}  # fmt: skip


async def _scrape(control: str) -> dict[str, float]:
    async with httpx.AsyncClient() as client:
        return await scrape(client, [control])


# --- --flood: one session's maximum-size bodies against another session and /health ------


NONCE = "00000000"
"""Where each flood post writes its number: a history no post before it sent, so the
session's history cache never spares the parse (`gateway.protocols.history`)."""


RETRY_AFTER_S = 1.0
"""What a refused post whose reply it never saw (the connection reset) waits."""


def flood_body(size: int) -> bytes:
    """A Chat Completions tool loop of exactly `size` bytes of JSON: what a long agent
    context looks like (4 KB tool outputs), the kind of body a parse pays most for."""
    output = "".join(f"line {i}: value = compute(x{i}, 'text')\n" for i in range(100))
    messages: list[dict[str, Any]] = [{"role": "user", "content": f"Fix bug {NONCE}."}]
    request = {"model": "tiny", "messages": messages, "max_tokens": 8, "padding": ""}
    length = len(json.dumps(request))
    while True:
        turn = len(messages)
        arguments = json.dumps({"cmd": f"cat f{turn}"})
        function = {"name": "run", "arguments": arguments}
        call = {"id": f"c{turn}", "type": "function", "function": function}
        pair = [
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"c{turn}", "content": output},
        ]
        grown = length + len(json.dumps(pair))  # its "[]" out, a ", " in: as long
        if grown > size:
            break
        messages.extend(pair)
        length = grown
    request["padding"] = "x" * (size - len(json.dumps(request)))  # ASCII: chars are bytes
    body = json.dumps(request).encode()
    assert len(body) == size, (len(body), size)
    return body


def _flood(url: str, token: str, size: int, posters: int, go: Any, done: Any, out: Any) -> None:
    """Child process: `posters` connections, each posting the body back to back while
    `go` is set, until `done`; a refused post waits its 429's `Retry-After` (or, the
    connection reset before its body was read, `RETRY_AFTER_S`) first, as an SDK would. At
    the lowest CPU priority: on a small machine it stands for a sandbox on other cores, so
    the figure is what the flood costs the gateway, not what the flooder's own CPU takes from it."""
    os.nice(19)
    host, port = url.removeprefix("http://").split("/")[0].split(":")
    body = flood_body(size)
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
        f"Authorization: Bearer {token}\r\nContent-Length: {size}\r\n\r\n"
    ).encode()
    outcomes: collections.Counter[str] = collections.Counter()
    nonce, sent = body.index(NONCE.encode()), 0

    async def post() -> tuple[str, float]:
        nonlocal sent
        sent += 1
        numbered = b"%s%08d%s" % (body[:nonce], sent, body[nonce + len(NONCE) :])
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            writer.write(head + numbered)
            with contextlib.suppress(OSError):  # refused before the body: the reply is there
                await writer.drain()
            status = await reader.readline()
            if not status:
                return "reset", RETRY_AFTER_S
            wait = 0.0
            while (line := await reader.readline()) not in (b"\r\n", b""):
                name, _, value = line.decode().partition(":")
                if name.strip().lower() == "retry-after":
                    wait = float(value)
            return status.split(b" ")[1].decode(), wait
        except OSError:
            return "reset", RETRY_AFTER_S
        finally:
            writer.close()

    async def poster() -> None:
        while not done.is_set():
            if not go.is_set():
                await asyncio.sleep(0.05)
                continue
            outcome, wait = await post()
            outcomes[outcome] += 1
            await asyncio.sleep(wait)  # as an SDK does: wait, then try again

    async def run() -> None:
        await asyncio.gather(*(poster() for _ in range(posters)))

    asyncio.run(run())
    out.put(dict(outcomes))


def _victim(session: dict[str, Any], stop: threading.Event, latencies: list[float]) -> None:
    """Another session's agent: one small whole call after another."""
    url = f"{session['openai_base_url']}/chat/completions"
    request = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
    auth = {"Authorization": f"Bearer {session['token']}"}
    with httpx.Client(timeout=120) as client:
        while not stop.is_set():
            started = time.perf_counter()
            reply = client.post(url, json=request, headers=auth)
            if reply.status_code != 200:
                raise SystemExit(f"victim call: HTTP {reply.status_code} {reply.text[:200]}")
            latencies.append(time.perf_counter() - started)


def _timed(
    control: str, victim: dict[str, Any], seconds: float, interval_s: float, gateway_pid: int
) -> dict:
    """The victim's call latencies and /health's over `seconds`, and the gateway's CPU."""
    stop, calls = threading.Event(), []  # type: ignore[var-annotated]
    thread = threading.Thread(target=_victim, args=(victim, stop, calls))
    ticks, started = process_ticks(gateway_pid), time.monotonic()
    thread.start()
    health: list[float] = []
    deadline = time.monotonic() + seconds
    with httpx.Client(timeout=60) as client:
        while time.monotonic() < deadline:
            health.append(probe(client, control, "GET /health"))
            time.sleep(interval_s)
    stop.set()
    thread.join()
    cpu = (process_ticks(gateway_pid) - ticks) / os.sysconf("SC_CLK_TCK")
    return {"call": calls, "health": health, "cpu": cpu / (time.monotonic() - started)}


def _add(into: dict[str, Any], window: dict[str, Any]) -> None:
    into["call"] += window["call"]
    into["health"] += window["health"]
    into["cpu"].append(window["cpu"])


def run_flood(
    args: argparse.Namespace, model: Path, engine_url: str, offload_bytes: int, apart: bool
) -> dict:
    """Idle and flooded in turn; `apart`: the flood goes to another gateway process on
    the same machine, the control that shows what the machine alone takes."""
    gateway = functools.partial(_gateway, model, engine_url, parse_offload_bytes=offload_bytes)
    with contextlib.ExitStack() as stack:
        control, pid = stack.enter_context(gateway())
        flood_control = control
        if apart:
            flood_control, _ = stack.enter_context(gateway())
        (victim,) = asyncio.run(create_sessions([control], 1))
        (attacker,) = asyncio.run(create_sessions([flood_control], 1))
        size = GatewayOptions.model_fields["session_max_body_bytes"].default
        interval = args.probe_interval_ms / 1000
        ctx = multiprocessing.get_context("spawn")
        go, done, out = ctx.Event(), ctx.Event(), ctx.Queue()
        child = ctx.Process(
            target=_flood,
            args=(attacker["openai_base_url"], attacker["token"], size, args.posters,
                  go, done, out),
        )  # fmt: skip
        child.start()
        idle: dict[str, Any] = {"call": [], "health": [], "cpu": []}
        flooded: dict[str, Any] = {"call": [], "health": [], "cpu": []}
        for _ in range(args.rounds):  # idle and flooded in turn: the machine's own load
            time.sleep(args.warmup_s)  # evens out; the flood's last bodies settle
            _add(idle, _timed(control, victim, args.idle_seconds, interval, pid))
            go.set()
            time.sleep(args.warmup_s)
            _add(flooded, _timed(control, victim, args.seconds, interval, pid))
            go.clear()
        done.set()
        outcomes = out.get(timeout=600)
        child.join()
        recorded = httpx.get(f"{control}/sessions/{victim['session_id']}/trajectory")
        made = len(idle["call"]) + len(flooded["call"])
        if len(recorded.json()["calls"]) != made:
            raise SystemExit(f"the other session made {made} calls; not all recorded")
        metrics = parse_metrics(httpx.get(f"{flood_control}/metrics").text)
        refusals = {
            name.split('"')[1]: int(value)
            for name, value in metrics.items()
            if name.startswith("rollout_gateway_limit_refusals_total{")
        }
    return {"offload_bytes": offload_bytes, "apart": apart, "size": size, "idle": idle,
            "flooded": flooded, "outcomes": outcomes, "refusals": refusals}  # fmt: skip


def _row_name(r: dict) -> str:
    b = r["offload_bytes"]
    parse = f"parsed in a worker from {b} B" if b else "parsed in process"
    return f"{'another' if r['apart'] else 'the same'} process, {parse}"


def print_flood(args: argparse.Namespace, rows: list[dict]) -> None:
    print(
        f"\n{args.posters} posters of one session, each body {rows[0]['size']} bytes, back to "
        f"back; another session's calls one after another (engine latency "
        f"{args.engine_latency_ms:g} ms); /health every {args.probe_interval_ms:g} ms; "
        f"{args.rounds} turns of idle {args.idle_seconds:g} s and flooded {args.seconds:g} s, "
        f"each after {args.warmup_s:g} s\n"
    )
    print("| flood sent to | measured | idle p50 / p99 ms | flooded p50 / p99 ms "
          "| flooded ÷ idle (p50, p99) |")  # fmt: skip
    print("|---|---|---|---|---|")
    for r in rows:
        for what, label in (("call", "other session's call"), ("health", "GET /health")):
            idle, flooded = r["idle"][what], r["flooded"][what]
            i50, i99 = 1000 * percentile(idle, 0.5), 1000 * percentile(idle, 0.99)
            f50, f99 = 1000 * percentile(flooded, 0.5), 1000 * percentile(flooded, 0.99)
            print(f"| {_row_name(r)} | {label} | {i50:.1f} / {i99:.1f} | {f50:.1f} / {f99:.1f} "
                  f"| {f50 / i50:.2f}× / {f99 / i99:.2f}× |")  # fmt: skip
    for r in rows:
        calls = len(r["flooded"]["call"])
        print(f"{_row_name(r)}: flood posts by reply {r['outcomes']} (a reset: refused "
              f"before the body, the rest of it cut); the flooded gateway's refusals by limit "
              f"{r['refusals']}; other session's calls {len(r['idle']['call'])} idle, {calls} "
              f"flooded; its gateway's CPU {statistics.mean(r['idle']['cpu']):.0%} idle, "
              f"{statistics.mean(r['flooded']['cpu']):.0%} flooded")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", type=int, default=500, help="concurrent agent streams")
    parser.add_argument("--seconds", type=float, default=30.0, help="loaded probe window")
    parser.add_argument("--idle-seconds", type=float, default=10.0, help="idle probe window")
    parser.add_argument("--warmup-s", type=float, default=10.0, help="load ramp before it")
    parser.add_argument("--probe-interval-ms", type=float, default=50.0)
    parser.add_argument("--engine-latency-ms", type=float, default=50.0)
    parser.add_argument("--modes", default="own,shared", help="own: own loop; shared: agent's")
    parser.add_argument(
        "--no-stream", dest="stream", action="store_false", help="agents' calls not streamed"
    )
    parser.add_argument("--flood", action="store_true", help="the body-flood case instead")
    parser.add_argument("--posters", type=int, default=200, help="--flood: parallel posts")
    parser.add_argument("--rounds", type=int, default=3, help="--flood: idle/flooded turns")
    parser.add_argument(
        "--parse-offload-bytes", default="1048576", help="--flood: one row per setting"
    )
    parser.add_argument(
        "--flood-to", default="same,apart", help="--flood: the victim's gateway, or another"
    )
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    model = ensure_tiny_model()
    if args.flood:
        with fixed_latency_engine(model, args.engine_latency_ms) as engine_url:
            flood_rows = [
                run_flood(args, model, engine_url, int(b), apart=to == "apart")
                for b in args.parse_offload_bytes.split(",")
                for to in args.flood_to.split(",")
            ]
        print_flood(args, flood_rows)
        return
    rows = []
    with fixed_latency_engine(model, args.engine_latency_ms) as engine_url:
        for mode in args.modes.split(","):
            rows.append(run_mode(args, model, engine_url, own_loop=mode == "own"))
    calls = "streamed calls (SSE)" if args.stream else "whole (not streamed) calls"
    print(
        f"\n{args.agents} agents, {calls} back to back, "
        f"engine latency {args.engine_latency_ms:g} ms, "
        f"probes every {args.probe_interval_ms:g} ms, idle {args.idle_seconds:g} s, "
        f"loaded {args.seconds:g} s after a {args.warmup_s:g} s ramp\n"
    )
    print(
        "| control listener | probe | idle p50 / p99 ms | loaded p50 / p99 / max ms "
        "| loaded ÷ idle (p50, p99) |"
    )
    print("|---|---|---|---|---|")
    for r in rows:
        where = "own thread and loop" if r["own_loop"] else "on the agent loop"
        for what in PROBES:
            idle, loaded = r["idle"][what], r["loaded"][what]
            i50, i99 = 1000 * percentile(idle, 0.5), 1000 * percentile(idle, 0.99)
            l50, l99 = 1000 * percentile(loaded, 0.5), 1000 * percentile(loaded, 0.99)
            print(
                f"| {where} | {what} | {i50:.1f} / {i99:.1f} | {l50:.1f} / {l99:.1f} / "
                f"{1000 * max(loaded):.0f} | {l50 / i50:.1f}× / {l99 / i99:.1f}× |"
            )
    for r in rows:
        where = "own thread and loop" if r["own_loop"] else "on the agent loop"
        errors = sum(r["load"]["errors"].values())
        print(
            f"{where}: agent calls/s {r['calls_per_s']:.0f}, agent loop lag p50 / p99 "
            f"≤{r['lag_p50_ms']:g} / ≤{r['lag_p99_ms']:g} ms, agent errors {errors} "
            f"{r['load']['errors'] or ''}"
        )
        print(
            f"{where}: agent replies by content type {r['load']['content_types']}, "
            f"SSE events per call p50 {r['load']['events_p50']:g}"
        )


if __name__ == "__main__":
    main()
