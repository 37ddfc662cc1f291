"""The vLLM engine behind the router: payload, reply validation, error mapping, session
placement, routing and per-engine stats, against scripted fakes."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import numpy as np
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from devstack.ports import free_port
from gateway.engines.routing import EngineRouter, EngineRouting
from gateway.engines.vllm import VllmEngine
from gateway.errors import GatewayError
from schemas.sampling import SamplingParams

MODEL = "tiny"
PROMPT = [1, 2, 3, 4]


def vllm_engines(
    urls: list[str], model: str, *, routing: EngineRouting = "sticky", **options: Any
) -> EngineRouter:
    """The router in front of the vLLM engine, as a gateway process builds them."""
    return EngineRouter(urls, VllmEngine(model, **options), routing=routing)


class FakeVllmForTests:
    """Scripted stand-in for a vLLM server — NOT vLLM. It answers `/v1/completions` with
    whatever the test queued (default: a well-formed reply echoing the request) and records
    every request body, so tests can check both directions of the wire."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.peers: list[tuple[str, int]] = []
        self.headers: list[dict[str, str]] = []
        self.scripted: list[Response] = []
        self.app = Starlette(
            routes=[
                Route("/v1/completions", self._completions, methods=["POST"]),
                Route("/inference/v1/generate", self._completions, methods=["POST"]),
                Route("/v1/models", self._models, methods=["GET"]),
            ]
        )

    @staticmethod
    def good_reply(prompt: list[int], output: list[int], **choice: Any) -> dict[str, Any]:
        lps = [-0.5 - i for i in range(len(output))]
        base_choice = {
            "index": 0,
            "text": "x" * len(output),
            "logprobs": {
                "text_offset": list(range(len(output))),
                "token_logprobs": lps,
                "tokens": ["x"] * len(output),
                "top_logprobs": [{"x": lp} for lp in lps],
            },
            "finish_reason": "stop",
            "stop_reason": None,
            "prompt_token_ids": prompt,
            "token_ids": output,
        }
        base_choice.update(choice)
        return {
            "id": "cmpl-1",
            "object": "text_completion",
            "created": 1,
            "model": MODEL,
            "choices": [base_choice],
            "usage": {
                "prompt_tokens": len(prompt),
                "completion_tokens": len(output),
                "total_tokens": len(prompt) + len(output),
                "prompt_tokens_details": {"cached_tokens": 2},
            },
        }

    async def _completions(self, request: Request) -> Response:
        body = await request.json()
        self.requests.append(body)
        self.headers.append(dict(request.headers))
        if request.client is not None:
            self.peers.append((request.client.host, request.client.port))
        if self.scripted:
            return self.scripted.pop(0)
        return JSONResponse(self.good_reply(body["prompt"], [7, 8, 9]))

    async def _models(self, request: Request) -> Response:
        if self.scripted:
            return self.scripted.pop(0)
        return JSONResponse(
            {"object": "list", "data": [{"id": MODEL, "object": "model", "max_model_len": 4096}]}
        )


@pytest.fixture
def fake() -> FakeVllmForTests:
    return FakeVllmForTests()


@pytest.fixture
def engine_url(fake: FakeVllmForTests) -> Iterator[str]:
    with serve_on_loopback(fake.app) as url:
        yield url


@pytest.fixture
async def client(engine_url: str) -> AsyncIterator[EngineRouter]:
    ec = vllm_engines([engine_url], MODEL, request_timeout_s=5, connect_retries=2)
    yield ec
    await ec.aclose()


async def expect_error(coro: Any, status: int, kind: str) -> GatewayError:
    with pytest.raises(GatewayError) as info:
        await coro
    assert (info.value.status, info.value.kind) == (status, kind), info.value
    return info.value


# --- success -----------------------------------------------------------------------------


async def test_success_payload_and_mapping(client: EngineRouter, fake: FakeVllmForTests) -> None:
    sampling = SamplingParams(
        temperature=0.7, max_tokens=64, seed=3, stop=["</s>"], engine_extra={"ignore_eos": True}
    )
    res = await client.complete(client.urls[0] + "/", PROMPT, sampling)
    sent = fake.requests[0]
    assert sent == {
        "model": MODEL,
        "prompt": PROMPT,
        "max_tokens": 64,
        "temperature": 0.7,
        "seed": 3,
        "stop": ["</s>"],
        "logprobs": 1,
        "return_token_ids": True,
        "skip_special_tokens": False,
        "ignore_eos": True,
    }
    assert res.output_ids == [7, 8, 9]
    assert res.output_logprobs == [-0.5, -1.5, -2.5]
    assert res.finish_reason == "stop" and res.stop_reason is None
    assert (res.prompt_tokens, res.completion_tokens, res.cached_prompt_tokens) == (4, 3, 2)
    assert res.url == client.urls[0]
    assert fake.headers[0]["content-type"] == "application/json"
    assert "gzip" not in fake.headers[0].get("accept-encoding", "")  # replies stay plain


async def test_logit_bias_is_sent_with_token_ids_as_keys(
    client: EngineRouter, fake: FakeVllmForTests
) -> None:
    """JSON object keys are strings: the ids go as vLLM's completions API reads them."""
    await client.complete(client.urls[0], PROMPT, SamplingParams(logit_bias={7: -100.0, 8: 2.5}))
    assert fake.requests[0]["logit_bias"] == {"7": -100.0, "8": 2.5}
    await client.complete(client.urls[0], PROMPT, SamplingParams())
    assert "logit_bias" not in fake.requests[1]


async def test_stop_reason_and_length(client: EngineRouter, fake: FakeVllmForTests) -> None:
    fake.scripted.append(JSONResponse(fake.good_reply(PROMPT, [5], stop_reason=151645)))
    res = await client.complete(client.urls[0], PROMPT, SamplingParams())
    assert res.stop_reason == 151645
    fake.scripted.append(JSONResponse(fake.good_reply(PROMPT, [5, 6], finish_reason="length")))
    res = await client.complete(client.urls[0], PROMPT, SamplingParams())
    assert res.finish_reason == "length"


async def test_usage_and_optional_fields_absent(
    client: EngineRouter, fake: FakeVllmForTests
) -> None:
    reply = fake.good_reply(PROMPT, [5])
    del reply["usage"]
    del reply["choices"][0]["prompt_token_ids"]
    reply["choices"][0]["logprobs"] = {"token_logprobs": [-0.1]}
    fake.scripted.append(JSONResponse(reply))
    res = await client.complete(client.urls[0], PROMPT, SamplingParams())
    assert res.output_ids == [5] and res.cached_prompt_tokens == 0


async def test_model_info(client: EngineRouter, fake: FakeVllmForTests) -> None:
    info = await client.model_info(client.urls[0])
    assert (info.id, info.max_model_len) == (MODEL, 4096)
    fake.scripted.append(JSONResponse({"data": [{"id": "other", "max_model_len": 10}]}))
    err = await expect_error(client.model_info(client.urls[0]), 502, "engine_bad_reply")
    assert "not served" in err.message


# --- malformed replies → 502 ----------------------------------------------------------------


def _mutations() -> list[tuple[str, Any]]:
    def choice(**kw: Any) -> Any:
        def apply(r: dict[str, Any]) -> None:
            r["choices"][0].update(kw)

        return apply

    def drop(key: str) -> Any:
        return lambda r: r["choices"][0].pop(key)

    def lps(values: list[Any]) -> Any:
        return lambda r: r["choices"][0]["logprobs"].update(token_logprobs=values)

    return [
        ("fewer logprobs", lps([-1.0, -1.0])),
        ("null logprob", lps([-1.0, None, -1.0])),
        ("string token id", choice(token_ids=[7, "8", 9])),
        ("negative token id", choice(token_ids=[7, -8, 9])),
        ("float token id", choice(token_ids=[7, 8.5, 9])),
        ("abort finish", choice(finish_reason="abort")),
        ("null finish", choice(finish_reason=None)),
        ("prompt echo differs", choice(prompt_token_ids=[1, 2, 3])),
        ("usage count differs", lambda r: r["usage"].update(completion_tokens=99)),
        ("usage prompt differs", lambda r: r["usage"].update(prompt_tokens=99)),
        ("empty choices", lambda r: r.update(choices=[])),
        ("token strings differ", lambda r: r["choices"][0]["logprobs"].update(tokens=["x"])),
        ("boolean token id", choice(token_ids=[7, True, 9])),
        ("token string not text", lambda r: r["choices"][0]["logprobs"].update(tokens=[1, 2, 3])),
        ("float stop reason", choice(stop_reason=1.5)),
        ("second choice", lambda r: r["choices"].append({**r["choices"][0], "token_ids": "x"})),
        ("cached count not a number", lambda r: r["usage"].update(prompt_tokens_details=[])),
    ]


@pytest.mark.parametrize(("label", "mutate"), _mutations(), ids=[m[0] for m in _mutations()])
async def test_malformed_reply_is_502(
    client: EngineRouter, fake: FakeVllmForTests, label: str, mutate: Any
) -> None:
    reply = fake.good_reply(PROMPT, [7, 8, 9])
    mutate(reply)
    fake.scripted.append(JSONResponse(reply))
    err = await expect_error(
        client.complete(client.urls[0], PROMPT, SamplingParams()), 502, "engine_bad_reply"
    )
    assert "malformed" in err.message


@pytest.mark.parametrize(
    ("missing", "says"),
    [
        ("token_ids", "sampled token ids (no choices[0].token_ids): it ignores `return_token_ids`"),
        ("logprobs", "logprobs of the sampled tokens (no choices[0].logprobs): it ignores"),
    ],
)
async def test_an_engine_without_what_the_gateway_needs_is_named_so(
    client: EngineRouter, fake: FakeVllmForTests, missing: str, says: str
) -> None:
    """A trainer's own server that answers without token ids (a vLLM before
    `return_token_ids`) or logprobs: the error names the capability and the fix, not
    just a malformed reply."""
    reply = fake.good_reply(PROMPT, [7, 8, 9])
    reply["choices"][0].pop(missing)
    fake.scripted.append(JSONResponse(reply))
    err = await expect_error(
        client.complete(client.urls[0], PROMPT, SamplingParams()), 502, "engine_bad_reply"
    )
    assert f"engine at {client.urls[0]} does not return {says}" in err.message


async def test_an_engine_without_the_generate_endpoint_says_how_to_get_it(
    gen_client: EngineRouter, fake: FakeVllmForTests
) -> None:
    fake.scripted.append(JSONResponse({"detail": "Not Found"}, 404))
    err = await expect_error(
        gen_client.complete(gen_client.urls[0], PROMPT, SamplingParams()), 502, "engine_bad_reply"
    )
    assert "has no /inference/v1/generate" in err.message
    assert "--enable-scale-out" in err.message and "--engine-api completions" in err.message
    unknown_model = {"error": {"message": "The model `m` does not exist.", "code": 404}}
    fake.scripted.append(JSONResponse(unknown_model, 404))
    err = await expect_error(
        gen_client.complete(gen_client.urls[0], PROMPT, SamplingParams()), 502, "engine_bad_reply"
    )
    assert "has no" not in err.message and "The model `m` does not exist." in err.message


async def test_non_json_reply_is_502(client: EngineRouter, fake: FakeVllmForTests) -> None:
    fake.scripted.append(PlainTextResponse("<html>gateway</html>"))
    await expect_error(
        client.complete(client.urls[0], PROMPT, SamplingParams()), 502, "engine_bad_reply"
    )


# --- engine HTTP errors ---------------------------------------------------------------------


async def test_engine_400_passes_message(client: EngineRouter, fake: FakeVllmForTests) -> None:
    msg = "This model's maximum context length is 4096 tokens. However, you requested 5000."
    fake.scripted.append(
        JSONResponse({"error": {"message": msg, "type": "BadRequestError", "code": 400}}, 400)
    )
    err = await expect_error(
        client.complete(client.urls[0], PROMPT, SamplingParams()), 400, "invalid_request"
    )
    assert err.message == msg
    # Older flat error shape.
    fake.scripted.append(JSONResponse({"object": "error", "message": "bad top_k"}, 400))
    err = await expect_error(
        client.complete(client.urls[0], PROMPT, SamplingParams()), 400, "invalid_request"
    )
    assert err.message == "bad top_k"


@pytest.mark.parametrize(
    ("status", "headers", "want_status", "want_kind", "retry_after"),
    [
        (429, {"Retry-After": "7"}, 429, "overloaded", 7.0),
        (503, {}, 503, "overloaded", 1.0),
        (413, {}, 413, "too_large", None),
        (500, {}, 502, "engine_bad_reply", None),
        (404, {}, 502, "engine_bad_reply", None),
    ],
)
async def test_engine_status_mapping(
    client: EngineRouter,
    fake: FakeVllmForTests,
    status: int,
    headers: dict[str, str],
    want_status: int,
    want_kind: str,
    retry_after: float | None,
) -> None:
    fake.scripted.append(JSONResponse({"error": {"message": "nope"}}, status, headers=headers))
    err = await expect_error(
        client.complete(client.urls[0], PROMPT, SamplingParams()), want_status, want_kind
    )
    assert err.retry_after == retry_after
    assert "nope" in err.message


# --- transport failures -----------------------------------------------------------------------


async def test_connect_refused_is_503_after_retries() -> None:
    async with vllm_engines(
        [f"http://127.0.0.1:{free_port()}"],
        MODEL,
        request_timeout_s=5,
        connect_retries=2,
        retry_backoff_s=0.01,
    ) as ec:
        err = await expect_error(
            ec.complete(ec.urls[0], PROMPT, SamplingParams()), 503, "engine_unavailable"
        )
    assert err.retry_after is not None and err.headers() == {"Retry-After": "5"}
    assert "after 3 attempt(s)" in err.message


async def test_connect_error_then_success_retries_same_url(fake: FakeVllmForTests) -> None:
    """Engine b is not listening yet when the call starts; it comes up while the client
    backs off, and the call lands there (never on a, which never listens)."""
    port = free_port()
    up = threading.Event()
    done = threading.Event()

    def serve_later() -> None:
        time.sleep(0.4)
        with serve_on_loopback(fake.app, port=port):
            up.set()
            done.wait(30)

    thread = threading.Thread(target=serve_later, daemon=True)
    thread.start()
    try:
        async with vllm_engines(
            [f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{port}"],
            MODEL,
            request_timeout_s=5,
            connect_retries=30,  # backoff capped at 2 s: a minute for b to come up
            retry_backoff_s=0.1,
        ) as ec:
            assert not up.is_set()
            res = await ec.complete(ec.urls[1], PROMPT, SamplingParams())
    finally:
        done.set()
        thread.join(10)
    assert res.output_ids == [7, 8, 9] and len(fake.requests) == 1


@asynccontextmanager
async def raw_server(
    handler: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]],
) -> AsyncIterator[str]:
    """A bare TCP server on loopback (an engine that misbehaves below HTTP); its URL."""
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()


async def test_dropped_connection_is_not_retried() -> None:
    """A real loopback server that reads the request and hangs up without answering: the
    call may have been processed, so it is not sent again."""
    connections = 0

    async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        await reader.read(65536)
        writer.close()

    async with (
        raw_server(hang_up) as url,
        vllm_engines([url], MODEL, request_timeout_s=5, connect_retries=3) as ec,
    ):
        await expect_error(ec.complete(url, PROMPT, SamplingParams()), 503, "engine_unavailable")
    assert connections == 1


async def test_read_timeout_is_504() -> None:
    """A real loopback server that accepts and never answers: the call times out (the
    server would hang up only after 10 s, an engine_unavailable) and is not retried."""
    connections = 0

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        await reader.read(65536)
        await asyncio.sleep(10)
        writer.close()

    async with (
        raw_server(silent) as url,
        vllm_engines([url], MODEL, request_timeout_s=0.3, connect_retries=2) as ec,
    ):
        await expect_error(ec.complete(url, PROMPT, SamplingParams()), 504, "engine_timeout")
    assert connections == 1  # not retried


@contextmanager
def serve_on_loopback(app: Any, port: int | None = None) -> Iterator[str]:
    """Run an ASGI app with uvicorn on 127.0.0.1 in a thread; yield its base URL."""
    config = uvicorn.Config(app, host="127.0.0.1", port=port or free_port(), log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{config.port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


async def test_real_http_round_trip(fake: FakeVllmForTests) -> None:
    with serve_on_loopback(fake.app) as url:
        async with vllm_engines([url], MODEL, request_timeout_s=5, connect_retries=0) as ec:
            res = await ec.complete(url, PROMPT, SamplingParams(top_k=20))
            info = await ec.model_info(url)
    assert res.output_ids == [7, 8, 9] and info.max_model_len == 4096
    assert fake.requests[0]["top_k"] == 20


# --- session placement ------------------------------------------------------------------------


def test_assign_least_loaded_sticky_and_release() -> None:
    ec = vllm_engines(["http://a", "http://b/"], MODEL, request_timeout_s=1, connect_retries=0)
    assert ec.assign("s1") == "http://a"  # tie → first
    assert ec.assign("s2") == "http://b"
    assert ec.assign("s3") == "http://a"
    assert ec.assign("s1") == "http://a"  # sticky, no double count
    assert ec.sessions_per_url() == {"http://a": 2, "http://b": 1}
    ec.release("s1")
    ec.release("s1")  # idempotent
    ec.release("unknown")
    assert ec.sessions_per_url() == {"http://a": 1, "http://b": 1}
    assert ec.assign("s4") == "http://a"


def test_constructor_validation() -> None:
    with pytest.raises(ValueError):
        vllm_engines([], MODEL, request_timeout_s=1, connect_retries=0)
    with pytest.raises(ValueError):
        vllm_engines(["http://a"], MODEL, request_timeout_s=1, connect_retries=-1)


# --- routing and per-engine stats -----------------------------------------------------------


@pytest.fixture
def two_engines() -> Iterator[tuple[list[FakeVllmForTests], list[str]]]:
    fakes = [FakeVllmForTests(), FakeVllmForTests()]
    with serve_on_loopback(fakes[0].app) as a, serve_on_loopback(fakes[1].app) as b:
        yield fakes, [a, b]


async def test_sticky_routing_keeps_a_session_on_its_engine_and_counts_per_engine(
    two_engines: tuple[list[FakeVllmForTests], list[str]],
) -> None:
    fakes, urls = two_engines
    async with vllm_engines(urls, MODEL, request_timeout_s=5, connect_retries=0) as ec:
        url = ec.assign("s1")
        for _ in range(3):
            await ec.complete(url, PROMPT, SamplingParams())
    assert [len(f.requests) for f in fakes] == [3, 0]
    a, b = ec.stats[urls[0]], ec.stats[urls[1]]
    assert (a.calls, a.failed, a.inflight, a.prompt_tokens, a.cached_prompt_tokens) == (
        3, 0, 0, 3 * len(PROMPT), 3 * 2,
    )  # fmt: skip
    assert a.busy_seconds() > 0 and b.busy_seconds() == 0
    assert (b.calls, b.prompt_tokens) == (0, 0)


async def test_round_robin_routing_sends_each_call_to_the_next_engine(
    two_engines: tuple[list[FakeVllmForTests], list[str]],
) -> None:
    """Only to compare with sticky routing (bench/engine_routing.py): the session's own
    engine is ignored, calls alternate."""
    fakes, urls = two_engines
    async with vllm_engines(
        urls, MODEL, request_timeout_s=5, connect_retries=0, routing="round_robin"
    ) as ec:
        url = ec.assign("s1")
        for _ in range(4):
            await ec.complete(url, PROMPT, SamplingParams())
    assert [len(f.requests) for f in fakes] == [2, 2]
    assert [ec.stats[u].calls for u in urls] == [2, 2]


async def test_a_failed_call_is_counted_as_failed_and_leaves_nothing_in_flight(
    client: EngineRouter, fake: FakeVllmForTests
) -> None:
    fake.scripted.append(JSONResponse({"error": {"message": "boom"}}, 500))
    await expect_error(
        client.complete(client.urls[0], PROMPT, SamplingParams()), 502, "engine_bad_reply"
    )
    stats = client.stats[client.urls[0]]
    assert (stats.calls, stats.failed, stats.inflight) == (0, 1, 0)


async def test_calls_reuse_a_kept_alive_connection_until_it_has_idled_too_long(
    fake: FakeVllmForTests, engine_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Engines close idle connections after 5 s; the client gives them up first, so a call
    is never sent on a connection the engine is closing."""
    # Back-to-back calls are far within 1 s even on a busy machine; the pause far past it.
    monkeypatch.setattr("gateway.engines.vllm.KEEPALIVE_S", 1.0)
    async with vllm_engines([engine_url], MODEL, request_timeout_s=5, connect_retries=0) as ec:
        for _ in range(3):
            await ec.complete(engine_url, PROMPT, SamplingParams())
        await asyncio.sleep(2.5)
        await ec.complete(engine_url, PROMPT, SamplingParams())
    ports = [peer[1] for peer in fake.peers]
    assert ports[0] == ports[1] == ports[2] and ports[3] != ports[0]


# --- streaming ------------------------------------------------------------------------------


def sse(*chunks: Any, done: bool = True) -> Response:
    lines = [f"data: {c if isinstance(c, str) else json.dumps(c)}\n\n" for c in chunks]
    return PlainTextResponse("".join(lines) + ("data: [DONE]\n\n" if done else ""))


def stream_chunks(prompt: list[int], output: list[int]) -> list[dict[str, Any]]:
    """`good_reply` as vLLM streams it: one token per chunk, then the usage chunk."""
    whole = FakeVllmForTests.good_reply(prompt, output)
    chunks = []
    for i, token in enumerate(output):
        reply = FakeVllmForTests.good_reply(prompt, [token])
        choice = reply["choices"][0]
        choice["logprobs"]["token_logprobs"] = [
            whole["choices"][0]["logprobs"]["token_logprobs"][i]
        ]
        choice["finish_reason"] = "stop" if i == len(output) - 1 else None
        if i > 0:
            del choice["prompt_token_ids"]
        del reply["usage"]
        chunks.append(reply)
    chunks.append({**whole, "choices": []})
    return chunks


async def test_stream_hands_over_each_chunk_and_validates_like_complete(
    client: EngineRouter, fake: FakeVllmForTests
) -> None:
    fake.scripted.append(sse(*stream_chunks(PROMPT, [7, 8, 9])))
    seen: list[tuple[list[int], list[float]]] = []
    streamed = await client.stream(
        client.urls[0], PROMPT, SamplingParams(), lambda i, lp: seen.append((i, lp))
    )
    assert seen == [([7], [-0.5]), ([8], [-1.5]), ([9], [-2.5])]
    assert fake.requests[0]["stream"] is True
    plain = await client.complete(client.urls[0], PROMPT, SamplingParams())
    assert streamed.model_dump(exclude={"text"}) == plain.model_dump(exclude={"text"})


@pytest.mark.parametrize(
    ("label", "reply"),
    [
        ("no [DONE]", sse(*stream_chunks(PROMPT, [7, 8]), done=False)),
        ("not JSON", sse("{oops")),
        ("error chunk", sse({"error": {"message": "boom"}})),
        ("flat error chunk", sse({"object": "error", "message": "boom"})),
        (
            "logprobs misaligned",
            sse({"choices": [{"token_ids": [7, 8], "logprobs": {"token_logprobs": [-1.0]}}]}),
        ),
        (
            "usage disagrees",
            sse(*stream_chunks(PROMPT, [7, 8])[:1], stream_chunks(PROMPT, [7, 8])[-1]),
        ),
    ],
)
async def test_malformed_stream_is_502(
    client: EngineRouter, fake: FakeVllmForTests, label: str, reply: Response
) -> None:
    fake.scripted.append(reply)
    await expect_error(
        client.stream(client.urls[0], PROMPT, SamplingParams(), lambda i, lp: None),
        502,
        "engine_bad_reply",
    )


async def test_stream_refused_up_front_keeps_its_status(
    client: EngineRouter, fake: FakeVllmForTests
) -> None:
    fake.scripted.append(JSONResponse({"error": {"message": "too long", "code": 400}}, 400))
    err = await expect_error(
        client.stream(client.urls[0], PROMPT, SamplingParams(), lambda i, lp: None),
        400,
        "invalid_request",
    )
    assert err.message == "too long"


def stream_head_and_first_chunk() -> bytes:
    """A streamed reply's head and its first chunk (token 7), as vLLM sends them."""
    event = f"data: {json.dumps(stream_chunks(PROMPT, [7, 8])[0])}\n\n".encode()
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
    return head + b"transfer-encoding: chunked\r\n\r\n" + b"%x\r\n%s\r\n" % (len(event), event)


@pytest.mark.parametrize("then", ["stall", "hang_up"])
async def test_a_stream_that_stops_mid_way_fails_after_handing_over_what_came(then: str) -> None:
    """A real loopback server that streams one chunk, then falls silent (the engine's
    silence: 504) or hangs up (503); the chunk that came was handed over first."""

    async def one_chunk(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(65536)
        writer.write(stream_head_and_first_chunk())
        await writer.drain()
        if then == "stall":
            await asyncio.sleep(10)
        writer.close()

    seen: list[int] = []
    want = (504, "engine_timeout") if then == "stall" else (503, "engine_unavailable")
    async with (
        raw_server(one_chunk) as url,
        vllm_engines([url], MODEL, request_timeout_s=0.3, connect_retries=2) as ec,
    ):
        err = await expect_error(
            ec.stream(url, PROMPT, SamplingParams(), lambda i, lp: seen.extend(i)), *want
        )
    assert seen == [7]
    if then == "stall":
        assert err.message == f"engine at {url} stalled for 0.3s mid-stream"
    else:
        assert err.message.startswith(f"stream from engine at {url} broke")


async def test_a_stream_line_longer_than_any_read_buffer(
    client: EngineRouter, fake: FakeVllmForTests
) -> None:
    """vLLM's first stream chunk echoes the whole prompt's ids: one line of ~250 KB here."""
    prompt = list(range(40_000))
    fake.scripted.append(sse(*stream_chunks(prompt, [7, 8])))
    seen: list[int] = []
    res = await client.stream(
        client.urls[0], prompt, SamplingParams(), lambda i, lp: seen.extend(i)
    )
    assert seen == res.output_ids == [7, 8] and res.prompt_tokens == 40_000


# --- the token-in/token-out generate endpoint ------------------------------------------------


def generate_reply(output: list[int], **choice: Any) -> dict[str, Any]:
    """vLLM's `/inference/v1/generate` reply in `output_mode="tokens"` (no text, no echo)."""
    content = [{"token_id": t, "logprob": -0.5 - i} for i, t in enumerate(output)]
    return {
        "request_id": "generate-tokens-1",
        "choices": [
            {
                "index": 0,
                "logprobs": {"content": content},
                "finish_reason": "stop",
                "stop_reason": None,
                "token_ids": output,
                **choice,
            }
        ],
        "usage": {
            "prompt_tokens": len(PROMPT),
            "completion_tokens": len(output),
            "total_tokens": len(PROMPT) + len(output),
        },
    }


@pytest.fixture
async def gen_client(engine_url: str) -> AsyncIterator[EngineRouter]:
    ec = vllm_engines([engine_url], MODEL, request_timeout_s=5, connect_retries=0, api="generate")
    yield ec
    await ec.aclose()


async def test_generate_payload_and_mapping(
    gen_client: EngineRouter, fake: FakeVllmForTests
) -> None:
    """Sampling fields and `engine_extra` go in `sampling_params`; vLLM detokenizes only
    when stop strings need the text."""
    sampling = SamplingParams(temperature=0.7, max_tokens=64, seed=3, engine_extra={"n": 1})
    fake.scripted.append(JSONResponse(generate_reply([7, 8, 9])))
    res = await gen_client.complete(gen_client.urls[0], PROMPT, sampling)
    assert fake.requests[0] == {
        "model": MODEL,
        "token_ids": PROMPT,
        "output_mode": "tokens",
        "sampling_params": {
            "max_tokens": 64,
            "temperature": 0.7,
            "seed": 3,
            "logprobs": 1,
            "skip_special_tokens": False,
            "detokenize": False,
            "n": 1,
        },
    }
    assert (res.output_ids, res.output_logprobs) == ([7, 8, 9], [-0.5, -1.5, -2.5])
    assert (res.finish_reason, res.prompt_tokens, res.completion_tokens) == ("stop", 4, 3)
    fake.scripted.append(JSONResponse(generate_reply([7], stop_reason="</s>")))
    res = await gen_client.complete(gen_client.urls[0], PROMPT, SamplingParams(stop=["</s>"]))
    assert fake.requests[1]["sampling_params"]["detokenize"] is True
    assert res.stop_reason == "</s>"


@pytest.mark.parametrize(
    ("label", "reply", "says"),
    [
        (
            "entry of another token",
            generate_reply([7, 8], logprobs={"content": [{"token_id": 7, "logprob": -1.0}] * 2}),
            "token ids differ",
        ),
        (
            "vLLM's no-logprob sentinel",
            generate_reply([7], logprobs={"content": [{"token_id": 7, "logprob": -9999.0}]}),
            "no logprob for sampled token 0",
        ),
        ("no logprobs", generate_reply([7], logprobs=None), "does not return logprobs"),
        (
            "usage disagrees",
            {**generate_reply([7, 8]), "usage": generate_reply([7])["usage"]},
            "usage",
        ),
    ],
)
async def test_malformed_generate_reply_is_502(
    gen_client: EngineRouter, fake: FakeVllmForTests, label: str, reply: Any, says: str
) -> None:
    fake.scripted.append(JSONResponse(reply))
    err = await expect_error(
        gen_client.complete(gen_client.urls[0], PROMPT, SamplingParams()), 502, "engine_bad_reply"
    )
    assert says in err.message, (label, err.message)


async def test_generate_stream_hands_over_each_chunk_and_validates_like_complete(
    gen_client: EngineRouter, fake: FakeVllmForTests
) -> None:
    whole = generate_reply([7, 8, 9])
    chunks = []
    for i, token in enumerate([7, 8, 9]):
        choice = generate_reply([token])["choices"][0]
        choice["logprobs"]["content"][0]["logprob"] = -0.5 - i
        choice["finish_reason"] = "stop" if i == 2 else None
        chunks.append({"request_id": "generate-tokens-1", "choices": [choice]})
    chunks.append({"request_id": "generate-tokens-1", "choices": [], "usage": whole["usage"]})
    fake.scripted.append(sse(*chunks))
    seen: list[tuple[list[int], list[float]]] = []
    streamed = await gen_client.stream(
        gen_client.urls[0], PROMPT, SamplingParams(), lambda i, lp: seen.append((i, lp))
    )
    assert seen == [([7], [-0.5]), ([8], [-1.5]), ([9], [-2.5])]
    assert fake.requests[0]["stream"] is True and "token_ids" in fake.requests[0]
    fake.scripted.append(JSONResponse(whole))
    plain = await gen_client.complete(gen_client.urls[0], PROMPT, SamplingParams())
    assert streamed == plain


# --- routed experts ----------------------------------------------------------------------------


def npy_b64(array: Any) -> str:
    """An array as vLLM's `numpy2base64` sends it: base64 of its `.npy` bytes."""
    with io.BytesIO() as buffer:
        np.save(buffer, np.asarray(array), allow_pickle=False)
        return base64.b64encode(buffer.getvalue()).decode("ascii")


async def test_routing_is_asked_from_a_prompt_token_and_decoded_only_when_asked(
    gen_client: EngineRouter, fake: FakeVllmForTests
) -> None:
    """4 prompt + 3 output tokens asked from prompt token 1: 4 - 1 + 3 - 1 = 5 rows."""
    rows = np.arange(5 * 2 * 2, dtype=np.int32).reshape(5, 2, 2) % 7
    fake.scripted.append(JSONResponse(generate_reply([7, 8, 9], routed_experts=npy_b64(rows))))
    res = await gen_client.complete(gen_client.urls[0], PROMPT, SamplingParams(), 1)
    assert fake.requests[0]["sampling_params"]["routed_experts_prompt_start"] == 1
    assert res.routed_experts is not None and res.routing_missing is None
    assert (res.routed_experts.start, res.routed_experts.dtype) == (1, "uint8")
    np.testing.assert_array_equal(res.routed_experts.array(), rows)
    # not asked: nothing sent, nothing decoded, whatever the engine returns
    fake.scripted.append(JSONResponse(generate_reply([7, 8, 9], routed_experts=npy_b64(rows))))
    res = await gen_client.complete(gen_client.urls[0], PROMPT, SamplingParams())
    assert "routed_experts_prompt_start" not in fake.requests[1]["sampling_params"]
    assert (res.routed_experts, res.routing_missing) == (None, None)


async def test_the_completions_endpoint_returns_no_routing(
    client: EngineRouter, fake: FakeVllmForTests
) -> None:
    assert not client.returns_routing
    res = await client.complete(client.urls[0], PROMPT, SamplingParams(), 0)
    assert res.output_ids and res.routed_experts is None
    assert res.routing_missing == "the /v1/completions endpoint returns no routed experts"
