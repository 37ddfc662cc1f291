"""Routed experts captured with the tokens, through the real Gateway over HTTP on vLLM's
token-in/token-out API, in front of the scripted engine (a FAKE LLM whose routing is
SCRIPTED: ids made up from token, position and layer; `devstack.scripted_engine`).

A session that asks records each call's routing from where its segment's previous call's
prompt ended; the segment splices them so every token but the last has one, the token
sampled in a call keeping that call's routing; re-reads are counted, and counted as
differing when the engine routes a re-read token otherwise. An engine that returns no
routing, or routing of the wrong shape, leaves the call recorded (and answered) with the
routing marked missing and named in the trajectory's notes.
"""

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from activities.samples import build_rows
from devstack.scripted_engine import ScriptedEngine, ScriptedRouting
from rollout_client.storage import read_samples, write_samples
from schemas.samples import table_to_rows
from schemas.trajectory import Trajectory
from tests.fixtures.gateway import scripted_gateway
from tests.unit.test_workflow_samples import request
from workers.local_stack import InProcessGateway

pytestmark = pytest.mark.integration

REPLY = "Looked at it: {nonce} and more words to route."


@pytest.fixture
def routed(
    gateway_factory: Callable[..., InProcessGateway], tiny_model_dir: Path
) -> Iterator[tuple[ScriptedEngine, InProcessGateway]]:
    with scripted_gateway(gateway_factory, tiny_model_dir, REPLY, engine_api="generate") as pair:
        pair[0].routing = ScriptedRouting(layers=3, top_k=2, experts=8)
        yield pair


def turns(
    session: dict[str, Any],
    n: int,
    stream: bool = False,
    before: Callable[[int], None] | None = None,
) -> list[int]:
    """`n` chat turns of one conversation (`before(i)` runs before turn i); the HTTP
    status of each."""
    url = f"{session['openai_base_url']}/chat/completions"
    headers = {"Authorization": f"Bearer {session['token']}"}
    messages: list[dict[str, Any]] = [{"role": "user", "content": "What is here?"}]
    statuses = []
    for i in range(n):
        if before is not None:
            before(i)
        body = {"model": "tiny", "messages": messages, "max_tokens": 64, "stream": stream}
        reply = httpx.post(url, headers=headers, json=body)
        statuses.append(reply.status_code)
        if stream:
            text = "".join(
                chunk["choices"][0]["delta"].get("content") or ""
                for line in reply.text.splitlines()
                if line.startswith("data: {")
                for chunk in [httpx.Response(200, content=line[6:]).json()]
                if chunk["choices"]
            )
        else:
            text = reply.json()["choices"][0]["message"]["content"]
        messages += [
            {"role": "assistant", "content": text},
            {"role": "user", "content": f"And then? ({i})"},
        ]
    return statuses


def trajectory(gw: InProcessGateway, session: dict[str, Any]) -> Trajectory:
    return Trajectory.model_validate(gw.trajectory(session["session_id"]))


def expected_rows(routing: ScriptedRouting, traj: Trajectory) -> np.ndarray:
    """The segment's routing by the documented rule, from the calls' own tokens: a token
    keeps the routing of the first call that routed it — the call that sampled it, or,
    for a call's last sampled token and the prompt tokens, the call that read it first
    (as prompt: SCRIPTED `reread_shift` routes those otherwise)."""
    segment = traj.segments[0]
    sequence = [*segment.prompt_ids, *segment.response_ids]
    rows = np.zeros((len(sequence) - 1, routing.layers, routing.top_k), dtype=np.int64)
    done = 0
    for call in traj.calls:
        whole = [*call.prompt_ids, *call.output_ids]
        assert whole == sequence[: len(whole)]
        mine = routing.rows(whole, len(call.prompt_ids), 0)
        rows[done : len(whole) - 1] = mine[done:]
        done = len(whole) - 1
    return rows


@pytest.mark.parametrize("reread_shift", [False, True])
def test_a_session_that_asks_records_each_tokens_routing_once(
    routed: tuple[ScriptedEngine, InProcessGateway], reread_shift: bool
) -> None:
    engine, gw = routed
    engine.routing = ScriptedRouting(layers=3, top_k=2, experts=8, reread_shift=reread_shift)
    session = gw.create_session(routed_experts=True)
    assert turns(session, 3) == [200, 200, 200]
    traj = trajectory(gw, session)
    calls = traj.calls
    assert len(calls) == 3 and len(traj.segments) == 1
    # each call asks from the previous call's prompt end: its sampled tokens come again
    assert engine.routing_starts == [0, len(calls[0].prompt_ids), len(calls[1].prompt_ids)]
    for call, start in zip(calls, engine.routing_starts, strict=True):
        experts = call.routed_experts
        assert experts is not None and call.routing_missing is None
        assert (experts.start, experts.layers, experts.top_k, experts.dtype) == (
            start,
            3,
            2,
            "uint8",
        )
        assert experts.tokens == len(call.prompt_ids) + len(call.output_ids) - 1 - start
    segment = traj.segments[0]
    assert segment.routed_experts is not None and segment.routing_missing is None
    stored = segment.routed_experts.array()
    assert stored.shape == (len(segment.prompt_ids) + len(segment.response_ids) - 1, 3, 2)
    np.testing.assert_array_equal(stored, expected_rows(engine.routing, traj))
    # the re-read tokens: all of call 1's and call 2's output but their last
    rereads = sum(len(c.output_ids) - 1 for c in calls[:2])
    assert segment.routing_rereads == rereads
    assert segment.routing_reread_differs == (rereads if reread_shift else 0)
    assert traj.notes == []


def test_the_samples_file_carries_the_segments_routing(
    routed: tuple[ScriptedEngine, InProcessGateway], tmp_path: Path
) -> None:
    """Gateway → trajectory → sample row → parquet → read back: the same routing, and a
    session that did not ask has none (null, not zeros)."""
    engine, gw = routed
    asked, plain = gw.create_session(routed_experts=True), gw.create_session()
    assert turns(asked, 2) == [200, 200] and turns(plain, 1) == [200]
    for session, name in ((asked, "asked"), (plain, "plain")):
        traj = trajectory(gw, session)
        write_samples(build_rows(traj, request()), tmp_path / f"{name}.parquet")
    [row] = table_to_rows(read_samples(tmp_path / "asked.parquet"))
    segment = trajectory(gw, asked).segments[0]
    assert row.routed_experts == segment.routed_experts and row.routed_experts is not None
    assert (row.routing_missing, row.routing_rereads) == ("", segment.routing_rereads)
    np.testing.assert_array_equal(
        row.routed_experts.array(),
        engine.routing.rows([*row.prompt_ids, *row.response_ids], len(row.prompt_ids), 0),
    )
    [other] = table_to_rows(read_samples(tmp_path / "plain.parquet"))
    assert other.routed_experts is None and other.routing_missing == ""


def test_a_streamed_call_records_the_same_routing(
    routed: tuple[ScriptedEngine, InProcessGateway],
) -> None:
    engine, gw = routed
    plain, streamed = gw.create_session(routed_experts=True), gw.create_session(routed_experts=True)
    engine.script.default_reply = "Same words each time, streamed or not."
    assert turns(plain, 2) == [200, 200]
    assert turns(streamed, 2, stream=True) == [200, 200]
    a, b = trajectory(gw, plain), trajectory(gw, streamed)
    assert [c.output_ids for c in a.calls] == [c.output_ids for c in b.calls]
    assert b.segments[0].routed_experts is not None
    assert b.segments[0].routed_experts == a.segments[0].routed_experts


def test_no_routing_unless_asked_and_the_gateway_flag_asks_for_every_session(
    gateway_factory: Callable[..., InProcessGateway], tiny_model_dir: Path
) -> None:
    with scripted_gateway(gateway_factory, tiny_model_dir, REPLY, engine_api="generate") as (
        engine,
        gw,
    ):
        engine.routing = ScriptedRouting()
        session = gw.create_session()
        assert turns(session, 2) == [200, 200]
        traj = trajectory(gw, session)
        assert engine.routing_starts == [None, None]  # not asked: nothing to skip either
        assert all(c.routed_experts is None and c.routing_missing is None for c in traj.calls)
        assert traj.segments[0].routed_experts is None
        assert traj.segments[0].routing_missing is None
    with scripted_gateway(
        gateway_factory, tiny_model_dir, REPLY, engine_api="generate", routed_experts=True
    ) as (engine, gw):
        engine.routing = ScriptedRouting()
        session = gw.create_session()
        assert turns(session, 2) == [200, 200]
        assert trajectory(gw, session).segments[0].routed_experts is not None


@pytest.mark.parametrize(
    ("fault", "says"),
    [
        ("none", "returned no routed_experts"),
        ("rows", "the call needs"),
        ("garbage", "not base64 of an .npy array"),
        ("layers", "4 layers x 2 experts; the model's are 3 x 2"),
    ],
)
def test_bad_routing_is_recorded_missing_never_failing_the_call(
    routed: tuple[ScriptedEngine, InProcessGateway], fault: str, says: str
) -> None:
    """The second call's routing is bad: that call is answered and recorded, its routing
    marked missing and named in the notes, and the segment has none so far. The third
    asks from the start again, and its routing makes the segment whole."""
    engine, gw = routed
    good = ScriptedRouting(layers=3, top_k=2, experts=8)
    bad = good.model_copy(update={"fault": fault})
    session = gw.create_session(routed_experts=True)

    def before(turn: int) -> None:
        engine.routing = bad if turn == 1 else good
        if turn == 2:
            so_far = trajectory(gw, session)
            assert so_far.segments[0].routed_experts is None
            assert says in (so_far.segments[0].routing_missing or "")

    assert turns(session, 3, before=before) == [200, 200, 200]
    traj = trajectory(gw, session)
    calls = traj.calls
    assert [c.status for c in calls] == ["ok"] * 3
    assert calls[1].routed_experts is None
    assert calls[1].routing_missing is not None and says in calls[1].routing_missing
    assert traj.notes == [
        f"call {calls[1].call_id}: no routed experts recorded: {calls[1].routing_missing}"
    ]
    assert engine.routing_starts == [0, len(calls[0].prompt_ids), 0]
    segment = traj.segments[0]
    assert segment.routed_experts is not None and segment.routing_missing is None
    np.testing.assert_array_equal(
        segment.routed_experts.array(),
        good.rows([*segment.prompt_ids, *segment.response_ids], len(segment.prompt_ids), 0),
    )


def test_routing_on_an_engine_api_that_cannot_return_it_is_refused(
    gateway_factory: Callable[..., InProcessGateway], tiny_model_dir: Path
) -> None:
    with scripted_gateway(gateway_factory, tiny_model_dir, REPLY) as (_, gw):
        reply = httpx.post(
            f"{gw.control_url}/sessions",
            json={"rollout_id": "r-1", "routed_experts": True},
            headers=gw.admin_headers,
        )
        assert reply.status_code == 400
        assert "routed_experts" in reply.text and "--engine-api generate" in reply.text
        assert gw.create_session()["session_id"]  # control: the same body without it
