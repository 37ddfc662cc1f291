"""A session's bodies load to exactly what a full parse gives, parsing only new history
items when a body resends a known one, and never taking the shortcut for bytes that only
look like a resent history."""

import json
import random
from typing import Any

import pytest

from gateway.errors import GatewayError
from gateway.protocols import resent_body
from gateway.protocols.resent_body import ResentBodies
from gateway.protocols.wire import load_object


def spy_on_full_parses(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """The bodies `ResentBodies` hands to the full parse."""
    full: list[bytes] = []

    def counted(data: bytes) -> dict[str, Any]:
        full.append(data)
        return load_object(data)

    monkeypatch.setattr(resent_body, "load_object", counted)
    return full


def load_all(bodies: list[bytes]) -> ResentBodies:
    """Load `bodies` in turn, each equal to its full parse, key order included."""
    loader = ResentBodies()
    for data in bodies:
        value = loader.load(data)
        assert value == load_object(data)
        assert list(value) == list(load_object(data))
    return loader


def chat(turns: int, **dumps: Any) -> bytes:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "List [the] files, {now}."}]
    for t in range(turns):
        call = {"id": f"c{t}", "type": "function", "function": {"name": "ls", "arguments": "{}"}}
        messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": f"c{t}", "content": f'"]}} {t}'})
    tools = [{"type": "function", "function": {"name": "ls"}}]
    body = {"model": "m", "messages": messages, "tools": tools, "max_tokens": 64}
    return json.dumps(body, **dumps).encode()


def responses(turns: int) -> bytes:
    items: list[dict[str, Any]] = [{"role": "user", "content": "Go. ✓"}]
    for t in range(turns):
        items.append({"type": "function_call", "call_id": f"c{t}", "name": "ls", "arguments": ""})
        items.append({"type": "function_call_output", "call_id": f"c{t}", "output": "é"})
    body = {"model": "m", "instructions": "Be brief.", "input": items}
    return json.dumps(body, ensure_ascii=False).encode()


@pytest.mark.parametrize(
    "make",
    [
        lambda t: chat(t),
        lambda t: chat(t, separators=(",", ":")),
        lambda t: chat(t, indent=2),
        responses,
    ],
    ids=["spaced", "compact", "indented", "responses"],
)
def test_a_growing_conversation_parses_only_its_new_items(
    make: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    full = spy_on_full_parses(monkeypatch)
    load_all([make(t) for t in range(6)])
    assert len(full) == 1  # the first body; every later one resent it


def test_what_only_looks_like_a_resent_history_is_parsed_in_full(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    full = spy_on_full_parses(monkeypatch)
    first = {"model": "m", "messages": [{"role": "user", "content": "a"}], "max_tokens": 8}
    base = json.dumps(first, separators=(",", ":")).encode()
    head, tail = base[: base.index(b"]")], base[base.index(b"]") :]
    assert head.endswith(b"}") and tail == b'],"max_tokens":8}'
    control = head + b',{"role":"user","content":"b"}' + tail
    bodies = [
        control,  # new items: the shortcut (the control that it is taken)
        head + b'],"messages":[0,{"role":"user","content":"x"}' + tail,  # a later duplicate
        head + b"],[0" + tail,  # closes the array early
        head + b".5" + tail,  # continues the last item: the opener is no int 0
        head + b",1e5" + tail,  # any JSON is an item (the protocol refuses this one)
        base,  # no new item: resent as is
        head + b",{" + tail,  # not JSON: the full parse's 400
    ]
    for data in bodies:
        loader = ResentBodies()
        loader.load(base)
        full.clear()
        try:
            value: Any = loader.load(data)
        except GatewayError as exc:
            value = str(exc)
        assert value == outcome(data)
        assert (not full) == (data in (control, base, head + b",1e5" + tail)), data


def test_a_nested_array_growing_is_not_taken_for_new_history() -> None:
    call = {"id": "c0", "type": "function", "function": {"name": "ls", "arguments": "{}"}}
    message = {"role": "assistant", "content": "", "tool_calls": [call]}
    before = {"model": "m", "messages": [message]}
    after = {"model": "m", "messages": [{**message, "tool_calls": [call, call]}]}
    loader = load_all([json.dumps(before).encode(), json.dumps(after).encode()])
    assert len(loader.load(json.dumps(after).encode())["messages"]) == 1


def test_the_last_occurrence_of_the_history_key_is_the_one_extended() -> None:
    twice = b'{"messages":[{"a":1}],"model":"m","messages":[{"b":2}]}'
    grown = b'{"messages":[{"a":1}],"model":"m","messages":[{"b":2},{"c":3}]}'
    earlier_grown = b'{"messages":[{"a":1},{"z":0}],"model":"m","messages":[{"b":2}]}'
    load_all([twice, grown, earlier_grown])


def test_deep_nesting_in_a_new_item_is_refused_as_in_the_whole_body() -> None:
    base = b'{"messages":[{"a":1}]}'
    limit = resent_body.json_text.MAX_JSON_DEPTH
    outcomes = []
    for depth in (limit - 3, limit + 3):
        data = base[:-2] + b"," + b"[" * depth + b"]" * depth + base[-2:]
        loader = ResentBodies()
        loader.load(base)
        try:
            got: Any = loader.load(data)
        except GatewayError as exc:
            got = str(exc)
        assert got == outcome(data)
        outcomes.append(got)
    assert isinstance(outcomes[0], dict) and "nest deeper" in outcomes[1]


def outcome(data: bytes) -> Any:
    """The full parse's value of `data`, or its error's message."""
    try:
        return load_object(data)
    except GatewayError as exc:
        return str(exc)


def test_bodies_that_never_extend_each_other_are_seldom_scanned(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    scanned: list[str] = []
    history_end = resent_body._history_end
    monkeypatch.setattr(
        resent_body,
        "_history_end",
        lambda text, field: scanned.append(text) or history_end(text, field),
    )
    loader = ResentBodies()
    for call in range(16):  # the system prompt changes every call, before the history
        body = {"system": f"call {call}", "messages": [{"role": "user", "content": "hi"}]}
        loader.load(json.dumps(body).encode())
    assert len(scanned) == 5  # calls 1, 2, 4, 8 and 16
    grown = {"system": "call 15", "messages": [{"role": "user", "content": "hi"}] * 2}
    loader.load(json.dumps(grown).encode())  # extends the 16th: the count starts again
    body = {"system": "other", "messages": [{"role": "user", "content": "hi"}]}
    loader.load(json.dumps(body).encode())
    assert len(scanned) == 6


def test_any_bytes_between_a_known_head_and_tail_load_as_the_full_parse_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    full = spy_on_full_parses(monkeypatch)
    rng = random.Random(7)
    base = b'{"model":"m","messages":[{"role":"user","content":"a"}],"tools":[],"n":1}'
    cut = base.index(b"]")
    head, tail = base[:cut], base[cut:]
    pieces = [b",", b"]", b"[", b"{", b"}", b'"', b"\\", b"0", b"1", b":", b" ", b'"x"']
    pieces += [b',{"a":1}', b'],"messages":[', b"e5", b".5", b"null", b"\\ud800", b"9" * 20]
    shortcut = 0
    for _ in range(3000):
        middle = b"".join(rng.choice(pieces) for _ in range(rng.randint(0, 6)))
        data = head + middle + tail
        loader = ResentBodies()
        loader.load(base)
        full.clear()
        try:
            got: Any = loader.load(data)
        except GatewayError as exc:
            got = str(exc)
        assert got == outcome(data), data
        shortcut += not full
    assert shortcut > 100  # the control: many of them did take the shortcut
