"""The incremental splitter never streams what the whole-output parse would not say, and
streams text before the output is complete."""

import random
from pathlib import Path

import pytest

from gateway.canonical import ParsedOutput, ToolCall
from gateway.parsers.base import ParseContext, StreamEvent, TextDelta, ToolCallDone
from gateway.parsers.hermes import HermesParser
from gateway.parsers.stream import IncrementalDecoder, OutputStream
from gateway.prompt.incremental import load_tokenizer
from tests.unit.parsers.conformance import shown

PARSER = HermesParser()
PIECES = [
    "<think>",
    "</think>",
    "\n",
    "  ",
    "hello",
    " world",
    "<tool_call>",
    "</tool_call>",
    '{"name": "run", "arguments": {"cmd": "ls"}}',
    '{"name": "x"',
    '"</tool_call>"',
    "<|im_end|>",
    "<|endoftext|>",
    "<",
    "tool",
    "é",
    "{",
    "}",
]


def bare_close(text: str, starts_in_reasoning: bool) -> bool:
    """Reasoning closed without being opened: the one case decided only in hindsight."""
    body = PARSER.strip_end_markers(text)
    close = body.find("</think>")
    return (
        not starts_in_reasoning
        and not body.lstrip().startswith("<think>")
        and close >= 0
        and "<think>" not in body[:close]
    )


def test_streamed_fields_are_always_a_start_of_the_whole_parse() -> None:
    rng = random.Random(7)
    checked = 0
    for _ in range(6000):
        text = "".join(rng.choice(PIECES) for _ in range(rng.randint(0, 12)))
        opens = rng.random() < 0.3
        if bare_close(text, opens):
            continue
        final = PARSER.parse(text, ParseContext("c1", opens))
        splitter = PARSER.splitter(ParseContext("c1", opens))
        events: list[StreamEvent] = []
        at = 0
        while at < len(text):
            step = rng.randint(1, 5)
            events += splitter.feed(text[at : at + step])
            at += step
            view = shown(events)
            assert (final.reasoning or "").startswith(view.reasoning or ""), text
            assert (final.content or "").startswith(view.content or ""), text
            assert final.tool_calls[: len(view.tool_calls)] == view.tool_calls, text
        checked += 1
    assert checked > 4000


def test_a_typical_reply_streams_everything_but_the_end_marker() -> None:
    text = (
        '<think>\nI should look.\n</think>\n\nLet me check.\n<tool_call>\n{"name": "run", '
        '"arguments": {"cmd": "ls"}}\n</tool_call><|im_end|>'
    )
    splitter = PARSER.splitter(ParseContext("c1"))
    events: list[StreamEvent] = []
    for ch in text:
        events += splitter.feed(ch)
    assert shown(events) == PARSER.parse(text, ParseContext("c1"))
    # Text goes out in many small deltas, not at the end.
    assert sum(isinstance(e, TextDelta) and e.field == "reasoning" for e in events) > 5
    assert sum(isinstance(e, TextDelta) and e.field == "content" for e in events) > 5
    assert isinstance(events[-1], ToolCallDone)


def test_a_tool_call_goes_out_once_its_block_closes() -> None:
    splitter = PARSER.splitter(ParseContext("c9"))
    head = 'ok <tool_call>\n{"name": "run", "arguments": {"cmd": "echo </tool_call>"}}'
    events = splitter.feed(head)
    assert shown(events).tool_calls == []  # the close tag is inside a JSON string
    events += splitter.feed("\n</tool_call>")
    assert shown(events).tool_calls == [
        ToolCall(id="call_c9_0", name="run", arguments='{"cmd": "echo </tool_call>"}')
    ]


def test_a_broken_block_holds_back_the_rest() -> None:
    splitter = PARSER.splitter(ParseContext("c1"))
    events = splitter.feed('Hi <tool_call>\n{"name": oops}\n</tool_call> more text here')
    assert shown(events) == ParsedOutput(content="Hi")


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path):
    return load_tokenizer(tiny_model_dir / "tokenizer.json")


def test_decoder_releases_whole_characters_only(tokenizer) -> None:
    text = "天气 北京 é 🙂 done"
    ids = tokenizer.encode(text)
    decoder = IncrementalDecoder(tokenizer)
    pieces = [decoder.feed([token]) for token in ids]
    assert "".join(pieces) == tokenizer.decode(ids) == text
    assert all("\ufffd" not in piece for piece in pieces)


def test_output_stream_from_token_ids(tokenizer) -> None:
    text = "<think>\nplan\n</think>\n\nThe answer is 42.<|im_end|>"
    ids = tokenizer.encode(text)
    output = OutputStream(tokenizer, PARSER, ParseContext("c1"))
    events: list[StreamEvent] = []
    for token in ids:
        events += output.feed([token])
    assert shown(events) == PARSER.parse(text, ParseContext("c1"))


class WholeOnly:
    """A family with no incremental form: its parse, and no splitter."""

    name = "whole-only"
    reasoning_tags = PARSER.reasoning_tags
    end_markers = PARSER.end_markers

    def parse(self, text: str, ctx: ParseContext) -> ParsedOutput:
        return PARSER.parse(text, ctx)

    def splitter(self, ctx: ParseContext) -> None:
        return None


def test_a_family_without_a_splitter_streams_nothing_before_the_finish(tokenizer) -> None:
    ids = tokenizer.encode("The answer is 42.<|im_end|>")
    output = OutputStream(tokenizer, WholeOnly(), ParseContext("c1"))
    assert [event for token in ids for event in output.feed([token])] == []
