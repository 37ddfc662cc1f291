"""What asking vLLM for logprobs costs, on its own: the floor under any capturing gateway.

The Gateway must record each sampled token's logprob (the trainer's behaviour policy), so
every engine call it makes asks `/v1/completions` for `logprobs`. This sends the same
token-ID prompt with the same generation length (`ignore_eos`) to vLLM with and without
logprobs, interleaved in one run, and prints the p50 of each and their ratio. Whatever this
ratio is, a gateway that captures logprobs cannot be faster than vLLM without them by more
than its own savings elsewhere (templating, tokenization).

Run: `python -m bench.vllm_logprobs_cost [--calls 30] [--prompt-tokens 500]
[--max-tokens 128]`.
"""

import argparse
import statistics
import time
from typing import Any

import httpx

from devstack.tiny_model import ensure_tiny_model
from devstack.vllm_server import VllmServer, VllmServerConfig

VARIANTS: dict[str, dict[str, Any]] = {
    "no logprobs": {},
    "logprobs 0 (sampled token)": {"logprobs": 0},
    "logprobs 1 (what the Gateway sends)": {"logprobs": 1},
    "logprobs 0, tokens as ids": {"logprobs": 0, "return_tokens_as_token_ids": True},
}


def timed_call(client: httpx.Client, url: str, body: dict[str, Any]) -> float:
    started = time.perf_counter()
    reply = client.post(f"{url}/v1/completions", json=body)
    reply.raise_for_status()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=30, help="calls per variant")
    parser.add_argument("--prompt-tokens", type=int, default=500)
    parser.add_argument("--max-tokens", type=int, default=128)
    args = parser.parse_args()
    model_dir = ensure_tiny_model()
    with VllmServer(VllmServerConfig(model_dir=model_dir)) as engine:
        base = {
            "model": engine.model,
            "prompt": list(range(100, 100 + args.prompt_tokens)),
            "max_tokens": args.max_tokens,
            "ignore_eos": True,
            "temperature": 1.0,
            "return_token_ids": True,
        }
        times: dict[str, list[float]] = {name: [] for name in VARIANTS}
        with httpx.Client(timeout=300) as client:
            for extra in VARIANTS.values():  # warm-up: first calls compile and allocate
                timed_call(client, engine.url, {**base, **extra})
            for _ in range(args.calls):
                for name, extra in VARIANTS.items():
                    times[name].append(timed_call(client, engine.url, {**base, **extra}))
    plain = statistics.median(times["no logprobs"])
    print(f"{args.calls} calls per variant, {args.prompt_tokens}-token prompt, "
          f"{args.max_tokens} tokens generated")  # fmt: skip
    print(f"{'variant':40s} {'p50 ms':>8s} {'x no logprobs':>14s}")
    for name, values in times.items():
        p50 = statistics.median(values)
        print(f"{name:40s} {p50 * 1000:8.1f} {p50 / plain:14.2f}")


if __name__ == "__main__":
    main()
