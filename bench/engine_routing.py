"""Several engines behind one gateway: prefix-cache hit rate, sticky vs round-robin, and
how busy the engines are kept, measured side by side in one run.

Two real vLLM CPU servers (tiny model, prefix caching on) behind one `rollout gateway
--engine A,B`. For each routing mode (`--engine-routing sticky`: a session keeps the
engine it was assigned least-loaded at creation; `round-robin`: every call goes to the
next engine) and each rollout count, R agents run T-turn conversations through the
gateway, each waiting `--tool-latency-s` between calls (the tool running). Between rows
both engines' prefix caches are reset (vLLM dev endpoint), so every row starts cold.

Reported per row: the prefix-cache hit rate from vLLM's own `/metrics`
(`vllm:prefix_cache_hits` ÷ `vllm:prefix_cache_queries`, in tokens, both engines), the
gateway's view of it (`rollout_gateway_engine_cached_prompt_tokens` ÷ prompt tokens), and
each engine's busy fraction: `rollout_gateway_engine_busy_seconds` (time with at least
one call in flight) ÷ the row's wall time.

Run: `python -m bench.engine_routing [--rollouts 4,16] [--turns 8] [--tool-latency-s 0.5]`.
The conversations share a long system prompt and differ from their user message on, as
agents on different tasks do.
"""

import argparse
import asyncio
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from bench.common import wait_healthy
from devstack.ports import consecutive_free_ports
from devstack.tiny_model import ensure_tiny_model
from devstack.vllm_server import VllmServer, VllmServerConfig

SYSTEM = "You are a careful coding agent working in a repository. " + " ".join(
    f"Rule {i}: read the file before you change it, run the tests after." for i in range(40)
)
TOOL_OUTPUT = "".join(
    f"src/module_{i}.py: {i * 17} lines, last changed by build {i}\n" for i in range(12)
)


def vllm_counters(url: str) -> tuple[float, float]:
    """(prefix-cache queries, hits) in tokens, summed over the engine's label sets."""
    queries = hits = 0.0
    for line in httpx.get(f"{url}/metrics", timeout=30).text.splitlines():
        if line.startswith("vllm:prefix_cache_queries_total"):
            queries += float(line.rsplit(" ", 1)[1])
        elif line.startswith("vllm:prefix_cache_hits_total"):
            hits += float(line.rsplit(" ", 1)[1])
    return queries, hits


def gateway_engine_metrics(control: str) -> dict[str, dict[str, float]]:
    """Per engine URL: busy seconds, calls, prompt and cached prompt tokens."""
    names = {
        "rollout_gateway_engine_busy_seconds_total": "busy_s",
        "rollout_gateway_engine_prompt_tokens_total": "prompt",
        "rollout_gateway_engine_cached_prompt_tokens_total": "cached",
    }
    out: dict[str, dict[str, float]] = {}
    for line in httpx.get(f"{control}/metrics", timeout=30).text.splitlines():
        name = line.split("{", 1)[0]
        if name in names or (
            name == "rollout_gateway_engine_calls_total" and 'outcome="ok"' in line
        ):
            engine = line.split('engine="', 1)[1].split('"', 1)[0]
            key = names.get(name, "calls")
            out.setdefault(engine, {})[key] = float(line.rsplit(" ", 1)[1])
    return out


async def agent(session: dict[str, Any], turns: int, tool_latency_s: float, max_tokens: int) -> int:
    """One rollout: T calls, each followed by a tool that takes `tool_latency_s`."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": f"Task {secrets.token_hex(8)}: fix the failing test."},
    ]
    headers = {"Authorization": f"Bearer {session['token']}"}
    failed = 0
    async with httpx.AsyncClient(base_url=session["openai_base_url"], timeout=600) as client:
        for turn in range(turns):
            reply = await client.post(
                "/chat/completions",
                headers=headers,
                json={"model": "m", "messages": messages, "max_tokens": max_tokens},
            )
            if reply.status_code != 200:
                failed += 1
                break
            content = reply.json()["choices"][0]["message"].get("content") or ""
            messages += [
                {"role": "assistant", "content": content},
                {"role": "user", "content": f"{TOOL_OUTPUT}(turn {turn})"},
            ]
            await asyncio.sleep(tool_latency_s)
    return failed


async def run_agents(
    control: str, rollouts: int, turns: int, tool_latency_s: float, max_tokens: int
) -> tuple[float, int]:
    async with httpx.AsyncClient(timeout=60) as client:
        sessions = [
            (await client.post(f"{control}/sessions", json={"rollout_id": f"r{i}"})).json()
            for i in range(rollouts)
        ]
    started = time.monotonic()
    failed = await asyncio.gather(*(agent(s, turns, tool_latency_s, max_tokens) for s in sessions))
    return time.monotonic() - started, sum(failed)


def run_row(
    args: argparse.Namespace, model: Path, engines: list[VllmServer], mode: str, rollouts: int
) -> dict[str, Any]:
    for engine in engines:
        httpx.post(f"{engine.url}/reset_prefix_cache", timeout=60).raise_for_status()
    before = [vllm_counters(e.url) for e in engines]
    port = consecutive_free_ports(2)
    with tempfile.TemporaryDirectory(prefix="gw-routing-") as data_dir:
        cmd = [
            sys.executable, "-m", "workers.cli", "gateway",
            "--engine", ",".join(e.url for e in engines), "--model", engines[0].model,
            "--tokenizer", str(model), "--insecure-dev", "--port", str(port),
            "--control-port", str(port + 1), "--data-dir", data_dir,
            "--engine-routing", mode,
        ]  # fmt: skip
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
        control = f"http://127.0.0.1:{port + 1}"
        try:
            wait_healthy(control, proc)
            wall, failed = asyncio.run(
                run_agents(control, rollouts, args.turns, args.tool_latency_s, args.max_tokens)
            )
            seen = gateway_engine_metrics(control)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
    after = [vllm_counters(e.url) for e in engines]
    queries = sum(a[0] - b[0] for a, b in zip(after, before, strict=True))
    hits = sum(a[1] - b[1] for a, b in zip(after, before, strict=True))
    per_engine = [seen.get(e.url, {}) for e in engines]
    prompt = sum(p.get("prompt", 0.0) for p in per_engine)
    cached = sum(p.get("cached", 0.0) for p in per_engine)
    return {
        "mode": mode,
        "rollouts": rollouts,
        "wall_s": wall,
        "failed": failed,
        "vllm_hit_rate": hits / queries if queries else 0.0,
        "gateway_cached_share": cached / prompt if prompt else 0.0,
        "calls": [int(p.get("calls", 0)) for p in per_engine],
        "busy": [p.get("busy_s", 0.0) / wall for p in per_engine],
    }


def start_engines(model: Path, count: int) -> list[VllmServer]:
    """Start the engines in parallel (each takes minutes on this CPU)."""
    engines = [
        VllmServer(
            VllmServerConfig(
                model_dir=model,
                max_model_len=4096,
                extra_args=["--enforce-eager", "--enable-prompt-tokens-details"],
                extra_env={"VLLM_SERVER_DEV_MODE": "1"},  # /reset_prefix_cache between rows
            )
        )
        for _ in range(count)
    ]
    errors: list[BaseException] = []

    def start(engine: VllmServer) -> None:
        try:
            engine.start()
        except BaseException as exc:  # reported below, after every start returned
            errors.append(exc)

    threads = [threading.Thread(target=start, args=(e,)) for e in engines]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        for engine in engines:
            engine.stop()
        raise errors[0]
    return engines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rollouts", default="4,16", help="concurrent rollouts per row")
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--tool-latency-s", type=float, default=0.5)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--modes", default="sticky,round-robin")
    args = parser.parse_args()
    model = ensure_tiny_model()
    engines = start_engines(model, 2)
    rows = []
    try:
        print(
            f"engines up: {[e.url for e in engines]} (startup {[e.startup_s for e in engines]} s)"
        )
        for rollouts in (int(r) for r in args.rollouts.split(",")):
            for mode in args.modes.split(","):
                row = run_row(args, model, engines, mode, rollouts)
                print(row, flush=True)
                rows.append(row)
    finally:
        for engine in engines:
            engine.stop()
    print(
        f"\n2 vLLM CPU engines (tiny model), {args.turns} turns per rollout, tool latency "
        f"{args.tool_latency_s:g} s, max_tokens {args.max_tokens}\n"
    )
    print(
        "| routing | rollouts | wall s | prefix-cache hit rate (vLLM) | cached share (gateway) "
        "| calls per engine | busy fraction per engine | failed |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        busy = " / ".join(f"{100 * b:.0f} %" for b in r["busy"])
        print(
            f"| {r['mode']} | {r['rollouts']} | {r['wall_s']:.1f} | "
            f"{100 * r['vllm_hit_rate']:.1f} % | {100 * r['gateway_cached_share']:.1f} % | "
            f"{' / '.join(map(str, r['calls']))} | {busy} | {r['failed']} |"
        )


if __name__ == "__main__":
    main()
