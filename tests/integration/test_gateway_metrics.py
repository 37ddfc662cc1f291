"""Every series of the Gateway's /metrics, moved by real traffic and read back from the
control listener with prometheus_client's own text parser.

The real Gateway in-process over HTTP, the official OpenAI SDK as the agent, and the
scripted engine (a FAKE LLM that follows a script) behind `HeldEngine`, which can keep
a completion at the engine until the test lets it go, or answer one with a 500. Each
value is checked against what the traffic implies (the recorded calls say how many
tokens were new, reused, sampled; how long each call took), not only for its presence.
The prefix-cache counter needs an engine that reports cached tokens: that one runs on
vLLM CPU. The last test walks the registry of a process built as `rollout gateway` builds it: a
series nobody asserts fails it.
"""

from __future__ import annotations

import asyncio
import collections
import json
import secrets
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from devstack.background_server import BackgroundServer
from devstack.scripted_engine import Script, ScriptedEngine
from devstack.vllm_server import VllmServer
from workers.gateway_server import GatewaySettings, build_listener_apps
from workers.local_stack import InProcessGateway

pytestmark = pytest.mark.integration

MODEL = "tiny-qwen3"
REPLY = "The answer is four."
TESTS = Path(__file__).resolve().parent


class HeldEngine:
    """ASGI in front of the scripted engine: with `holding` set, the next completion
    waits until `release` (the test sees it arrive on `arrived`); `fail_next` answers
    that many completions with a 500 instead."""

    def __init__(self, engine: ScriptedEngine) -> None:
        self.inner = engine.app()
        self.holding = False
        self.arrived = threading.Event()
        self.release = threading.Event()
        self.fail_next = 0

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] == "/v1/completions":
            if self.fail_next:
                self.fail_next -= 1
                body = json.dumps({"error": {"message": "engine fault for the test"}}).encode()
                await send({"type": "http.response.start", "status": 500, "headers": []})
                await send({"type": "http.response.body", "body": body})
                return
            if self.holding:
                self.holding = False
                self.arrived.set()
                await asyncio.to_thread(self.release.wait, 300)
        await self.inner(scope, receive, send)


@pytest.fixture
def held(
    tiny_model_dir: Path, gateway_factory: Any
) -> Iterator[tuple[InProcessGateway, HeldEngine, str]]:
    engine = HeldEngine(
        ScriptedEngine(tiny_model_dir / "tokenizer.json", Script(default_reply=REPLY), model=MODEL)
    )
    with BackgroundServer(engine) as server:
        yield gateway_factory(server.url, tiny_model_dir, MODEL), engine, server.url
        engine.release.set()


Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(gw: InProcessGateway) -> Samples:
    """Every sample of /metrics: (sample name, labels) → value."""
    text = httpx.get(f"{gw.control_url}/metrics", headers=gw.admin_headers, timeout=60).text
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    """A sample's value; 0 when absent (a labelled child not made yet)."""
    return samples.get((name, frozenset(labels.items())), 0.0)


def agent(session: dict[str, Any]) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=session["openai_base_url"], api_key=session["token"], max_retries=0
    )


def ask(session: dict[str, Any], messages: list[dict[str, str]], **extra: Any) -> httpx.Response:
    """One chat call as raw HTTP (its reply and status kept whatever they are)."""
    body = {"model": MODEL, "messages": messages, "max_tokens": 32, "temperature": 0.5}
    return httpx.post(
        f"{session['openai_base_url']}/chat/completions",
        json=body | extra.pop("body", {}),
        headers={"Authorization": f"Bearer {session['token']}", **extra.pop("headers", {})},
        timeout=300,
    )


#: Series the tests of this module assert (family names, as the registry has them).
ASSERTED_HERE = {
    "rollout_gateway_engine_cached_prompt_tokens",  # on vLLM
    "rollout_gateway_calls",
    "rollout_gateway_errors",
    "rollout_gateway_requests_stored_truncated",
    "rollout_gateway_new_prompt_tokens",
    "rollout_gateway_reused_prompt_tokens",
    "rollout_gateway_sampled_tokens",
    "rollout_gateway_retries_answered",
    "rollout_gateway_sampling_overridden",
    "rollout_gateway_sessions_open",
    "rollout_gateway_engine_inflight",
    "rollout_gateway_call_seconds",
    "rollout_gateway_prepare_seconds",
    "rollout_gateway_event_loop_lag_seconds",
    "rollout_gateway_engine_sessions",
    "rollout_gateway_engine_calls_inflight",
    "rollout_gateway_engine_calls",
    "rollout_gateway_engine_busy_seconds",
    "rollout_gateway_engine_prompt_tokens",
}
#: Series asserted (by name, on their value) in a test of their own feature.
ASSERTED_ELSEWHERE = {
    "rollout_gateway_limit_refusals": "test_gateway_limits.py",
    "rollout_gateway_sessions_expired": "test_session_lifetime.py",
    "rollout_gateway_call_span_seconds": "test_gateway_spans.py",
    "rollout_gateway_call_span_cpu_seconds": "test_gateway_spans.py",
    "rollout_gateway_offloaded_encodes": "test_gateway_tokenize_offload.py",
    "rollout_gateway_forwarded_calls": "test_gateway_shared_port.py",
}


def test_traffic_moves_every_series_by_what_it_did(
    held: tuple[InProcessGateway, HeldEngine, str],
) -> None:
    """Two sessions: a two-turn conversation, an SDK retry, a refused body, a call the
    engine fails, a raw request kept cut, a call held in flight; then one session closed."""
    gw, engine, url = held
    before = scrape(gw)
    started = time.monotonic()
    assert value(before, "rollout_gateway_sessions_open") == 0

    # one conversation of two turns; the session pins temperature 1.0, the agent asks 0.5
    session = gw.create_session(sampling={"temperature": 1.0})
    sid = session["session_id"]
    first = [{"role": "user", "content": "What is 2+2?"}]
    assert ask(session, first).status_code == 200
    turn2 = [*first, {"role": "assistant", "content": REPLY}, {"role": "user", "content": "Sure?"}]
    second = ask(session, turn2)
    assert second.status_code == 200
    # the SDK's retry of the second turn: answered from the record, the engine not asked
    retry = ask(session, turn2, headers={"x-stainless-retry-count": "1"})
    assert retry.json()["id"] == second.json()["id"]
    # a body the protocol refuses (400), and a call the engine fails (500 at the engine)
    refused = ask(session, [])
    assert refused.status_code == 400
    engine.fail_next = 1
    failed = ask(session, [{"role": "user", "content": "Once more."}])
    assert (failed.status_code, failed.json()["error"]["code"]) == (502, "engine_bad_reply")
    # a second session, whose raw requests are kept to 400 bytes
    small = gw.create_session(limits={"max_stored_request_bytes": 400})
    assert ask(small, first, body={"junk": "y" * 2000}).status_code == 200
    during = scrape(gw)

    # a call held at the engine: in flight while the test looks
    engine.holding = True
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(ask, small, [{"role": "user", "content": "Held."}])
        assert engine.arrived.wait(300)
        inflight = scrape(gw)
        # the loop-lag probe samples every LAG_INTERVAL_S: the call stays held until it has
        lag = "rollout_gateway_event_loop_lag_seconds_count"
        deadline = time.monotonic() + 30
        while value(scrape(gw), lag) == value(before, lag):
            assert time.monotonic() < deadline, "the loop-lag probe took no sample in 30 s"
            time.sleep(0.05)
        engine.release.set()
        assert pending.result().status_code == 200
    httpx.delete(f"{gw.control_url}/sessions/{sid}", headers=gw.admin_headers).raise_for_status()
    after = scrape(gw)
    elapsed = time.monotonic() - started

    calls = gw.trajectory(sid)["calls"] + gw.trajectory(small["session_id"])["calls"]
    ok = [c for c in calls if c["status"] == "ok"]
    failed_calls = [c for c in calls if c["status"] != "ok"]
    assert (len(ok), len(failed_calls)) == (4, 1)

    def moved(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    # calls, by protocol, scene, status and prefix match
    kinds = collections.Counter((c["status"], c["match"]) for c in calls)
    assert kinds[("engine_error", "fork")] == 1
    for (status, match), count in kinds.items():
        labels = {"protocol": "openai_chat", "scene": "main", "status": status, "match": match}
        assert moved("rollout_gateway_calls_total", **labels) == count
    assert moved("rollout_gateway_errors_total", status="400", kind="invalid_request") == 1
    assert moved("rollout_gateway_errors_total", status="502", kind="engine_bad_reply") == 1
    errors = [k for k in after if k[0] == "rollout_gateway_errors_total"]
    assert sum(moved(name, **dict(labels)) for name, labels in errors) == 2  # no other
    assert moved("rollout_gateway_requests_stored_truncated_total") == 1
    # tokens: new and reused prompt tokens, sampled tokens, of the calls that succeeded
    new = sum(c["new_prompt_tokens"] for c in ok)
    reused = sum(len(c["prompt_ids"]) - c["new_prompt_tokens"] for c in ok)
    assert reused > 0  # the second turn extends the first
    assert moved("rollout_gateway_new_prompt_tokens_total") == new
    assert moved("rollout_gateway_reused_prompt_tokens_total") == reused
    assert moved("rollout_gateway_sampled_tokens_total") == sum(len(c["output_ids"]) for c in ok)
    assert moved("rollout_gateway_retries_answered_total") == 1
    # every call asked temperature 0.5; both sessions pin it (the second by default)
    overridden = sum(c["sampling_overridden"].get("temperature") == 0.5 for c in calls)
    assert overridden == len(calls)
    assert moved("rollout_gateway_sampling_overridden_total", field="temperature") == overridden
    # sessions: both open in between, one left at the end
    assert value(during, "rollout_gateway_sessions_open") == 2
    assert value(after, "rollout_gateway_sessions_open") == 1
    assert value(during, "rollout_gateway_engine_sessions", engine=url) == 2
    assert value(after, "rollout_gateway_engine_sessions", engine=url) == 1
    # calls in flight: the held one, then none
    for name, labels in (
        ("rollout_gateway_engine_inflight", {}),
        ("rollout_gateway_engine_calls_inflight", {"engine": url}),
    ):
        assert (value(during, name, **labels), value(inflight, name, **labels)) == (0, 1)
        assert value(after, name, **labels) == 0
    # time: each ok call once, with the duration it was recorded with
    count, total = "rollout_gateway_call_seconds_count", "rollout_gateway_call_seconds_sum"
    assert moved(count, protocol="openai_chat") == len(ok)
    assert moved(total, protocol="openai_chat") == pytest.approx(
        sum(c["duration_s"] for c in ok), abs=1e-6
    )
    assert moved("rollout_gateway_prepare_seconds_count") == len(calls)  # the failed one too
    assert moved("rollout_gateway_prepare_seconds_sum") > 0
    busy = "rollout_gateway_engine_busy_seconds_total"
    assert value(during, busy, engine=url) < value(inflight, busy, engine=url)
    assert 0 < moved(busy, engine=url) <= elapsed
    assert moved("rollout_gateway_event_loop_lag_seconds_count") > 0
    # the engine: calls by outcome, prompt tokens sent
    assert moved("rollout_gateway_engine_calls_total", engine=url, outcome="ok") == len(ok)
    assert moved("rollout_gateway_engine_calls_total", engine=url, outcome="failed") == 1
    prompt = sum(len(c["prompt_ids"]) for c in ok)
    assert moved("rollout_gateway_engine_prompt_tokens_total", engine=url) == prompt


def test_the_engines_cached_prompt_tokens_are_counted(
    vllm_server: VllmServer, tiny_model_dir: Path, gateway_factory: Any
) -> None:
    """vLLM (prompt-token details on) reports the prompt tokens its prefix cache served:
    none for a first turn no earlier prompt shares, part of the second turn (the first
    turn's full blocks), never more than the first turn's prompt."""
    gw = gateway_factory(vllm_server.url, tiny_model_dir, vllm_server.model)
    url = vllm_server.url.rstrip("/")
    name = "rollout_gateway_engine_cached_prompt_tokens_total"
    session = gw.create_session(sampling={"temperature": 0.0, "max_tokens": 8})
    oai = agent(session)
    seen = [value(scrape(gw), name, engine=url)]
    unique = f"{secrets.token_hex(8)}: count the words in this sentence. " * 6
    messages = [{"role": "user", "content": unique}]
    reply = oai.chat.completions.create(model=MODEL, messages=messages)  # type: ignore[arg-type]
    seen.append(value(scrape(gw), name, engine=url))
    messages += [
        {"role": "assistant", "content": reply.choices[0].message.content or ""},
        {"role": "user", "content": "And now?"},
    ]
    oai.chat.completions.create(model=MODEL, messages=messages)  # type: ignore[arg-type]
    seen.append(value(scrape(gw), name, engine=url))
    [first, _] = gw.trajectory(session["session_id"])["calls"]
    assert seen[1] == seen[0]
    assert 0 < seen[2] - seen[1] <= len(first["prompt_ids"])


def test_every_registered_series_is_asserted(
    held: tuple[InProcessGateway, HeldEngine, str], tiny_model_dir: Path, tmp_path: Path
) -> None:
    """The registry of one `rollout gateway` process, built as it builds it (the core,
    the app's engine collector and loop-lag monitor, the shared port's forwarder),
    against the series these tests assert: a new series that no test asserts fails
    here, and so does an asserted one that is gone."""
    _, _, url = held
    settings = GatewaySettings(
        engine_urls=[url],
        model=MODEL,
        tokenizer=tiny_model_dir,
        data_dir=tmp_path / "walk",
        admin_token="walk-" + "x" * 16,
    )
    _, _, shared = build_listener_apps(settings)
    registered = {family.name for family in shared.gateway.metrics.registry.collect()}
    covered = ASSERTED_HERE | set(ASSERTED_ELSEWHERE)
    assert registered - covered == set(), "series no test asserts"
    assert covered - registered == set(), "asserted series the gateway no longer has"
    for name, test_file in ASSERTED_ELSEWHERE.items():
        assert name in (TESTS / test_file).read_text(), f"{test_file} does not assert {name}"
