"""What routed experts cost in a samples file: bytes per 1,000 tokens, measured.

The same rows are written twice with the real writer (`rollout_client.storage.
write_samples`: Parquet, zstd), once without routing and once with each segment's
`routed_experts` (schema v8), for MoE shapes of served families; the difference of the
two files' sizes over the tokens they hold is the cost. Expert ids are drawn uniformly
(top_k distinct experts per token and layer): real routing is skewed towards some
experts and compresses somewhat better, so the figures are an upper bound. The raw size
(layers x top_k x the dtype's bytes per token) is printed beside it.

Run: `python -m bench.routing_storage [--rows 8] [--tokens 4000]`.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np

from rollout_client.storage import write_samples
from schemas.outcome import RolloutStatus
from schemas.routing import RoutedExperts
from schemas.samples import SampleRow
from schemas.scenes import Scene

SHAPES = {
    # name: (MoE layers, experts per token, experts)
    "Qwen3-30B-A3B": (48, 8, 128),
    "GLM-4.5-Air": (45, 8, 128),
    "DeepSeek-V3": (58, 8, 256),
    "Kimi-K2": (60, 8, 384),
    "gpt-oss-20b": (24, 4, 32),
}


def routing(rng: np.random.Generator, tokens: int, layers: int, top_k: int, experts: int):
    """Uniform routing: `top_k` distinct experts per token and layer."""
    scores = rng.random((tokens, layers, experts))
    return RoutedExperts.of(np.argpartition(scores, top_k, axis=-1)[..., :top_k])


def rows(rng: np.random.Generator, n: int, tokens: int, shape: tuple[int, int, int] | None):
    out = []
    prompt = tokens // 4
    for i in range(n):
        ids = rng.integers(0, 150_000, tokens).tolist()
        response = tokens - prompt
        out.append(
            SampleRow(
                rollout_id=f"r{i}",
                task_id="t",
                group_id="g",
                segment_id=f"s{i}",
                scene=Scene.main,
                prompt_ids=ids[:prompt],
                response_ids=ids[prompt:],
                loss_mask=[1] * response,
                logprobs=(-rng.random(response)).tolist(),
                reward=1.0,
                status=RolloutStatus.ok,
                policy_version="v1",
                env_version="e",
                prompt_template_version="t",
                reward_fn_version="r",
                harness="command",
                harness_version="1",
                sampling="{}",
                routed_experts=routing(rng, tokens - 1, *shape) if shape else None,
            )
        )
    return out


def size(sample_rows: list[SampleRow], directory: Path, name: str) -> int:
    path = directory / f"{name}.parquet"
    write_samples(sample_rows, path)
    return path.stat().st_size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=8, help="segments per file")
    parser.add_argument("--tokens", type=int, default=4000, help="tokens per segment")
    args = parser.parse_args()
    total = args.rows * args.tokens
    print(f"{args.rows} segments x {args.tokens} tokens, zstd Parquet (schema v8)")
    head = f"{'shape':<16}{'layers x top_k':>15}{'dtype':>8}"
    print(f"{head}{'raw B/1k tok':>14}{'file B/1k tok':>15}")
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        base = size(rows(np.random.default_rng(0), args.rows, args.tokens, None), directory, "none")
        print(f"{'(no routing)':<16}{'':>15}{'':>8}{'':>14}{base * 1000 / total:>15,.0f}")
        for name, shape in SHAPES.items():
            sample_rows = rows(np.random.default_rng(0), args.rows, args.tokens, shape)
            routed = size(sample_rows, directory, name)
            dtype = sample_rows[0].routed_experts.dtype  # type: ignore[union-attr]
            raw = shape[0] * shape[1] * np.dtype(dtype).itemsize * 1000
            cost = (routed - base) * 1000 / total
            print(f"{name:<16}{f'{shape[0]} x {shape[1]}':>15}{dtype:>8}{raw:>14,}{cost:>15,.0f}")


if __name__ == "__main__":
    main()
