"""`rollout engine-check` against a plain vLLM OpenAI server (the shared vLLM CPU
fixture: `vllm.entrypoints.openai.api_server`, what verl's and SkyRL's servers build on),
and against that server behind a proxy that drops the sampled token ids from its replies
(what a vLLM before `return_token_ids` answers): the check names the missing capability,
and exits 1."""

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from devstack.background_server import BackgroundServer
from devstack.vllm_server import VllmServer
from gateway.engines.engine_check import check_engine

pytestmark = pytest.mark.integration


def engine_check(url: str, model: str, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "workers.cli", "engine-check", "--engine", url, "--model", model]
    return subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=300)


@pytest.fixture
def without_token_ids(vllm_server: VllmServer) -> Iterator[str]:
    """The real server, its completion replies stripped of `token_ids` on the way back."""

    async def forward(request: Request) -> Response:
        async with httpx.AsyncClient(timeout=300) as client:
            reply = await client.request(
                request.method,
                vllm_server.url + request.url.path,
                content=await request.body(),
                headers={"content-type": "application/json"},
            )
        body = reply.content
        if request.url.path == "/v1/completions" and reply.is_success:
            data = json.loads(body)
            for choice in data["choices"]:
                choice.pop("token_ids", None)
            body = json.dumps(data).encode()
        return Response(body, reply.status_code, media_type="application/json")

    app = Starlette(routes=[Route("/{path:path}", forward, methods=["GET", "POST"])])
    with BackgroundServer(app) as server:
        yield server.url


def test_a_plain_vllm_server_offers_what_the_gateway_needs(vllm_server: VllmServer) -> None:
    """Both sampling endpoints pass; its dev weight endpoints are off, so the check says a
    trainer's own sync goes through the hold and release instead of POST /policy."""
    for api in ("completions", "generate"):
        found = asyncio.run(check_engine(vllm_server.url, vllm_server.model, api=api))
        assert [(c.required, c.ok) for c in found] == [(False, True), (True, True), (False, False)]
        assert "max_model_len 16384" in found[0].detail
        assert "VLLM_SERVER_DEV_MODE=1" in found[2].detail and "/policy/hold" in found[2].detail
    done = engine_check(vllm_server.url, vllm_server.model)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "ok   token-id prompt in, sampled ids and logprobs out" in done.stdout


def test_an_engine_that_drops_token_ids_fails_the_check_naming_it(
    vllm_server: VllmServer, without_token_ids: str
) -> None:
    done = engine_check(without_token_ids, vllm_server.model)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "FAIL token-id prompt in, sampled ids and logprobs out" in done.stdout
    assert "does not return sampled token ids (no choices[0].token_ids)" in done.stdout
    assert "vLLM >= 0.10.2" in done.stdout
