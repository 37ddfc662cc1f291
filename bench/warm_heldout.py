"""Held-out reward of the warm tiny model sampled by vLLM CPU, and trainer/engine agreement.

Serves the model (``--dtype``, default float32) with the project's vLLM launcher and plays
every held-out task of the tiny family (``devstack.tiny_model.tasks``) the way its agent
does: the model's chat template, the Gateway's output parser (``HermesParser``), the
``get_weather`` tool answered from the task's data, and prompts extended token by token
like the Gateway's incremental tokenization. Each episode is scored by the task's file
check rule (``answer.txt`` equals the reference). Then the sampled completions' engine
log-probabilities are compared with transformers float32 (``devstack.tiny_model.logprobs``
in the vLLM venv): mean and max |difference| per token.

Run: ``python -m bench.warm_heldout [--samples 4] [--model DIR]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import tempfile
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
from tokenizers import Tokenizer

from devstack.tiny_model import IM_END, render_chat
from devstack.tiny_model.task_agent import SYSTEM_PROMPT, TOOLS_BY_NAME, weather_reply
from devstack.tiny_model.tasks import (
    HELDOUT_SEED,
    HELDOUT_SIZE,
    MAX_TOKENS,
    TaskCase,
    heldout_cases,
    score,
)
from devstack.tiny_model.warm import ensure_warm_model, subprocess_env
from devstack.vllm_server import VllmServer, VllmServerConfig
from environments.vllm_cpu import ensure_vllm_venv, venv_python
from gateway.parsers.base import ParseContext
from gateway.parsers.hermes import HermesParser

MAX_TURNS = 3


def _complete(
    client: httpx.Client, url: str, model: str, prompt: list[int], seed: int, temperature: float
) -> dict[str, Any]:
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": MAX_TOKENS,
        "temperature": temperature,
        "seed": seed,
        "logprobs": 1,
        "return_token_ids": True,
        "skip_special_tokens": False,
    }
    reply = client.post(f"{url}/v1/completions", json=body, timeout=300)
    reply.raise_for_status()
    return reply.json()["choices"][0]


def episode(
    url: str, model: str, tok: Tokenizer, case: TaskCase, seed: int, temperature: float
) -> dict[str, Any]:
    """One agent run; returns the answer, its reward and every engine call's tokens."""
    tools = [TOOLS_BY_NAME[n] for n in case.tools] or None
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": case.prompt},
    ]
    prompt = tok.encode(render_chat(messages, tools, add_generation_prompt=True)).ids
    parser = HermesParser()
    calls: list[dict[str, Any]] = []
    answer = ""
    with httpx.Client() as client:
        for turn in range(MAX_TURNS):
            choice = _complete(client, url, model, prompt, seed * 10 + turn, temperature)
            out = choice["token_ids"]
            calls.append(
                {
                    "prompt_ids": prompt,
                    "response_ids": out,
                    "logprobs": choice["logprobs"]["token_logprobs"],
                    "finish_reason": choice["finish_reason"],
                }
            )
            parsed = parser.parse(
                tok.decode(out, skip_special_tokens=False), ParseContext(f"c{turn}")
            )
            answer = (parsed.content or "").strip()
            if not parsed.tool_calls:
                break
            assistant = {
                "role": "assistant",
                "content": parsed.content or "",
                "tool_calls": [
                    {
                        "id": tc.id,
                        "type": "function",
                        "function": {"name": tc.name, "arguments": tc.arguments},
                    }
                    for tc in parsed.tool_calls
                ],
            }
            results = [
                {
                    "role": "tool",
                    "tool_call_id": tc.id,
                    "content": weather_reply(case.weather, tc.arguments)
                    if tc.name == "get_weather"
                    else f"error: unknown tool {tc.name!r}",
                }
                for tc in parsed.tool_calls
            ]
            before = render_chat([*messages, assistant], tools)
            messages += [assistant, *results]
            after = render_chat(messages, tools, add_generation_prompt=True)
            if out and out[-1] == tok.token_to_id(IM_END) and after.startswith(before):
                # As the Gateway does: the sampled IDs stay, only the new text is encoded.
                prompt = prompt + out + tok.encode(after[len(before) - 1 :]).ids
            else:
                prompt = tok.encode(after).ids
    return {"task_id": case.task_id, "kind": case.kind, "answer": answer,
            "reward": score(case, answer), "calls": calls}  # fmt: skip


def agreement(python: Path, model_dir: Path, calls: list[dict[str, Any]]) -> dict[str, float]:
    """|transformers float32 logprob - engine logprob| over the calls' sampled tokens."""
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = Path(tmp) / "in.json", Path(tmp) / "out.json"
        src.write_text(json.dumps(calls))
        cmd = [str(python), "-m", "devstack.tiny_model.logprobs", str(model_dir), str(src)]
        subprocess.run([*cmd, str(dst)], check=True, env=subprocess_env())
        ours = json.loads(dst.read_text())
    diffs = [
        abs(a - b) for c, row in zip(calls, ours, strict=True)
        for a, b in zip(c["logprobs"], row, strict=True)
    ]  # fmt: skip
    return {"tokens": len(diffs), "mean": statistics.fmean(diffs), "max": max(diffs)}


def _recorded_expected_reward(model_dir: Path) -> dict[str, float] | None:
    """What the warm-up predicted (teacher-forced, same held-out cases), to compare."""
    path = model_dir / "warmup.json"
    if not path.exists():
        return None
    return json.loads(path.read_text())["curve"][-1].get("heldout_expected_reward")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=None, help="default: the cached warm model")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--samples", type=int, default=4, help="episodes per held-out task")
    ap.add_argument("--tasks", type=int, default=HELDOUT_SIZE)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--agreement-calls", type=int, default=32)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--json", type=Path, default=None, help="write the figures here")
    args = ap.parse_args()

    python = venv_python(ensure_vllm_venv())
    t0 = time.monotonic()
    model_dir = args.model or ensure_warm_model(python)
    print(f"model {model_dir} (ready after {time.monotonic() - t0:.0f}s)", flush=True)
    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    cases = heldout_cases(HELDOUT_SEED, args.tasks)
    config = VllmServerConfig(
        model_dir=model_dir, dtype=args.dtype, max_model_len=2048, extra_args=["--enforce-eager"]
    )
    with VllmServer(config) as server:
        print(f"vLLM ({args.dtype}) up in {server.startup_s:.0f}s", flush=True)
        jobs = [(c, s) for c in cases for s in range(args.samples)]
        t1 = time.monotonic()
        with ThreadPoolExecutor(args.concurrency) as pool:
            runs = list(
                pool.map(
                    lambda j: episode(
                        server.url, server.model, tok, j[0], 1000 * cases.index(j[0]) + j[1],
                        args.temperature,
                    ),
                    jobs,
                )
            )  # fmt: skip
        wall = time.monotonic() - t1
    generated = sum(len(c["response_ids"]) for r in runs for c in r["calls"])
    by_kind: dict[str, list[float]] = defaultdict(list)
    for r in runs:
        by_kind[r["kind"]].append(r["reward"])
    calls = [c for r in runs for c in r["calls"]][: args.agreement_calls]
    figures = {
        "model": str(model_dir),
        "dtype": args.dtype,
        "temperature": args.temperature,
        "episodes": len(runs),
        "heldout_reward": statistics.fmean(r["reward"] for r in runs),
        "by_kind": {k: statistics.fmean(v) for k, v in sorted(by_kind.items())},
        "warmup_expected_reward": _recorded_expected_reward(model_dir),
        "truncated_calls": sum(c["finish_reason"] == "length" for r in runs for c in r["calls"]),
        "generated_tokens": generated,
        "tokens_per_s": generated / wall,
        "agreement": agreement(python, model_dir, calls),
        "examples": [
            {k: r[k] for k in ("task_id", "answer", "reward")} for r in runs[:: args.samples][:8]
        ],
    }
    print(json.dumps(figures, indent=2, ensure_ascii=False))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
