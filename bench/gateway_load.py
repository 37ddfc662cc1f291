"""Gateway under load: K concurrent sessions of tool-calling conversations with agent
think-time, against an engine with a fixed latency, on 1..N gateway processes.

Per (processes, sessions) run, side by side in one invocation: calls/s (total and per
process), the latency the gateway adds (client-observed minus the engine's fixed delay,
p50/p99), the gateway processes' event-loop lag (p50/p99 from their
`rollout_gateway_event_loop_lag_seconds` histogram, and its mean), gateway CPU per call,
and with `--shared-port` the share of calls relayed to their owner process.

The engine is `devstack.fixed_latency_engine` (a FAKE that answers every call with the
same tool call after `--engine-latency-ms`, in its own process): a real engine here would
measure itself. The agents are raw HTTP/1.1 keep-alive connections (one per session) in
this process — an SDK per session would cost the client more CPU than the gateway.
Each session runs up to `--turns` turns; the measurement window is `--seconds` after a
`--warmup-s` ramp, so at large K sessions do not reach the last turn (reported).
With `--stream` every call is a streamed Chat Completions call (`stream: true`; the engine
streams too, token by token over its fixed delay): the agent reads the SSE events off its
connection, rebuilds the assistant message and its tool call from the deltas, and times the
call to its last event; a stream that breaks the protocol counts as an error.

Run: `python -m bench.gateway_load [--processes 1,2] [--sessions 100,500,2000]
[--shared-port] [--large-every 0 --large-chars 60000] [--tokenize-offload-chars 16384]
[--stream] [--py-spy DIR]`. With `--py-spy` each run's gateway is sampled by py-spy
over its measurement (`DIR/p<processes>-s<sessions>.svg`, or collapsed stacks with
`--py-spy-format raw`; one process only, a supervisor's children are not sampled).
"""

import argparse
import asyncio
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from bench.common import (
    fixed_latency_engine,
    percentile,
    process_ticks,
    py_spy,
    stop_process,
    wait_healthy,
)
from bench.conversations import TOOL_OUTPUT, TOOLS
from devstack.ports import consecutive_free_ports, free_port
from devstack.tiny_model import ensure_tiny_model

LARGE_LINE = "2026-12-01 00:00:00 INFO worker-{i} wrote block {j} of the build cache\n"


# ----------------------------------------------------------------------- metrics


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text → {"name{labels}": value} (sums need no label parsing here)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def summed(snapshot: dict[str, float], name: str) -> float:
    return sum(v for k, v in snapshot.items() if k == name or k.startswith(name + "{"))


def lag_quantiles(before: dict[str, float], after: dict[str, float]) -> tuple[float, float, float]:
    """(p50, p99) bucket upper bounds and the mean of the lag histogram between snapshots."""
    name = "rollout_gateway_event_loop_lag_seconds"
    buckets: list[tuple[float, float]] = []
    for key, value in after.items():
        if key.startswith(name + "_bucket{"):
            le = key.split('le="', 1)[1].split('"', 1)[0]
            bound = float("inf") if le == "+Inf" else float(le)
            buckets.append((bound, value - before.get(key, 0.0)))
    buckets.sort()
    count = summed(after, name + "_count") - summed(before, name + "_count")
    total = summed(after, name + "_sum") - summed(before, name + "_sum")

    def q(frac: float) -> float:
        for bound, cumulative in buckets:
            if cumulative >= frac * count:
                return bound
        return float("inf")

    return q(0.5), q(0.99), (total / count if count else 0.0)


async def scrape(client: httpx.AsyncClient, controls: list[str]) -> dict[str, float]:
    """All processes' metrics merged (counters and histograms add up)."""
    merged: dict[str, float] = {}
    for control in controls:
        page = parse_metrics((await client.get(f"{control}/metrics", timeout=300)).text)
        for key, value in page.items():
            merged[key] = merged.get(key, 0.0) + value
    return merged


# ----------------------------------------------------------------------- agents


class Connection:
    """One keep-alive HTTP/1.1 connection: just enough client for JSON POSTs."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post(
        self,
        path: str,
        token: str,
        body: bytes,
        on_piece: Callable[[bytes], None] | None = None,
    ) -> tuple[int, dict[str, str], bytes]:
        """(status, lower-cased headers, body); `on_piece` gets each piece of a chunked
        body the moment it is read (a stream's events as they arrive)."""
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        assert self.reader is not None
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
            f"Authorization: Bearer {token}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        )
        self.writer.write(head.encode() + body)
        try:
            status_and_headers = await self.reader.readuntil(b"\r\n\r\n")
            lines = status_and_headers.decode("latin-1").split("\r\n")
            status = int(lines[0].split()[1])
            headers = {k.lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:])}
            if "content-length" in headers:
                data = await self.reader.readexactly(int(headers["content-length"]))
                if on_piece is not None:
                    on_piece(data)
            else:  # chunked
                parts = []
                while (size := int((await self.reader.readline()).strip(), 16)) > 0:
                    parts.append(await self.reader.readexactly(size))
                    await self.reader.readline()
                    if on_piece is not None:
                        on_piece(parts[-1])
                await self.reader.readline()
                data = b"".join(parts)
        except Exception:
            self.close()
            raise
        if headers.get("connection", "").lower() == "close":
            self.close()
        return status, headers, data

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


class StreamError(Exception):
    """A streamed reply that breaks the protocol; its message is the error's key."""


class ChatStream:
    """A streamed Chat Completions reply, read as it arrives: each SSE event's `data` and
    when it completed, then the assistant message rebuilt from the deltas."""

    def __init__(self) -> None:
        self.buffer = b""
        self.events: list[tuple[float, str]] = []

    def feed(self, piece: bytes) -> None:
        self.buffer += piece
        while (end := self.buffer.find(b"\n\n")) >= 0:
            event, self.buffer = self.buffer[:end].decode(), self.buffer[end + 2 :]
            data = [line[5:].strip() for line in event.split("\n") if line.startswith("data:")]
            if data:
                self.events.append((time.monotonic(), "\n".join(data)))

    def message(self) -> dict[str, Any]:
        """The assistant message (content and its one tool call), or StreamError."""
        if self.buffer.strip():
            raise StreamError("stream: bytes after the last event")
        if not self.events or self.events[-1][1] != "[DONE]":
            raise StreamError("stream: [DONE] missing or not last")
        content, finish = "", None
        calls: dict[int, dict[str, str]] = {}
        for _, data in self.events[:-1]:
            try:
                chunk = json.loads(data)
            except ValueError:
                raise StreamError("stream: an event is not JSON") from None
            if isinstance(chunk, dict) and "error" in chunk:
                raise StreamError(f"stream error event: {str(chunk['error'])[:80]}")
            try:
                content, finish = self._absorb(chunk, calls, content, finish)
            except (KeyError, TypeError, AttributeError) as exc:
                raise StreamError(f"stream: malformed chunk ({exc!r})"[:80]) from None
        if finish != "tool_calls" or len(calls) != 1:
            raise StreamError(f"stream: finish {finish!r} with {len(calls)} tool calls")
        (call,) = calls.values()
        try:
            json.loads(call["arguments"])
        except ValueError:
            raise StreamError("stream: tool call arguments are not JSON") from None
        if not call["id"] or not call["name"]:
            raise StreamError("stream: tool call without id or name")
        function = {"name": call["name"], "arguments": call["arguments"]}
        tool_call = {"id": call["id"], "type": "function", "function": function}
        return {"content": content or None, "tool_calls": [tool_call]}

    @staticmethod
    def _absorb(
        chunk: Any, calls: dict[int, dict[str, str]], content: str, finish: str | None
    ) -> tuple[str, str | None]:
        """One `chat.completion.chunk` into (content so far, finish reason); tool call
        deltas into `calls` by index."""
        for choice in chunk["choices"]:
            delta = choice["delta"]
            content += delta.get("content") or ""
            finish = choice.get("finish_reason") or finish
            for part in delta.get("tool_calls") or []:
                call = calls.setdefault(part["index"], {"id": "", "name": "", "arguments": ""})
                call["id"] += part.get("id") or ""
                function = part.get("function") or {}
                call["name"] += function.get("name") or ""
                call["arguments"] += function.get("arguments") or ""
        return content, finish


@dataclass
class Results:
    latencies: list[tuple[float, float]] = field(default_factory=list)  # (finished, seconds)
    errors: dict[str, int] = field(default_factory=dict)
    turns: list[int] = field(default_factory=list)
    stream_events: list[int] = field(default_factory=list)  # events per streamed call
    content_types: dict[str, int] = field(default_factory=dict)  # of the 200 replies

    def error(self, key: str) -> None:
        self.errors[key] = self.errors.get(key, 0) + 1


async def agent(
    session: dict[str, Any], args: argparse.Namespace, results: Results, deadline: float
) -> None:
    base = urlsplit(session["openai_base_url"])
    conn = Connection(base.hostname or "127.0.0.1", base.port or 80)
    path = f"{base.path}/chat/completions"
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "List the files, then inspect each one."},
    ]
    await asyncio.sleep(random.uniform(0, args.warmup_s))
    turn = 0
    try:
        while turn < args.turns and time.monotonic() < deadline:
            request: dict[str, Any] = {
                "model": "m", "messages": messages, "tools": TOOLS, "max_tokens": 64,
            }  # fmt: skip
            if args.stream:
                request["stream"] = True
            body = json.dumps(request)
            stream = ChatStream() if args.stream else None
            started = time.monotonic()
            try:
                status, headers, data = await conn.post(
                    path, session["token"], body.encode(), stream and stream.feed
                )
            except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
                results.error(type(exc).__name__)
                break
            finished = time.monotonic()
            if status != 200:
                try:
                    key = f"HTTP {status}: {json.loads(data)['error']['message'][:80]}"
                except (ValueError, KeyError, TypeError):
                    key = f"HTTP {status}"
                results.error(key)
                break
            kind = headers.get("content-type", "").split(";")[0]
            results.content_types[kind] = results.content_types.get(kind, 0) + 1
            if stream is not None:
                try:
                    if kind != "text/event-stream":
                        raise StreamError(f"stream: content-type {kind!r}")
                    message = stream.message()
                except StreamError as exc:
                    results.error(str(exc))
                    break
                finished = stream.events[-1][0]  # the call ends with its last event
                results.stream_events.append(len(stream.events))
            else:
                message = json.loads(data)["choices"][0]["message"]
            results.latencies.append((finished, finished - started))
            turn += 1
            call = message["tool_calls"][0]
            messages.append(
                {"role": "assistant", "content": message.get("content"), "tool_calls": [call]}
            )
            output = f"{TOOL_OUTPUT}turn {turn}"
            if args.large_every and turn % args.large_every == 0:
                count = args.large_chars // len(LARGE_LINE) + 1
                big = "".join(LARGE_LINE.format(i=turn, j=j) for j in range(count))
                output = big[: args.large_chars]
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": output})
            await asyncio.sleep(args.think_s * random.uniform(0.5, 1.5))
    finally:
        results.turns.append(turn)
        conn.close()


async def loop_lag(samples: list[float], stop_at: float) -> None:
    """This (client) process's own event-loop lag: if it is high, the client is the limit."""
    while time.monotonic() < stop_at:
        asked = time.monotonic()
        await asyncio.sleep(0.05)
        samples.append(max(0.0, time.monotonic() - asked - 0.05))


async def drive(
    args: argparse.Namespace, sessions: list[dict[str, Any]], controls: list[str], gw_pid: int
) -> dict[str, Any]:
    results = Results()
    start = time.monotonic()
    window_start = start + args.warmup_s
    deadline = window_start + args.seconds
    own_lag: list[float] = []
    async with httpx.AsyncClient(timeout=30) as client:
        tasks = [asyncio.create_task(agent(s, args, results, deadline)) for s in sessions]
        lag_task = asyncio.create_task(loop_lag(own_lag, deadline))
        await asyncio.sleep(window_start - time.monotonic())
        before, ticks0, cpu0 = (
            await scrape(client, controls),
            process_ticks(gw_pid),
            time.process_time(),
        )
        await asyncio.sleep(max(0.0, deadline - time.monotonic()))
        after, ticks1, cpu1 = (
            await scrape(client, controls),
            process_ticks(gw_pid),
            time.process_time(),
        )
        await asyncio.gather(*tasks, lag_task)
    in_window = [lat for done, lat in results.latencies if window_start <= done <= deadline]
    calls = len(in_window)
    added = [max(0.0, lat - args.engine_latency_ms / 1000) for lat in in_window]
    lag50, lag99, lag_mean = lag_quantiles(before, after)
    gw_calls = summed(after, "rollout_gateway_calls_total") - summed(
        before, "rollout_gateway_calls_total"
    )
    forwarded = summed(after, "rollout_gateway_forwarded_calls_total") - summed(
        before, "rollout_gateway_forwarded_calls_total"
    )
    tick = os.sysconf("SC_CLK_TCK")
    return {
        "calls": calls,
        "calls_per_s": calls / args.seconds,
        "added_p50_ms": 1000 * percentile(added, 0.5),
        "added_p99_ms": 1000 * percentile(added, 0.99),
        "lag_p50_ms": 1000 * lag50,
        "lag_p99_ms": 1000 * lag99,
        "lag_mean_ms": 1000 * lag_mean,
        "gateway_cpu_ms_per_call": 1000 * (ticks1 - ticks0) / tick / max(gw_calls, 1),
        "client_cpu_ms_per_call": 1000 * (cpu1 - cpu0) / max(calls, 1),
        "client_lag_p99_ms": 1000 * percentile(own_lag, 0.99),
        "forwarded_share": forwarded / gw_calls if gw_calls else 0.0,
        "turns_mean": statistics.fmean(results.turns) if results.turns else 0.0,
        "errors": results.errors,
        "content_types": results.content_types,
        "stream_events_p50": percentile([float(n) for n in results.stream_events], 0.5),
    }


# ----------------------------------------------------------------------- one run


async def create_sessions(controls: list[str], count: int) -> list[dict[str, Any]]:
    limit = asyncio.Semaphore(32)
    async with httpx.AsyncClient(timeout=60) as client:

        async def create(i: int) -> dict[str, Any]:
            async with limit:
                reply = await client.post(
                    f"{controls[i % len(controls)]}/sessions", json={"rollout_id": f"load-{i}"}
                )
                reply.raise_for_status()
                return dict(reply.json())

        return list(await asyncio.gather(*(create(i) for i in range(count))))


def run_one(
    args: argparse.Namespace, model: Path, engine_url: str, processes: int, sessions: int
) -> dict[str, Any]:
    port = consecutive_free_ports(2 * processes)
    control = port + processes
    with tempfile.TemporaryDirectory(prefix="gw-load-") as data_dir:
        cmd = [
            sys.executable, "-m", "workers.cli", "gateway", "--engine", engine_url,
            "--model", "tiny", "--tokenizer", str(model), "--insecure-dev",
            "--port", str(port), "--control-port", str(control),
            "--processes", str(processes), "--data-dir", data_dir, "--fsync", args.fsync,
            "--tokenize-offload-chars", str(args.tokenize_offload_chars),
            "--context-window", "1048576",  # the fake engine has no limit; large outputs fit
        ]  # fmt: skip
        if args.shared_port:
            cmd += ["--shared-port", str(free_port())]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
        try:
            controls = [f"http://127.0.0.1:{control + i}" for i in range(processes)]
            for url in controls:
                wait_healthy(url, proc)
            created = asyncio.run(create_sessions(controls, sessions))
            suffix = ".svg" if args.py_spy_format == "flamegraph" else ".txt"
            out = args.py_spy / f"p{processes}-s{sessions}{suffix}" if args.py_spy else None
            with py_spy(proc.pid, out if processes == 1 else None, args.py_spy_format):
                row = asyncio.run(drive(args, created, controls, proc.pid))
        finally:
            stop_process(proc)
    return {"processes": processes, "sessions": sessions, **row}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", default="1,2", help="gateway process counts")
    parser.add_argument("--sessions", default="100,500,2000", help="concurrent sessions")
    parser.add_argument("--turns", type=int, default=40)
    parser.add_argument("--think-s", type=float, default=2.0, help="mean agent think time")
    parser.add_argument("--engine-latency-ms", type=float, default=50.0)
    parser.add_argument("--seconds", type=float, default=45.0, help="measurement window")
    parser.add_argument("--warmup-s", type=float, default=10.0, help="ramp before it")
    parser.add_argument("--shared-port", action="store_true", help="one address, relayed")
    parser.add_argument("--fsync", choices=["group", "off"], default="group")
    parser.add_argument("--large-every", type=int, default=0, help="every Nth tool output large")
    parser.add_argument("--large-chars", type=int, default=60000)
    parser.add_argument("--tokenize-offload-chars", type=int, default=16384)
    parser.add_argument("--stream", action="store_true", help="streamed calls (SSE)")
    parser.add_argument("--json", action="store_true", help="print rows as JSON lines too")
    parser.add_argument("--py-spy", type=Path, default=None, help="write py-spy profiles here")
    parser.add_argument("--py-spy-format", choices=["flamegraph", "raw"], default="flamegraph")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the children on the way out
    model = ensure_tiny_model()
    rows: list[dict[str, Any]] = []
    with fixed_latency_engine(model, args.engine_latency_ms) as engine_url:
        for processes in (int(p) for p in args.processes.split(",")):
            for sessions in (int(k) for k in args.sessions.split(",")):
                try:
                    row = run_one(args, model, engine_url, processes, sessions)
                except (httpx.HTTPError, OSError) as exc:  # a starved gateway: say so, go on
                    print(f"processes={processes} sessions={sessions}: {exc!r}", flush=True)
                    continue
                rows.append(row)
                if args.json:
                    print(json.dumps(row), flush=True)
    print(
        f"\nengine latency {args.engine_latency_ms:g} ms, think {args.think_s:g} s (±50 %), "
        f"{args.turns} turns max, window {args.seconds:g} s, fsync {args.fsync}, "
        f"shared port {'on' if args.shared_port else 'off'}, large tool output every "
        f"{args.large_every or '-'} turns ({args.large_chars} chars), offload ≥ "
        f"{args.tokenize_offload_chars or 'off'} chars, "
        f"{'streamed (SSE)' if args.stream else 'not streamed'}\n"
    )
    print(
        "| processes | sessions | calls/s | calls/s per process | added p50 ms | added p99 ms "
        "| loop lag p50 / p99 / mean ms | gateway CPU ms/call | relayed | turns reached | "
        "errors |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['processes']} | {r['sessions']} | {r['calls_per_s']:.0f} | "
            f"{r['calls_per_s'] / r['processes']:.0f} | {r['added_p50_ms']:.1f} | "
            f"{r['added_p99_ms']:.1f} | ≤{r['lag_p50_ms']:g} / ≤{r['lag_p99_ms']:g} / "
            f"{r['lag_mean_ms']:.1f} | {r['gateway_cpu_ms_per_call']:.2f} | "
            f"{100 * r['forwarded_share']:.0f} % | {r['turns_mean']:.1f} | "
            f"{sum(r['errors'].values()) or 0} |"
        )
    base = {r["sessions"]: r["calls_per_s"] for r in rows if r["processes"] == 1}
    for r in rows:
        if r["processes"] > 1 and base.get(r["sessions"]):
            print(
                f"{r['processes']} processes ÷ 1 at {r['sessions']} sessions: "
                f"{r['calls_per_s'] / base[r['sessions']]:.2f}×"
            )
    if args.stream:
        print(
            "replies by content type: "
            f"{[r['content_types'] for r in rows]}; SSE events per call (p50): "
            f"{[r['stream_events_p50'] for r in rows]}"
        )
    client_cpu = [round(r["client_cpu_ms_per_call"], 2) for r in rows]
    client_lag = [round(r["client_lag_p99_ms"], 1) for r in rows]
    print(f"client CPU ms/call: {client_cpu}; client loop lag p99 ms: {client_lag}")
    print(
        "calls/s one gateway core could serve (1000 / gateway CPU ms per call): "
        f"{[round(1000 / max(r['gateway_cpu_ms_per_call'], 1e-9)) for r in rows]}"
    )


if __name__ == "__main__":
    main()
