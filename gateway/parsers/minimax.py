"""The MiniMax-M2 family (vLLM's `minimax_m2` parsers): `<think>` reasoning, then the
turn's tool calls in one `<minimax:tool_call>` block, one `<invoke>` per call:

    <minimax:tool_call>
    <invoke name="NAME">
    <parameter name="K">V</parameter>
    </invoke>
    </minimax:tool_call>

The template writes a string value as it is and any other value as JSON, so each value is
read back by the request's schema (`typed_arguments`); strings stay verbatim. Names may be
quoted with `"` or `'`, or not at all. Whitespace between the tags is allowed; any other
text there, an unclosed `<parameter>` or a block without an `<invoke>` makes the block
malformed (vLLM skips stray text and ends an unclosed parameter at the next one). A block
ends at its first closing marker (`first_close_ends_block`: values are raw text).

The generation prompt always opens `<think>` (the template has no switch to turn thinking
off), so the model continues inside reasoning; a tool call that starts inside reasoning
ends it.
"""

from __future__ import annotations

import re

from gateway.canonical import ToolCall
from gateway.parsers.base import ParseContext, tool_call_id
from gateway.parsers.family import Family
from gateway.parsers.tagged import TaggedParser, skip_ws
from gateway.parsers.typed_arguments import typed_arguments

__all__ = ["FAMILIES", "MINIMAX_END_MARKERS", "MinimaxParser"]

MINIMAX_END_MARKERS = ("[e~[",)
"""The end of every message (the tokenizer's eos), after a tool call or an answer."""

_QUOTED = r"""(?:"([^"<>]*)"|'([^'<>]*)'|([^\s"'<>]+))"""
_INVOKE = re.compile(rf"<invoke\s+name\s*=\s*{_QUOTED}\s*>")
_INVOKE_CLOSE = "</invoke>"
_PARAMETER = re.compile(rf"<parameter\s+name\s*=\s*{_QUOTED}\s*>")
_PARAMETER_CLOSE = "</parameter>"
_NAME = re.compile(r"[^\s<>]+")


class MinimaxParser(TaggedParser):
    """MiniMax-M2 output: `reasoning</think>content<minimax:tool_call><invoke …>…`."""

    reasoning_tags = ("<think>", "</think>")
    block_open = "<minimax:tool_call>"
    block_close = "</minimax:tool_call>"
    end_markers = MINIMAX_END_MARKERS
    calls_in_reasoning = True
    first_close_ends_block = True

    def __init__(self, name: str = "minimax-m2") -> None:
        self.name = name

    def decode_block(self, body: str, ctx: ParseContext, first_index: int) -> list[ToolCall] | str:
        calls: list[ToolCall] = []
        pos = 0
        while (pos := skip_ws(body, pos)) < len(body):
            invoke = _INVOKE.match(body, pos)
            if invoke is None:
                return f"unexpected text in the block at invoke {len(calls) + 1}"
            name = _quoted(invoke)
            if not _NAME.fullmatch(name):
                return f"invoke {len(calls) + 1} has no valid name ({name[:40]!r})"
            close = body.find(_INVOKE_CLOSE, invoke.end())
            if close < 0:
                return f"unclosed <invoke> of {name!r}"
            raw = _read_parameters(body[invoke.end() : close], name)
            if isinstance(raw, str):
                return raw
            try:
                arguments = typed_arguments(ctx.tools, name, raw)
            except ValueError as exc:
                return str(exc)
            index = first_index + len(calls)
            calls.append(
                ToolCall(id=tool_call_id(ctx.call_id, index), name=name, arguments=arguments)
            )
            pos = close + len(_INVOKE_CLOSE)
        return calls or "the block holds no <invoke>"


def _quoted(match: re.Match[str]) -> str:
    """The name attribute's value, whichever way it was quoted."""
    return next((g for g in match.groups() if g is not None), "").strip()


def _read_parameters(text: str, name: str) -> dict[str, str] | str:
    """The raw string values of one invoke's parameters, or why they are malformed."""
    values: dict[str, str] = {}
    pos = 0
    while (pos := skip_ws(text, pos)) < len(text):
        parameter = _PARAMETER.match(text, pos)
        if parameter is None:
            return f"unexpected text in the parameters of {name!r}"
        key = _quoted(parameter)
        if not key:
            return f"a parameter of {name!r} has no name"
        close = text.find(_PARAMETER_CLOSE, parameter.end())
        if close < 0:
            return f"unclosed <parameter> {key!r} of {name!r}"
        values[key] = text[parameter.end() : close]
        pos = close + len(_PARAMETER_CLOSE)
    return values


FAMILIES = (
    Family(
        "minimax-m2",
        MinimaxParser,
        signature=("<minimax:tool_call>",),
        vllm_tool_parsers=("minimax_m2",),
        vllm_reasoning_parsers=(None, "minimax_m2"),
        vllm_reasoning_alone=True,
    ),
)
