"""Prompt caps: a request over the message or character cap is refused with a 413 in its
protocol's shape that names the limit, before anything renders or tokenizes it, and
nothing is recorded; a request at the caps is served (the control). `count_tokens`
counts off the event loop: a large prompt is tokenized in the pool, with the count
inline tokenization gives."""

from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest

from devstack.background_server import BackgroundServer
from devstack.scripted_engine import Script, ScriptedEngine
from stress.malformed_requests import error_shape_problem
from workers.local_stack import InProcessGateway

pytestmark = pytest.mark.integration

MODEL = "tiny-qwen3"


def post(gw: InProcessGateway, token: str, path: str, body: dict[str, Any]) -> httpx.Response:
    headers = {"authorization": f"Bearer {token}", "anthropic-version": "2023-06-01"}
    return httpx.post(f"{gw.url}{path}", json=body, headers=headers, timeout=60)


@pytest.fixture
def capped(tiny_model_dir: Path, gateway_factory: Any) -> Any:
    engine = ScriptedEngine(tiny_model_dir / "tokenizer.json", Script(default_reply="ok"))
    with BackgroundServer(engine.app()) as server:
        yield gateway_factory(
            server.url, tiny_model_dir, MODEL, max_prompt_messages=5, max_prompt_chars=2000
        )


@pytest.mark.parametrize(
    ("path", "shape", "extra"),
    [
        ("/v1/chat/completions", "openai", {}),
        ("/v1/chat/completions", "openai", {"stream": True}),
        ("/v1/messages", "anthropic", {"max_tokens": 16}),
        ("/v1/messages/count_tokens", "anthropic", {}),
    ],
)
def test_a_prompt_over_a_cap_is_a_413_naming_the_limit(
    capped: InProcessGateway, path: str, shape: Any, extra: dict[str, Any]
) -> None:
    session = capped.create_session()
    token = session["token"]
    user = {"role": "user", "content": "hi"}
    turns = [user, {"role": "assistant", "content": "ok"}] * 2 + [user]
    at_caps = {"model": MODEL, "messages": turns, **extra}
    assert post(capped, token, path, at_caps).status_code == 200, "control: at the caps"
    calls_before = len(capped.trajectory(session["session_id"])["calls"])

    too_many = {"model": MODEL, "messages": [*turns, turns[1], user], **extra}
    too_long = {"model": MODEL, "messages": [{"role": "user", "content": "y" * 2001}], **extra}
    for body, named in ((too_many, "7 messages; the limit is 5"), (too_long, "the limit is 2000")):
        refused = post(capped, token, path, body)
        assert refused.status_code == 413, refused.text
        assert error_shape_problem(shape, refused) is None, refused.text
        assert named in refused.text
    assert len(capped.trajectory(session["session_id"])["calls"]) == calls_before


def test_count_tokens_of_a_large_prompt_is_tokenized_in_the_pool(
    tiny_model_dir: Path, gateway_factory: Any
) -> None:
    engine = ScriptedEngine(tiny_model_dir / "tokenizer.json", Script(default_reply="ok"))
    text = "".join(f"line {i}: worker {i % 7} wrote block {i * 31}\n" for i in range(400))
    with BackgroundServer(engine.app()) as server:
        counts, offloaded = [], []
        for offload in (1000, 0):
            gw = gateway_factory(server.url, tiny_model_dir, MODEL, tokenize_offload_chars=offload)
            session = gw.create_session()
            client = anthropic.Anthropic(
                base_url=session["anthropic_base_url"], api_key=session["token"]
            )
            counted = client.messages.count_tokens(
                model=MODEL, messages=[{"role": "user", "content": text}]
            )
            counts.append(counted.input_tokens)
            offloaded.append(getattr(gw.gateway.incremental.tokenizer, "offloaded", 0))
    assert counts[0] == counts[1] > 400
    assert offloaded == [1, 0], "the offloading gateway counted in its pool"
