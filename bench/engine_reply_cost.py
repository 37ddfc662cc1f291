"""CPU per call of the Gateway's vLLM client on its own, HTTP left out: the request body
built and encoded, then vLLM's reply read and checked, whole (`/v1/completions`, which
echoes the prompt's ids) and streamed (one token per chunk, the prompt's ids in the
first), at a short and a long prompt.

The client's `_send`/`_read` (whole) and `_read_stream` (streamed) are replaced by ones that
hand over a prepared vLLM reply, so only the client's own work is timed (thread CPU,
median of rounds). With `--before TREE` another source tree's client (its `gateway` and
`schemas`) is measured too, each in its own process, the two trees taking turns run by
run: `python -m bench.engine_reply_cost [--prompts 200 4000] [--tokens 61] [--before TREE
--runs 3]`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

from gateway.engines.vllm import VllmEngine
from schemas.sampling import SamplingParams

URL = "http://engine"


def _choice(ids: list[int], index: int, finish: str | None) -> dict[str, Any]:
    """A completions choice as vLLM sends it with `logprobs: 1` and `return_token_ids`."""
    lps = [-0.05 * ((index + i) % 9 + 1) for i in range(len(ids))]
    tokens = [f"t{t}" for t in ids]
    return {
        "index": 0,
        "text": "".join(tokens),
        "logprobs": {
            "text_offset": list(range(len(ids))),
            "token_logprobs": lps,
            "tokens": tokens,
            "top_logprobs": [{t: lp} for t, lp in zip(tokens, lps, strict=True)],
        },
        "finish_reason": finish,
        "stop_reason": None,
        "token_ids": ids,
    }


def whole_reply(prompt: list[int], output: list[int]) -> bytes:
    choice = {**_choice(output, 0, "stop"), "prompt_token_ids": prompt}
    usage = {"prompt_tokens": len(prompt), "completion_tokens": len(output)}
    body = {"id": "cmpl-1", "object": "text_completion", "choices": [choice], "usage": usage}
    return json.dumps(body).encode()


def stream_lines(prompt: list[int], output: list[int]) -> list[str]:
    lines = []
    for i, token in enumerate(output):
        choice = _choice([token], i, "stop" if i == len(output) - 1 else None)
        if i == 0:
            choice["prompt_token_ids"] = prompt
        lines += [f"data: {json.dumps({'id': 'cmpl-1', 'choices': [choice]})}", ""]
    usage = {"prompt_tokens": len(prompt), "completion_tokens": len(output)}
    return [*lines, f"data: {json.dumps({'choices': [], 'usage': usage})}", "", "data: [DONE]"]


class ReplayedEngine(VllmEngine):
    """The real client, with the network replaced by a prepared reply."""

    def __init__(self, content: bytes, lines: list[str]) -> None:
        super().__init__("m", request_timeout_s=30.0, connect_retries=0)
        self.content = content
        self.lines = lines

    async def _send(self, method: str, url: str, path: str, body: bytes | None = None) -> Any:
        return None

    async def _read(self, url: str, resp: Any) -> bytes:
        return self.content

    async def _read_stream(
        self, url: str, path: str, payload: dict[str, Any], read: Any, on_tokens: Any
    ) -> None:
        orjson.dumps(payload)  # encoded as the real one encodes what it sends
        for line in self.lines:
            chunk = read(line)
            if chunk is not None:
                on_tokens(*chunk)


def cost_us(engine: ReplayedEngine, prompt: list[int], stream: bool, rounds: int) -> float:
    sampling = SamplingParams(max_tokens=256, temperature=1.0)

    async def run() -> list[float]:
        samples = []
        for _ in range(rounds):
            start = time.thread_time()
            if stream:
                done = await engine.stream(URL, prompt, sampling, lambda ids, lps: None)
            else:
                done = await engine.complete(URL, prompt, sampling)
            samples.append(time.thread_time() - start)
        if done.prompt_tokens != len(prompt) or not done.output_ids:
            raise SystemExit(f"the client read the prepared reply wrong: {done}")
        return samples

    return 1e6 * statistics.median(asyncio.run(run()))


def measure(prompts: list[int], tokens: int, rounds: int) -> dict[int, tuple[float, float]]:
    """Prompt size → (whole, streamed) CPU µs per call of the client imported here."""
    output = [1000 + i for i in range(tokens)]
    costs = {}
    for size in prompts:
        prompt = list(range(100, 100 + size))
        engine = ReplayedEngine(whole_reply(prompt, output), stream_lines(prompt, output))
        costs[size] = (
            cost_us(engine, prompt, False, rounds),
            cost_us(engine, prompt, True, rounds // 4),
        )
    return costs


def measure_in(tree: Path | None, args: argparse.Namespace) -> dict[int, tuple[float, float]]:
    """`measure` in a child process whose `gateway` and `schemas` are `tree`'s (None: this
    tree's)."""
    argv = [sys.executable, "-P", "-m", "bench.engine_reply_cost", "--json", "--rounds"]
    argv += [str(args.rounds), "--tokens", str(args.tokens), "--prompts"]
    argv += [str(p) for p in args.prompts]
    here = str(Path(__file__).resolve().parent.parent)
    with tempfile.TemporaryDirectory() as links:
        path = here
        if tree is not None:
            for package in ("gateway", "schemas"):
                os.symlink(tree.resolve() / package, Path(links) / package)
            path = f"{links}{os.pathsep}{here}"
        env = {**os.environ, "PYTHONPATH": path}
        out = subprocess.run(argv, env=env, check=True, capture_output=True, text=True).stdout
    return {int(k): tuple(v) for k, v in json.loads(out).items()}  # type: ignore[misc]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prompts", type=int, nargs="+", default=[200, 4000])
    parser.add_argument("--tokens", type=int, default=61, help="sampled tokens per reply")
    parser.add_argument("--rounds", type=int, default=2000)
    parser.add_argument("--before", type=Path, default=None, help="also measure this tree")
    parser.add_argument("--runs", type=int, default=3, help="runs per tree with --before")
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.json:
        print(json.dumps(measure(args.prompts, args.tokens, args.rounds)))
        return
    trees: list[tuple[str, Path | None]] = [("this tree", None)]
    if args.before is not None:
        trees.insert(0, ("before", args.before))
    runs = args.runs if args.before is not None else 1
    results: dict[str, list[dict[int, tuple[float, float]]]] = {label: [] for label, _ in trees}
    for _ in range(runs):
        for label, tree in trees:
            results[label].append(measure_in(tree, args))
    print(f"vLLM client CPU per call, HTTP left out, {args.tokens} sampled tokens")
    print("(median of rounds; with --before, each cell lists the runs)")
    for size in args.prompts:
        for label, _ in trees:
            whole = " / ".join(f"{r[size][0]:.0f}" for r in results[label])
            streamed = " / ".join(f"{r[size][1]:.0f}" for r in results[label])
            print(f"prompt {size:>6} ids  {label:<10} whole {whole} us   streamed {streamed} us")


if __name__ == "__main__":
    main()
