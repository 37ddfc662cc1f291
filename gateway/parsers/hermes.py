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
        template_signature=("<|im_start|>assistant\\n<think>",),
        vllm_parsers=(("hermes", "deepseek_r1"),),
    ),
    Family(
        "qwen3",
        HermesParser,
        template_signature=("<tool_call>", "<think>"),
        vllm_parsers=(("hermes", "qwen3"),),
        vllm_reasoning_alone=("qwen3",),
    ),
    Family("qwen2.5", HermesParser, template_signature=("<tool_call>",), vllm_parsers=()),
    Family("hermes", HermesParser, template_signature=(), vllm_parsers=(("hermes", None),)),
)
