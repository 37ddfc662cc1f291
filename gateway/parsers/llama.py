"""The Llama 3.1 / 3.2 families: a tool call is the whole assistant message.

Llama writes no marker around a call. With custom tools it answers with the call's JSON,
`{"name": …, "parameters": {…}}` (`arguments` also seen), several calls joined by `;`,
sometimes after `<|python_tag|>`; Llama 3.2 prompted the pythonic way answers
`[f(a=1), g(b="x")]` instead (`PythonicParser`). The turn ends `<|eot_id|>`, or
`<|eom_id|>` when the model expects a tool result.

So an output is read as calls in two cases only: it starts (after whitespace) like a call
in the format (`{` with a call's keys, `[name(`), or it reaches `<|python_tag|>`, whose
text before it is content. Either way the calls run to the end of the output and must all
decode, or the whole run is content with a parse note. An output that starts like JSON
but is no call (`{"answer": 42}`, a JSON reply) is plain content without a note.

Streaming: nothing marks where such a run ends, and one stray character at its end turns
every call back into content, so the splitter holds back an output that may be a call to
the finish, where the whole parse decides: from `<|python_tag|>` on, and a whole output
starting with `{` (whether its first object has a call's keys is known only once it is
complete) or with `[name(`. Text that starts any other way streams as it arrives.
"""

from __future__ import annotations

import ast
import json
import math
import re
from typing import Any, Literal

from gateway.canonical import ParsedOutput, ToolCall
from gateway.parsers.base import ParseContext, StreamEvent, tool_call_id
from gateway.parsers.family import Family
from gateway.parsers.json_calls import json_call
from gateway.parsers.tagged import TaggedParser, TaggedSplitter

PYTHON_TAG = "<|python_tag|>"
LLAMA_END_MARKERS = ("<|eot_id|>", "<|eom_id|>", "<|end_of_text|>")

_DECODER = json.JSONDecoder()


class _WholeMessageParser(TaggedParser):
    """A format whose calls are either the whole output (starting with `opening`) or the
    text after `<|python_tag|>`; subclasses decode the run of calls."""

    reasoning_tags = None
    block_open = PYTHON_TAG
    block_close = None
    end_markers = LLAMA_END_MARKERS
    opening = "{"

    def __init__(self, name: str) -> None:
        self.name = name

    def looks_like_call(self, body: str) -> bool:
        """Whether an output starting with `opening` means to call a tool: its first item
        has a call's shape (or, cut short, starts like one). Any other such output is
        content the model meant as text (read like an output that starts otherwise)."""
        raise NotImplementedError

    def prospect(self, lead: str) -> Literal["call", "text", "open"]:
        """What a stream can tell from an output's start (`lead`, starting with `opening`):
        "text" when no output starting so looks like a call (it may stream), "open" when
        more text may tell, "call" when only the finished output can (it is held)."""
        return "call"

    def parse(self, text: str, ctx: ParseContext) -> ParsedOutput:
        body = self.strip_end_markers(text).strip()
        if not body.startswith(self.opening):
            return super().parse(text, ctx)
        if not self.looks_like_call(body):
            return super().parse(text, ctx)
        decoded = self._checked(body, ctx, 0)
        if isinstance(decoded, str):
            return ParsedOutput(content=body, parse_error=f"tool call: {decoded}")
        return ParsedOutput(tool_calls=decoded)

    def splitter(self, ctx: ParseContext) -> WholeMessageSplitter:
        return WholeMessageSplitter(self, ctx)


class WholeMessageSplitter:
    """Holds an output that starts with the format's opening character to the finish,
    unless its start already rules out a call; any other output goes to the tagged
    splitter (which holds a `<|python_tag|>` run)."""

    def __init__(self, parser: _WholeMessageParser, ctx: ParseContext) -> None:
        self.parser = parser
        self.inner = TaggedSplitter(parser, ctx)
        self.lead = ""
        self.mode: Literal["undecided", "held", "tagged"] = "undecided"

    def feed(self, text: str) -> list[StreamEvent]:
        if self.mode == "tagged":
            return self.inner.feed(text)
        if self.mode == "held":
            return []
        self.lead += text
        stripped = self.lead.lstrip()
        if not stripped:
            return []
        if stripped.startswith(self.parser.opening):
            prospect = self.parser.prospect(stripped)
            if prospect == "open":
                return []
            if prospect == "call":
                self.mode = "held"
                return []
        self.mode = "tagged"
        return self.inner.feed(self.lead)


class LlamaJsonParser(_WholeMessageParser):
    """`[<|python_tag|>]{"name": …, "parameters"|"arguments": {…}}[; {…}]…` (a trailing
    `;` is allowed, and so is whitespace alone between calls)."""

    def decode_block(self, body: str, ctx: ParseContext, first_index: int) -> list[ToolCall] | str:
        calls: list[ToolCall] = []
        pos = _skip_ws(body, 0)
        while True:
            number = len(calls) + 1
            try:
                obj, end = _DECODER.raw_decode(body, pos)
            except RecursionError:
                return f"call {number}: JSON nested too deeply"
            except json.JSONDecodeError as exc:
                return f"call {number}: invalid JSON ({exc.msg})"
            if isinstance(obj, dict) and "arguments" in obj and "parameters" in obj:
                return f"call {number} has both arguments and parameters"
            name, arguments = json_call(obj)
            index = first_index + len(calls)
            calls.append(
                ToolCall(id=tool_call_id(ctx.call_id, index), name=name, arguments=arguments)
            )
            pos = _skip_ws(body, end)
            if pos < len(body) and body[pos] == ";":
                pos = _skip_ws(body, pos + 1)
            if pos == len(body):
                return calls
            if body[pos] != "{":  # calls on their own lines, no `;`, are seen too
                return f"unexpected text after call {number}"

    def looks_like_call(self, body: str) -> bool:
        try:
            obj, _ = _DECODER.raw_decode(body)
        except (json.JSONDecodeError, RecursionError):
            # Cut short or broken: judged by how it starts.
            return _JSON_CALL_START.match(body) is not None
        return (
            isinstance(obj, dict) and "name" in obj and ("parameters" in obj or "arguments" in obj)
        )


_JSON_CALL_START = re.compile(r'\{\s*"name"\s*:')


class PythonicParser(_WholeMessageParser):
    """`[<|python_tag|>][f(a=1, b="x"), pkg.g(c=[1, 2])]`: a Python list of calls with
    keyword arguments whose values are literals (JSON's `true`/`false`/`null` too)."""

    opening = "["

    def decode_block(self, body: str, ctx: ParseContext, first_index: int) -> list[ToolCall] | str:
        try:
            tree = ast.parse(_escape_controls_in_strings(body.strip()), mode="eval")
        except (SyntaxError, MemoryError) as exc:
            return f"not a Python list of calls ({type(exc).__name__})"
        if not isinstance(tree.body, ast.List):
            return "not a list of calls"
        calls: list[ToolCall] = []
        for number, node in enumerate(tree.body.elts, 1):
            if not isinstance(node, ast.Call):
                return f"item {number} is not a call"
            name = _dotted_name(node.func)
            if name is None:
                return f"call {number} has no plain name"
            if node.args or any(kw.arg is None for kw in node.keywords):
                return f"call {number} ({name}) has positional arguments"
            try:
                args = {kw.arg: _literal(kw.value) for kw in node.keywords if kw.arg is not None}
            except ValueError as exc:
                return f"call {number} ({name}): {exc}"
            index = first_index + len(calls)
            arguments = json.dumps(args, ensure_ascii=False)
            calls.append(
                ToolCall(id=tool_call_id(ctx.call_id, index), name=name, arguments=arguments)
            )
        return calls

    def looks_like_call(self, body: str) -> bool:
        return _PYTHONIC_CALL_START.match(body) is not None

    def prospect(self, lead: str) -> Literal["call", "text", "open"]:
        if self.looks_like_call(lead):
            return "call"
        return "open" if _PYTHONIC_CALL_PREFIX.fullmatch(lead) else "text"


_PYTHONIC_CALL_START = re.compile(r"\[\s*[A-Za-z_][\w.]*\(")
_PYTHONIC_CALL_PREFIX = re.compile(r"\[\s*(?:[A-Za-z_][\w.]*)?")

_JSON_NAMES: dict[str, Any] = {"true": True, "false": False, "null": None}


def _dotted_name(node: ast.expr) -> str | None:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return ".".join(reversed(parts))


def _literal(node: ast.expr) -> Any:
    """A JSON value from a Python literal; raises `ValueError` for anything else."""
    if isinstance(node, ast.Constant):
        value = node.value
        if value is None or isinstance(value, (str, bool, int)):
            return value
        if isinstance(value, float) and math.isfinite(value):
            return value
        raise ValueError(f"{value!r} is not a JSON value")
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        return [_literal(item) for item in node.elts]
    if isinstance(node, ast.Dict):
        out: dict[str, Any] = {}
        for key, value in zip(node.keys, node.values, strict=True):
            if not (isinstance(key, ast.Constant) and isinstance(key.value, str)):
                raise ValueError("a dict key is not a string")
            out[key.value] = _literal(value)
        return out
    if isinstance(node, ast.Name) and node.id in _JSON_NAMES:
        return _JSON_NAMES[node.id]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        operand = _literal(node.operand)
        if isinstance(operand, (int, float)) and not isinstance(operand, bool):
            return -operand if isinstance(node.op, ast.USub) else operand
    raise ValueError(f"a {type(node).__name__} is not a literal")


def _escape_controls_in_strings(text: str) -> str:
    """Raw newlines and tabs inside quoted strings, escaped: models write multi-line
    string arguments literally, which Python only accepts escaped."""
    out: list[str] = []
    quote: str | None = None
    i = 0
    while i < len(text):
        char = text[i]
        if quote is not None and char == "\\" and i + 1 < len(text):
            out.append(text[i : i + 2])
            i += 2
            continue
        if char in "'\"":
            quote = char if quote is None else (None if char == quote else quote)
        elif quote is not None and char in _CONTROL_ESCAPES:
            char = _CONTROL_ESCAPES[char]
        out.append(char)
        i += 1
    return "".join(out)


_CONTROL_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _skip_ws(text: str, i: int) -> int:
    while i < len(text) and text[i] in " \t\r\n":
        i += 1
    return i


FAMILIES = (
    Family(
        "llama3.1", LlamaJsonParser, signature=(PYTHON_TAG,), vllm_tool_parsers=("llama3_json",)
    ),
    Family("llama3.2", LlamaJsonParser, signature=("<|start_header_id|>",), vllm_tool_parsers=()),
    Family("pythonic", PythonicParser, signature=(), vllm_tool_parsers=("pythonic",)),
)
