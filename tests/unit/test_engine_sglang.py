"""The SGLang engine (`gateway.engines.sglang`): payload, reply mapping and validation,
streaming (cumulative and incremental), abort, model info and in-place weight loads,
against `FakeSglangForTests` — SGLang does not run on this CPU box."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import openai
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from tokenizers import Tokenizer

from gateway.engines.base import WeightLoadError
from gateway.engines.routing import EngineRouter
from gateway.engines.sglang import SglangEngine
from gateway.errors import GatewayError
from schemas.policy import WeightUpdate
from schemas.sampling import SamplingParams
from tests.unit.test_engine_client import serve_on_loopback

MODEL = "tiny"
PROMPT = [1, 2, 3, 4]


def meta(output: list[int], finish: dict[str, Any] | None, **extra: Any) -> dict[str, Any]:
    return {
        "id": "r1",
        "prompt_tokens": len(PROMPT),
        "completion_tokens": len(output),
        "cached_tokens": 2,
        "output_token_logprobs": [[-0.5 - i, t, None] for i, t in enumerate(output)],
        "finish_reason": finish,
        "weight_version": "7",
        **extra,
    }


class FakeSglangForTests:
    """Scripted stand-in for an SGLang server — NOT SGLang. `/generate` answers with the
    queued reply (default: tokens 7, 8, 9 ending on `stop`), streamed as SGLang's
    `data:` lines (each repeating the output so far, or only the new part when
    `incremental`); it records every request body."""

    def __init__(self, incremental: bool = False) -> None:
        self.incremental = incremental
        self.requests: list[dict[str, Any]] = []
        self.scripted: list[dict[str, Any]] = []
        self.server_info: dict[str, Any] = {"context_length": 4096, "served_model_name": MODEL}
        self.loads: list[dict[str, Any]] = []
        self.load_reply: dict[str, Any] = {"success": True, "message": "ok"}
        self.app = Starlette(
            routes=[
                Route("/generate", self._generate, methods=["POST"]),
                Route("/get_server_info", self._info, methods=["GET"]),
                Route("/get_weight_version", self._version, methods=["GET"]),
                Route("/update_weights_from_disk", self._load, methods=["POST"]),
            ]
        )

    async def _generate(self, request: Request) -> Response:
        body = await request.json()
        self.requests.append(body)
        reply = (
            self.scripted.pop(0)
            if self.scripted
            else {"text": "xyz", "meta_info": meta([7, 8, 9], {"type": "stop", "matched": 2})}
        )
        reply["meta_info"].setdefault("prompt_tokens", len(body["input_ids"]))
        if not body.get("stream"):
            return JSONResponse(reply)
        return StreamingResponse(self._chunks(reply), media_type="text/event-stream")

    async def _chunks(self, reply: dict[str, Any]) -> AsyncIterator[bytes]:
        entries = reply["meta_info"]["output_token_logprobs"]
        for n in range(1, len(entries) + 1):
            last = n == len(entries)
            part = entries[n - 1 : n] if self.incremental else entries[:n]
            info = {**reply["meta_info"], "output_token_logprobs": part, "completion_tokens": n}
            info["finish_reason"] = reply["meta_info"]["finish_reason"] if last else None
            text = reply["text"][n - 1 : n] if self.incremental else reply["text"][:n]
            yield f"data: {json.dumps({'text': text, 'meta_info': info})}\n\n".encode()
        yield b"data: [DONE]\n\n"

    async def _info(self, request: Request) -> Response:
        return JSONResponse(self.server_info)

    async def _version(self, request: Request) -> Response:
        return JSONResponse({"weight_version": "7"})

    async def _load(self, request: Request) -> Response:
        self.loads.append(await request.json())
        return JSONResponse(self.load_reply)


@pytest.fixture
def fake() -> FakeSglangForTests:
    return FakeSglangForTests()


@pytest.fixture
def url(fake: FakeSglangForTests) -> Iterator[str]:
    with serve_on_loopback(fake.app) as base:
        yield base


@pytest.fixture
async def engine(url: str) -> AsyncIterator[EngineRouter]:
    router = EngineRouter([url], SglangEngine(MODEL, request_timeout_s=5, connect_retries=0))
    yield router
    await router.aclose()


async def test_payload_is_sglangs_and_the_reply_maps_onto_a_completion(
    engine: EngineRouter, fake: FakeSglangForTests, url: str
) -> None:
    sampling = SamplingParams(max_tokens=16, temperature=0.7, seed=3, top_k=20, stop=["\n"])
    result = await engine.complete(url, PROMPT, sampling)
    (body,) = fake.requests
    assert body["input_ids"] == PROMPT and body["return_logprob"] is True
    params = body["sampling_params"]
    assert (params["max_new_tokens"], params["sampling_seed"], params["top_k"]) == (16, 3, 20)
    assert params["stop"] == ["\n"] and params["temperature"] == 0.7
    assert params["no_stop_trim"] is True and params["skip_special_tokens"] is False
    assert "max_tokens" not in params and "seed" not in params
    assert result.output_ids == [7, 8, 9]
    assert result.output_logprobs == [-0.5, -1.5, -2.5]
    assert (result.finish_reason, result.stop_reason) == ("stop", 2)
    assert (result.prompt_tokens, result.completion_tokens, result.cached_prompt_tokens) == (
        4,
        3,
        2,
    )


async def test_length_finish(engine: EngineRouter, fake: FakeSglangForTests, url: str) -> None:
    fake.scripted.append({"text": "ab", "meta_info": meta([5, 6], {"type": "length"})})
    result = await engine.complete(url, PROMPT, SamplingParams(max_tokens=2))
    assert (result.finish_reason, result.output_ids) == ("length", [5, 6])


async def test_an_aborted_call_is_retryable_not_a_completion(
    engine: EngineRouter, fake: FakeSglangForTests, url: str
) -> None:
    fake.scripted.append({"text": "a", "meta_info": meta([5], {"type": "abort"})})
    with pytest.raises(GatewayError) as info:
        await engine.complete(url, PROMPT, SamplingParams())
    assert info.value.kind == "engine_unavailable" and info.value.retry_after is not None


@pytest.mark.parametrize(
    ("meta_info", "message"),
    [
        (meta([5, 6], {"type": "stop"}, completion_tokens=3), "completion_tokens=3"),
        (meta([5], {"type": "stop"}, prompt_tokens=9), "prompt_tokens=9"),
        (meta([5], {"type": "stop"}, output_token_logprobs=None), "output_token_logprobs"),
        (meta([5], {"type": "stop"}, output_token_logprobs=[[None, 5, None]]), "is None"),
        (meta([5], None), "finish_reason missing"),
    ],
)
async def test_a_malformed_reply_is_a_bad_reply(
    engine: EngineRouter, fake: FakeSglangForTests, url: str, meta_info: Any, message: str
) -> None:
    fake.scripted.append({"text": "a", "meta_info": meta_info})
    with pytest.raises(GatewayError, match=message) as info:
        await engine.complete(url, PROMPT, SamplingParams())
    assert info.value.kind == "engine_bad_reply"


@pytest.mark.parametrize("incremental", [False, True])
async def test_a_stream_hands_over_each_new_token_and_ends_like_a_whole_reply(
    incremental: bool,
) -> None:
    fake = FakeSglangForTests(incremental=incremental)
    seen: list[tuple[list[int], list[float]]] = []
    with serve_on_loopback(fake.app) as url:
        engine = SglangEngine(
            MODEL, request_timeout_s=5, connect_retries=0, incremental_stream=incremental
        )
        streamed = await engine.stream(
            url, PROMPT, SamplingParams(), lambda i, lp: seen.append((i, lp))
        )
        whole = await engine.complete(url, PROMPT, SamplingParams())
        await engine.aclose()
    assert seen == [([7], [-0.5]), ([8], [-1.5]), ([9], [-2.5])]
    assert streamed.model_dump() == whole.model_dump()
    assert fake.requests[0]["stream"] is True


async def test_a_cumulative_stream_that_does_not_extend_itself_is_refused() -> None:
    fake = FakeSglangForTests(incremental=True)  # deltas, read as cumulative
    with serve_on_loopback(fake.app) as url:
        engine = SglangEngine(MODEL, request_timeout_s=5, connect_retries=0)
        with pytest.raises(GatewayError, match="does not extend"):
            await engine.stream(url, PROMPT, SamplingParams(), lambda i, lp: None)
        await engine.aclose()


async def test_a_streamed_token_without_a_logprob_is_refused() -> None:
    fake = FakeSglangForTests()
    fake.scripted.append({"text": "a", "meta_info": meta([5], {"type": "stop"})})
    fake.scripted[0]["meta_info"]["output_token_logprobs"] = [[None, 5, None]]
    with serve_on_loopback(fake.app) as url:
        engine = SglangEngine(MODEL, request_timeout_s=5, connect_retries=0)
        with pytest.raises(GatewayError, match="without a logprob"):
            await engine.stream(url, PROMPT, SamplingParams(), lambda i, lp: None)
        await engine.aclose()


async def test_model_info_reads_the_server_arguments(
    engine: EngineRouter, fake: FakeSglangForTests, url: str
) -> None:
    assert (await engine.model_info(url)).max_model_len == 4096
    fake.server_info = {"context_length": None, "served_model_name": MODEL}
    with pytest.raises(GatewayError, match="--context-length"):
        await engine.model_info(url)
    fake.server_info = {"context_length": 4096, "served_model_name": "other"}
    with pytest.raises(GatewayError, match="'other'"):
        await engine.model_info(url)


async def test_weights_load_in_place_under_the_policy_version(
    fake: FakeSglangForTests, url: str
) -> None:
    loader = SglangEngine(MODEL, request_timeout_s=5, connect_retries=0).weight_loader(url)
    assert await loader.current_version() == "7"
    report = await loader.load(WeightUpdate(policy_version="run-v8", checkpoint="/ckpt/v8"))
    assert fake.loads == [{"model_path": "/ckpt/v8", "weight_version": "run-v8"}]
    assert (report.policy_version, report.method) == ("run-v8", "reload")
    fake.load_reply = {"success": False, "message": "shape mismatch"}
    with pytest.raises(WeightLoadError, match="shape mismatch"):
        await loader.load(WeightUpdate(policy_version="run-v9", checkpoint="/ckpt/v9"))


def test_the_gateway_serves_an_agent_from_an_sglang_engine_and_records_its_tokens(
    tiny_model_dir: Path, gateway_factory: Any
) -> None:
    """`rollout gateway --engine-api sglang`: an agent's chat call goes to `/generate` as
    the rendered prompt's ids, and the segment records exactly the ids and logprobs the
    engine sampled."""
    tokenizer = Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json"))
    ids = tokenizer.encode("Done.", add_special_tokens=False).ids
    ids.append(tokenizer.token_to_id("<|im_end|>"))
    fake = FakeSglangForTests()
    fake.server_info["served_model_name"] = "tiny-qwen3"
    reply_meta = meta(ids, {"type": "stop", "matched": ids[-1]})
    del reply_meta["prompt_tokens"]  # the fake counts the ids it is sent
    fake.scripted.append({"text": "Done.", "meta_info": reply_meta})
    with serve_on_loopback(fake.app) as url:
        gateway = gateway_factory(url, tiny_model_dir, "tiny-qwen3", engine_api="sglang")
        session = gateway.create_session()
        agent = openai.OpenAI(base_url=session["openai_base_url"], api_key=session["token"])
        answer = agent.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "Hi."}]
        )
        trajectory = gateway.trajectory(session["session_id"])
    assert answer.choices[0].message.content == "Done."
    (segment,) = trajectory["segments"]
    assert segment["prompt_ids"] == fake.requests[0]["input_ids"]
    assert segment["response_ids"] == ids
    assert segment["logprobs"] == [-0.5 - i for i in range(len(ids))]


# --- routed experts -------------------------------------------------------------------------


def sglang_routing(rows: int, layers: int = 2, top_k: int = 2) -> str:
    """`meta_info.routed_experts` as SGLang sends it: base64 of raw int32, no shape."""
    ids = np.arange(rows * layers * top_k, dtype="<i4") % 64
    return base64.b64encode(ids.tobytes()).decode("ascii")


@pytest.mark.parametrize("stream", [False, True])
async def test_routed_experts_are_asked_for_and_kept_from_the_start_asked(
    url: str, fake: FakeSglangForTests, stream: bool
) -> None:
    """SGLang returns the whole sequence's routing (4 prompt + 3 output - 1 rows); the
    call keeps it from the prompt token asked (2) on, shaped by the model's (2, 2)."""
    engine = SglangEngine(MODEL, routing_shape=(2, 2), request_timeout_s=5, connect_retries=0)
    reply = meta([7, 8, 9], {"type": "stop", "matched": 2}, routed_experts=sglang_routing(6))
    fake.scripted.append({"text": "xyz", "meta_info": reply})
    if stream:
        result = await engine.stream(url, PROMPT, SamplingParams(), lambda *_: None, 2)
    else:
        result = await engine.complete(url, PROMPT, SamplingParams(), 2)
    await engine.aclose()
    assert fake.requests[0]["return_routed_experts"] is True
    experts = result.routed_experts
    assert experts is not None and result.routing_missing is None
    assert (experts.start, experts.shape) == (2, (4, 2, 2))
    whole = np.frombuffer(base64.b64decode(sglang_routing(6)), dtype="<i4").reshape(6, 2, 2)
    np.testing.assert_array_equal(experts.array(), whole[2:])


async def test_sglang_routing_of_another_width_is_missing_not_a_failure(
    url: str, fake: FakeSglangForTests
) -> None:
    engine = SglangEngine(MODEL, routing_shape=(3, 2), request_timeout_s=5, connect_retries=0)
    reply = meta([7, 8, 9], {"type": "stop", "matched": 2}, routed_experts=sglang_routing(6))
    fake.scripted.append({"text": "xyz", "meta_info": reply})
    result = await engine.complete(url, PROMPT, SamplingParams(), 0)
    await engine.aclose()
    assert result.output_ids == [7, 8, 9] and result.routed_experts is None
    assert result.routing_missing is not None
    assert result.routing_missing.startswith("routed_experts has shape (4, 3, 2); the call needs 6")


async def test_without_its_shape_sglang_cannot_return_routing(engine: EngineRouter) -> None:
    assert not engine.returns_routing
    shaped = SglangEngine(MODEL, routing_shape=(2, 2), request_timeout_s=5, connect_retries=0)
    assert shaped.returns_routing
