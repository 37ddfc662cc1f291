"""What an engine must offer to sit behind `rollout gateway --engine URL`, asked of it
before a run (`rollout engine-check`).

Why: a trainer that brings its own inference server (verl's, SkyRL's, a pinned older
vLLM) serves an OpenAI API that may lack what the Gateway needs, and the first sign
would otherwise be every agent call failing mid-run. Each check runs the Gateway's own
engine client (`vllm.VllmEngine`) on one short call, so a pass means the calls of a
run pass the same validation; a failure carries the client's error, which names the
missing capability and what offers it.

Required: the model listed with its context window (else `--context-window`), and one
sampled token with its id and logprob through the chosen endpoint. Optional: vLLM's dev
weight endpoints (`VLLM_SERVER_DEV_MODE=1`), without which `POST /policy` cannot load a
checkpoint; a trainer that syncs weights itself uses `POST /policy/hold` and
`/policy/release` instead, which need nothing of the engine.
"""

import httpx
from pydantic import BaseModel

from gateway.engines.vllm import EngineApi, VllmEngine
from gateway.errors import GatewayError
from schemas.sampling import SamplingParams

PROBE_PROMPT = [0, 1, 2]
"""Token ids every vocabulary has: the probe's prompt (its text does not matter)."""


class EngineCapability(BaseModel):
    name: str
    required: bool
    ok: bool
    detail: str


async def check_engine(
    url: str, model: str, api: EngineApi = "completions", timeout_s: float = 60.0
) -> list[EngineCapability]:
    """Every capability of engine `url`, in the order a run needs them."""
    url = url.rstrip("/")
    engine = VllmEngine(model, request_timeout_s=timeout_s, connect_retries=0, api=api)
    found: list[EngineCapability] = []
    try:
        try:
            info = await engine.model_info(url)
            found.append(
                EngineCapability(
                    name="model listed with its context window (/v1/models)",
                    required=False,
                    ok=True,
                    detail=f"{info.id}, max_model_len {info.max_model_len}",
                )
            )
        except GatewayError as exc:
            found.append(
                EngineCapability(
                    name="model listed with its context window (/v1/models)",
                    required=False,
                    ok=False,
                    detail=f"{exc.message} (give the Gateway --context-window)",
                )
            )
        sampled = "token-id prompt in, sampled ids and logprobs out"
        try:
            done = await engine.complete(
                url, PROBE_PROMPT, SamplingParams(max_tokens=1, temperature=1.0)
            )
            found.append(
                EngineCapability(
                    name=f"{sampled} ({'/v1/completions' if api == 'completions' else api})",
                    required=True,
                    ok=True,
                    detail=f"ids {done.output_ids}, logprobs {done.output_logprobs}",
                )
            )
        except GatewayError as exc:
            found.append(
                EngineCapability(name=sampled, required=True, ok=False, detail=exc.message)
            )
    finally:
        await engine.aclose()
    found.append(await _weight_endpoints(url, timeout_s))
    return found


async def _weight_endpoints(url: str, timeout_s: float) -> EngineCapability:
    name = "in-place checkpoint loads for POST /policy (vLLM dev endpoints)"
    try:
        async with httpx.AsyncClient(timeout=timeout_s) as client:
            reply = await client.get(f"{url}/weight_info")
    except httpx.HTTPError as exc:
        return EngineCapability(name=name, required=False, ok=False, detail=repr(exc))
    if reply.status_code == 200:
        return EngineCapability(
            name=name, required=False, ok=True, detail=f"weight_info {reply.text[:200]}"
        )
    return EngineCapability(
        name=name,
        required=False,
        ok=False,
        detail=f"/weight_info answers {reply.status_code}: start vLLM with "
        "VLLM_SERVER_DEV_MODE=1 for POST /policy, or have the trainer sync weights itself "
        "inside POST /policy/hold and /policy/release",
    )
