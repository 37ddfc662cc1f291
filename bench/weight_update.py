"""What a new policy costs the engine: in-place reload vs restarting vLLM.

    python -m bench.weight_update --reloads 5 [--no-restart]

Starts vLLM CPU (float32, dev endpoints on, `--enforce-eager`) on the tiny model, then
loads a checkpoint into it `--reloads` times through `gateway.engines.vllm_weights`
(pause → `reload_weights` → reset prefix cache → set version → resume) and reports
pause / load / total per reload; then restarts the server on the same checkpoint (the
fallback when in-place loading is unavailable) and reports stop and start-to-healthy
times. A request in flight during a reload is timed too: with `pause mode=wait` it
finishes on the old weights, and a request sent during the pause waits, it is not failed.

Then the same through the Gateway (`POST /policy`, in this process, in front of the same
server), alternating with direct reloads so both see the same load: per update the
gateway's drain (a 256-token agent call in flight), load and total, how long that call
took, and how long an agent call sent during the update waited and took in all.
"""

import argparse
import asyncio
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from devstack.tiny_model import ensure_tiny_model
from devstack.vllm_server import VllmServer, VllmServerConfig
from gateway.calls.pipeline import Gateway
from gateway.engines.vllm_weights import VllmWeightLoader
from schemas.policy import PolicyUpdateRecord, WeightUpdate
from workers.local_stack import start_gateway


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


async def agent_call(base: str, token: str, max_tokens: int) -> float:
    started = time.monotonic()
    async with httpx.AsyncClient(timeout=600) as client:
        reply = await client.post(
            f"{base}/v1/chat/completions",
            headers={"Authorization": f"Bearer {token}"},
            json={
                "model": "tiny-qwen3",
                "messages": [{"role": "user", "content": "write"}],
                "max_tokens": max_tokens,
            },
        )
        reply.raise_for_status()
    return time.monotonic() - started


async def until(condition: object, timeout_s: float = 300.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise TimeoutError("condition not reached")
        await asyncio.sleep(0.005)


async def gateway_update(
    gateway: Gateway, agent_url: str, control_url: str, checkpoint: Path, version: str
) -> dict[str, float]:
    """One `POST /policy` with an agent call in flight and one sent during the update."""
    async with httpx.AsyncClient(timeout=600) as client:
        session = await client.post(f"{control_url}/sessions", json={"rollout_id": version})
        token = session.json()["token"]
        in_flight = asyncio.ensure_future(agent_call(agent_url, token, 256))
        await until(lambda: gateway.policy.inflight >= 1)
        update = asyncio.ensure_future(
            client.post(
                f"{control_url}/policy",
                json={"policy_version": version, "checkpoint": str(checkpoint)},
            )
        )
        await until(lambda: gateway.policy.closed)
        sent = time.monotonic()
        held = asyncio.ensure_future(agent_call(agent_url, token, 4))
        reply = await update
        reply.raise_for_status()
        waited = time.monotonic() - sent
        record = PolicyUpdateRecord.model_validate_json(reply.content)
        return {
            "drain_s": record.drain_s,
            "load_s": record.load_s,
            "total_s": record.total_s,
            "in_flight_s": await in_flight,
            "held_wait_s": waited,
            "held_call_s": await held,
            "engine_pause_s": record.engines[0].pause_s,
            "engine_load_s": record.engines[0].load_s,
            "engine_total_s": record.engines[0].total_s,
        }


async def alternate(
    server: VllmServer, gateway: Gateway, agent_url: str, control_url: str, ckpt: Path, n: int
) -> tuple[list[dict[str, float]], list[dict[str, float]]]:
    direct, through = [], []
    for i in range(n):
        direct.extend(await reloads(server, ckpt, 1))
        through.append(await gateway_update(gateway, agent_url, control_url, ckpt, f"g{i}"))
    return direct, through


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reloads", type=int, default=5)
    parser.add_argument("--no-restart", action="store_true", help="skip the restart fallback")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-weights-"))
    checkpoint = work / "ckpt"
    shutil.copytree(ensure_tiny_model(), checkpoint)
    server = VllmServer(VllmServerConfig.trainable(ensure_tiny_model()))
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
        gw = start_gateway(
            server.url,
            ensure_tiny_model(),
            work / "gw",
            server.model,
            insecure_dev=True,
            checkpoint_roots=[work],
        )
        try:
            direct, through = asyncio.run(
                alternate(server, gw.gateway, gw.url, gw.control_url, checkpoint, args.reloads)
            )
        finally:
            gw.stop()
        print("\nalternating, same server: direct reload vs POST /policy through the Gateway")
        print(
            "| # | direct pause (drain) s | direct reload s | direct total s | gw drain s "
            "| gw load s (engine: pause / reload / total) | gw total s | held call waited s "
            "| held call total s |"
        )
        print("|---|---|---|---|---|---|---|---|---|")
        for i, (d, g) in enumerate(zip(direct, through, strict=True)):
            print(
                f"| {i} | {d['pause_s']:.3f} | {d['load_s']:.3f} | {d['total_s']:.3f} "
                f"| {g['drain_s']:.3f} | {g['load_s']:.3f} ({g['engine_pause_s']:.3f} / "
                f"{g['engine_load_s']:.3f} / {g['engine_total_s']:.3f}) | {g['total_s']:.3f} "
                f"| {g['held_wait_s']:.3f} | {g['held_call_s']:.3f} |"
            )
        med = statistics.median
        print(
            f"median: direct total {med(d['total_s'] for d in direct):.3f}s, gateway total "
            f"{med(g['total_s'] for g in through):.3f}s (drain "
            f"{med(g['drain_s'] for g in through):.3f}s, load "
            f"{med(g['load_s'] for g in through):.3f}s, of which the engine's reload "
            f"{med(g['engine_load_s'] for g in through):.3f}s vs direct "
            f"{med(d['load_s'] for d in direct):.3f}s)"
        )
        if args.no_restart:
            return
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
