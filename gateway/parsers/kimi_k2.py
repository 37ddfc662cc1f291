"""The Kimi-K2 family: tool calls in a section of special tokens, each call named by the
model's own id `functions.NAME:N`; the Thinking model reasons in `<think>…</think>` first.

Layout: `[<think>reasoning</think>]content<|tool_calls_section_begin|>
<|tool_call_begin|>functions.NAME:N<|tool_call_argument_begin|>{json}<|tool_call_end|>…
<|tool_calls_section_end|><|im_end|>`.

The id the model wrote is kept as the call's id: Kimi's templates render the history's
calls (Thinking: by that id; Instruct: by a `functions.NAME:N` it rebuilds) and the tool
results as `## Return of <id>`, so any other id would change what the next prompt shows.
The section tokens are wrappers (dropped); each call is one block. The Thinking model may
open the section before closing its thoughts: that ends the reasoning, as in vLLM.

Unlike vLLM, a call whose id is not `functions.NAME:N`, whose arguments are not a JSON
object or that never closes stays visible as content with a parse note (vLLM drops a call
it cannot split and passes the others on unchecked); arguments keep their whitespace;
output of the Thinking model that opens no `<think>` is content (vLLM: reasoning); text
after the section is content (vLLM drops it).
"""

from __future__ import annotations

import re
from functools import partial

from gateway.canonical import ToolCall
from gateway.parsers.base import ParseContext
from gateway.parsers.family import Family
from gateway.parsers.json_calls import json_object_text
from gateway.parsers.tagged import TaggedParser

SECTION_BEGIN = "<|tool_calls_section_begin|>"
SECTION_END = "<|tool_calls_section_end|>"
CALL_BEGIN = "<|tool_call_begin|>"
CALL_END = "<|tool_call_end|>"
ARGUMENT_BEGIN = "<|tool_call_argument_begin|>"

_CALL_ID = re.compile(r"(?P<name>[^\s:]+):\d+")
"""`NAME:N` after the `functions.` prefix (optional, as vLLM reads it)."""


class KimiK2Parser(TaggedParser):
    """Kimi-K2 Instruct (`thinking=False`) or Kimi-K2 Thinking (`thinking=True`)."""

    block_open = CALL_BEGIN
    block_close = CALL_END
    wrappers = (SECTION_BEGIN, SECTION_END)
    end_markers = ("<|im_end|>", "[EOS]")

    def __init__(self, name: str = "kimi-k2", *, thinking: bool = False) -> None:
        self.name = name
        self.reasoning_tags = ("<think>", "</think>") if thinking else None
        self.calls_in_reasoning = thinking

    @property
    def reasoning_enders(self) -> tuple[str, ...]:
        # The section opens before its first call: reasoning ends there, so the section
        # token lands in the content (where it is a dropped wrapper), not in the reasoning.
        enders = super().reasoning_enders
        return (*enders, SECTION_BEGIN) if self.calls_in_reasoning else enders

    def decode_block(self, body: str, ctx: ParseContext, first_index: int) -> list[ToolCall] | str:
        header, marker, arguments = body.partition(ARGUMENT_BEGIN)
        if not marker:
            return f"no {ARGUMENT_BEGIN} in the call"
        if ARGUMENT_BEGIN in arguments:
            return f"more than one {ARGUMENT_BEGIN} in the call"
        call_id = header.strip()
        match = _CALL_ID.fullmatch(call_id.removeprefix("functions."))
        if match is None:
            return f"tool call id {call_id!r} is not functions.NAME:N"
        try:
            arguments = json_object_text(arguments)
        except ValueError as exc:
            return str(exc)
        return [ToolCall(id=call_id, name=match["name"], arguments=arguments)]


FAMILIES = (
    Family(
        "kimi-k2-thinking",
        partial(KimiK2Parser, thinking=True),
        signature=(SECTION_BEGIN, "<think>"),
        vllm_tool_parsers=("kimi_k2",),
        vllm_reasoning_parsers=("kimi_k2",),
        vllm_reasoning_alone=True,
    ),
    Family("kimi-k2", KimiK2Parser, signature=(SECTION_BEGIN,), vllm_tool_parsers=("kimi_k2",)),
)
