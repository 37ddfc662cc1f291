"""The Hermes / Qwen3 family: `<think>` reasoning and `<tool_call>` JSON blocks.

Qwen3, QwQ and Qwen2.5 write their tool calls this way; they differ only in whether the
generation prompt opens the reasoning block, which the Gateway reads from the prompt
itself (`ParseContext.starts_in_reasoning`).
"""

from __future__ import annotations

from gateway.canonical import ToolCall
from gateway.parsers.base import ParseContext, tool_call_id
from gateway.parsers.family import Family
from gateway.parsers.json_calls import json_call, whole_json
from gateway.parsers.tagged import TaggedParser


class HermesParser(TaggedParser):
    """`[<think>]reasoning</think>\\n\\ncontent<tool_call>\\n{json}\\n</tool_call>...`,
    optionally followed by an end-of-turn marker. The JSON is `{"name", "arguments"}` where
    arguments is an object or a JSON string (`parameters` is accepted for `arguments`)."""

    end_markers = ("<|im_end|>", "<|endoftext|>")

    def __init__(self, name: str = "qwen3") -> None:
        self.name = name

    def decode_block(self, body: str, ctx: ParseContext, first_index: int) -> list[ToolCall] | str:
        name, arguments = json_call(whole_json(body))
        return [ToolCall(id=tool_call_id(ctx.call_id, first_index), name=name, arguments=arguments)]


FAMILIES = (
    Family(
        "qwq-32b",
        HermesParser,
        signature=("<|im_start|>assistant\\n<think>",),
        vllm_tool_parsers=("hermes",),
        vllm_reasoning_parsers=("deepseek_r1",),
    ),
    Family(
        "qwen3",
        HermesParser,
        signature=("<tool_call>", "<think>"),
        vllm_tool_parsers=("hermes",),
        vllm_reasoning_parsers=("qwen3",),
        vllm_reasoning_alone=True,
    ),
    Family("qwen2.5", HermesParser, signature=("<tool_call>",), vllm_tool_parsers=()),
    Family("hermes", HermesParser, signature=(), vllm_tool_parsers=("hermes",)),
)
