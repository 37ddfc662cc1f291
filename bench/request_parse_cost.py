"""CPU per call of what grows with the history an agent resends: the body's JSON (loaded
by the session, parsing only new items, where the tree has `gateway.protocols.resent_body`),
the protocol parse (resuming the session's converted history where the tree has
`gateway.protocols.history`) and the retry digest, at an early and a late turn.

Run from this tree, or against another tree to compare (its gateway package first on the
path): `PYTHONPATH=<tree>:. python -P -m bench.request_parse_cost [--turns 3 38]`.
Bodies are tool loops in each protocol; the previous turn's body is parsed first, as the
session would have, and only the late body is timed (thread CPU, median).
"""

from __future__ import annotations

import argparse
import inspect
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

from gateway.capture.retries import request_digest
from gateway.protocols.anthropic_messages import request as anthropic_messages
from gateway.protocols.openai_chat import request as openai_chat
from gateway.protocols.openai_responses import request as openai_responses
from gateway.protocols.wire import load_object

try:
    from gateway.protocols.history import HistoryCache
except ImportError:  # a tree from before the history cache
    HistoryCache = None  # type: ignore[assignment,misc]

DIGESTS_BYTES = "bytes" in str(inspect.signature(request_digest).parameters["body"].annotation)
"""The digest is of the body's bytes (else, in an older tree, of the parsed body)."""

OUTPUT = "total 8\n-rw-r--r-- 1 root root 42 hello.py\n-rw-r--r-- 1 root root 17 notes.md\n"
SCHEMA = {"type": "object", "properties": {"cmd": {"type": "string"}}}


def chat(turns: int) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "List the files."},
    ]
    for t in range(turns):
        fn = {"name": "run", "arguments": '{"cmd": "ls"}'}
        call = {"id": f"call_{t}", "type": "function", "function": fn}
        messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": f"call_{t}", "content": f"{OUTPUT}{t}"})
    tool = {"type": "function", "function": {"name": "run", "parameters": SCHEMA}}
    return {"model": "m", "messages": messages, "tools": [tool], "max_tokens": 64}


def responses(turns: int) -> dict[str, Any]:
    items: list[dict[str, Any]] = [{"role": "user", "content": "List the files."}]
    for t in range(turns):
        text = [{"type": "reasoning_text", "text": "look"}]
        items.append({"type": "reasoning", "summary": [], "content": text})
        items.append(
            {"type": "function_call", "call_id": f"c{t}", "name": "run", "arguments": "{}"}
        )
        items.append({"type": "function_call_output", "call_id": f"c{t}", "output": OUTPUT})
    tool = {"type": "function", "name": "run", "parameters": SCHEMA}
    return {"model": "m", "instructions": "Be brief.", "input": items, "tools": [tool]}


def messages(turns: int) -> dict[str, Any]:
    history: list[dict[str, Any]] = [{"role": "user", "content": "List the files."}]
    for t in range(turns):
        use = {"type": "tool_use", "id": f"t{t}", "name": "run", "input": {"cmd": "ls"}}
        think = {"type": "thinking", "thinking": "look", "signature": "x"}
        history.append({"role": "assistant", "content": [think, use]})
        result = {"type": "tool_result", "tool_use_id": f"t{t}", "content": OUTPUT}
        history.append({"role": "user", "content": [result]})
    tool = {"name": "run", "input_schema": SCHEMA}
    return {
        "model": "m",
        "system": "Be brief.",
        "messages": history,
        "tools": [tool],
        "max_tokens": 64,
    }


PROTOCOLS: list[tuple[str, Callable[[int], dict[str, Any]], Callable[..., Any], str]] = [
    ("chat", chat, openai_chat.parse_chat_request, "/v1/chat/completions"),
    ("responses", responses, openai_responses.parse_responses_request, "/v1/responses"),
    ("messages", messages, anthropic_messages.parse_messages_request, "/v1/messages"),
]


def cost_us(make: Callable[[int], dict[str, Any]], parse: Any, path: str, turn: int) -> float:
    previous, body = json.dumps(make(turn - 1)).encode(), json.dumps(make(turn)).encode()
    samples = []
    for _ in range(200):
        history = HistoryCache() if HistoryCache is not None else None
        load = getattr(history, "bodies", None)  # the session's loader, in a tree with one
        load = load.load if load is not None else load_object
        if history is not None:
            parse(load(previous), {}, path, history)
        start = time.thread_time()
        data = load(body)
        if history is not None:
            parse(data, {}, path, history)
        else:
            parse(data, {}, path)
        request_digest(path, body if DIGESTS_BYTES else data)
        samples.append(time.thread_time() - start)
    return 1e6 * statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--turns", type=int, nargs=2, default=[3, 38])
    early, late = parser.parse_args().turns
    cached = "with" if HistoryCache is not None else "without"
    print(f"JSON load + parse + retry digest, {cached} the history cache (thread CPU, median)")
    for name, make, parse, path in PROTOCOLS:
        a, b = cost_us(make, parse, path, early), cost_us(make, parse, path, late)
        print(f"{name:<10} turn {early}: {a:7.0f} us   turn {late}: {b:7.0f} us   (+{b - a:.0f})")


if __name__ == "__main__":
    main()
