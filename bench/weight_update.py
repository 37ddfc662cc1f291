"""What a new policy costs the engine: in-place reload vs restarting vLLM.

    python bench/weight_update.py --reloads 5

Starts vLLM CPU (float32, dev endpoints on, `--enforce-eager`) on the tiny model, then
loads a checkpoint into it `--reloads` times through `schemas.engine_weights`
(pause → `reload_weights` → reset prefix cache → set version → resume) and reports
pause / load / total per reload; then restarts the server on the same checkpoint (the
fallback when in-place loading is unavailable) and reports stop and start-to-healthy
times. A request in flight during a reload is timed too: with `pause mode=wait` it
finishes on the old weights, and a request sent during the pause waits, it is not failed.
"""

import argparse
import asyncio
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from devstack.tiny_model import ensure_tiny_model  # noqa: E402
from devstack.vllm_server import VllmServer, VllmServerConfig  # noqa: E402
from schemas.engine_weights import VllmWeightLoader, WeightUpdate  # noqa: E402


async def completion(url: str, model: str, max_tokens: int) -> float:
    started = time.monotonic()
    async with httpx.AsyncClient(timeout=600) as client:
        reply = await client.post(
            f"{url}/v1/completions",
            json={"model": model, "prompt": list(range(100, 140)), "max_tokens": max_tokens},
        )
        reply.raise_for_status()
    return time.monotonic() - started


async def reloads(server: VllmServer, checkpoint: Path, n: int) -> list[dict[str, float]]:
    loader = VllmWeightLoader(server.url)
    rows = []
    for i in range(n):
        in_flight = asyncio.ensure_future(completion(server.url, server.model, 256))
        await asyncio.sleep(0.05)
        report = await loader.load(WeightUpdate(policy_version=f"b{i}", checkpoint=str(checkpoint)))
        rows.append(
            {
                "pause_s": report.pause_s,
                "load_s": report.load_s,
                "total_s": report.total_s,
                "in_flight_s": await in_flight,
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reloads", type=int, default=5)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-weights-"))
    checkpoint = work / "ckpt"
    shutil.copytree(ensure_tiny_model(), checkpoint)
    server = VllmServer(
        VllmServerConfig(
            model_dir=ensure_tiny_model(),
            dtype="float32",
            max_model_len=4096,
            extra_args=["--enforce-eager"],
            extra_env={"VLLM_SERVER_DEV_MODE": "1"},
        )
    )
    try:
        server.start()
        print(f"vLLM up in {server.startup_s:.1f}s")
        asyncio.run(completion(server.url, server.model, 4))  # lazy init out of the way
        rows = asyncio.run(reloads(server, checkpoint, args.reloads))
        print("| reload | pause s | load s | total s | request in flight s |")
        print("|---|---|---|---|---|")
        for i, r in enumerate(rows):
            print(
                f"| {i} | {r['pause_s']:.3f} | {r['load_s']:.3f} | {r['total_s']:.3f} "
                f"| {r['in_flight_s']:.3f} |"
            )
        print(f"median total: {statistics.median(r['total_s'] for r in rows):.3f}s")
        t0 = time.monotonic()
        server.stop()
        stop_s = time.monotonic() - t0
        server.config.model_dir = checkpoint
        server.start()
        print(f"restart fallback: stop {stop_s:.1f}s + start-to-healthy {server.startup_s:.1f}s")
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
