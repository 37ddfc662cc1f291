"""Kimi-K2 (Instruct and Thinking): the model's `functions.NAME:N` ids kept, section tokens
dropped, reasoning in `<think>`; malformed calls stay text; stream = whole parse; a call
the real templates render parses back to the same call."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest

from gateway.canonical import Message, ParsedOutput, Tool, ToolCall
from gateway.parsers.base import ParseContext
from gateway.parsers.kimi_k2 import KimiK2Parser
from gateway.prompt.chat_template import ChatTemplate
from tests.fixtures.real_templates import real_template_text
from tests.unit.parsers.conformance import assert_streams_like_whole

BEGIN, END = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
IM_END = "<|im_end|>"


def call(call_id: str, arguments: str) -> str:
    return f"<|tool_call_begin|>{call_id}<|tool_call_argument_begin|>{arguments}<|tool_call_end|>"


def tc(call_id: str, arguments: str) -> ToolCall:
    name = call_id.removeprefix("functions.").rsplit(":", 1)[0]
    return ToolCall(id=call_id, name=name, arguments=arguments)


CUT_CALL = '<|tool_call_begin|>functions.read:0<|tool_call_argument_begin|>{"path": "/et'

INSTRUCT = KimiK2Parser("kimi-k2")
THINKING = KimiK2Parser("kimi-k2-thinking", thinking=True)


@dataclass(frozen=True)
class Case:
    id: str
    parser: KimiK2Parser
    text: str
    expected: ParsedOutput
    error: str | None = None  # a fragment the parse note must contain
    tools: tuple[str, ...] = ()


CASES = [
    Case("plain", INSTRUCT, "The sky is blue." + IM_END, ParsedOutput(content="The sky is blue.")),
    Case(
        "plain, thinking model without a think block",
        THINKING,
        "Sure, here it is.[EOS]",
        ParsedOutput(content="Sure, here it is."),
    ),
    Case(
        "reasoning then content",
        THINKING,
        "<think>The user greets me; greet back.</think>Hello!" + IM_END,
        ParsedOutput(reasoning="The user greets me; greet back.", content="Hello!"),
    ),
    Case(
        "reasoning cut by the token budget",
        THINKING,
        "<think>Counting: one, two, thr",
        ParsedOutput(reasoning="Counting: one, two, thr"),
    ),
    Case(
        "one call, ids as written",
        INSTRUCT,
        BEGIN + call("functions.get_weather:0", '{"city": "Oslo"}') + END + IM_END,
        ParsedOutput(tool_calls=[tc("functions.get_weather:0", '{"city": "Oslo"}')]),
    ),
    Case(
        "content before several calls, numbering continued from earlier turns",
        INSTRUCT,
        "I'll read both files.\n"
        + BEGIN
        + call("functions.read_file:3", '{"path":"a.py"}')
        + call("functions.read_file:4", '{"path": "b/c.py", "lines": [1, 20]}')
        + END
        + IM_END,
        ParsedOutput(
            content="I'll read both files.",
            tool_calls=[
                tc("functions.read_file:3", '{"path":"a.py"}'),
                tc("functions.read_file:4", '{"path": "b/c.py", "lines": [1, 20]}'),
            ],
        ),
    ),
    Case(
        "reasoning, content and a call (Thinking's usual turn)",
        THINKING,
        "<think>Need the listing first.</think>Listing it."
        + BEGIN
        + call("functions.bash:0", '{"command": "ls -la /tmp"}')
        + END
        + IM_END,
        ParsedOutput(
            reasoning="Need the listing first.",
            content="Listing it.",
            tool_calls=[tc("functions.bash:0", '{"command": "ls -la /tmp"}')],
        ),
    ),
    Case(
        "the section opens before the think block closes",
        THINKING,
        "<think>I must search. "
        + BEGIN
        + call("functions.search:0", '{"q": "kimi"}')
        + END
        + IM_END,
        ParsedOutput(
            reasoning="I must search.", tool_calls=[tc("functions.search:0", '{"q": "kimi"}')]
        ),
    ),
    Case(
        "a think tag is text for the Instruct model",
        INSTRUCT,
        "<think>not a thought</think>ok",
        ParsedOutput(content="<think>not a thought</think>ok"),
    ),
    Case(
        "id without the functions. prefix, no arguments, spaces around",
        INSTRUCT,
        BEGIN + call(" now:0 ", "  ") + END,
        ParsedOutput(tool_calls=[tc("now:0", "{}")]),
    ),
    Case(
        "CJK, and a closing token inside a JSON string",
        INSTRUCT,
        "好的。" + BEGIN + call("functions.写入:0", '{"文本": "a <|tool_call_end|> b"}') + END,
        ParsedOutput(
            content="好的。",
            tool_calls=[tc("functions.写入:0", '{"文本": "a <|tool_call_end|> b"}')],
        ),
    ),
    Case(
        "unclosed section: the calls stand",
        INSTRUCT,
        "Checking." + BEGIN + call("functions.ping:0", '{"host": "a"}') + IM_END,
        ParsedOutput(content="Checking.", tool_calls=[tc("functions.ping:0", '{"host": "a"}')]),
    ),
    Case(
        "text after the section is content",
        INSTRUCT,
        BEGIN + call("functions.ping:0", "{}") + END + "Done." + IM_END,
        ParsedOutput(content="Done.", tool_calls=[tc("functions.ping:0", "{}")]),
    ),
    Case(
        "unclosed call (cut by the token budget)",
        THINKING,
        "<think>go</think>Looking." + BEGIN + CUT_CALL,
        ParsedOutput(reasoning="go", content="Looking." + CUT_CALL),
        error="unclosed",
    ),
    Case(
        "broken JSON is text; the next call still parses",
        INSTRUCT,
        BEGIN + call("functions.f:0", '{"a": 1,}') + call("functions.g:1", '{"b": 2}') + END,
        ParsedOutput(
            content=call("functions.f:0", '{"a": 1,}'), tool_calls=[tc("functions.g:1", '{"b": 2}')]
        ),
        error="block 1: arguments are not JSON",
    ),
    Case(
        "id without :N",
        INSTRUCT,
        BEGIN + call("functions.get_weather", "{}") + END,
        ParsedOutput(content=call("functions.get_weather", "{}")),
        error="not functions.NAME:N",
    ),
    Case(
        "id without a name",
        INSTRUCT,
        BEGIN + call("functions.:2", "{}") + END,
        ParsedOutput(content=call("functions.:2", "{}")),
        error="not functions.NAME:N",
    ),
    Case(
        "no argument marker",
        INSTRUCT,
        BEGIN + '<|tool_call_begin|>functions.f:0{"a": 1}<|tool_call_end|>' + END,
        ParsedOutput(content='<|tool_call_begin|>functions.f:0{"a": 1}<|tool_call_end|>'),
        error="no <|tool_call_argument_begin|>",
    ),
    Case(
        "arguments not an object",
        INSTRUCT,
        BEGIN + call("functions.f:0", "[1, 2]") + END,
        ParsedOutput(content=call("functions.f:0", "[1, 2]")),
        error="not a JSON object",
    ),
    Case(
        "a tool the request did not declare",
        INSTRUCT,
        BEGIN + call("functions.rm_rf:0", "{}") + call("functions.ls:1", "{}") + END,
        ParsedOutput(
            content=call("functions.rm_rf:0", "{}"), tool_calls=[tc("functions.ls:1", "{}")]
        ),
        error="unknown tool 'rm_rf'",
        tools=("ls",),
    ),
]


def ctx_of(case: Case) -> ParseContext:
    return ParseContext("c1", tools={name: {"type": "object"} for name in case.tools})


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_whole_parse(case: Case) -> None:
    out = case.parser.parse(case.text, ctx_of(case))
    assert out.model_copy(update={"parse_error": None}) == case.expected
    if case.error is None:
        assert out.parse_error is None
    else:
        assert out.parse_error is not None and case.error in out.parse_error


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_stream_equals_whole_for_every_chunking(case: Case) -> None:
    assert_streams_like_whole(case.parser, case.text, ctx_of(case))


def test_calls_stream_before_the_finish() -> None:
    text = (
        "<think>r</think>x"
        + BEGIN
        + call("functions.a:0", "{}")
        + call("functions.b:1", "{}")
        + END
    )
    shown = assert_streams_like_whole(THINKING, text, ParseContext("c"))
    assert [c.id for c in shown.tool_calls] == ["functions.a:0", "functions.b:1"]
    assert shown.reasoning == "r" and shown.content == "x"


def test_markers_and_names() -> None:
    assert INSTRUCT.name == "kimi-k2" and INSTRUCT.reasoning_tags is None
    assert THINKING.name == "kimi-k2-thinking"
    assert THINKING.reasoning_tags == ("<think>", "</think>")
    assert "<|im_end|>" in INSTRUCT.end_markers


# -- round trip through the real templates ---------------------------------------------------

TOOLS = [
    Tool(
        name="get_weather",
        parameters={"type": "object", "properties": {"city": {"type": "string"}}},
    ),
    Tool(name="get_time", parameters={"type": "object", "properties": {"tz": {"type": "string"}}}),
]
# The model's own ids, and arguments as the templates' `tojson` prints them.
CALLS = [
    ToolCall(
        id="functions.get_weather:0", name="get_weather", arguments=json.dumps({"city": "Oslo"})
    ),
    ToolCall(id="functions.get_time:1", name="get_time", arguments=json.dumps({"tz": "CET"})),
]


@pytest.mark.parametrize(
    ("template", "parser", "reasoning"),
    [("kimi-k2", INSTRUCT, None), ("kimi-k2-thinking", THINKING, "Two lookups.")],
)
def test_a_rendered_call_parses_back_to_the_same_call(
    template: str, parser: KimiK2Parser, reasoning: str | None
) -> None:
    chat = ChatTemplate(real_template_text(template), bos_token=None, eos_token=IM_END)
    history = [Message(role="user", content="Weather and time in Oslo?")]
    reply = Message(role="assistant", content="Looking.", reasoning=reasoning, tool_calls=CALLS)
    prompt = chat.render(history, TOOLS, add_generation_prompt=True)
    rendered = chat.render([*history, reply], TOOLS, add_generation_prompt=False)
    assert rendered.startswith(prompt)
    assistant_text = rendered[len(prompt) :]

    ctx = ParseContext.of("c9", False, TOOLS)
    out = parser.parse(assistant_text, ctx)
    assert out == ParsedOutput(reasoning=reasoning, content="Looking.", tool_calls=CALLS)
    assert_streams_like_whole(parser, assistant_text, ctx)
