"""vLLM CPU's CPU per call with the model in a worker process (mp) or in the engine core (uni).

    python -m bench.vllm_executor [--model DIR] [--calls 40] [--prompt-len 300] [--tokens 8]

Starts the trainer's server (`VllmServerConfig.trainable`: float32, `--enforce-eager`) on
the tiny model twice, once per executor, and sends the same token-ID `/v1/completions`
calls (a `--prompt-len` prompt, exactly `--tokens` sampled, logprobs of the sampled
tokens: what the Gateway asks for) at 1, 4 and 16 in flight. Reports, per executor and
concurrency, the CPU time of the server and all its descendants per call (from /proc, so
every vLLM process counts) and the wall time per call, and the ratios uni ÷ mp.

Why: with vLLM's default multiprocess executor the model runs in a `VLLM::Worker`
process; the engine core spins (sched_yield) on a shared-memory queue while the worker
computes a step, and the worker spins for the next step, so one call in flight keeps
both cores of this box busy and takes CPU from everything else on it.
"""

import argparse
import asyncio
import os
import time
from pathlib import Path

import httpx
from rich.console import Console
from rich.table import Table

from bench.common import process_ticks
from devstack.tiny_model import ensure_tiny_model
from devstack.vllm_server import VllmServer, VllmServerConfig

CONCURRENCY = (1, 4, 16)
TICK = os.sysconf("SC_CLK_TCK")


async def send(
    url: str, model: str, calls: int, in_flight: int, prompt_len: int, tokens: int
) -> None:
    gate = asyncio.Semaphore(in_flight)
    async with httpx.AsyncClient(timeout=300) as client:

        async def one(i: int) -> None:
            body = {
                "model": model,
                "prompt": [5 + (i * 7 + k) % 200 for k in range(prompt_len)],
                "max_tokens": tokens,
                "min_tokens": tokens,
                "temperature": 1.0,
                "logprobs": 0,
                "return_token_ids": True,
            }
            async with gate:
                reply = await client.post(f"{url}/v1/completions", json=body)
                reply.raise_for_status()

        await asyncio.gather(*(one(i) for i in range(calls)))


def measure(
    model_dir: Path, single: bool, args: argparse.Namespace
) -> dict[int, tuple[float, float]]:
    """{in flight: (ms CPU per call, ms wall per call)} for one executor."""
    config = VllmServerConfig.trainable(model_dir, single_process=single)
    out: dict[int, tuple[float, float]] = {}
    with VllmServer(config) as server:
        assert server.pid is not None
        asyncio.run(send(server.url, server.model, 16, 4, args.prompt_len, args.tokens))  # warm
        for in_flight in CONCURRENCY:
            calls = args.calls * in_flight
            cpu0, wall0 = process_ticks(server.pid), time.monotonic()
            asyncio.run(
                send(server.url, server.model, calls, in_flight, args.prompt_len, args.tokens)
            )
            cpu, wall = (process_ticks(server.pid) - cpu0) / TICK, time.monotonic() - wall0
            out[in_flight] = (1000 * cpu / calls, 1000 * wall / calls)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", type=Path, default=None, help="default: the tiny model")
    parser.add_argument("--calls", type=int, default=40, help="calls per unit of concurrency")
    parser.add_argument("--prompt-len", type=int, default=300)
    parser.add_argument("--tokens", type=int, default=8)
    args = parser.parse_args()
    model_dir = args.model or ensure_tiny_model()
    mp = measure(model_dir, False, args)
    uni = measure(model_dir, True, args)
    table = Table(
        title=f"vLLM CPU per call ({args.prompt_len}-token prompt, {args.tokens} sampled)"
    )
    for col in (
        "in flight",
        "mp ms CPU",
        "uni ms CPU",
        "CPU uni/mp",
        "mp ms wall",
        "uni ms wall",
        "wall uni/mp",
    ):
        table.add_column(col, justify="right")
    for n in CONCURRENCY:
        (mc, mw), (uc, uw) = mp[n], uni[n]
        table.add_row(
            str(n),
            f"{mc:.1f}",
            f"{uc:.1f}",
            f"{uc / mc:.2f}",
            f"{mw:.1f}",
            f"{uw:.1f}",
            f"{uw / mw:.2f}",
        )
    Console().print(table)


if __name__ == "__main__":
    main()
