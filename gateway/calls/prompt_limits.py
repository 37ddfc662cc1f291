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

from gateway.canonical import CanonicalRequest, Message, Tool
from gateway.errors import GatewayError


@dataclass(frozen=True)
class PromptSize:
    """What a render and a tokenize of a request cost grows with."""

    messages: int
    chars: int
    """Characters of message text, reasoning, tool calls and tool declarations."""


def prompt_size(request: CanonicalRequest) -> PromptSize:
    chars = sum(map(_message_chars, request.messages))
    return PromptSize(len(request.messages), chars + _tool_chars(request.tools))


def _message_chars(message: Message) -> int:
    chars = len(message.content or "") + len(message.reasoning or "")
    for call in message.tool_calls:
        chars += len(call.name) + len(call.arguments)
    return chars


def _tool_chars(tools: list[Tool]) -> int:
    chars = 0
    for tool in tools:
        chars += len(tool.name) + len(tool.description or "")
        chars += len(orjson.dumps(tool.parameters, default=str))
    return chars


class PromptSizes:
    """`prompt_size` for one session's calls, reading only the messages its last call
    did not have. A resent history the protocol's cache resumed is the same message
    objects (`protocols.history`), found by identity at their place: a call compares
    references rather than reading every message's text."""

    def __init__(self) -> None:
        self._messages: list[Message] = []
        self._chars: list[int] = []
        """Characters of each of `_messages`."""

    def size(self, request: CanonicalRequest) -> PromptSize:
        known, known_chars = self._messages, self._chars
        shared = min(len(known), len(request.messages))
        chars = [
            known_chars[i] if i < shared and message is known[i] else _message_chars(message)
            for i, message in enumerate(request.messages)
        ]
        self._messages, self._chars = list(request.messages), chars
        return PromptSize(len(chars), sum(chars) + _tool_chars(request.tools))


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
