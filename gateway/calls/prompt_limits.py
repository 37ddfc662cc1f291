"""Caps on one request's prompt, checked before anything renders or tokenizes it.

Rendering costs per message and tokenizing per character; without a cap one request can
hold a tokenizer worker (or, for `count_tokens`, which samples nothing and is not
limited by the context window before it is counted) for minutes. The caps sit far above
any prompt a context window holds, so a real conversation never meets them; a request
over one is refused with a 413 that names the limit, before any work is done.
"""

from dataclasses import dataclass
from typing import Any

import orjson

from gateway.canonical import CanonicalRequest
from gateway.errors import GatewayError


@dataclass(frozen=True)
class PromptSize:
    """What a render and a tokenize of a request cost grows with."""

    messages: int
    chars: int
    """Characters of message text, reasoning, tool calls and tool declarations."""


def prompt_size(request: CanonicalRequest) -> PromptSize:
    chars = 0
    for message in request.messages:
        chars += len(message.content or "") + len(message.reasoning or "")
        for call in message.tool_calls:
            chars += len(call.name) + len(call.arguments)
    for tool in request.tools:
        chars += len(tool.name) + len(tool.description or "")
        chars += len(orjson.dumps(tool.parameters, default=str))
    return PromptSize(len(request.messages), chars)


def history_items(body: dict[str, Any]) -> int:
    """How many items a raw request's history holds (`messages`, or Responses' `input`),
    known before the protocol parses it: parsing costs per item too."""
    for field in ("messages", "input"):
        items = body.get(field)
        if isinstance(items, list):
            return len(items)
    return 0


def check_history_items(items: int, max_messages: int) -> None:
    """A 413 naming the limit before the parse of a history of more items than the
    message cap. Items become at least as many messages, except Responses' function-call
    items, which merge into their turn's message; the cap is far above either."""
    if max_messages and items > max_messages:
        raise GatewayError(
            "too_large",
            f"the request has {items} messages; the limit is {max_messages}",
            param="messages",
        )


def check_prompt_size(size: PromptSize, max_messages: int, max_chars: int) -> None:
    """A 413 naming the limit when `size` is over one (0: no limit)."""
    if max_messages and size.messages > max_messages:
        raise GatewayError(
            "too_large",
            f"the request has {size.messages} messages; the limit is {max_messages}",
            param="messages",
        )
    if max_chars and size.chars > max_chars:
        raise GatewayError(
            "too_large",
            f"the request's prompt is {size.chars} characters; the limit is {max_chars}",
            param="messages",
        )
