"""The Mistral families: tool calls after `[TOOL_CALLS]`, which has no closing marker.

- Mistral-Nemo (tokenizer before v11): `content[TOOL_CALLS][{"name": …, "arguments": {…},
  "id": …}, …]</s>`. Its chat template refuses any call id but 9 alphanumerics, so an id
  the model wrote in that shape is kept (the echo then re-renders what it sampled) and any
  other call (or a repeated id) gets one derived from the call ID (`base.alnum_call_id`).
- Ministral 3 reasoning (v13): `[THINK]reasoning[/THINK]content[TOOL_CALLS]NAME[ARGS]{json}`,
  the `[TOOL_CALLS]NAME[ARGS]{…}` part repeated per call; a call written before
  `[/THINK]` ends the reasoning. Arguments are kept as the model wrote them.

Each `[TOOL_CALLS]` opens a block that ends where the next one opens outside a JSON
string (an argument may quote the marker), or at the end of the output. So a stream sends
a call as soon as the next `[TOOL_CALLS]` arrives, and the last one at the finish (nothing
else can tell that its JSON is complete: the model might still write text after it, which
would make the block malformed). A block that does not decode is content with a parse
note; the blocks around it still count.
"""

from __future__ import annotations

import json
import re
from typing import Any

from gateway.canonical import ToolCall
from gateway.parsers.base import ParseContext, StreamEvent, ToolCallDone, alnum_call_id
from gateway.parsers.family import Family
from gateway.parsers.json_calls import whole_json
from gateway.parsers.tagged import TaggedParser, TaggedSplitter

TOOL_CALLS = "[TOOL_CALLS]"
ARGS = "[ARGS]"
MISTRAL_END_MARKERS = ("</s>",)

_DECODER = json.JSONDecoder()


class _MistralParser(TaggedParser):
    """`[TOOL_CALLS]` blocks that run to the next `[TOOL_CALLS]` outside a JSON string, or
    to the end of the output."""

    block_open = TOOL_CALLS
    block_close = None
    end_markers = MISTRAL_END_MARKERS

    def __init__(self, name: str) -> None:
        self.name = name

    def read_block(
        self, text: str, body_start: int, ctx: ParseContext, first_index: int
    ) -> tuple[int, list[ToolCall] | str]:
        end = MarkerScan(self.block_open, body_start).find(text)
        end = len(text) if end < 0 else end
        return end, self._checked(text[body_start:end], ctx, first_index)

    def splitter(self, ctx: ParseContext) -> TaggedSplitter:
        return _NextMarkerSplitter(self, ctx)


class MarkerScan:
    """Finds a marker outside JSON strings, resumably: a stream scans each character once
    (a marker inside an argument's string does not end the block)."""

    def __init__(self, marker: str, start: int) -> None:
        self.marker = marker
        self.pos = start
        self.in_string = False
        self._tokens = re.compile(r'\\.|"|' + re.escape(marker), re.DOTALL)

    def find(self, text: str) -> int:
        """Index of the marker in `text` (which only grows between calls), or -1."""
        resume = self.pos
        for match in self._tokens.finditer(text, self.pos):
            token = match.group()
            if token == '"':
                self.in_string = not self.in_string
            elif token == self.marker and not self.in_string:
                self.pos = match.start()
                return self.pos
            resume = match.end()
        # Rescan the tail next time: a marker or an escape may be cut at the end.
        self.pos = max(resume, len(text) - len(self.marker) + 1, self.pos)
        return -1


class _NextMarkerSplitter(TaggedSplitter):
    """Decides a block once the next `[TOOL_CALLS]` shows where it ends: its calls, or
    (not decoding) its text as content."""

    _scan: MarkerScan | None = None

    def _block(self, events: list[StreamEvent], rest: str) -> bool:
        p = self.parser
        body_start = self.pos + len(p.block_open)
        if self._scan is None:
            self._scan = MarkerScan(p.block_open, body_start)
        end = self._scan.find(self.text)
        if end < 0:
            return False
        self._scan = None
        decoded = p._checked(self.text[body_start:end], self.ctx, self.calls)
        if isinstance(decoded, str):
            self._emit(events, "content", self.text[self.pos : end])
        else:
            events += [ToolCallDone(call) for call in decoded]
            self.calls += len(decoded)
        self.pos, self.phase = end, "content"
        return True


class MistralNemoParser(_MistralParser):
    """`[TOOL_CALLS]` then a JSON array of `{"name", "arguments"[, "id"]}` (a lone object
    is taken as one call); `arguments` an object, a JSON string of one, or absent."""

    reasoning_tags = None

    def decode_block(self, body: str, ctx: ParseContext, first_index: int) -> list[ToolCall] | str:
        value = whole_json(body)
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
            fits = _is_mistral_id(written) and all(c.id != written for c in calls)
            call_id = written if fits else alnum_call_id(ctx.call_id, index)
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


FAMILIES = (
    Family(
        "ministral-3-reasoning",
        MinistralParser,
        signature=(TOOL_CALLS, "[THINK]"),
        vllm_tool_parsers=("mistral",),
        vllm_reasoning_parsers=("mistral",),
        vllm_reasoning_alone=True,
    ),
    Family(
        "mistral-nemo", MistralNemoParser, signature=(TOOL_CALLS,), vllm_tool_parsers=("mistral",)
    ),
)
