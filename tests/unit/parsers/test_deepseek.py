"""DeepSeek-V3.1 (`NAME<sep>{json}`) and the DeepSeek-R1 distills (`function<sep>NAME` and a
json fence): reasoning in `<think>` (often opened by the prompt), section tokens dropped,
arguments kept as written; malformed calls stay text; stream = whole parse; a call the real
templates render parses back to the same call."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest

from gateway.canonical import Message, ParsedOutput, Tool, ToolCall
from gateway.parsers.base import ParseContext, tool_call_id
from gateway.parsers.deepseek import DeepSeekParser
from gateway.prompt.chat_template import ChatTemplate
from tests.fixtures.real_templates import real_template_text
from tests.unit.parsers.conformance import assert_streams_like_whole

BEGIN, END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
EOS = "<｜end▁of▁sentence｜>"
CALL_ID = "c7"

V31 = DeepSeekParser("deepseek-v3.1")
R1 = DeepSeekParser("deepseek-r1-distill-qwen", fenced=True)


def v31(name: str, arguments: str) -> str:
    return f"<｜tool▁call▁begin｜>{name}<｜tool▁sep｜>{arguments}<｜tool▁call▁end｜>"


def r1(name: str, arguments: str, kind: str = "function") -> str:
    fenced = f"{name}\n```json\n{arguments}\n```"
    return f"<｜tool▁call▁begin｜>{kind}<｜tool▁sep｜>{fenced}<｜tool▁call▁end｜>"


def tc(index: int, name: str, arguments: str) -> ToolCall:
    return ToolCall(id=tool_call_id(CALL_ID, index), name=name, arguments=arguments)


@dataclass(frozen=True)
class Case:
    id: str
    parser: DeepSeekParser
    text: str
    expected: ParsedOutput
    in_reasoning: bool = False  # the generation prompt opened <think>
    error: str | None = None  # a fragment the parse note must contain
    tools: tuple[str, ...] = ()


CASES = [
    # -- V3.1 --
    Case(
        "v3.1 plain",
        V31,
        "Paris is the capital." + EOS,
        ParsedOutput(content="Paris is the capital."),
    ),
    Case(
        "v3.1 thinking: reasoning then content",
        V31,
        "The user asks for a capital.</think>Paris." + EOS,
        ParsedOutput(reasoning="The user asks for a capital.", content="Paris."),
        in_reasoning=True,
    ),
    Case(
        "v3.1 thinking cut by the token budget",
        V31,
        "Step one, then step tw",
        ParsedOutput(reasoning="Step one, then step tw"),
        in_reasoning=True,
    ),
    Case(
        "v3.1 one call",
        V31,
        BEGIN + v31("get_weather", '{"city": "Lima"}') + END + EOS,
        ParsedOutput(tool_calls=[tc(0, "get_weather", '{"city": "Lima"}')]),
    ),
    Case(
        "v3.1 content before several calls, arguments as written",
        V31,
        "Let me check both.\n\n"
        + BEGIN
        + v31("read", '{"path":"a.txt"}')
        + v31("read", '{ "path" : "b.txt", "n": [1,2] }')
        + END
        + EOS,
        ParsedOutput(
            content="Let me check both.",
            tool_calls=[
                tc(0, "read", '{"path":"a.txt"}'),
                tc(1, "read", '{ "path" : "b.txt", "n": [1,2] }'),
            ],
        ),
    ),
    Case(
        "v3.1 reasoning, content and a call",
        V31,
        "Need the file.</think>Reading." + BEGIN + v31("cat", '{"f": "x"}') + END + EOS,
        ParsedOutput(
            reasoning="Need the file.", content="Reading.", tool_calls=[tc(0, "cat", '{"f": "x"}')]
        ),
        in_reasoning=True,
    ),
    Case(
        "v3.1 a call written inside the reasoning stays reasoning",
        V31,
        "maybe " + BEGIN + v31("f", "{}") + END + "</think>No call." + EOS,
        ParsedOutput(reasoning="maybe " + BEGIN + v31("f", "{}") + END, content="No call."),
        in_reasoning=True,
    ),
    Case(
        "v3.1 no arguments, CJK name, closing token inside a JSON string",
        V31,
        BEGIN + v31("现在", "") + v31("echo", '{"s": "<｜tool▁call▁end｜>"}') + END,
        ParsedOutput(
            tool_calls=[tc(0, "现在", "{}"), tc(1, "echo", '{"s": "<｜tool▁call▁end｜>"}')]
        ),
    ),
    Case(
        "v3.1 unclosed section: the calls stand",
        V31,
        "ok" + BEGIN + v31("ping", "{}") + EOS,
        ParsedOutput(content="ok", tool_calls=[tc(0, "ping", "{}")]),
    ),
    Case(
        "v3.1 unclosed call",
        V31,
        "ok" + BEGIN + '<｜tool▁call▁begin｜>ping<｜tool▁sep｜>{"host": "h',
        ParsedOutput(content='ok<｜tool▁call▁begin｜>ping<｜tool▁sep｜>{"host": "h'),
        error="unclosed",
    ),
    Case(
        "v3.1 broken JSON is text; the next call still parses as call 0",
        V31,
        BEGIN + v31("f", '{"a": tru}') + v31("g", '{"b": 2}') + END,
        ParsedOutput(content=v31("f", '{"a": tru}'), tool_calls=[tc(0, "g", '{"b": 2}')]),
        error="block 1: arguments are not JSON",
    ),
    Case(
        "v3.1 no separator",
        V31,
        BEGIN + '<｜tool▁call▁begin｜>f{"a": 1}<｜tool▁call▁end｜>' + END,
        ParsedOutput(content='<｜tool▁call▁begin｜>f{"a": 1}<｜tool▁call▁end｜>'),
        error="no <｜tool▁sep｜>",
    ),
    Case(
        "v3.1 a name with a space",
        V31,
        BEGIN + v31("get weather", "{}") + END,
        ParsedOutput(content=v31("get weather", "{}")),
        error="tool name 'get weather'",
    ),
    Case(
        "v3.1 arguments not an object",
        V31,
        BEGIN + v31("f", '"just text"') + END,
        ParsedOutput(content=v31("f", '"just text"')),
        error="not a JSON object",
    ),
    Case(
        "v3.1 a tool the request did not declare",
        V31,
        BEGIN + v31("shutdown", "{}") + END,
        ParsedOutput(content=v31("shutdown", "{}")),
        error="unknown tool 'shutdown'",
        tools=("ls",),
    ),
    # -- R1 distill --
    Case(
        "r1 reasoning opened by the prompt, then the answer",
        R1,
        "Okay, 2 + 2 is 4.\n</think>\n\nThe answer is 4." + EOS,
        ParsedOutput(reasoning="Okay, 2 + 2 is 4.", content="The answer is 4."),
        in_reasoning=True,
    ),
    Case(
        "r1 reasoning then two calls a newline apart",
        R1,
        "I need both.\n</think>\n\n"
        + BEGIN
        + r1("get_weather", '{"city": "Rome"}')
        + "\n"
        + r1("get_time", '{"tz": "CET"}')
        + END
        + EOS,
        ParsedOutput(
            reasoning="I need both.",
            tool_calls=[
                tc(0, "get_weather", '{"city": "Rome"}'),
                tc(1, "get_time", '{"tz": "CET"}'),
            ],
        ),
        in_reasoning=True,
    ),
    Case(
        "r1 a fence inside a JSON string does not end the arguments",
        R1,
        BEGIN + r1("write", '{"md": "```py\\nx = 1\\n```"}') + END,
        ParsedOutput(tool_calls=[tc(0, "write", '{"md": "```py\\nx = 1\\n```"}')]),
    ),
    Case(
        "r1 a single call, as its template renders it (no section end)",
        R1,
        BEGIN + r1("ls", '{"dir": "."}'),
        ParsedOutput(tool_calls=[tc(0, "ls", '{"dir": "."}')]),
    ),
    Case(
        "r1 no json fence (a V3.1 body)",
        R1,
        BEGIN + v31("ls", "{}") + END,
        ParsedOutput(content=v31("ls", "{}")),
        error="no ```json block",
    ),
    Case(
        "r1 no call type",
        R1,
        BEGIN + r1("ls", "{}", kind="") + END,
        ParsedOutput(content=r1("ls", "{}", kind="")),
        error="no call type",
    ),
    Case(
        "r1 broken JSON inside the fence",
        R1,
        "Let me list." + BEGIN + r1("ls", '{"dir": }') + END + EOS,
        # R1 thinks first: text before a call it makes without closing its thoughts is
        # reasoning (its template opens none after a tool result).
        ParsedOutput(reasoning="Let me list.", content=r1("ls", '{"dir": }')),
        error="arguments are not JSON",
    ),
]


def ctx_of(case: Case) -> ParseContext:
    return ParseContext(
        CALL_ID, case.in_reasoning, {name: {"type": "object"} for name in case.tools}
    )


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
    text = "Two.</think>" + BEGIN + v31("a", "{}") + v31("b", '{"x": 1}') + END
    shown = assert_streams_like_whole(V31, text, ParseContext("s", True))
    assert [c.name for c in shown.tool_calls] == ["a", "b"]
    assert shown.reasoning == "Two."


def test_markers_and_names() -> None:
    assert (V31.name, R1.name) == ("deepseek-v3.1", "deepseek-r1-distill-qwen")
    for parser in (V31, R1):
        assert parser.reasoning_tags == ("<think>", "</think>")
        assert parser.end_markers == (EOS,)


# -- round trip through the real templates ---------------------------------------------------

TOOLS = [
    Tool(
        name="get_weather",
        parameters={"type": "object", "properties": {"city": {"type": "string"}}},
    ),
    Tool(name="get_time", parameters={"type": "object", "properties": {"tz": {"type": "string"}}}),
]
WEATHER = ("get_weather", json.dumps({"city": "Rome"}))
TIME = ("get_time", '{"tz":"CET"}')
HISTORY = [Message(role="user", content="Weather and time in Rome?")]


def chat(name: str) -> ChatTemplate:
    return ChatTemplate(
        real_template_text(name), bos_token="<｜begin▁of▁sentence｜>", eos_token=EOS
    )


def assistant(content: str | None, calls: list[tuple[str, str]]) -> Message:
    tool_calls = [ToolCall(id=f"call_{i}", name=n, arguments=a) for i, (n, a) in enumerate(calls)]
    return Message(role="assistant", content=content, tool_calls=tool_calls)


def assert_parses_back(
    parser: DeepSeekParser, text: str, content: str | None, calls: list[tuple[str, str]]
) -> None:
    ctx = ParseContext.of("rt", False, TOOLS)
    out = parser.parse(text, ctx)
    expected = [
        ToolCall(id=tool_call_id("rt", i), name=n, arguments=a) for i, (n, a) in enumerate(calls)
    ]
    assert out == ParsedOutput(content=content, tool_calls=expected)
    assert_streams_like_whole(parser, text, ctx)


@pytest.mark.parametrize("calls", [[WEATHER], [WEATHER, TIME]])
def test_v31_rendered_calls_parse_back(calls: list[tuple[str, str]]) -> None:
    template = chat("deepseek-v3.1")
    prompt = template.render(HISTORY, TOOLS, add_generation_prompt=True)
    rendered = template.render(
        [*HISTORY, assistant("On it.", calls)], TOOLS, add_generation_prompt=False
    )
    assert rendered.startswith(prompt)  # non-thinking: the prompt ends `</think>`
    assert_parses_back(V31, rendered[len(prompt) :], "On it.", calls)


@pytest.mark.parametrize("calls", [[WEATHER], [WEATHER, TIME]])
def test_r1_rendered_calls_parse_back(calls: list[tuple[str, str]]) -> None:
    # The template renders calls only when the content is None, under its own
    # `<｜Assistant｜>` (not after the generation prompt's `<think>\n`).
    template = chat("deepseek-r1-distill-qwen")
    before = template.render(HISTORY, TOOLS, add_generation_prompt=False)
    rendered = template.render(
        [*HISTORY, assistant(None, calls)], TOOLS, add_generation_prompt=False
    )
    assert rendered.startswith(before + "<｜Assistant｜>")
    assert_parses_back(R1, rendered[len(before + "<｜Assistant｜>") :], None, calls)


def test_r1_reasons_first_also_when_its_template_opened_nothing() -> None:
    """After a tool result the R1 template writes no `<think>` opener; the model still
    thinks first, and the stream must say so too (not content that becomes reasoning)."""
    text = "plan it\n</think>\n\nhello" + EOS
    whole = R1.parse(text, ParseContext("c"))
    assert whole == ParsedOutput(reasoning="plan it", content="hello")
    shown = assert_streams_like_whole(R1, text, ParseContext("c"))
    assert shown.reasoning == "plan it"
