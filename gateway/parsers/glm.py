"""The GLM-4.x family (GLM-4.5/4.6/4.7; vLLM's `glm45` / `glm47` parsers): `<think>`
reasoning, then one `<tool_call>` block per call with the arguments as key/value tags:

    <tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value>…</tool_call>

The template writes a string value as it is and any other value as JSON, so each value is
read back by the request's schema (`typed_arguments`); strings stay verbatim, whitespace
included, exactly as an echo re-renders them. GLM-4.5 puts newlines between the name and
the pairs: whitespace between the tags is allowed, any other text there makes the block
malformed (vLLM skips it). A block ends at its first `</tool_call>`
(`first_close_ends_block`: values are raw text).

The generation prompt opens `<think>` (or writes `</think>` at once when `enable_thinking`
is false, which the Gateway reads in the prompt's tail), so the model continues inside
reasoning or in content; a tool call that starts inside reasoning ends it.
"""

from __future__ import annotations

import re

from gateway.canonical import ToolCall
from gateway.parsers.base import ParseContext, tool_call_id
from gateway.parsers.family import Family
from gateway.parsers.tagged import TaggedParser, skip_ws
from gateway.parsers.typed_arguments import typed_arguments

__all__ = ["FAMILIES", "GLM_END_MARKERS", "GlmParser"]

GLM_END_MARKERS = ("<|observation|>", "<|user|>", "<|endoftext|>")
"""`<|observation|>` ends a turn that called tools, `<|user|>` one that answered; the
tokenizer's eos may end either."""

_KEY_OPEN, _KEY_CLOSE = "<arg_key>", "</arg_key>"
_VALUE_OPEN, _VALUE_CLOSE = "<arg_value>", "</arg_value>"
_NAME = re.compile(r"[^\s<>]+")


class GlmParser(TaggedParser):
    """GLM-4.x output: `[<think>]reasoning</think>content<tool_call>…</tool_call>…`."""

    reasoning_tags = ("<think>", "</think>")
    block_open = "<tool_call>"
    block_close = "</tool_call>"
    end_markers = GLM_END_MARKERS
    calls_in_reasoning = True
    first_close_ends_block = True

    def __init__(self, name: str = "glm-4.7-flash") -> None:
        self.name = name

    def decode_block(self, body: str, ctx: ParseContext, first_index: int) -> list[ToolCall] | str:
        decoded = _read_pairs(body)
        if isinstance(decoded, str):
            return decoded
        name, raw = decoded
        try:
            arguments = typed_arguments(ctx.tools, name, raw)
        except ValueError as exc:
            return str(exc)
        return [ToolCall(id=tool_call_id(ctx.call_id, first_index), name=name, arguments=arguments)]


def _read_pairs(body: str) -> tuple[str, dict[str, str]] | str:
    """(name, raw string values) of one block's body, or why it is malformed."""
    at = body.find(_KEY_OPEN)
    name = (body if at < 0 else body[:at]).strip()
    if not name:
        return "tool call has no name"
    if not _NAME.fullmatch(name):
        return f"tool call name {name[:40]!r} is not a name"
    values: dict[str, str] = {}
    pos = len(body) if at < 0 else at
    while (pos := skip_ws(body, pos)) < len(body):
        if not body.startswith(_KEY_OPEN, pos):
            return f"unexpected text in the arguments of {name!r}"
        key_end = body.find(_KEY_CLOSE, pos)
        if key_end < 0:
            return f"unclosed {_KEY_OPEN} in {name!r}"
        key = body[pos + len(_KEY_OPEN) : key_end].strip()
        if not key:
            return f"an empty {_KEY_OPEN} in {name!r}"
        pos = skip_ws(body, key_end + len(_KEY_CLOSE))
        if not body.startswith(_VALUE_OPEN, pos):
            return f"argument {key!r} of {name!r} has no {_VALUE_OPEN}"
        value_end = body.find(_VALUE_CLOSE, pos)
        if value_end < 0:
            return f"unclosed {_VALUE_OPEN} of {key!r} in {name!r}"
        values[key] = body[pos + len(_VALUE_OPEN) : value_end]
        pos = value_end + len(_VALUE_CLOSE)
    return name, values


FAMILIES = (
    Family(
        "glm-4.7-flash",
        GlmParser,
        signature=("<arg_key>",),
        vllm_tool_parsers=("glm45", "glm47"),
        vllm_reasoning_parsers=(None, "glm45", "glm47"),
        vllm_reasoning_alone=True,
    ),
)
