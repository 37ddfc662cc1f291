"""Session lifetime: a session past its idle or absolute TTL is refused with a clear 409
and closed, by the next call or by the gateway's reaper without any call, also after a
restart (an expired session is never revived); its recorded calls stay intact. Real
Gateway over HTTP (official OpenAI SDK) in front of the scripted engine.

The gateway reads session time from a `ForwardClock`: TTLs are a minute long, so no call
of a slow machine outlives one by accident, and the test moves the clock past them."""

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from devstack.background_server import BackgroundServer
from devstack.scripted_engine import Script, ScriptedEngine, ScriptRule
from tests.fixtures.gateway import ForwardClock
from workers.local_stack import InProcessGateway

pytestmark = pytest.mark.integration

MODEL = "tiny-qwen3"
HI = [{"role": "user", "content": "hi"}]
#: Every TTL here; the clock then moves past it at once (`PAST_TTL`).
TTL_S = 60.0
PAST_TTL_S = 2 * TTL_S


@pytest.fixture
def scripted(tiny_model_dir: Path) -> Iterator[BackgroundServer]:
    engine = ScriptedEngine(
        tiny_model_dir / "tokenizer.json",
        Script(rules=[ScriptRule(reply="Hello there.", repeat=True)]),
        model=MODEL,
    )
    with BackgroundServer(engine.app()) as server:
        yield server


def agent(session: dict[str, Any], url: str | None = None) -> openai.OpenAI:
    """The agent's client (at `url` when the gateway moved); no SDK retries, so each 409
    is seen as it is."""
    base_url = f"{url}/v1" if url else session["openai_base_url"]
    return openai.OpenAI(base_url=base_url, api_key=session["token"], max_retries=0)


def expired_count(gw: InProcessGateway, ttl: str) -> float:
    text = httpx.get(f"{gw.control_url}/metrics").text
    for family in text_string_to_metric_families(text):
        if family.name == "rollout_gateway_sessions_expired":
            for sample in family.samples:
                if sample.name.endswith("_total") and sample.labels == {"ttl": ttl}:
                    return sample.value
    return 0.0


def wait_until(cond: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def summary(gw: InProcessGateway, session_id: str) -> dict[str, Any]:
    reply = httpx.get(f"{gw.control_url}/sessions/{session_id}", headers=gw.admin_headers)
    assert reply.status_code == 200, reply.text
    return reply.json()


def open_sessions(gw: InProcessGateway) -> list[str]:
    reply = httpx.get(f"{gw.control_url}/sessions", headers=gw.admin_headers)
    assert reply.status_code == 200, reply.text
    return [s["session_id"] for s in reply.json()["sessions"]]


def test_call_past_idle_ttl_is_409_and_trajectory_intact(
    scripted: BackgroundServer, tiny_model_dir: Path, gateway_factory: Any
) -> None:
    """No reaper here: the call itself finds the session expired, closes it and says so."""
    clock = ForwardClock()
    gw = gateway_factory(
        scripted.url, tiny_model_dir, MODEL, session_reaper_interval_s=0, clock=clock
    )
    session = gw.create_session(idle_ttl_s=TTL_S)
    client = agent(session)
    first = client.chat.completions.create(model=MODEL, messages=HI)  # type: ignore[arg-type]
    clock.advance(PAST_TTL_S)  # idle for longer than the TTL
    with pytest.raises(openai.ConflictError) as err:
        client.chat.completions.create(model=MODEL, messages=HI)  # type: ignore[arg-type]
    message = err.value.body["message"]  # type: ignore[index]
    assert message.startswith(f"session {session['session_id']} expired: no call for ")
    assert "past its idle TTL of 60s" in message
    trajectory = gw.trajectory(session["session_id"])
    assert trajectory["closed"] is True
    assert [c["call_id"] for c in trajectory["calls"]] == [first.id.removeprefix("chatcmpl-")]
    assert trajectory["calls"][0]["status"] == "ok"
    assert session["session_id"] not in gw.gateway.sessions  # memory released
    assert expired_count(gw, "idle") == 1.0
    # Later calls keep being refused, with the reason.
    with pytest.raises(openai.ConflictError) as again:
        client.chat.completions.create(model=MODEL, messages=HI)  # type: ignore[arg-type]
    assert "is closed (expired: no call for" in again.value.body["message"]  # type: ignore[index]


def test_reaper_closes_expired_session_without_a_call(
    scripted: BackgroundServer, tiny_model_dir: Path, gateway_factory: Any
) -> None:
    """The reaper started with the app closes an idle session nobody calls any more (a
    terminated rollout's agent) and leaves a session within its TTL open."""
    clock = ForwardClock()
    gw = gateway_factory(
        scripted.url, tiny_model_dir, MODEL, session_reaper_interval_s=0.2, clock=clock
    )
    idle = gw.create_session(idle_ttl_s=TTL_S)
    kept = gw.create_session(idle_ttl_s=3600.0, absolute_ttl_s=7200.0)
    agent(idle).chat.completions.create(model=MODEL, messages=HI)  # type: ignore[arg-type]
    assert sorted(open_sessions(gw)) == sorted([idle["session_id"], kept["session_id"]])

    clock.advance(PAST_TTL_S)
    wait_until(lambda: summary(gw, idle["session_id"])["closed"], 60, "the reaper to close it")
    assert idle["session_id"] not in gw.gateway.sessions
    assert expired_count(gw, "idle") == 1.0
    assert open_sessions(gw) == [kept["session_id"]]
    assert summary(gw, kept["session_id"])["closed"] is False
    assert len(gw.trajectory(idle["session_id"])["calls"]) == 1
    with pytest.raises(openai.ConflictError) as err:
        agent(idle).chat.completions.create(model=MODEL, messages=HI)  # type: ignore[arg-type]
    assert "is closed (expired: no call for" in err.value.body["message"]  # type: ignore[index]


def test_absolute_ttl_counts_from_creation_across_a_restart(
    scripted: BackgroundServer, tiny_model_dir: Path, gateway_factory: Any
) -> None:
    """A session that outlived its absolute TTL while its gateway was down stays closed:
    a restarted process neither serves it to its agent nor revives it for a retried
    create, and its reaper closes the ones nobody asks for."""
    clock = ForwardClock()
    gw = gateway_factory(
        scripted.url, tiny_model_dir, MODEL, session_reaper_interval_s=0, clock=clock
    )
    asked = gw.create_session(absolute_ttl_s=TTL_S, idempotency_key="asked")
    ignored = gw.create_session(absolute_ttl_s=TTL_S, idempotency_key="ignored")
    for session in (asked, ignored):
        agent(session).chat.completions.create(model=MODEL, messages=HI)  # type: ignore[arg-type]
    data_dir = gw.gateway.options.data_dir
    gw.server.stop()
    clock.advance(PAST_TTL_S)  # past the absolute TTL while no process runs

    restarted = gateway_factory(
        scripted.url, tiny_model_dir, MODEL, data_dir=data_dir, public_url=gw.url,
        session_reaper_interval_s=0, clock=clock,
    )  # fmt: skip
    with pytest.raises(openai.ConflictError) as err:
        agent(asked, restarted.url).chat.completions.create(model=MODEL, messages=HI)  # type: ignore[arg-type]
    assert "expired: created" in err.value.body["message"]  # type: ignore[index]
    assert "past its absolute TTL of 60s" in err.value.body["message"]  # type: ignore[index]
    body = {"rollout_id": restarted.trajectory(asked["session_id"])["rollout_id"]}
    retried = httpx.post(
        f"{restarted.control_url}/sessions",
        json={**body, "absolute_ttl_s": TTL_S, "idempotency_key": "asked"},
        headers=restarted.admin_headers,
    )
    assert retried.status_code == 409 and "is closed (expired: created" in retried.text
    assert restarted.trajectory(asked["session_id"])["closed"] is True
    assert len(restarted.trajectory(asked["session_id"])["calls"]) == 1
    restarted.server.stop()

    # The next process's reaper closes the one nobody called, from the files alone.
    third = gateway_factory(
        scripted.url, tiny_model_dir, MODEL, data_dir=data_dir, public_url=gw.url,
        session_reaper_interval_s=0.2, clock=clock,
    )  # fmt: skip
    wait_until(lambda: summary(third, ignored["session_id"])["closed"], 60, "the reaper")
    assert open_sessions(third) == []
    assert expired_count(third, "absolute") == 1.0
    assert len(third.trajectory(ignored["session_id"])["calls"]) == 1
