"""The Mistral families: tool calls after `[TOOL_CALLS]`, which has no closing marker.

- Mistral-Nemo (tokenizer before v11): `content[TOOL_CALLS][{"name": …, "arguments": {…},
  "id": …}, …]</s>`. Its chat template refuses any call id but 9 alphanumerics, so an id
  the model wrote in that shape is kept (the echo then re-renders what it sampled) and any
  other call gets one derived from the call ID (`base.alnum_call_id`).
- Ministral 3 reasoning (v13): `[THINK]reasoning[/THINK]content[TOOL_CALLS]NAME[ARGS]{json}`,
  the `[TOOL_CALLS]NAME[ARGS]{…}` part repeated per call; a call written before
  `[/THINK]` ends the reasoning. Arguments are kept as the model wrote them.

Each `[TOOL_CALLS]` opens a block that ends where the next one opens or at the end of the
output. So a stream sends a call as soon as the next `[TOOL_CALLS]` arrives, and the last
one at the finish (nothing else can tell that its JSON is complete: the model might still
write text after it, which would make the block malformed). A block that does not decode
is content with a parse note; the blocks around it still count.
"""

from __future__ import annotations

import json
from typing import Any

from gateway.canonical import ToolCall
from gateway.parsers.base import ParseContext, StreamEvent, ToolCallDone, alnum_call_id
from gateway.parsers.tagged import TaggedParser, TaggedSplitter

TOOL_CALLS = "[TOOL_CALLS]"
ARGS = "[ARGS]"
MISTRAL_END_MARKERS = ("</s>",)

_DECODER = json.JSONDecoder()


class _MistralParser(TaggedParser):
    """`[TOOL_CALLS]` blocks that run to the next `[TOOL_CALLS]` or the end."""

    block_open = TOOL_CALLS
    block_close = None
    end_markers = MISTRAL_END_MARKERS

    def __init__(self, name: str) -> None:
        self.name = name

    def read_block(
        self, text: str, body_start: int, ctx: ParseContext, first_index: int
    ) -> tuple[int, list[ToolCall] | str]:
        end = text.find(self.block_open, body_start)
        end = len(text) if end < 0 else end
        return end, self._checked(text[body_start:end], ctx, first_index)

    def splitter(self, ctx: ParseContext) -> TaggedSplitter:
        return _NextOpenSplitter(self, ctx)


class _NextOpenSplitter(TaggedSplitter):
    """Decides a block once the next `[TOOL_CALLS]` shows where it ends."""

    _scanned = 0  # how far into the current block the next opener was looked for

    def _block(self, events: list[StreamEvent], rest: str) -> bool:
        p = self.parser
        start = max(len(p.block_open), self._scanned - len(p.block_open) + 1)
        self._scanned = len(rest)
        if rest.find(p.block_open, start) < 0:
            return False
        self._scanned = 0
        end, decoded = p.read_block(self.text, self.pos + len(p.block_open), self.ctx, self.calls)
        if isinstance(decoded, str):
            return False  # the rest is held back; the finish shows it as the parse does
        events += [ToolCallDone(call) for call in decoded]
        self.calls += len(decoded)
        self.pos = end
        self.phase = "content"
        return True


class MistralNemoParser(_MistralParser):
    """`[TOOL_CALLS]` then a JSON array of `{"name", "arguments"[, "id"]}` (a lone object
    is taken as one call); `arguments` an object, a JSON string of one, or absent."""

    reasoning_tags = None

    def decode_block(self, body: str, ctx: ParseContext, first_index: int) -> list[ToolCall] | str:
        body = body.strip()
        try:
            value, end = _DECODER.raw_decode(body)
        except RecursionError:
            return "JSON nested too deeply"
        except json.JSONDecodeError as exc:
            return f"invalid JSON ({exc.msg})"
        if end != len(body):
            return "unexpected text after the JSON"
        items = value if isinstance(value, list) else [value]
        calls: list[ToolCall] = []
        for number, item in enumerate(items, 1):
            if not isinstance(item, dict):
                return f"item {number} is not an object"
            name = item.get("name")
            if not isinstance(name, str) or not name:
                return f"call {number} has no name"
            arguments = _arguments_text(name, item.get("arguments"))
            index = first_index + len(calls)
            written = item.get("id")
            call_id = written if _is_mistral_id(written) else alnum_call_id(ctx.call_id, index)
            calls.append(ToolCall(id=call_id, name=name, arguments=arguments))
        return calls


class MinistralParser(_MistralParser):
    """`[THINK]…[/THINK]` reasoning; each call `[TOOL_CALLS]NAME[ARGS]{json}` (the JSON
    may be empty for no arguments; `NAME{json}` without `[ARGS]` is read too)."""

    reasoning_tags = ("[THINK]", "[/THINK]")
    calls_in_reasoning = True

    def decode_block(self, body: str, ctx: ParseContext, first_index: int) -> list[ToolCall] | str:
        at = body.find(ARGS)
        if at >= 0:
            name, raw = body[:at], body[at + len(ARGS) :].strip()
        else:
            brace = body.find("{")
            if brace < 0:
                return f"no {ARGS} after the tool name"
            name, raw = body[:brace], body[brace:].strip()
        if not name or name != name.strip() or any(c in name for c in "[]{}\"'"):
            return f"not a tool name: {name!r}"
        if not raw:
            raw = "{}"
        try:
            value, end = _DECODER.raw_decode(raw)
        except RecursionError:
            return "JSON nested too deeply"
        except json.JSONDecodeError as exc:
            return f"invalid JSON arguments ({exc.msg})"
        if end != len(raw):
            return "unexpected text after the arguments"
        if not isinstance(value, dict):
            return f"arguments of {name!r} are not a JSON object"
        _check_text(value)
        return [ToolCall(id=alnum_call_id(ctx.call_id, first_index), name=name, arguments=raw)]


def _arguments_text(name: str, args: Any) -> str:
    """An object re-serialised as the template's `tojson` prints it (so an echo renders
    the same text); a JSON string of an object kept as written; absent or null: `{}`."""
    if args is None:
        return "{}"
    if isinstance(args, dict):
        return json.dumps(args, ensure_ascii=False)
    if isinstance(args, str):
        try:
            decoded = json.loads(args)
        except json.JSONDecodeError:
            raise ValueError(f"arguments of {name!r} are a string but not JSON") from None
        if isinstance(decoded, dict):
            _check_text(decoded)
            return args
    raise ValueError(f"arguments of {name!r} are not a JSON object")


def _check_text(value: Any) -> None:
    """Raise `ValueError` when decoded JSON holds a lone surrogate (`\\ud800`): text no
    client reply or record can encode, though its escaped form looks harmless."""
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("a lone surrogate escape in the arguments") from None


def _is_mistral_id(value: Any) -> bool:
    return isinstance(value, str) and len(value) == 9 and value.isascii() and value.isalnum()
