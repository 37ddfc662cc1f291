"""Through the real Gateway over HTTP (scripted engine: a fake LLM that follows a script),
the same requests sent to a session that resumes its converted history and to one that
converts every request in full leave the same records, byte for byte apart from ids and
times — also when the history is edited in the middle, which must fall back to the full
conversion."""

import copy
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fixtures.gateway import scripted_gateway

pytestmark = pytest.mark.integration

REPLY = "Done."


@pytest.fixture
def gw(tiny_model_dir: Path, gateway_factory: Any) -> Any:
    with scripted_gateway(gateway_factory, tiny_model_dir, REPLY) as (_, running):
        yield running


def chat_body(history: list[dict[str, Any]]) -> dict[str, Any]:
    return {"model": "m", "messages": history, "max_tokens": 16}


def responses_body(history: list[dict[str, Any]]) -> dict[str, Any]:
    items = [{"type": "message", "role": m["role"], "content": m["content"]} for m in history]
    return {"model": "m", "instructions": "Be brief.", "input": items, "store": False}


def messages_body(history: list[dict[str, Any]]) -> dict[str, Any]:
    blocks = [
        {"role": m["role"], "content": [{"type": "text", "text": m["content"]}]} for m in history
    ]
    return {"model": "m", "system": "Be brief.", "messages": blocks, "max_tokens": 16}


PROTOCOLS = [
    ("/v1/chat/completions", chat_body, "Authorization"),
    ("/v1/responses", responses_body, "Authorization"),
    ("/v1/messages", messages_body, "x-api-key"),
]


def conversation() -> list[list[dict[str, Any]]]:
    """Histories sent in turn: growing, then one edited in the middle, then growing again."""
    history = [{"role": "user", "content": "Start."}]
    sent = []
    for turn in range(4):
        sent.append(copy.deepcopy(history))
        history += [
            {"role": "assistant", "content": REPLY},
            {"role": "user", "content": f"Go {turn}."},
        ]
    edited = copy.deepcopy(history)
    edited[2]["content"] = "Go 0, but differently."
    sent.append(copy.deepcopy(edited))
    edited += [{"role": "assistant", "content": REPLY}, {"role": "user", "content": "On."}]
    sent.append(copy.deepcopy(edited))
    return sent


def comparable(path: Path) -> list[str]:
    """The session's records with call and segment ids, times and durations blanked."""
    ids: dict[str, str] = {}
    lines = []
    for line in path.read_text().splitlines():
        record = json.loads(line)
        call = record.get("call")
        if call is not None:
            call["call_id"] = ids.setdefault(call["call_id"], f"call{len(ids)}")
            call["segment_id"] = ids.setdefault(call["segment_id"], f"seg{len(ids)}")
            call["started_at"], call["duration_s"] = "T", 0
            if record.get("prompt_ref"):
                record["prompt_ref"]["call_id"] = ids[record["prompt_ref"]["call_id"]]
        else:
            record["segment_id"] = ids.setdefault(record["segment_id"], f"seg{len(ids)}")
            if record.get("parent_id"):
                record["parent_id"] = ids[record["parent_id"]]
        lines.append(json.dumps(record, ensure_ascii=False))
    return lines


@pytest.mark.parametrize(("path", "body_of", "header"), PROTOCOLS)
def test_resumed_and_full_conversion_record_the_same_calls(
    gw: Any, path: str, body_of: Any, header: str
) -> None:
    sessions = [gw.create_session(), gw.create_session()]
    gw.gateway.sessions[sessions[1]["session_id"]].history = None  # always the full path
    for history in conversation():
        for session in sessions:
            token = session["token"]
            auth = f"Bearer {token}" if header == "Authorization" else token
            reply = httpx.post(f"{gw.url}{path}", json=body_of(history), headers={header: auth})
            assert reply.status_code == 200, reply.text
    cached, full = (
        comparable(gw.gateway.store.root / s["session_id"] / "records.jsonl") for s in sessions
    )
    assert cached == full
    calls = [json.loads(line)["call"] for line in full if '"kind":"call"' in line.replace(" ", "")]
    assert [c["match"] for c in calls] == ["fork", "clean", "clean", "clean", "fork", "clean"]
    # the resumed session did resume: its cache holds the last history
    last = body_of(conversation()[-1])
    items = last.get("input", last.get("messages"))
    protocol = calls[0]["protocol"]
    context = last.get("instructions") if protocol == "openai_responses" else None
    history = gw.gateway.sessions[sessions[0]["session_id"]].history
    assert history.lookup(protocol, items, context).count == len(items)
