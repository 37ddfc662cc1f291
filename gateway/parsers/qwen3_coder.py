"""The Qwen3-Coder / Qwen3.5 family: XML-like tool calls, a `<tool_call>` block per call
(a block holding several functions is several calls).

    <tool_call>
    <function=NAME>
    <parameter=KEY>
    VALUE
    </parameter>
    </function>
    </tool_call>

Qwen3.5 also reasons in `<think>…</think>`; its generation prompt opens the block, so the
output usually starts inside it, and the model may open a tool call before closing its
thoughts: the call ends the reasoning and reaches the agent (a `</think>` it writes later
is dropped from the content). Qwen3-Coder does not reason.

Every value is written as text. The chat templates render a string raw and anything else
with `tojson` (mappings, lists) or Python's `str` (`True`, `None`, `3`), each between a
newline after the opening tag and one before the closing tag. Reading a value back, those
two newlines are dropped (inner and further ones are the value's own) and the text is
typed by the tool's schema (`typed_arguments`), so a rendered call parses back to itself.
The templates print a null as `None`; where the schema admits null and not a string, that
spelling reads as null too.

The body of a block is read strictly: only whitespace may sit between the tags, every tag
must be closed, a function and each parameter must be named, each value must fit its type.
A value runs to its `</parameter>`, so tag text inside it is its own, except a tag that
starts a line: that is the model moving on without closing the parameter. Anything else
is not a call: the block stays content with a parse note, as for every family.
"""

from __future__ import annotations

import re
from functools import partial

from gateway.canonical import ToolCall
from gateway.parsers.base import ParseContext, tool_call_id
from gateway.parsers.family import Family
from gateway.parsers.tagged import TaggedParser
from gateway.parsers.typed_arguments import typed_arguments

FUNCTION_OPEN = "<function="
FUNCTION_CLOSE = "</function>"
PARAMETER_OPEN = "<parameter="
PARAMETER_CLOSE = "</parameter>"
_LINE_TAG = re.compile(r"(?:\A|\n)(?:<parameter=|<function=|</function>)")


class Qwen3CoderParser(TaggedParser):
    """`[reasoning</think>]content<tool_call>\\n<function=…>…</function>\\n</tool_call>…`,
    optionally followed by an end-of-turn marker. `reasoning=False` (Qwen3-Coder) reads no
    reasoning block at all."""

    end_markers = ("<|im_end|>", "<|endoftext|>")
    calls_in_reasoning = True

    def __init__(self, name: str = "qwen3.5", *, reasoning: bool = True) -> None:
        self.name = name
        self.reasoning_tags = ("<think>", "</think>") if reasoning else None
        # A model that called a tool from inside its reasoning may close the block after
        # the call: that closing tag is markup, not content.
        self.wrappers = ("</think>",) if reasoning else ()

    def decode_block(self, body: str, ctx: ParseContext, first_index: int) -> list[ToolCall] | str:
        calls: list[ToolCall] = []
        pos = _skip_space(body, 0)
        while pos < len(body):
            if not body.startswith(FUNCTION_OPEN, pos):
                return f"expected {FUNCTION_OPEN}NAME> but found {_excerpt(body, pos)}"
            read = _read_function(body, pos + len(FUNCTION_OPEN))
            if isinstance(read, str):
                return read
            name, parameters, pos = read
            try:
                arguments = typed_arguments(ctx.tools, name, parameters)
            except ValueError as exc:
                return f"{name}: {exc}"
            index = first_index + len(calls)
            calls.append(
                ToolCall(id=tool_call_id(ctx.call_id, index), name=name, arguments=arguments)
            )
            pos = _skip_space(body, pos)
        if not calls:
            return f"no {FUNCTION_OPEN}NAME> in the block"
        return calls


def qwen3_coder() -> Qwen3CoderParser:
    """Qwen3-Coder: XML tool calls, no reasoning."""
    return Qwen3CoderParser("qwen3-coder", reasoning=False)


def qwen3_5() -> Qwen3CoderParser:
    """Qwen3.5: XML tool calls after (or inside) `<think>` reasoning."""
    return Qwen3CoderParser("qwen3.5", reasoning=True)


def _read_function(body: str, at: int) -> tuple[str, dict[str, str], int] | str:
    """One function from just after `<function=`: (name, raw parameters, index after
    `</function>`) or why it is not one."""
    name, pos = _tag_name(body, at)
    if name is None:
        return f"unclosed {FUNCTION_OPEN} tag"
    if not name:
        return "a function without a name"
    if not _is_name(name):
        return f"malformed function name {name!r}"
    parameters: dict[str, str] = {}
    while True:
        pos = _skip_space(body, pos)
        if body.startswith(FUNCTION_CLOSE, pos):
            return name, parameters, pos + len(FUNCTION_CLOSE)
        if pos >= len(body):
            return f"unclosed {FUNCTION_OPEN}{name}>"
        if not body.startswith(PARAMETER_OPEN, pos):
            return f"unexpected text in {FUNCTION_OPEN}{name}>: {_excerpt(body, pos)}"
        key, pos = _tag_name(body, pos + len(PARAMETER_OPEN))
        if key is None:
            return f"unclosed {PARAMETER_OPEN} tag in {name}"
        if not key:
            return f"a parameter of {name} without a name"
        if not _is_name(key):
            return f"malformed parameter name {key!r} in {name}"
        close = body.find(PARAMETER_CLOSE, pos)
        if close < 0 or _LINE_TAG.search(body[pos:close]):
            # A tag opening a line inside the value: the model left the parameter open
            # and went on (a value's own tag text in mid-line is the value's).
            return f"unclosed {PARAMETER_OPEN}{key}> in {name}"
        parameters[key] = _unwrap(body[pos:close])
        pos = close + len(PARAMETER_CLOSE)


def _tag_name(body: str, at: int) -> tuple[str | None, int]:
    """The name written from `at` up to the tag's `>` (surrounding spaces dropped) and the
    index after it; None when the tag does not close."""
    end = body.find(">", at)
    if end < 0:
        return None, len(body)
    return body[at:end].strip(), end + 1


def _is_name(name: str) -> bool:
    """A name is one word: no whitespace, no tag character (a missing `>` otherwise reads
    the next tag into the name)."""
    return not any(c.isspace() or c in "<>" for c in name)


def _unwrap(value: str) -> str:
    """The value without the one newline each side that the format puts around it."""
    if value.startswith("\n"):
        value = value[1:]
    if value.endswith("\n"):
        value = value[:-1]
    return value


def _skip_space(text: str, pos: int) -> int:
    while pos < len(text) and text[pos].isspace():
        pos += 1
    return pos


def _excerpt(text: str, pos: int, width: int = 24) -> str:
    return repr(text[pos : pos + width])


FAMILIES = (
    Family(
        "qwen3.5",
        Qwen3CoderParser,
        signature=(FUNCTION_OPEN, "<think>"),
        vllm_tool_parsers=("qwen3_coder", "qwen3_xml"),
        vllm_reasoning_parsers=("qwen3",),
    ),
    Family(
        "qwen3-coder",
        partial(Qwen3CoderParser, reasoning=False),
        signature=(FUNCTION_OPEN,),
        vllm_tool_parsers=("qwen3_coder", "qwen3_xml"),
    ),
)
