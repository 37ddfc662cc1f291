"""Routing replay against real vLLM on a GPU: does vLLM's `routed_experts` match the
experts a fresh transformers forward picks for the same tokens?

For a machine with a GPU (vLLM 0.32 returns routing only with its V2 model runner, which
needs Triton and a GPU; vLLM CPU refuses `--enable-return-routed-experts`). Not yet run on
one. It

1. serves MODEL with the exact command it prints (`VLLM_USE_V2_MODEL_RUNNER=1 ... vllm
   serve MODEL --enable-return-routed-experts --enable-scale-out ...`);
2. renders a few chat prompts with vLLM's `/tokenize`, samples each on the token-in/
   token-out `/inference/v1/generate`, then a second turn that extends the first with
   `routed_experts_prompt_start` set to the part already returned (a multi-turn agent's
   call), and checks the rows it gets back have vLLM's documented shape;
3. stops vLLM (freeing the GPU) and recomputes every stored sequence's top-k experts
   with transformers (`devstack/reference_moe/recompute_routing.py`: a plain forward with
   router logits, on the GPU in bfloat16), printing agreement per MoE layer.

Run, with PYTHON an interpreter that has vLLM (GPU build), torch and transformers, and
the model already on disk (the bench, like every bench, stays off the network: both
vLLM and transformers run with HF_HUB_OFFLINE=1; `huggingface-cli download MODEL` first,
or pass a model directory):

    python -m bench.routing_replay_gpu --vllm-python PYTHON --model Qwen/Qwen3-30B-A3B

A smaller MoE fits a smaller GPU: `--model Qwen/Qwen1.5-MoE-A2.7B`. vLLM runs bfloat16 with
fused kernels, so a router logit pair closer than `--tie-tolerance` is counted as a tie
and not compared; expect agreement near, not at, 100% outside ties.
"""

from __future__ import annotations

import argparse
import base64
import io
import shlex
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from devstack.reference_moe import RoutedSequence, recompute_routing
from devstack.vllm_server import VllmServer, VllmServerConfig

PROMPTS = [
    "List three prime numbers and explain why each is prime.",
    "Write a Python function that reverses a linked list.",
    "Summarise the causes of the French Revolution in four sentences.",
    "你好！请用两句话介绍一下你自己。",
]
FOLLOW_UP = " Now say it again, shorter."


def server_config(args: argparse.Namespace) -> VllmServerConfig:
    return VllmServerConfig(
        model_dir=Path(args.model),
        served_model_name=args.model,
        python=args.vllm_python,
        dtype="bfloat16",
        max_model_len=args.max_model_len,
        single_process=False,
        startup_timeout_s=3600.0,
        extra_args=[
            "--enable-return-routed-experts",
            "--enable-scale-out",
            "--enable-prefix-caching",
            "--tensor-parallel-size",
            str(args.tensor_parallel_size),
            "--gpu-memory-utilization",
            str(args.gpu_memory_utilization),
        ],
        extra_env={"VLLM_USE_V2_MODEL_RUNNER": "1"},
    )


def decode(encoded: str) -> np.ndarray:
    return np.load(io.BytesIO(base64.b64decode(encoded)), allow_pickle=False)


def generate(
    client: httpx.Client, url: str, ids: list[int], seed: int, start: int, args: argparse.Namespace
) -> dict[str, Any]:
    sampling = {
        "temperature": 1.0,
        "seed": seed,
        "max_tokens": args.max_tokens,
        "logprobs": 1,
        "routed_experts_prompt_start": start,
    }
    reply = client.post(
        f"{url}/inference/v1/generate",
        json={"model": args.model, "token_ids": ids, "sampling_params": sampling},
    )
    reply.raise_for_status()
    choice: dict[str, Any] = reply.json()["choices"][0]
    if choice.get("routed_experts") is None:
        raise SystemExit("vLLM returned no routed_experts: is --enable-return-routed-experts on?")
    return choice


def tokenize(client: httpx.Client, url: str, model: str, text: str, chat: bool = True) -> list[int]:
    """`text` as a rendered user turn (`chat`), or as plain text."""
    body: dict[str, Any] = {"model": model}
    if chat:
        body.update(messages=[{"role": "user", "content": text}], add_generation_prompt=True)
    else:
        body.update(prompt=text, add_special_tokens=False)
    reply = client.post(f"{url}/tokenize", json=body)
    reply.raise_for_status()
    return list(reply.json()["tokens"])


def sample(server: VllmServer, args: argparse.Namespace) -> list[RoutedSequence]:
    """Two turns per prompt; each turn's rows checked against vLLM's documented shape."""
    sequences = []
    with httpx.Client(timeout=600) as client:
        for seed, text in enumerate(PROMPTS[: args.prompts]):
            first_ids = tokenize(client, server.url, args.model, text)
            first = generate(client, server.url, first_ids, seed, 0, args)
            rows = decode(first["routed_experts"])
            full = first_ids + first["token_ids"]
            assert rows.shape[0] == len(full) - 1, (rows.shape, len(full))
            sequences.append(
                RoutedSequence(
                    name=f"p{seed}", token_ids=full, routed_experts=first["routed_experts"]
                )
            )
            follow = tokenize(client, server.url, args.model, FOLLOW_UP, chat=False)
            second_ids = full + follow
            # Rows for the first turn's tokens came with it: ask only for what is new.
            start = len(full) - 1
            second = generate(client, server.url, second_ids, seed, start, args)
            more = decode(second["routed_experts"])
            assert more.shape[0] == len(second_ids) + len(second["token_ids"]) - 1 - start
            sequences.append(
                RoutedSequence(
                    name=f"p{seed}-turn2",
                    token_ids=second_ids + second["token_ids"],
                    routed_experts=second["routed_experts"],
                    first_token=start,
                )
            )
            print(f"prompt {seed}: {rows.shape} then {more.shape} ({rows.dtype})")
    return sequences


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.routing_replay_gpu", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--vllm-python",
        type=Path,
        required=True,
        help="python with vLLM (GPU), torch, transformers",
    )
    parser.add_argument("--model", default="Qwen/Qwen3-30B-A3B")
    parser.add_argument("--prompts", type=int, default=len(PROMPTS))
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--max-model-len", type=int, default=8192)
    parser.add_argument("--tensor-parallel-size", type=int, default=1)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.85)
    parser.add_argument(
        "--tie-tolerance", type=float, default=1e-2, help="router logit gap counted as a tie"
    )
    args = parser.parse_args(argv)

    with VllmServer(server_config(args)) as server:
        env = " ".join(f"{k}={v}" for k, v in server.config.extra_env.items())
        print("vLLM command:", env, shlex.join(server.command(args.vllm_python)))
        sequences = sample(server, args)
    report = recompute_routing(
        args.model,
        sequences,
        python=args.vllm_python,
        options={"dtype": "bfloat16", "device_map": "auto", "tie_tolerance": args.tie_tolerance},
        timeout_s=3600.0,
    )
    print(f"{'layer':>5} {'agree':>7} {'compared':>8} {'ties':>5} {'agreement':>9}")
    rows = [(str(layer), c) for layer, c in enumerate(report.layers())]
    for name, counts in [*rows, ("all", report.total())]:
        rate = counts.agree / counts.compared if counts.compared else float("nan")
        print(f"{name:>5} {counts.agree:>7} {counts.compared:>8} {counts.ties:>5} {rate:>9.4f}")
    for mismatch in report.mismatches:
        print("mismatch:", mismatch)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
