"""The gpt-oss family: OpenAI's harmony format, parsed whole or while the tokens arrive.

After the generation prompt `<|start|>assistant` the model writes one or more messages,
each a header, `<|message|>`, a body and a terminator (`<|end|>`, `<|call|>`, `<|return|>`):

    <|channel|>analysis<|message|>thinking<|end|>
    <|start|>assistant<|channel|>commentary to=functions.F <|constrain|>json<|message|>{…}<|call|>
    <|start|>assistant<|channel|>final<|message|>answer<|return|>

The header holds the channel, optionally a recipient (`to=…`, before or after the channel)
and a content type (`<|constrain|>json`, or a bare `json` as the chat template writes it).
A message to `functions.F` is a tool call whose body is its JSON arguments, kept as
written; otherwise `analysis` is reasoning and `final` or recipient-less `commentary`
(a preamble) is content. Messages of one field are joined by a newline; bodies are kept
as written (the template renders them back verbatim).

Why not `TaggedParser`: harmony has no reasoning tags or tool-call blocks to look for.
What a body is depends on the header before it, and the same terminators close every kind
of message. So this module is one small state machine over the decoded text (the Gateway
keeps the special tokens when it detokenizes), and the whole parse is that machine fed the
whole text and then finished: streamed and whole agree by construction.

Held back while streaming: a header until its `<|message|>` (it decides what the body
is), a body's tail that may be the start of a terminator, and a tool call's body until its
terminator (the arguments must parse as a whole). A tool call cut off by the token limit
is decided only at the finish: complete JSON is a call, anything else is content.

Malformed messages never raise and are never dropped: a header without `<|message|>`, an
unknown or missing channel, a message to a recipient that is not a function (a built-in
tool such as `python`), a role other than the assistant, or arguments that are not a JSON
object come back as content, spelled as sampled, with `parse_error` saying why.

Where vLLM (its harmony parser over `openai_harmony`) differs, on purpose: it re-serialises
arguments (`json.dumps(json.loads(…))`) and passes broken ones on as a call, where we keep
them as written or answer with content; it silently drops messages to built-in tools,
unknown channels and other roles; harmony reads a lone bare header word as a recipient
(so `commentary json` would call a function named `json`), where we read it as the
content type; and its stream joins messages without the newline its whole parse puts
between them. We parse the decoded text, not token ids: `openai_harmony` loads its
encoding over the network.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

from gateway import json_text
from gateway.canonical import ParsedOutput, ToolCall
from gateway.parsers.base import ParseContext, StreamEvent, TextDelta, ToolCallDone, tool_call_id
from gateway.parsers.family import Family

START = "<|start|>"
MESSAGE = "<|message|>"
CHANNEL = "<|channel|>"
CONSTRAIN = "<|constrain|>"
END = "<|end|>"
CALL = "<|call|>"
RETURN = "<|return|>"
END_OF_TEXT = "<|endoftext|>"

END_MARKERS = (CALL, RETURN, END_OF_TEXT)
"""What ends a gpt-oss turn: `<|call|>` after a tool call, `<|return|>` after the final
answer, `<|endoftext|>` as the tokenizer's own end of sequence."""

_TERMINATORS = (END, CALL, RETURN, END_OF_TEXT)

_ASSISTANT = "assistant"
_FUNCTIONS = "functions."
_BUILTIN_TOOLS = frozenset({"python", "browser", "container"})
"""Harmony's built-in tool namespaces: addressed by the model, never a client's function."""

_EMPTY_HEADER = re.compile(rf"\s*(?:{re.escape(START)}\s*(?:{_ASSISTANT})?)?\s*")
"""A header cut off before it said anything: dropped at the finish, not content."""

Field = Literal["reasoning", "content"]
Kind = Literal["reasoning", "content", "tool", "bad"]


@dataclass
class _Message:
    """The message whose body is being read."""

    kind: Kind
    raw: str
    """Its header as sampled (from `<|start|>` through `<|message|>`): content if it fails."""
    ordinal: int
    name: str = ""
    error: str = ""
    body: list[str] = field(default_factory=list)
    wrote: bool = False
    """Whether this message has put text into its field (the next one is joined by a newline)."""


class HarmonyParser:
    """gpt-oss output (see the module docstring). vLLM names: tool parser `openai`,
    reasoning parser `openai_gptoss`."""

    reasoning_tags: tuple[str, str] | None = None
    """The generation prompt opens no reasoning block: the channel is in each header."""

    end_markers: tuple[str, ...] = END_MARKERS

    def __init__(self, name: str = "gpt-oss") -> None:
        self.name = name

    def parse(self, text: str, ctx: ParseContext) -> ParsedOutput:
        machine = _Machine(ctx, self._terminators())
        machine.feed(text)
        return machine.finish()

    def splitter(self, ctx: ParseContext) -> HarmonySplitter:
        return HarmonySplitter(_Machine(ctx, self._terminators()))

    def _terminators(self) -> tuple[str, ...]:
        """What closes a message: harmony's own markers and any end-of-turn marker the
        served model adds (its generation config's stop tokens)."""
        return tuple(dict.fromkeys((*_TERMINATORS, *(m for m in self.end_markers if m))))


class HarmonySplitter:
    """The incremental form of `HarmonyParser.parse`: decoded text in, stream events out."""

    def __init__(self, machine: _Machine) -> None:
        self._machine = machine

    def feed(self, text: str) -> list[StreamEvent]:
        return self._machine.feed(text)


class _Machine:
    """Reads messages off the text as far as is certain; `finish` settles the rest."""

    def __init__(self, ctx: ParseContext, terminators: tuple[str, ...]) -> None:
        self.ctx = ctx
        # `<|start|>` inside a body: the model began a new message without closing the last.
        # Longest first: of two markers found at one index, the longer one is meant.
        by_length = sorted(terminators, key=len, reverse=True)
        self.body_stops = (*by_length, START)
        self.header_stops = (MESSAGE, *by_length, START)
        self.longest = max(len(m) for m in self.header_stops)
        self.heads = frozenset(m[0] for m in self.body_stops)
        self.buf = ""  # text not yet consumed
        self.scan = 0  # a header's stop markers cannot start before this index of `buf`
        self.ordinal = 0
        self.msg: _Message | None = None  # None: reading a header
        self.fields: dict[Field, list[str]] = {"reasoning": [], "content": []}
        self.calls: list[ToolCall] = []
        self.errors: list[str] = []
        self._events: list[StreamEvent] = []
        if ctx.starts_in_reasoning:
            self.ordinal = 1
            self.msg = _Message("reasoning", "", 1)

    def feed(self, text: str) -> list[StreamEvent]:
        self.buf += text
        while self._header() if self.msg is None else self._body():
            pass
        events, self._events = self._events, []
        return events

    def finish(self) -> ParsedOutput:
        """The text is complete: what is still held is settled (a cut-off header is
        content unless it said nothing; a cut-off body ends its message)."""
        rest, self.buf = self.buf, ""
        if self.msg is None:
            if not _EMPTY_HEADER.fullmatch(rest):
                self.ordinal += 1
                self._bad_text(rest, f"message {self.ordinal}: header cut off before {MESSAGE}")
        else:
            self._take(rest)
            self._close(cut=True)
        reasoning = "".join(self.fields["reasoning"])
        content = "".join(self.fields["content"])
        return ParsedOutput(
            reasoning=reasoning or None,
            content=content or None,
            tool_calls=self.calls,
            parse_error="; ".join(self.errors) if self.errors else None,
        )

    # -- headers --------------------------------------------------------------------

    def _header(self) -> bool:
        """Read a header up to its `<|message|>`; True when one ended (step again)."""
        buf = self.buf
        if not buf or (len(buf) < len(START) and START.startswith(buf)):
            return False
        lo = max(self.scan, len(START) if buf.startswith(START) else 0)
        at, stop = _earliest(buf, self.header_stops, lo)
        if stop is None:
            self.scan = max(lo, len(buf) - self.longest + 1)
            return False
        header = buf[:at]
        self.scan = 0
        if stop != MESSAGE:
            # No `<|message|>` before a terminator or the next `<|start|>`: not a message.
            self.buf = buf[at + (0 if stop == START else len(stop)) :]
            if header.strip():
                self.ordinal += 1
                self._bad_text(header, f"message {self.ordinal}: header without {MESSAGE}")
            return True
        self.buf = buf[at + len(MESSAGE) :]
        self.ordinal += 1
        self.msg = self._open(header + MESSAGE, header)
        return True

    def _open(self, raw: str, header: str) -> _Message:
        """The message a complete header announces."""
        n = self.ordinal
        read = _read_header(header)
        if isinstance(read, str):
            msg = _Message("bad", raw, n, error=f"message {n}: {read}")
        else:
            channel, recipient = read
            msg = self._classify(raw, n, channel, recipient)
        if msg.kind == "bad":
            self._write("content", raw, msg)
        return msg

    def _classify(self, raw: str, n: int, channel: str | None, recipient: str | None) -> _Message:
        if recipient is not None:
            name = _function_name(recipient)
            if name is None:
                return _Message(
                    "bad", raw, n, error=f"message {n}: to {recipient!r}, not a function"
                )
            return _Message("tool", raw, n, name=name)
        if channel == "analysis":
            return _Message("reasoning", raw, n)
        if channel in ("final", "commentary"):
            return _Message("content", raw, n)
        if channel is None:
            return _Message("bad", raw, n, error=f"message {n}: no channel")
        return _Message("bad", raw, n, error=f"message {n}: unknown channel {channel!r}")

    # -- bodies ---------------------------------------------------------------------

    def _body(self) -> bool:
        """Read the body as far as is certain; True when its message ended (step again)."""
        buf = self.buf
        at, stop = _earliest(buf, self.body_stops, 0)
        if stop is None:
            safe = len(buf) - _held(buf, self.body_stops, self.heads, self.longest)
            self._take(buf[:safe])
            self.buf = buf[safe:]
            return False
        self._take(buf[:at])
        self.buf = buf[at + (0 if stop == START else len(stop)) :]
        self._close(cut=False)
        return True

    def _take(self, text: str) -> None:
        msg = self.msg
        assert msg is not None
        if not text:
            return
        if msg.kind == "tool":
            msg.body.append(text)
        else:
            self._write("content" if msg.kind == "bad" else msg.kind, text, msg)

    def _close(self, *, cut: bool) -> None:
        """End the current message (`cut`: by the end of the text, not a terminator)."""
        msg = self.msg
        assert msg is not None
        self.msg = None
        if msg.kind == "bad":
            self.errors.append(msg.error)
        if msg.kind != "tool":
            return
        body = "".join(msg.body)
        arguments, problem = _arguments(body)
        if problem is None and self.ctx.tools and msg.name not in self.ctx.tools:
            problem = f"unknown tool {msg.name!r}"
        if problem is not None or arguments is None:
            where = "cut off, " if cut else ""
            self._bad_text(msg.raw + body, f"message {msg.ordinal}: tool call {where}{problem}")
            return
        call = ToolCall(
            id=tool_call_id(self.ctx.call_id, len(self.calls)), name=msg.name, arguments=arguments
        )
        self.calls.append(call)
        self._events.append(ToolCallDone(call))

    # -- output ---------------------------------------------------------------------

    def _bad_text(self, text: str, error: str) -> None:
        """A malformed message: its text, as sampled, becomes content."""
        self._write("content", text, _Message("bad", "", 0))
        self.errors.append(error)

    def _write(self, name: Field, text: str, msg: _Message) -> None:
        if not text:
            return
        parts = self.fields[name]
        piece = "\n" + text if parts and not msg.wrote else text
        msg.wrote = True
        parts.append(piece)
        self._events.append(TextDelta(name, piece))


def _read_header(header: str) -> tuple[str | None, str | None] | str:
    """(channel, recipient) of a header, or what is wrong with it.

    Words are split on whitespace once the channel is cut out: `to=X` is the recipient,
    `<|constrain|>X` or one bare word the content type (not needed: arguments are read as
    JSON whatever it says), and after `<|start|>` the first word is the author's role (the
    first header's role is the prompt's; a leading `assistant` there is dropped)."""
    text = header
    opened = text.startswith(START)
    if opened:
        text = text[len(START) :]
    channel = None
    at = text.find(CHANNEL)
    if at >= 0:
        after = text[at + len(CHANNEL) :]
        end = next((i for i, c in enumerate(after) if c.isspace() or c == "<"), len(after))
        channel = after[:end]
        if not channel:
            return f"empty channel in header {header!r}"
        text = text[:at] + " " + after[end:]
    words = text.replace(CONSTRAIN, " " + CONSTRAIN).split()
    if words and not words[0].startswith(("to=", "<|")):
        if words[0] == _ASSISTANT:
            words.pop(0)
        elif opened:
            return f"a message from {words[0]!r}, not from the assistant"
    recipient = None
    content_type = None
    for word in words:
        if word.startswith("to="):
            if recipient is not None:
                return f"two recipients in header {header!r}"
            recipient = word[3:]
        elif word.startswith(CONSTRAIN) and content_type is None:
            content_type = word[len(CONSTRAIN) :]
        elif content_type is None and "<|" not in word:
            content_type = word
        else:
            return f"unexpected {word!r} in header {header!r}"
    return channel, recipient


def _function_name(recipient: str) -> str | None:
    """The function a recipient names: `functions.NAME`, or a bare name as vLLM's chat
    path accepts it; None for a built-in tool, the assistant itself or an empty name."""
    if recipient.startswith(_FUNCTIONS):
        return recipient[len(_FUNCTIONS) :] or None
    if not recipient or recipient == _ASSISTANT or recipient.startswith("<|"):
        return None
    if recipient.split(".", 1)[0] in _BUILTIN_TOOLS:
        return None
    return recipient


def _arguments(body: str) -> tuple[str | None, str | None]:
    """(arguments as written, without surrounding whitespace) or (None, the problem).
    An empty body is a call without arguments."""
    text = body.strip()
    if not text:
        return "{}", None
    try:
        value = json_text.loads(text, allow_nan=True)
    except ValueError as exc:
        return None, f"arguments are not JSON ({_short(exc)})"
    if not isinstance(value, dict):
        return None, "arguments are not a JSON object"
    return text, None


def _short(exc: ValueError) -> str:
    return str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__


def _earliest(text: str, markers: tuple[str, ...], start: int) -> tuple[int, str | None]:
    """The first marker at or after `start` (at one index, the first listed)."""
    best, found = len(text), None
    for marker in markers:
        at = text.find(marker, start, best + len(marker))
        if 0 <= at < best:
            best, found = at, marker
    return best, found


def _held(text: str, markers: tuple[str, ...], heads: frozenset[str], longest: int) -> int:
    """Length of the longest tail of `text` that may be the start of a marker (`heads`:
    the markers' first characters, to skip the rest cheaply)."""
    for at in range(max(0, len(text) - longest + 1), len(text)):
        if text[at] in heads and any(m.startswith(text[at:]) for m in markers):
            return len(text) - at
    return 0


FAMILIES = (
    Family(
        "gpt-oss",
        HarmonyParser,
        signature=("<|channel|>",),
        vllm_tool_parsers=("openai",),
        vllm_reasoning_parsers=(None, "openai_gptoss"),
        vllm_reasoning_alone=True,
    ),
)
