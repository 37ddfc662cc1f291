"""The Hermes / Qwen3 family: `<think>` reasoning and `<tool_call>` JSON blocks.

Qwen3, QwQ and Qwen2.5 write their tool calls this way; they differ only in whether the
generation prompt opens the reasoning block, which the Gateway reads from the prompt
itself (`ParseContext.starts_in_reasoning`).
"""

from __future__ import annotations

import json
from typing import Any

from gateway.canonical import ToolCall
from gateway.parsers.base import ParseContext, tool_call_id
from gateway.parsers.tagged import TaggedParser

_DECODER = json.JSONDecoder()


class HermesParser(TaggedParser):
    """`[<think>]reasoning</think>\\n\\ncontent<tool_call>\\n{json}\\n</tool_call>...`,
    optionally followed by an end-of-turn marker. The JSON is `{"name", "arguments"}` where
    arguments is an object or a JSON string (`parameters` is accepted for `arguments`)."""

    end_markers = ("<|im_end|>", "<|endoftext|>")

    def __init__(self, name: str = "qwen3") -> None:
        self.name = name

    def decode_block(self, body: str, ctx: ParseContext, first_index: int) -> list[ToolCall] | str:
        body = body.strip()
        try:
            obj, end = _DECODER.raw_decode(body)
        except RecursionError:
            return "JSON nested too deeply"
        except json.JSONDecodeError as exc:
            return f"invalid JSON ({exc.msg})"
        if end != len(body):
            return "unexpected text after the JSON"
        name, arguments = json_call(obj)
        return [ToolCall(id=tool_call_id(ctx.call_id, first_index), name=name, arguments=arguments)]


def json_call(obj: Any) -> tuple[str, str]:
    """(name, arguments JSON) of a `{"name", "arguments"|"parameters"}` object; raises
    `ValueError` saying what is missing. An object is re-serialised the way the chat
    templates' `tojson` prints it, so an echo re-renders identically; a JSON string is
    kept as written."""
    if not isinstance(obj, dict):
        raise ValueError("tool call JSON is not an object")
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError("tool call has no name")
    args = obj.get("arguments")
    if args is None:
        args = obj.get("parameters")
    if args is None:
        args = {}
    if isinstance(args, str):
        try:
            decoded = json.loads(args)
        except json.JSONDecodeError:
            raise ValueError(f"arguments of {name!r} are a string but not JSON") from None
        if not isinstance(decoded, dict):
            raise ValueError(f"arguments of {name!r} are not a JSON object")
        return name, args
    if isinstance(args, dict):
        return name, json.dumps(args, ensure_ascii=False)
    raise ValueError(f"arguments of {name!r} are not an object")
