"""Mistral output: `[TOOL_CALLS]` blocks (Nemo's JSON array, Ministral 3's NAME[ARGS]{json})
and Ministral 3's `[THINK]` reasoning."""

from __future__ import annotations

import json

import pytest

from gateway.canonical import Message, ParsedOutput, Tool, ToolCall
from gateway.parsers.base import ParseContext, alnum_call_id
from gateway.parsers.mistral import MinistralParser, MistralNemoParser
from gateway.prompt.chat_template import ChatTemplate
from tests.fixtures.real_templates import real_template_text
from tests.unit.parsers.conformance import assert_streams_like_whole

WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}}
TOOLS = {"get_weather": WEATHER, "search": {"type": "object"}}


@pytest.fixture
def nemo() -> MistralNemoParser:
    return MistralNemoParser("mistral-nemo")


@pytest.fixture
def ministral() -> MinistralParser:
    return MinistralParser("ministral-3-reasoning")


def ctx(call_id: str = "c1", tools: dict[str, object] | None = None) -> ParseContext:
    return ParseContext(call_id, tools=TOOLS if tools is None else tools)  # type: ignore[arg-type]


def as_calls(out: ParsedOutput) -> list[tuple[str, object]]:
    return [(c.name, json.loads(c.arguments)) for c in out.tool_calls]


def is_mistral_id(s: str) -> bool:
    return len(s) == 9 and s.isascii() and s.isalnum()


# -- Mistral-Nemo -------------------------------------------------------------------------


def test_nemo_plain_answer(nemo: MistralNemoParser) -> None:
    assert nemo.parse("It is sunny.</s>", ctx()) == ParsedOutput(content="It is sunny.")
    assert nemo.reasoning_tags is None and nemo.end_markers == ("</s>",)


def test_nemo_one_call_keeps_the_id_the_model_wrote(nemo: MistralNemoParser) -> None:
    text = '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Nice"}, "id": "a1B2c3D4e"}]'
    out = nemo.parse(text + "</s>", ctx())
    assert out == ParsedOutput(
        tool_calls=[ToolCall(id="a1B2c3D4e", name="get_weather", arguments='{"city": "Nice"}')]
    )


def test_nemo_ids_are_derived_when_missing_or_unfit(nemo: MistralNemoParser) -> None:
    text = (
        '[TOOL_CALLS][{"name": "search", "arguments": {"q": "a"}}, '
        '{"name": "search", "arguments": {"q": "b"}, "id": "short"}, '
        '{"name": "search", "arguments": {"q": "c"}, "id": "call-0001"}, '
        '{"name": "search", "arguments": {"q": "d"}, "id": 123456789}, '
        '{"name": "search", "arguments": {"q": "e"}, "id": "Twice0001"}, '
        '{"name": "search", "arguments": {"q": "f"}, "id": "Twice0001"}]'
    )
    out = nemo.parse(text, ctx("abc"))
    derived = [alnum_call_id("abc", i) for i in range(6)]
    assert [c.id for c in out.tool_calls] == [*derived[:4], "Twice0001", derived[5]]
    assert all(is_mistral_id(c.id) for c in out.tool_calls)
    assert as_calls(out) == [("search", {"q": q}) for q in "abcdef"]
    assert nemo.parse(text, ctx("abc")) == out  # a replay yields the same ids


def test_nemo_content_before_the_calls(nemo: MistralNemoParser) -> None:
    out = nemo.parse('Checking.\n[TOOL_CALLS] [{"name": "search", "arguments": {}}]', ctx())
    assert out.content == "Checking." and as_calls(out) == [("search", {})]


def test_nemo_lone_object_string_and_missing_arguments(nemo: MistralNemoParser) -> None:
    out = nemo.parse('[TOOL_CALLS]{"name": "search", "arguments": {"q": "x"}}', ctx())
    assert as_calls(out) == [("search", {"q": "x"})]
    raw = '{"q":"kept  as written"}'
    out = nemo.parse("[TOOL_CALLS]" + json.dumps([{"name": "search", "arguments": raw}]), ctx())
    assert out.tool_calls[0].arguments == raw
    out = nemo.parse(
        '[TOOL_CALLS][{"name": "search"}, {"name": "search", "arguments": null}]', ctx()
    )
    assert [c.arguments for c in out.tool_calls] == ["{}", "{}"]


def test_nemo_unknown_keys_are_ignored(nemo: MistralNemoParser) -> None:
    text = '[TOOL_CALLS][{"type": "function", "name": "search", "arguments": {}, "x": [1]}]'
    assert as_calls(nemo.parse(text, ctx())) == [("search", {})]


def test_nemo_a_second_marker_opens_another_block(nemo: MistralNemoParser) -> None:
    text = (
        '[TOOL_CALLS][{"name": "search", "arguments": {"q": 1}}]'
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Bern"}}]</s>'
    )
    out = nemo.parse(text, ctx("t"))
    assert as_calls(out) == [("search", {"q": 1}), ("get_weather", {"city": "Bern"})]
    assert [c.id for c in out.tool_calls] == [alnum_call_id("t", 0), alnum_call_id("t", 1)]


def test_a_marker_inside_a_json_string_does_not_end_the_block(
    nemo: MistralNemoParser, ministral: MinistralParser
) -> None:
    text = '[TOOL_CALLS][{"name": "search", "arguments": {"q": "say [TOOL_CALLS] twice"}}]'
    out = nemo.parse(text + '[TOOL_CALLS][{"name": "search"}]', ctx())
    assert as_calls(out) == [("search", {"q": "say [TOOL_CALLS] twice"}), ("search", {})]
    text = '[TOOL_CALLS]search[ARGS]{"q": "[TOOL_CALLS]x[ARGS]{}"}[TOOL_CALLS]search[ARGS]{}'
    out = ministral.parse(text, ctx())
    assert as_calls(out) == [("search", {"q": "[TOOL_CALLS]x[ARGS]{}"}), ("search", {})]
    assert out.parse_error is None and out.content is None


@pytest.mark.parametrize(
    ("block", "reason"),
    [
        ('[TOOL_CALLS][{"name": "search", "arguments": {"q": }}]', "invalid JSON"),
        ('[TOOL_CALLS][{"name": "search", "arguments": {"q": "x"}', "invalid JSON"),
        ("[TOOL_CALLS]", "invalid JSON"),
        ('[TOOL_CALLS][{"name": "search", "arguments": {}}] I called it.', "unexpected text"),
        ('[TOOL_CALLS][{"name": "search", "arguments": {}}, 7]', "item 2 is not an object"),
        ('[TOOL_CALLS][{"arguments": {}}]', "no name"),
        ('[TOOL_CALLS][{"name": "search", "arguments": [1, 2]}]', "not a JSON object"),
        ('[TOOL_CALLS][{"name": "search", "arguments": "{nope"}]', "not JSON"),
        ('[TOOL_CALLS][{"name": "delete_all", "arguments": {}}]', "unknown tool 'delete_all'"),
        ("[TOOL_CALLS][]", "no tool call"),
        ('[TOOL_CALLS][{"name": "search", "arguments": {"q": "\\ud800"}}]', "surrogate"),
    ],
)
def test_nemo_malformed_block_is_content_with_a_note(
    nemo: MistralNemoParser, block: str, reason: str
) -> None:
    out = nemo.parse("Sure. " + block + "</s>", ctx())
    assert out.tool_calls == [] and out.content == "Sure. " + block
    assert out.parse_error is not None and reason in out.parse_error


def test_nemo_a_bad_block_leaves_the_good_one(nemo: MistralNemoParser) -> None:
    bad = '[TOOL_CALLS][{"name": "search", "arguments": {"q": }}]'
    good = '[TOOL_CALLS][{"name": "search", "arguments": {"q": 2}}]'
    out = nemo.parse(bad + good, ctx())
    assert out.content == bad and as_calls(out) == [("search", {"q": 2})]
    assert out.parse_error is not None and "block 1" in out.parse_error


# -- Ministral 3 ---------------------------------------------------------------------------


def test_ministral_reasoning_content_and_calls(ministral: MinistralParser) -> None:
    text = (
        "[THINK]The user wants two cities.\n[/THINK]I'll check both."
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}'
        '[TOOL_CALLS]get_weather[ARGS]{"city":"Oslo"}</s>'
    )
    out = ministral.parse(text, ctx("q"))
    assert out.reasoning == "The user wants two cities."
    assert out.content == "I'll check both." and out.parse_error is None
    assert out.tool_calls == [
        ToolCall(id=alnum_call_id("q", 0), name="get_weather", arguments='{"city": "Paris"}'),
        # Arguments are the model's own text, spacing and all.
        ToolCall(id=alnum_call_id("q", 1), name="get_weather", arguments='{"city":"Oslo"}'),
    ]


def test_ministral_answer_without_and_with_reasoning(ministral: MinistralParser) -> None:
    assert ministral.parse("Hello!</s>", ctx()) == ParsedOutput(content="Hello!")
    out = ministral.parse("[THINK]short[/THINK]\n\nHello!</s>", ctx())
    assert out == ParsedOutput(reasoning="short", content="Hello!")
    assert ministral.reasoning_tags == ("[THINK]", "[/THINK]")


def test_ministral_unclosed_reasoning_is_all_reasoning(ministral: MinistralParser) -> None:
    out = ministral.parse("[THINK]still thinking when the budget ra", ctx())
    assert out == ParsedOutput(reasoning="still thinking when the budget ra")


def test_ministral_a_call_inside_reasoning_ends_it(ministral: MinistralParser) -> None:
    out = ministral.parse(
        '[THINK]Need the weather.[TOOL_CALLS]get_weather[ARGS]{"city": "Rome"}', ctx()
    )
    assert out.reasoning == "Need the weather." and out.content is None
    assert as_calls(out) == [("get_weather", {"city": "Rome"})]


def test_ministral_empty_arguments_and_missing_args_marker(ministral: MinistralParser) -> None:
    out = ministral.parse("[TOOL_CALLS]search[ARGS]", ctx())
    assert out.tool_calls[0].arguments == "{}"
    out = ministral.parse('[TOOL_CALLS]search{"q": "no args marker"}', ctx())
    assert as_calls(out) == [("search", {"q": "no args marker"})]


@pytest.mark.parametrize(
    ("block", "reason"),
    [
        ('[TOOL_CALLS]search[ARGS]{"q":', "invalid JSON"),
        ('[TOOL_CALLS]search[ARGS]{"q": 1} and then words', "unexpected text"),
        ("[TOOL_CALLS]search[ARGS][1, 2]", "not a JSON object"),
        ("[TOOL_CALLS]search", "no [ARGS]"),
        ('[TOOL_CALLS][ARGS]{"q": 1}', "not a tool name"),
        ('[TOOL_CALLS] search[ARGS]{"q": 1}', "not a tool name"),
        ('[TOOL_CALLS]shutdown[ARGS]{"now": true}', "unknown tool 'shutdown'"),
        ('[TOOL_CALLS]search[ARGS]{"q": "\\udfff"}', "surrogate"),
    ],
)
def test_ministral_malformed_block_is_content_with_a_note(
    ministral: MinistralParser, block: str, reason: str
) -> None:
    out = ministral.parse("[THINK]plan[/THINK]Okay." + block + "</s>", ctx())
    assert out.reasoning == "plan" and out.tool_calls == []
    assert out.content == "Okay." + block
    assert out.parse_error is not None and reason in out.parse_error


def test_ministral_a_bad_block_between_good_ones(ministral: MinistralParser) -> None:
    text = (
        '[TOOL_CALLS]search[ARGS]{"q": 1}'
        '[TOOL_CALLS]search[ARGS]{"q": '
        '[TOOL_CALLS]search[ARGS]{"q": 3}'
    )
    out = ministral.parse(text, ctx("b"))
    assert as_calls(out) == [("search", {"q": 1}), ("search", {"q": 3})]
    assert [c.id for c in out.tool_calls] == [alnum_call_id("b", 0), alnum_call_id("b", 1)]
    assert out.content == '[TOOL_CALLS]search[ARGS]{"q":'
    assert out.parse_error is not None and "block 2" in out.parse_error


# -- streaming -----------------------------------------------------------------------------

NEMO_TEXTS = [
    "It is sunny.</s>",
    'Checking.\n[TOOL_CALLS][{"name": "search", "arguments": {"q": "[TOOL_CALLS]"}}]</s>',
    '[TOOL_CALLS][{"name": "search", "arguments": {}}][TOOL_CALLS][{"name": "search"}]</s>',
    '[TOOL_CALLS][{"name": "search", "arguments": {"q": }}][TOOL_CALLS][{"name": "search"}]',
    '[TOOL_CALLS][{"name": "search", "arguments": {}}] I called it.</s>',
    "Use [TOOL_CA and keep going",
    "",
]


@pytest.mark.parametrize("text", NEMO_TEXTS)
def test_nemo_streams_like_whole(nemo: MistralNemoParser, text: str) -> None:
    assert_streams_like_whole(nemo, text, ctx())


MINISTRAL_TEXTS = [
    "[THINK]a plan[/THINK]The answer.</s>",
    '[THINK]hmm [TOOL_CALLS]search[ARGS]{"q": 1}[TOOL_CALLS]search[ARGS]{}</s>',
    'Text first [TOOL_CALLS]search[ARGS]{"q": "}[TOOL_CALLS]"}</s>',
    '[TOOL_CALLS]search[ARGS]{"q": [TOOL_CALLS]search[ARGS]{"q": 3}</s>',
    '[TOOL_CALLS]search[ARGS]{"q": "[TOOL_CALLS]x[ARGS]{}"}[TOOL_CALLS]search[ARGS]{}</s>',
    '[TOOL_CALLS]search[ARGS]{"q": 1}[TOOL_CALLS]search[ARGS]{"q":[TOOL_CALLS]bad[TOOL_CALLS]'
    'search[ARGS]{"q": 4}</s>',
    "[THINK]never closed [/THI",
    "  \n[THINK]\n\n[/THINK]\n\nok",
    "plain answer with [THINK] in the middle</s>",
]


@pytest.mark.parametrize("text", MINISTRAL_TEXTS)
def test_ministral_streams_like_whole(ministral: MinistralParser, text: str) -> None:
    assert_streams_like_whole(ministral, text, ctx())


def test_a_call_streams_once_the_next_marker_arrives(ministral: MinistralParser) -> None:
    text = '[THINK]r[/THINK][TOOL_CALLS]search[ARGS]{"q": 1}[TOOL_CALLS]search[ARGS]{"q": 2}'
    whole = ministral.parse(text, ctx())
    shown = assert_streams_like_whole(ministral, text, ctx())
    # The last call waits for the finish: text after its JSON would make it malformed.
    assert shown == ParsedOutput(reasoning="r", tool_calls=whole.tool_calls[:1])


def test_a_block_that_does_not_decode_streams_as_content(ministral: MinistralParser) -> None:
    bad = '[TOOL_CALLS]search[ARGS]{"q": oops}'
    text = (
        '[TOOL_CALLS]search[ARGS]{"q": 1}' + bad + '[TOOL_CALLS]search[ARGS]{"q": 3}'
        '[TOOL_CALLS]search[ARGS]{"q": 4}</s>'
    )
    whole = ministral.parse(text, ctx())
    assert whole.content == bad and len(whole.tool_calls) == 3
    shown = assert_streams_like_whole(ministral, text, ctx())
    assert shown == ParsedOutput(content=bad, tool_calls=whole.tool_calls[:2])


# -- round trip through the real templates ----------------------------------------------------


def template(name: str) -> ChatTemplate:
    return ChatTemplate(real_template_text(name), bos_token="<s>", eos_token="</s>")


def tools() -> list[Tool]:
    return [Tool(name="get_weather", description="Weather of a city.", parameters=WEATHER)]


def echo(out: ParsedOutput) -> Message:
    """The assistant message an agent sends back for a parsed reply."""
    return Message(role="assistant", content=out.content, tool_calls=out.tool_calls)


USER = Message(role="user", content="Weather in Paris and Lyon?")


def rerender(chat: ChatTemplate, out: ParsedOutput) -> str:
    """What the template renders for the echoed reply after the prompt that produced it."""
    prompt = chat.render([USER], tools())
    full = chat.render([USER, echo(out)], tools(), add_generation_prompt=False)
    assert full.startswith(prompt)
    return full[len(prompt) :]


@pytest.mark.parametrize(
    "output",
    [
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "x7Yq2LmN0"}, '
        '{"name": "get_weather", "arguments": {"city": "Lyon"}, "id": "Pq8ZrT3vB"}]</s>',
        "Both are sunny.</s>",
    ],
)
def test_nemo_echo_renders_the_sampled_text(nemo: MistralNemoParser, output: str) -> None:
    out = nemo.parse(output, ctx("n"))
    assert out.parse_error is None
    assert rerender(template("mistral-nemo"), out) == output


def test_nemo_echo_carries_the_derived_ids(nemo: MistralNemoParser) -> None:
    """Without ids in the output, the echo renders the ids the parse gave (the template
    accepts them: 9 alphanumerics); everything else is as sampled."""
    output = '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]</s>'
    out = nemo.parse(output, ctx("n"))
    expected = output.replace("}}]", '}, "id": "' + alnum_call_id("n", 0) + '"}]')
    assert rerender(template("mistral-nemo"), out) == expected


@pytest.mark.parametrize(
    "output",
    [
        'Checking both.[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}'
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Lyon"}</s>',
        "Both are sunny.</s>",
    ],
)
def test_ministral_echo_renders_the_sampled_text(ministral: MinistralParser, output: str) -> None:
    out = ministral.parse(output, ctx("m"))
    assert out.parse_error is None
    assert rerender(template("ministral-3-reasoning"), out) == output


def test_ministral_echo_drops_reasoning(ministral: MinistralParser) -> None:
    """The template renders thinking only from content chunks, never from a message's
    reasoning field: an echo of a reasoning turn lacks its [THINK] block (a realign)."""
    output = '[THINK]Paris first.[/THINK][TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}</s>'
    out = ministral.parse(output, ctx("m"))
    assert out.reasoning == "Paris first."
    assert rerender(template("ministral-3-reasoning"), out) == output.replace(
        "[THINK]Paris first.[/THINK]", ""
    )
