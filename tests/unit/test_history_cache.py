"""The session history cache (`gateway.protocols.history`): a request that extends one the
session already sent converts only its new items, and the result is the same canonical
request (byte for byte) as the full conversion; anything else falls back to the full path."""

import copy
import json
from collections.abc import Callable
from typing import Any

import pytest

from gateway.canonical import CanonicalRequest
from gateway.errors import GatewayError
from gateway.protocols import history
from gateway.protocols.anthropic_messages import request as anthropic_messages
from gateway.protocols.history import HistoryCache
from gateway.protocols.openai_chat import request as openai_chat
from gateway.protocols.openai_responses import request as openai_responses

Parse = Callable[..., CanonicalRequest]

OUTPUT = "total 8\n-rw-r--r-- 1 root root 42 hello.py\n"


def chat_turns(turns: int) -> list[dict[str, Any]]:
    """Chat Completions bodies of a growing tool loop, one per turn."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": [{"type": "text", "text": "List the files."}]},
    ]
    bodies = []
    for turn in range(turns):
        bodies.append({"model": "m", "messages": copy.deepcopy(messages), "max_tokens": 64})
        call = {
            "id": f"call_{turn}",
            "type": "function",
            "function": {"name": "run", "arguments": json.dumps({"cmd": "ls", "n": turn})},
        }
        messages.append(
            {"role": "assistant", "content": None, "tool_calls": [call], "reasoning": "hm"}
        )
        messages.append({"role": "tool", "tool_call_id": f"call_{turn}", "content": OUTPUT})
    return bodies


def responses_turns(turns: int) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = [{"role": "user", "content": "List the files."}]
    bodies = []
    for turn in range(turns):
        bodies.append(
            {
                "model": "m",
                "instructions": "Be brief.",
                "input": copy.deepcopy(items),
                "store": False,
            }
        )
        items += [
            {
                "type": "reasoning",
                "summary": [],
                "content": [{"type": "reasoning_text", "text": "a"}],
            },
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "b"}],
            },
            {"type": "function_call", "call_id": f"c{turn}", "name": "run", "arguments": "{}"},
        ]
        if turn % 2:  # a turn left open: the next request's first item continues it
            items.append(
                {"type": "function_call", "call_id": f"d{turn}", "name": "x", "arguments": "{}"}
            )
        items.append({"type": "function_call_output", "call_id": f"c{turn}", "output": OUTPUT})
    return bodies


def messages_turns(turns: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "List the files."}]
    bodies = []
    for turn in range(turns):
        bodies.append(
            {
                "model": "m",
                "max_tokens": 64,
                "system": [
                    {"type": "text", "text": f"x-anthropic-billing-header: cch={turn}"},
                    {"type": "text", "text": "You are Claude Code."},
                ],
                "messages": copy.deepcopy(messages),
            }
        )
        use = {"type": "tool_use", "id": f"t{turn}", "name": "run", "input": {"n": 1}}
        messages.append(
            {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm"}, use]}
        )
        result = {"type": "tool_result", "tool_use_id": f"t{turn}", "content": OUTPUT}
        messages.append({"role": "user", "content": [{"type": "text", "text": "ok"}, result]})
    return bodies


PROTOCOLS: list[tuple[str, Parse, Callable[[int], list[dict[str, Any]]], str]] = [
    ("openai_chat", openai_chat.parse_chat_request, chat_turns, "messages"),
    ("openai_responses", openai_responses.parse_responses_request, responses_turns, "input"),
    ("anthropic_messages", anthropic_messages.parse_messages_request, messages_turns, "messages"),
]


def both(parse: Parse, body: dict[str, Any], cache: HistoryCache) -> CanonicalRequest:
    """Parse through the cache and in full; they must agree byte for byte."""
    full = parse(copy.deepcopy(body), {"x-h": "1"})
    cached = parse(copy.deepcopy(body), {"x-h": "1"}, history=cache)
    assert cached.model_dump_json() == full.model_dump_json()
    return cached


def history_key(protocol: str, body: dict[str, Any]) -> Any:
    return body.get("instructions") if protocol == "openai_responses" else None


@pytest.mark.parametrize(("protocol", "parse", "turns", "field"), PROTOCOLS)
def test_a_growing_conversation_converts_only_new_items(
    protocol: str, parse: Parse, turns: Any, field: str
) -> None:
    cache = HistoryCache()
    bodies = turns(6)
    for i, body in enumerate(bodies):
        resumed = cache.lookup(protocol, body[field], history_key(protocol, body)).count
        assert resumed == (len(bodies[i - 1][field]) if i else 0)
        both(parse, body, cache)


@pytest.mark.parametrize(("protocol", "parse", "turns", "field"), PROTOCOLS)
def test_an_edited_history_falls_back_to_the_full_conversion(
    protocol: str, parse: Parse, turns: Any, field: str
) -> None:
    cache = HistoryCache()
    bodies = turns(5)
    for body in bodies[:4]:
        both(parse, body, cache)
    edited = copy.deepcopy(bodies[4])
    # An edit that `==` on parsed JSON would miss (1 == True): the JSON text differs.
    if protocol == "anthropic_messages":
        edited[field][1]["content"][1]["input"]["n"] = True
    elif protocol == "openai_chat":
        edited[field][2]["content"] = OUTPUT + " (edited)"
    else:
        edited[field][3]["arguments"] = '{"edited": 1}'
    assert cache.lookup(protocol, edited[field], history_key(protocol, edited)).count == 0
    request = both(parse, edited, cache)
    assert (
        request.model_dump_json() != parse(copy.deepcopy(bodies[4]), {"x-h": "1"}).model_dump_json()
    )
    # Dropped items (a rewind) and a shorter history fall back too.
    shorter = copy.deepcopy(bodies[4])
    del shorter[field][1]
    assert cache.lookup(protocol, shorter[field], history_key(protocol, shorter)).count == 0
    both(parse, shorter, cache)
    # The conversation goes on from the last request converted in full.
    both(parse, bodies[4], cache)
    assert cache.lookup(protocol, bodies[4][field], history_key(protocol, bodies[4])).count == len(
        bodies[4][field]
    )


def test_other_instructions_do_not_resume_a_responses_history() -> None:
    cache = HistoryCache()
    first, second = responses_turns(2)
    both(openai_responses.parse_responses_request, first, cache)
    second["instructions"] = "Be verbose."
    assert cache.lookup("openai_responses", second["input"], "Be verbose.").count == 0
    request = both(openai_responses.parse_responses_request, second, cache)
    assert request.messages[0].content == "Be verbose."


@pytest.mark.parametrize(("protocol", "parse", "turns", "field"), PROTOCOLS)
def test_a_bad_new_item_gets_the_full_paths_error(
    protocol: str, parse: Parse, turns: Any, field: str
) -> None:
    cache = HistoryCache()
    first, second = turns(2)
    both(parse, first, cache)
    bad = copy.deepcopy(second)
    bad[field].append({"role": "user", "content": 5})
    with pytest.raises(GatewayError) as full:
        parse(copy.deepcopy(bad))
    assert cache.lookup(protocol, bad[field], history_key(protocol, bad)).count == len(first[field])
    with pytest.raises(GatewayError) as cached:
        parse(copy.deepcopy(bad), history=cache)
    assert (cached.value.message, cached.value.param) == (full.value.message, full.value.param)
    assert str(len(bad[field]) - 1) in full.value.message


def test_side_calls_do_not_evict_the_main_conversation() -> None:
    cache = HistoryCache()
    bodies = chat_turns(4)
    for body in bodies[:3]:
        both(openai_chat.parse_chat_request, body, cache)
    for n in range(3):  # titles and probes in between
        probe = {"model": "m", "messages": [{"role": "user", "content": f"title {n}"}]}
        both(openai_chat.parse_chat_request, probe, cache)
    assert cache.lookup("openai_chat", bodies[3]["messages"]).count == len(bodies[2]["messages"])


@pytest.mark.parametrize(("protocol", "parse", "turns", "field"), PROTOCOLS)
def test_a_resent_history_the_session_loaded_resumes_without_being_encoded(
    protocol: str, parse: Parse, turns: Any, field: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    encoded: list[Any] = []
    dumps = history._dumps
    monkeypatch.setattr(history, "_dumps", lambda value: encoded.append(value) or dumps(value))
    cache = HistoryCache()
    for i, body in enumerate(turns(5)):
        if "system" in body:  # the same each call, as the bodies must resend their head
            body["system"] = "You are Claude Code."
        data = cache.bodies.load(json.dumps(body).encode())  # the session's load
        encoded.clear()
        resumed = cache.lookup(protocol, data[field], history_key(protocol, data)).count
        cached = parse(data, {"x-h": "1"}, history=cache)
        assert (
            cached.model_dump_json() == parse(copy.deepcopy(body), {"x-h": "1"}).model_dump_json()
        )
        lists = [value for value in encoded if isinstance(value, list)]
        if i == 0:
            assert resumed == 0 and lists  # nothing to resume: encoded to be compared
        else:
            assert resumed > 0 and not lists  # the same objects: nothing encoded
