"""Sampling the trainer believes in, through the real Gateway with the official `openai`
and `anthropic` SDKs as agents: what the session pins is what the engine gets, whatever
the agent sends (seen at the engine by a recording proxy); an agent's value of a pinned
field is overridden and recorded, or refused when the session says so; and the samples
carry each call's settings when the agent changed agent-chosen fields between calls.

The engine is the scripted one (a FAKE LLM that follows a script; tokens come from the
real tokenizer) except in the last test, where real vLLM shows that a logit bias the
agent sends changes what is sampled only when the session leaves it to the agent."""

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
from temporalio.testing import ActivityEnvironment
from tokenizers import Tokenizer

from activities.samples import build_rows, sampling_json
from activities.session import GatewayAccess, SessionActivities
from devstack.background_server import BackgroundServer
from devstack.scripted_engine import Script, ScriptedEngine
from rollout_client.storage import read_samples, write_samples
from schemas.rollout import SessionRequest
from schemas.samples import SCHEMA_VERSION, table_to_rows
from schemas.sampling import SamplingControl, SamplingParams
from schemas.tasks import HarnessSpec
from schemas.trajectory import Trajectory
from tests.fixtures.collect import collect_request
from tests.fixtures.gateway import RecordingProxy
from workers.local_stack import InProcessGateway

pytestmark = pytest.mark.integration

MODEL = "tiny-qwen3"
REPLY = "The answer is four."
#: The session's policy: what a trainer sets.
POLICY = {"temperature": 1.0, "top_p": 1.0, "seed": 11, "max_tokens": 64}
#: What an agent asks for instead (OpenAI Chat carries all of them).
AGENT_CHAT = {
    "temperature": 0.1,
    "top_p": 0.2,
    "presence_penalty": 1.0,
    "seed": 5,
    "logit_bias": {"7": 100},
}


@pytest.fixture
def proxied(
    tiny_model_dir: Path, gateway_factory: Any
) -> Iterator[tuple[InProcessGateway, RecordingProxy]]:
    """Gateway → recording proxy → scripted engine; the proxy keeps every engine request."""
    engine = ScriptedEngine(
        tiny_model_dir / "tokenizer.json", Script(default_reply=REPLY), model=MODEL
    )
    with BackgroundServer(engine.app()) as engine_server:
        proxy = RecordingProxy(engine_server.url)
        with BackgroundServer(proxy.app()) as proxy_server:
            yield gateway_factory(proxy_server.url, tiny_model_dir, MODEL), proxy


def sent_sampling(proxy: RecordingProxy, index: int = -1) -> dict[str, Any]:
    """The sampling fields of an engine request as the engine received them."""
    body = proxy.exchanges[index][0]
    fields = set(SamplingParams.model_fields) - {"engine_extra", "max_tokens"}
    return {k: v for k, v in body.items() if k in fields}


def chat(session: dict[str, Any]) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=session["openai_base_url"], api_key=session["token"], max_retries=0
    )


def messages_client(session: dict[str, Any]) -> anthropic.Anthropic:
    return anthropic.Anthropic(
        base_url=session["anthropic_base_url"], api_key=session["token"], max_retries=0
    )


@pytest.mark.parametrize("stream", [False, True])
def test_pinned_fields_reach_the_engine_whatever_the_openai_agent_sends(
    proxied: tuple[InProcessGateway, RecordingProxy], stream: bool
) -> None:
    """Default control: the engine gets the session's values (and nothing for pinned
    fields the session leaves to the engine's default); the record says what the agent
    asked. Control: the same request in a session that leaves those fields to the
    agent reaches the engine as sent, so the comparison can fail."""
    gw, proxy = proxied
    session = gw.create_session(sampling=POLICY)
    kwargs: dict[str, Any] = {"model": MODEL, "max_tokens": 32, **AGENT_CHAT}
    ask = [{"role": "user", "content": "What is 2+2?"}]
    if stream:
        with chat(session).chat.completions.create(messages=ask, stream=True, **kwargs) as s:
            text = "".join(c.choices[0].delta.content or "" for c in s if c.choices)
    else:
        text = chat(session).chat.completions.create(messages=ask, **kwargs).choices[0]
        text = text.message.content
    assert REPLY in (text or "")
    assert sent_sampling(proxy) == {"temperature": 1.0, "top_p": 1.0, "seed": 11}
    assert proxy.exchanges[-1][0]["max_tokens"] == 32  # the agent's, under the session's cap
    [call] = gw.trajectory(session["session_id"])["calls"]
    assert {k: v for k, v in call["sampling"].items() if v not in (None, {})} == {
        "temperature": 1.0,
        "top_p": 1.0,
        "seed": 11,
        "max_tokens": 32,
    }
    assert call["sampling_overridden"] == {
        "temperature": 0.1,
        "top_p": 0.2,
        "presence_penalty": 1.0,
        "seed": 5,
        "logit_bias": {"7": 100.0},
    }
    metrics = httpx.get(f"{gw.control_url}/metrics", headers=gw.admin_headers).text
    assert 'rollout_gateway_sampling_overridden_total{field="temperature"}' in metrics

    free = {name: "agent" for name in AGENT_CHAT}
    open_session = gw.create_session(sampling=POLICY, sampling_control=free)
    chat(open_session).chat.completions.create(messages=ask, **kwargs)
    assert sent_sampling(proxy) == {**AGENT_CHAT, "logit_bias": {"7": 100.0}}
    [call] = gw.trajectory(open_session["session_id"])["calls"]
    assert call["sampling_overridden"] == {} and call["sampling"]["temperature"] == 0.1


@pytest.mark.parametrize("stream", [False, True])
def test_claude_code_style_sampling_is_overridden_for_anthropic_agents(
    proxied: tuple[InProcessGateway, RecordingProxy], stream: bool
) -> None:
    """Claude Code sends `temperature=1` (and other CLIs top_p/top_k): with those pinned
    to the session's values, or to the engine's default when the session leaves them
    unset, the agent keeps working and the engine gets the policy."""
    gw, proxy = proxied
    session = gw.create_session(sampling={"temperature": 0.7, "max_tokens": 64})
    client = messages_client(session)
    kwargs: dict[str, Any] = {
        "model": MODEL,
        "max_tokens": 32,
        "messages": [{"role": "user", "content": "What is 2+2?"}],
        # this SDK no longer names them; the body is what Claude Code and others send
        "extra_body": {"temperature": 1.0, "top_p": 0.5, "top_k": 3},
    }
    if stream:
        with client.messages.stream(**kwargs) as events:
            message = events.get_final_message()
    else:
        message = client.messages.create(**kwargs)
    assert REPLY in "".join(b.text for b in message.content if b.type == "text")
    assert sent_sampling(proxy) == {"temperature": 0.7}  # top_p, top_k: the engine's default
    [call] = gw.trajectory(session["session_id"])["calls"]
    assert call["sampling_overridden"] == {"temperature": 1.0, "top_p": 0.5, "top_k": 3}


@pytest.mark.parametrize("stream", [False, True])
def test_pinned_fields_reach_the_engine_whatever_a_responses_agent_sends(
    proxied: tuple[InProcessGateway, RecordingProxy], stream: bool
) -> None:
    """The Responses API carries temperature and top_p (Codex sends its own): pinned, the
    engine gets the session's and the record says what the agent asked; a session that
    refuses answers 400 naming the field; left to the agent, its value reaches the engine
    (the control)."""
    gw, proxy = proxied
    asked: dict[str, Any] = {"model": MODEL, "input": "What is 2+2?", "max_output_tokens": 32}
    agent = {"temperature": 0.1, "top_p": 0.2}

    def respond(session: dict[str, Any]) -> str:
        client = chat(session)
        if not stream:
            return client.responses.create(**asked, **agent).output_text
        with client.responses.stream(**asked, **agent) as events:
            return events.get_final_response().output_text

    session = gw.create_session(sampling=POLICY)
    assert REPLY in respond(session)
    assert sent_sampling(proxy) == {"temperature": 1.0, "top_p": 1.0, "seed": 11}
    [call] = gw.trajectory(session["session_id"])["calls"]
    assert call["sampling_overridden"] == agent

    strict = gw.create_session(sampling=POLICY, sampling_control={"on_conflict": "refuse"})
    with pytest.raises(openai.BadRequestError) as refused:
        respond(strict)
    assert refused.value.body["param"] == "temperature"  # type: ignore[index]
    assert gw.trajectory(strict["session_id"])["calls"] == []

    free = gw.create_session(
        sampling=POLICY, sampling_control={"temperature": "agent", "top_p": "agent"}
    )
    respond(free)
    assert sent_sampling(proxy) == {**agent, "seed": 11}


def test_a_session_that_refuses_answers_400_naming_the_field(
    proxied: tuple[InProcessGateway, RecordingProxy],
) -> None:
    """`on_conflict: refuse`: a pinned field asked otherwise is a protocol-shaped 400 that
    names it, in either protocol; nothing is recorded and the engine is not called. The
    pinned value itself, or leaving the field out, is served."""
    gw, proxy = proxied
    session = gw.create_session(sampling=POLICY, sampling_control={"on_conflict": "refuse"})
    ask = [{"role": "user", "content": "What is 2+2?"}]
    with pytest.raises(openai.BadRequestError) as chat_refused:
        chat(session).chat.completions.create(model=MODEL, messages=ask, temperature=0.3)
    assert chat_refused.value.body["param"] == "temperature"  # type: ignore[index]
    assert "pinned by this session to 1.0" in chat_refused.value.body["message"]  # type: ignore[index]
    with pytest.raises(anthropic.BadRequestError) as messages_refused:
        messages_client(session).messages.create(
            model=MODEL, max_tokens=16, messages=ask, extra_body={"top_k": 3}
        )
    error = messages_refused.value.body["error"]  # type: ignore[index]
    assert error["type"] == "invalid_request_error"
    assert "top_k is pinned by this session to the engine's default" in error["message"]
    assert gw.trajectory(session["session_id"])["calls"] == [] and proxy.exchanges == []

    chat(session).chat.completions.create(model=MODEL, messages=ask, temperature=1.0, seed=11)
    messages_client(session).messages.create(model=MODEL, max_tokens=16, messages=ask)
    assert [sent_sampling(proxy, i)["temperature"] for i in (0, 1)] == [1.0, 1.0]
    assert len(gw.trajectory(session["session_id"])["calls"]) == 2


def test_a_logit_bias_on_a_token_the_model_lacks_is_refused_before_the_engine(
    proxied: tuple[InProcessGateway, RecordingProxy], tiny_model_dir: Path
) -> None:
    gw, proxy = proxied
    vocab = gw.gateway.options.vocab_size
    assert vocab is not None
    bad = {"rollout_id": "r-bias", "sampling": {"logit_bias": {str(vocab): 1}}}
    created = httpx.post(f"{gw.control_url}/sessions", json=bad, headers=gw.admin_headers)
    assert created.status_code == 400, created.text
    assert f"sampling.logit_bias.{vocab}" in created.text
    session = gw.create_session(sampling_control={"logit_bias": "agent"})
    with pytest.raises(openai.BadRequestError) as refused:
        chat(session).chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "hi"}],
            logit_bias={str(vocab + 5): 1},
        )
    assert refused.value.body["param"] == f"logit_bias.{vocab + 5}"  # type: ignore[index]
    assert gw.trajectory(session["session_id"])["calls"] == [] and proxy.exchanges == []


async def test_the_create_session_activity_hands_the_control_to_the_gateway(
    proxied: tuple[InProcessGateway, RecordingProxy],
) -> None:
    """The gateway-host activity opens the session with the task's control: a field the
    task leaves to the agent reaches the engine as the agent sent it, the others not."""
    gw, proxy = proxied
    access = GatewayAccess([gw.control_url], gw.admin_token, owner_queue="q")
    request = SessionRequest(
        rollout_id="r-act",
        attempt=1,
        policy_version="v1",
        sampling=SamplingParams(temperature=1.0, top_p=1.0),
        sampling_control=SamplingControl(top_p="agent"),
        harness=HarnessSpec(name="command", config={"command": "true"}),
    )
    try:
        ref = await ActivityEnvironment().run(SessionActivities(access).create_session, request)
    finally:
        await access.aclose()
    client = openai.AsyncOpenAI(base_url=ref.openai_base_url, api_key=ref.token, max_retries=0)
    await client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], temperature=0.1, top_p=0.4
    )
    await client.close()
    assert sent_sampling(proxy) == {"temperature": 1.0, "top_p": 0.4}


def test_samples_carry_each_calls_settings_across_a_segment(
    proxied: tuple[InProcessGateway, RecordingProxy], tmp_path: Path
) -> None:
    """One conversation of three calls (one segment); temperature and top_p are the
    agent's, and it changes them between calls; top_k it also sends, pinned. The sample
    row lists each call's settings as the engine got them, aligned with the calls, and
    they survive the Parquet round trip."""
    gw, proxy = proxied
    session = gw.create_session(
        sampling=POLICY, sampling_control={"temperature": "agent", "top_p": "agent"}
    )
    client = chat(session)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "What is 2+2?"}]
    asked = [{"temperature": 0.3}, {"temperature": 0.9, "top_p": 0.5}, {}]
    for turn, extra in enumerate(asked):
        reply = client.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=32, extra_body={"top_k": 4}, **extra
        )
        messages.append({"role": "assistant", "content": reply.choices[0].message.content})
        messages.append({"role": "user", "content": f"And again ({turn})?"})
    engine_got = [sent_sampling(proxy, i) for i in range(3)]
    assert [(s["temperature"], s["top_p"]) for s in engine_got] == [
        (0.3, 1.0),
        (0.9, 0.5),
        (1.0, 1.0),
    ]
    assert all("top_k" not in s for s in engine_got)

    trajectory = Trajectory.model_validate(gw.trajectory(session["session_id"]))
    [segment] = trajectory.segments
    assert len(segment.call_ids) == 3 and len(segment.call_starts) == 3
    [row] = build_rows(trajectory, collect_request(session, POLICY))
    calls = {c.call_id: c for c in trajectory.calls}
    assert row.call_sampling == [sampling_json(calls[c].sampling) for c in segment.call_ids]
    assert len(set(row.call_sampling)) == 3 and row.sampling == row.call_sampling[0]
    assert [c.sampling_overridden for c in trajectory.calls] == [{"top_k": 4}] * 3
    write_samples([row], tmp_path / "r-1.parquet")
    [back] = table_to_rows(read_samples(tmp_path / "r-1.parquet"))
    assert back.call_sampling == row.call_sampling and back.schema_version == SCHEMA_VERSION


@pytest.mark.parametrize("engine_api", ["completions", "generate"])
def test_an_agents_logit_bias_changes_what_vllm_samples_only_when_it_is_the_agents(
    vllm_server: Any, tiny_model_dir: Path, gateway_factory: Any, engine_api: str
) -> None:
    """Real vLLM: a +100 bias on one token makes every sampled token that token when the
    session leaves logit_bias to the agent (which also shows the engine reads our
    payload), and has no effect when the session pins it (the default)."""
    gw = gateway_factory(vllm_server.url, tiny_model_dir, vllm_server.model, engine_api=engine_api)
    tokenizer = Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json"))
    favourite = tokenizer.encode(" four").ids[-1]
    request: dict[str, Any] = {
        "model": vllm_server.model,
        "messages": [{"role": "user", "content": "Say something."}],
        "max_tokens": 6,
        "logit_bias": {str(favourite): 100},
    }
    policy = {"temperature": 1.0, "seed": 3}
    outputs = {}
    for choice in ("agent", "pinned"):
        session = gw.create_session(sampling=policy, sampling_control={"logit_bias": choice})
        chat(session).chat.completions.create(**request)
        [call] = gw.trajectory(session["session_id"])["calls"]
        outputs[choice] = call["output_ids"]
    assert outputs["agent"] == [favourite] * 6
    assert outputs["pinned"] != [favourite] * 6
