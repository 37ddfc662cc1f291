"""The fixed-latency FAKE engine (load benches) streams as vLLM does: the Gateway's own
engine client takes its stream, one token per chunk, and reads the same completion from
it as from the whole reply, cut at `max_tokens` or not."""

from pathlib import Path

import pytest

from devstack.background_server import BackgroundServer
from devstack.fixed_latency_engine import FakeFixedLatencyEngine
from gateway.engines.vllm import VllmEngine
from schemas.sampling import SamplingParams

PROMPT = [1, 2, 3, 4]


@pytest.mark.parametrize("max_tokens", [64, 5])
async def test_stream_gives_the_whole_reply_token_by_token(
    tiny_model_dir: Path, max_tokens: int
) -> None:
    fake = FakeFixedLatencyEngine(tiny_model_dir / "tokenizer.json", latency_s=0.0)
    engine = VllmEngine("tiny", request_timeout_s=10, connect_retries=0)
    sampling = SamplingParams(max_tokens=max_tokens)
    with BackgroundServer(fake) as server:
        try:
            chunks: list[tuple[list[int], list[float]]] = []
            streamed = await engine.stream(
                server.url, PROMPT, sampling, lambda ids, lps: chunks.append((ids, lps))
            )
            whole = await engine.complete(server.url, PROMPT, sampling)
        finally:
            await engine.aclose()
    expected = fake.output_ids[:max_tokens]
    assert chunks == [([token], [-0.1]) for token in expected]
    # the whole reply carries the whole text even when cut; the stream only what it sent
    assert streamed.model_dump(exclude={"text"}) == whole.model_dump(exclude={"text"})
    assert fake.text.startswith(streamed.text) and (streamed.text == fake.text) == (
        max_tokens > len(fake.output_ids)
    )
    assert streamed.output_ids == expected
    assert streamed.finish_reason == ("stop" if max_tokens > len(fake.output_ids) else "length")
    assert streamed.prompt_tokens == len(PROMPT)
