"""The DeepSeek families: `<think>` reasoning, then tool calls in a section of special
tokens, then `<｜end▁of▁sentence｜>`.

- DeepSeek-V3.1: `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{json}
  <｜tool▁call▁end｜>…<｜tool▁calls▁end｜>` (vLLM's `deepseek_v31`). Its generation prompt
  ends `<think>` in thinking mode and `</think>` otherwise; the Gateway reads which.
- DeepSeek-R1 distills (and V3): `<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\\n```json
  \\n{json}\\n```<｜tool▁call▁end｜>`, calls separated by a newline (vLLM's `deepseek_v3`);
  the generation prompt opens `<think>\\n`.

The section tokens are wrappers (dropped), each call is one block, and the arguments are
kept as written: both templates concatenate the argument text into the prompt as it is,
so an echo of the same text re-renders what the model sampled. A tool call written
inside the reasoning stays reasoning, as in vLLM (its reasoning parser runs first).

Unlike vLLM, a call without a separator, with a name holding spaces, with arguments that
are not a JSON object, or that never closes stays visible as content with a parse note
(vLLM drops a call it cannot split and passes the others on unchecked); empty arguments
are `{}`.
"""

from __future__ import annotations

import re
from functools import partial

from gateway.canonical import ToolCall
from gateway.parsers.base import ParseContext, tool_call_id
from gateway.parsers.family import Family
from gateway.parsers.json_calls import json_object_text
from gateway.parsers.tagged import TaggedParser

SECTION_BEGIN = "<｜tool▁calls▁begin｜>"
SECTION_END = "<｜tool▁calls▁end｜>"
CALL_BEGIN = "<｜tool▁call▁begin｜>"
CALL_END = "<｜tool▁call▁end｜>"
SEPARATOR = "<｜tool▁sep｜>"
END_OF_SENTENCE = "<｜end▁of▁sentence｜>"

_NAME = re.compile(r"[^\s<>]+")
_FENCE = re.compile(r"\s*```json\n?(?P<args>.*?)\n?```\s*", re.S)
"""The ```json block after a V3 / R1 call's name line; the arguments run to its last fence
(a fence inside a JSON string does not end them)."""


class DeepSeekParser(TaggedParser):
    """`fenced=False`: V3.1's `NAME<sep>{json}`; `fenced=True`: V3/R1's
    `function<sep>NAME` + a ```json fence."""

    reasoning_tags = ("<think>", "</think>")
    block_open = CALL_BEGIN
    block_close = CALL_END
    wrappers = (SECTION_BEGIN, SECTION_END)
    end_markers = (END_OF_SENTENCE,)

    def __init__(self, name: str = "deepseek-v3.1", *, fenced: bool = False) -> None:
        self.name = name
        self.fenced = fenced
        # R1 thinks first, also where its template opened nothing (after a tool result); a
        # call it makes without closing its thoughts (as its template renders one) ends them.
        self.reasons_first = self.calls_in_reasoning = fenced

    @property
    def reasoning_enders(self) -> tuple[str, ...]:
        enders = super().reasoning_enders
        return (*enders, SECTION_BEGIN) if self.calls_in_reasoning else enders

    def decode_block(self, body: str, ctx: ParseContext, first_index: int) -> list[ToolCall] | str:
        head, separator, tail = body.partition(SEPARATOR)
        if not separator:
            return f"no {SEPARATOR} in the call"
        if SEPARATOR in tail:
            return f"more than one {SEPARATOR} in the call"
        if self.fenced:
            decoded = _fenced(head, tail)
            if isinstance(decoded, str):
                return decoded
            name, arguments = decoded
        else:
            name, arguments = head.strip(), tail
        if not _NAME.fullmatch(name):
            return f"tool name {name!r} is empty or has spaces or angle brackets"
        try:
            arguments = json_object_text(arguments)
        except ValueError as exc:
            return str(exc)
        return [ToolCall(id=tool_call_id(ctx.call_id, first_index), name=name, arguments=arguments)]


def _fenced(head: str, tail: str) -> tuple[str, str] | str:
    """(name, arguments) of `TYPE` + `NAME\\n```json\\n{json}\\n```` (the text between the
    fences' newlines is the arguments, unchanged)."""
    kind = head.strip()
    if not kind:
        return "no call type before the separator"
    name, newline, fenced = tail.partition("\n")
    if not newline:
        return "no ```json block after the tool name"
    match = _FENCE.fullmatch(fenced)
    if match is None:
        return "no ```json block after the tool name"
    return name.strip(), match["args"]


FAMILIES = (
    Family(
        "deepseek-r1-distill-qwen",
        partial(DeepSeekParser, fenced=True),
        signature=(SECTION_BEGIN, "tool['type']"),
        vllm_tool_parsers=("deepseek_v3",),
        vllm_reasoning_parsers=(None, "deepseek_r1"),
        vllm_reasoning_alone=True,
    ),
    Family(
        "deepseek-v3.1",
        DeepSeekParser,
        signature=(SECTION_BEGIN,),
        vllm_tool_parsers=("deepseek_v31",),
        vllm_reasoning_parsers=(None, "deepseek_v3"),
        vllm_reasoning_alone=True,
    ),
)
