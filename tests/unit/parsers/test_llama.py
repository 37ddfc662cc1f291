"""Llama 3.1/3.2 output: the whole message is the call (JSON or pythonic), or content."""

from __future__ import annotations

import json
from datetime import datetime

import pytest

from gateway.canonical import Message, ParsedOutput, Tool, ToolCall
from gateway.parsers.base import ParseContext, tool_call_id
from gateway.parsers.llama import LlamaJsonParser, PythonicParser
from gateway.prompt.chat_template import ChatTemplate
from tests.fixtures.real_templates import real_template_text
from tests.unit.parsers.conformance import assert_streams_like_whole

WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}}
TOOLS = {"get_weather": WEATHER, "search": {"type": "object"}}


@pytest.fixture
def llama() -> LlamaJsonParser:
    return LlamaJsonParser("llama3.1")


@pytest.fixture
def pythonic() -> PythonicParser:
    return PythonicParser("pythonic")


def ctx(call_id: str = "c1", tools: dict[str, object] | None = None) -> ParseContext:
    return ParseContext(call_id, tools=TOOLS if tools is None else tools)  # type: ignore[arg-type]


def as_calls(out: ParsedOutput) -> list[tuple[str, object]]:
    return [(c.name, json.loads(c.arguments)) for c in out.tool_calls]


# -- JSON ----------------------------------------------------------------------------------


def test_plain_answer_with_either_end_marker(llama: LlamaJsonParser) -> None:
    for end in ("<|eot_id|>", "<|eom_id|>", "<|eot_id|><|end_of_text|>", ""):
        out = llama.parse("Paris is sunny today.\n" + end, ctx())
        assert out == ParsedOutput(content="Paris is sunny today.")


def test_one_call_with_parameters(llama: LlamaJsonParser) -> None:
    text = '{"name": "get_weather", "parameters": {"city": "Paris"}}<|eot_id|>'
    out = llama.parse(text, ctx("k"))
    assert out.content is None and out.parse_error is None and out.reasoning is None
    assert out.tool_calls == [
        ToolCall(id=tool_call_id("k", 0), name="get_weather", arguments='{"city": "Paris"}')
    ]


def test_arguments_key_is_read_like_parameters(llama: LlamaJsonParser) -> None:
    a = llama.parse('{"name": "get_weather", "arguments": {"city": "Oslo"}}', ctx())
    p = llama.parse('{"name": "get_weather", "parameters": {"city": "Oslo"}}', ctx())
    assert a == p and as_calls(a) == [("get_weather", {"city": "Oslo"})]


def test_python_tag_before_the_call(llama: LlamaJsonParser) -> None:
    out = llama.parse(
        '<|python_tag|>{"name": "search", "parameters": {"q": "llamas"}}<|eom_id|>', ctx()
    )
    assert out.content is None and as_calls(out) == [("search", {"q": "llamas"})]


def test_text_before_python_tag_is_content(llama: LlamaJsonParser) -> None:
    text = 'Let me look that up.\n<|python_tag|>{"name": "search", "parameters": {"q": "x"}}'
    out = llama.parse(text, ctx())
    assert out.content == "Let me look that up."
    assert as_calls(out) == [("search", {"q": "x"})] and out.parse_error is None


def test_several_calls_joined_by_semicolons(llama: LlamaJsonParser) -> None:
    text = (
        '{"name": "get_weather", "parameters": {"city": "Rome"}}; '
        '{"name": "get_weather", "arguments": {"city": "Lima"}};\n'
        '{"name": "search", "parameters": {}};<|eot_id|>'
    )
    out = llama.parse(text, ctx("m"))
    assert as_calls(out) == [
        ("get_weather", {"city": "Rome"}),
        ("get_weather", {"city": "Lima"}),
        ("search", {}),
    ]
    assert [c.id for c in out.tool_calls] == [tool_call_id("m", i) for i in range(3)]
    assert out.content is None and out.parse_error is None


def test_calls_on_separate_lines_without_semicolons(llama: LlamaJsonParser) -> None:
    text = '{"name": "search", "parameters": {"q": 1}}\n{"name": "search", "parameters": {}}'
    assert as_calls(llama.parse(text, ctx())) == [("search", {"q": 1}), ("search", {})]


def test_unknown_keys_beside_the_call_are_ignored(llama: LlamaJsonParser) -> None:
    text = '{"type": "function", "name": "search", "parameters": {"q": "a"}, "note": 1}'
    assert as_calls(llama.parse(text, ctx())) == [("search", {"q": "a"})]


def test_arguments_written_as_a_json_string_are_kept(llama: LlamaJsonParser) -> None:
    raw = '{"city":  "Kyiv"}'
    out = llama.parse(json.dumps({"name": "get_weather", "parameters": raw}), ctx())
    assert out.tool_calls[0].arguments == raw


def test_non_ascii_arguments_stay_literal(llama: LlamaJsonParser) -> None:
    text = '{"name": "get_weather", "parameters": {"city": "\\u4e1c\\u4eac"}}'
    assert llama.parse(text, ctx()).tool_calls[0].arguments == '{"city": "东京"}'


@pytest.mark.parametrize(
    "text",
    [
        '{"answer": 42}',
        '{"name": "Ada Lovelace", "born": 1815}',
        '{"name": "get_weather"}',  # no arguments at all: a record, not a call
        "[1, 2, 3]",
        '{"answer": 42} and some words',
        "{not json at all",
    ],
)
def test_json_that_is_not_a_call_is_content_without_a_note(
    llama: LlamaJsonParser, text: str
) -> None:
    assert llama.parse(text + "<|eot_id|>", ctx()) == ParsedOutput(content=text)


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ('{"name": "get_weather", "parameters": {"city":', "invalid JSON"),
        ('{"name": "get_weather", "parameters": {"city": "Rome"}} Done.', "unexpected text"),
        (
            '{"name": "search", "parameters": {}}; {"name": "search", "parameters": {"q": }}',
            "call 2: invalid JSON",
        ),
        ('{"name": "search", "parameters": {}}; 42', "unexpected text after call 1"),
        ('{"name": "search", "parameters": {}, "arguments": {}}', "both"),
        ('{"name": "search", "parameters": [1]}', "not an object"),
        ('{"name": "rm_rf", "parameters": {}}', "unknown tool 'rm_rf'"),
        ('<|python_tag|>{"name": "search", "parameters": {"q": 1}', "invalid JSON"),
        ("<|python_tag|>print(1 + 1)", "invalid JSON"),
        ('<|python_tag|>{"parameters": {}}', "no name"),
        ('<|python_tag|>{"name": "search", "parameters": "{oops"}', "not JSON"),
    ],
)
def test_malformed_calls_are_content_with_a_note(
    llama: LlamaJsonParser, text: str, reason: str
) -> None:
    out = llama.parse(text + "<|eot_id|>", ctx())
    assert out.tool_calls == [] and out.content == text
    assert out.parse_error is not None and reason in out.parse_error


def test_any_tool_name_when_the_request_declared_none(llama: LlamaJsonParser) -> None:
    out = llama.parse('{"name": "anything", "parameters": {}}', ctx(tools={}))
    assert as_calls(out) == [("anything", {})]


def test_a_call_with_no_arguments_after_the_python_tag(llama: LlamaJsonParser) -> None:
    # The tag says a call is meant, so the missing arguments are an empty object.
    out = llama.parse('<|python_tag|>{"name": "search"}', ctx())
    assert as_calls(out) == [("search", {})]


def test_empty_output(llama: LlamaJsonParser) -> None:
    assert llama.parse("", ctx()) == ParsedOutput()
    assert llama.parse("  <|eot_id|>", ctx()) == ParsedOutput()


# -- pythonic ------------------------------------------------------------------------------


def test_pythonic_calls(pythonic: PythonicParser) -> None:
    text = (
        "[get_weather(city='Paris'), search(q=\"two\\nlines\", n=-3, exact=True, "
        "tags=('a', 'b'), opts={'deep': null, 'k': [1.5, false]})]<|eot_id|>"
    )
    out = pythonic.parse(text, ctx("p"))
    assert out.content is None and out.parse_error is None
    assert as_calls(out) == [
        ("get_weather", {"city": "Paris"}),
        (
            "search",
            {
                "q": "two\nlines",
                "n": -3,
                "exact": True,
                "tags": ["a", "b"],
                "opts": {"deep": None, "k": [1.5, False]},
            },
        ),
    ]
    assert [c.id for c in out.tool_calls] == [tool_call_id("p", 0), tool_call_id("p", 1)]


def test_pythonic_literal_newline_inside_a_string(pythonic: PythonicParser) -> None:
    out = pythonic.parse("[search(q='line one\nline two\ttab')]", ctx())
    assert as_calls(out) == [("search", {"q": "line one\nline two\ttab"})]


def test_pythonic_dotted_name_and_python_tag(pythonic: PythonicParser) -> None:
    out = pythonic.parse("Checking.<|python_tag|>[pkg.tool(x=1)]", ctx(tools={}))
    assert out.content == "Checking." and as_calls(out) == [("pkg.tool", {"x": 1})]


@pytest.mark.parametrize("text", ["[1, 2]", "[see the docs](https://x.y)", "[]", "['a']"])
def test_pythonic_lists_that_are_not_calls_are_content(pythonic: PythonicParser, text: str) -> None:
    assert pythonic.parse(text, ctx()) == ParsedOutput(content=text)


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("[search('positional')]", "positional"),
        ("[search(**kw)]", "positional"),
        ("[search(q=some_variable)]", "not a literal"),
        ("[search(q=1 + 2)]", "not a literal"),
        ("[search(q=float('nan'))]", "not a literal"),
        ("[search(q={1: 'a'})]", "key is not a string"),
        ("[search(q='a'), 3]", "item 2 is not a call"),
        ("[search(q='unclosed)]", "not a Python list"),
        ("[search(q='x')", "not a Python list"),
        ("[nope(q=1)]", "unknown tool 'nope'"),
        ("[search(q=1e999)]", "not a JSON value"),
    ],
)
def test_pythonic_malformed(pythonic: PythonicParser, text: str, reason: str) -> None:
    out = pythonic.parse(text, ctx())
    assert out.tool_calls == [] and out.content == text
    assert out.parse_error is not None and reason in out.parse_error


# -- streaming -----------------------------------------------------------------------------

JSON_TEXTS = [
    "Paris is sunny today.<|eot_id|>",
    "  \n Two\n\nparagraphs  here. <|eot_id|>",
    '{"name": "get_weather", "parameters": {"city": "Paris"}}<|eot_id|>',
    '  {"name": "get_weather", "parameters": {"city": "Paris"}}; '
    '{"name": "search", "arguments": {"q": "}; {"}}<|eom_id|>',
    '<|python_tag|>{"name": "search", "parameters": {"q": "<|python_tag|>"}}<|eom_id|>',
    'I will search.<|python_tag|>{"name": "search", "parameters": {}}',
    '{"answer": 42}<|eot_id|>',
    '{"answer": 42}<|python_tag|>{"name": "search", "parameters": {}}<|eom_id|>',
    '{"name": "get_weather", "parameters": {"city": "Rome"}} Done.<|eot_id|>',
    "<|python_tag|>print(1)<|eom_id|>",
    "Use <|python_ta and more text",
    "",
]


@pytest.mark.parametrize("text", JSON_TEXTS)
def test_llama_streams_like_whole(llama: LlamaJsonParser, text: str) -> None:
    assert_streams_like_whole(llama, text, ctx())


PYTHONIC_TEXTS = [
    "[get_weather(city='Paris'), search(q='x; y')]<|eot_id|>",
    "[see the docs](https://x.y) for more.<|eot_id|>",
    " [ search.v2 (q=1)]",
    "[1, 2]<|python_tag|>[search(q='a')]<|eom_id|>",
    "[<|eot_id|>",
    "Sure.<|python_tag|>[search(q='a')]",
    "[search(q='x')",
    "Plain words.",
]


@pytest.mark.parametrize("text", PYTHONIC_TEXTS)
def test_pythonic_streams_like_whole(pythonic: PythonicParser, text: str) -> None:
    assert_streams_like_whole(pythonic, text, ctx())


def test_plain_text_streams_before_the_finish(
    llama: LlamaJsonParser, pythonic: PythonicParser
) -> None:
    shown = assert_streams_like_whole(llama, "The answer is 4, not 5.<|eot_id|>", ctx())
    assert shown.content == "The answer is 4, not 5."
    # A bracket that cannot open a call any more streams too.
    text = "[the docs](https://x.y) say so.<|eot_id|>"
    assert assert_streams_like_whole(pythonic, text, ctx()).content == text[:-10]


def test_content_that_is_no_call_before_python_tag(
    llama: LlamaJsonParser, pythonic: PythonicParser
) -> None:
    out = llama.parse('{"answer": 42}<|python_tag|>{"name": "search", "parameters": {}}', ctx())
    assert out.content == '{"answer": 42}' and as_calls(out) == [("search", {})]
    out = pythonic.parse("[1, 2]<|python_tag|>[search(q='a')]", ctx())
    assert out.content == "[1, 2]" and as_calls(out) == [("search", {"q": "a"})]


def test_a_call_is_held_to_the_finish(llama: LlamaJsonParser) -> None:
    """Nothing marks the end of the JSON: text after it would turn it into content."""
    text = '{"name": "search", "parameters": {"q": "x"}}'
    assert assert_streams_like_whole(llama, text, ctx()) == ParsedOutput()
    shown = assert_streams_like_whole(llama, "Looking.<|python_tag|>" + text, ctx())
    assert shown == ParsedOutput(content="Looking.")


# -- round trip through the real templates ----------------------------------------------------


def template(name: str) -> ChatTemplate:
    return ChatTemplate(
        real_template_text(name),
        bos_token="<|begin_of_text|>",
        eos_token="<|eot_id|>",
        clock=lambda: datetime(2025, 3, 14),
    )


def tools() -> list[Tool]:
    return [Tool(name="get_weather", description="Weather of a city.", parameters=WEATHER)]


def echo(out: ParsedOutput) -> Message:
    """The assistant message an agent sends back for a parsed reply."""
    return Message(role="assistant", content=out.content, tool_calls=out.tool_calls)


@pytest.mark.parametrize("name", ["llama3.1", "llama3.2"])
@pytest.mark.parametrize(
    "output",
    [
        '{"name": "get_weather", "parameters": {"city": "São Paulo", "days": [1, 2]}}<|eot_id|>',
        "It is 21 degrees in Paris.<|eot_id|>",
    ],
)
def test_echo_renders_the_sampled_text(llama: LlamaJsonParser, name: str, output: str) -> None:
    chat = template(name)
    user = Message(role="user", content="Weather in Paris?")
    prompt = chat.render([user], tools())
    out = llama.parse(output, ctx("r"))
    assert out.parse_error is None
    full = chat.render([user, echo(out)], tools(), add_generation_prompt=False)
    assert full == prompt + output


def test_pythonic_echo_renders_the_same_call_as_json(pythonic: PythonicParser) -> None:
    """Llama 3.2's template writes calls as JSON: a pythonic reply's echo differs in form
    (the Gateway sees the drift) but carries the same call."""
    chat = template("llama3.2")
    user = Message(role="user", content="Weather in Paris?")
    prompt = chat.render([user], tools())
    out = pythonic.parse("[get_weather(city='Paris')]<|eot_id|>", ctx("r"))
    full = chat.render([user, echo(out)], tools(), add_generation_prompt=False)
    assert full.startswith(prompt)
    rendered = json.loads(full[len(prompt) :].removesuffix("<|eot_id|>"))
    assert rendered == {"name": "get_weather", "parameters": {"city": "Paris"}}
