"""What the families whose tool calls are XML-like tags with raw text values (GLM,
MiniMax) share: the call's JSON arguments from its values, each read by the request's
schema, and a block that ends at its first closing marker.

Values are raw text, not JSON: a closing marker after the first is no evidence that the
first was inside a value, so (as vLLM does) the first one ends the block rather than
`TaggedParser`'s retry at later markers, which would fold the next block into a value.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from gateway.canonical import ToolCall
from gateway.parsers.base import ParseContext
from gateway.parsers.tagged import TaggedParser
from gateway.parsers.typed_arguments import parameter_schema, typed_value


class FirstCloseParser(TaggedParser):
    """A `TaggedParser` whose block ends at the first closing marker."""

    def read_block(
        self, text: str, body_start: int, ctx: ParseContext, first_index: int
    ) -> tuple[int, list[ToolCall] | str]:
        if self.block_close is None:
            return super().read_block(text, body_start, ctx, first_index)
        close = text.find(self.block_close, body_start)
        if close < 0:
            return len(text), f"unclosed {self.block_open}"
        body = text[body_start:close]
        return close + len(self.block_close), self._checked(body, ctx, first_index)


def typed_json(ctx: ParseContext, name: str, raw: Mapping[str, str]) -> str:
    """The call's JSON arguments, each value read by its declared type; `ValueError`
    names the argument that does not fit."""
    typed: dict[str, Any] = {}
    for key, value in raw.items():
        try:
            typed[key] = typed_value(value, parameter_schema(ctx.tools, name, key))
        except ValueError as exc:
            raise ValueError(f"argument {key!r} of {name!r}: {exc}") from None
    return json.dumps(typed, ensure_ascii=False)


def skip_ws(text: str, i: int) -> int:
    """The first index at or after `i` that is not whitespace."""
    while i < len(text) and text[i].isspace():
        i += 1
    return i
