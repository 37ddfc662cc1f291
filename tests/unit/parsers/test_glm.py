"""GLM-4.x output: reasoning, content and `<tool_call>NAME<arg_key>…` calls typed by the
request's schema; whole and streamed alike, never raising, and the real template's
rendering of a call parses back to that call."""

from __future__ import annotations

import json
from typing import Any

import pytest

from devstack.family_output import assistant_output
from gateway.canonical import Message, ParsedOutput, Tool, ToolCall
from gateway.parsers.base import ParseContext, tool_call_id
from gateway.parsers.glm import GLM_END_MARKERS, GlmParser
from gateway.prompt.chat_template import ChatTemplate
from tests.fixtures.real_templates import real_template_text
from tests.unit.parsers.conformance import assert_streams_like_whole

TOOLS: dict[str, dict[str, Any]] = {
    "get_weather": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city"],
    },
    "configure": {
        "type": "object",
        "properties": {
            "count": {"type": "integer"},
            "ratio": {"type": "number"},
            "enabled": {"type": "boolean"},
            "options": {"type": "object"},
            "tags": {"type": "array", "items": {"type": "string"}},
            "cleared": {"type": "null"},
            "limit": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
            "label": {"type": "string"},
        },
    },
    "list_files": {"type": "object", "properties": {}},
}

PARSER = GlmParser()


def ctx(in_reasoning: bool = True) -> ParseContext:
    """The default generation prompt opens `<think>`; `enable_thinking=False` closes it."""
    return ParseContext("c7", in_reasoning, TOOLS)


def parse(text: str, context: ParseContext | None = None) -> ParsedOutput:
    """The whole parse, after checking that every chunking streams a start of it."""
    context = context or ctx()
    assert_streams_like_whole(PARSER, text, context)
    return PARSER.parse(text, context)


def pairs(name: str, **values: str) -> str:
    body = "".join(f"<arg_key>{k}</arg_key><arg_value>{v}</arg_value>" for k, v in values.items())
    return f"<tool_call>{name}{body}</tool_call>"


def test_answer_with_thinking_switched_off() -> None:
    out = parse("Paris is the capital of France.<|user|>", ctx(in_reasoning=False))
    assert out == ParsedOutput(content="Paris is the capital of France.")


def test_reasoning_then_answer() -> None:
    out = parse("The user greets me.\nA short reply.</think>Hello! How can I help?<|user|>")
    assert out.reasoning == "The user greets me.\nA short reply."
    assert out.content == "Hello! How can I help?"
    assert out.tool_calls == [] and out.parse_error is None


def test_model_reopening_think_changes_nothing() -> None:
    out = parse("<think>plan it</think>done")
    assert (out.reasoning, out.content) == ("plan it", "done")


def test_reasoning_cut_by_max_tokens_is_all_reasoning() -> None:
    out = parse("still weighing the two opt")
    assert out == ParsedOutput(reasoning="still weighing the two opt")


def test_one_call_after_reasoning() -> None:
    text = "I need the forecast.</think>" + pairs("get_weather", city="Oslo", days="3")
    out = parse(text + "<|observation|>")
    assert out.reasoning == "I need the forecast."
    assert out.content is None and out.parse_error is None
    assert out.tool_calls == [
        ToolCall(
            id=tool_call_id("c7", 0), name="get_weather", arguments='{"city": "Oslo", "days": 3}'
        )
    ]


def test_several_calls_in_the_glm45_layout_with_newlines() -> None:
    text = (
        "</think>\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Oslo</arg_value>\n"
        "</tool_call>\n<tool_call>list_files\n</tool_call>\n<|observation|>\n"
    )
    out = parse(text)
    assert out.reasoning is None and out.content is None and out.parse_error is None
    assert [(c.id, c.name, json.loads(c.arguments)) for c in out.tool_calls] == [
        (tool_call_id("c7", 0), "get_weather", {"city": "Oslo"}),
        (tool_call_id("c7", 1), "list_files", {}),
    ]


def test_calls_go_out_while_streaming() -> None:
    """Each call is shown as soon as its block closes, not only at the finish."""
    text = "</think>" + pairs("get_weather", city="Oslo") + pairs("list_files")
    shown = assert_streams_like_whole(PARSER, text + "<|observation|>", ctx())
    assert [c.name for c in shown.tool_calls] == ["get_weather", "list_files"]


def test_values_typed_by_the_schema_every_kind() -> None:
    text = "</think>" + pairs(
        "configure",
        count=" -12 ",
        ratio="0.5",
        enabled="false",
        options='{"depth": 2, "paths": ["a", "b"]}',
        tags='["x", "y"]',
        cleared="null",
        limit="null",
        label="42",
        note="not in the schema: 7",
    )
    text += pairs("configure", limit="7", ratio="3", enabled="True")
    out = parse(text)
    assert out.parse_error is None
    assert [json.loads(c.arguments) for c in out.tool_calls] == [
        {
            "count": -12,
            "ratio": 0.5,
            "enabled": False,
            "options": {"depth": 2, "paths": ["a", "b"]},
            "tags": ["x", "y"],
            "cleared": None,
            "limit": None,
            "label": "42",
            "note": "not in the schema: 7",
        },
        {"limit": 7, "ratio": 3, "enabled": True},
    ]


def test_strings_stay_verbatim() -> None:
    value = "  two spaces,\na line, <b>markup</b>, Zürich 東京 \n"
    out = parse("</think>" + pairs("get_weather", city=value))
    assert json.loads(out.tool_calls[0].arguments) == {"city": value}


def test_without_declared_tools_values_stay_strings() -> None:
    text = "</think>" + pairs("anything", n="3", flag="true")
    out = parse(text, ParseContext("c7", True))
    assert json.loads(out.tool_calls[0].arguments) == {"n": "3", "flag": "true"}


def test_content_before_and_after_calls() -> None:
    text = "</think>Let me check. " + pairs("list_files") + "\nWaiting for the listing."
    out = parse(text)
    assert out.content == "Let me check. \nWaiting for the listing."
    assert [c.name for c in out.tool_calls] == ["list_files"]


def test_call_opened_inside_reasoning_ends_it() -> None:
    out = parse("I will look it up" + pairs("get_weather", city="Rome") + "<|observation|>")
    assert out.reasoning == "I will look it up"
    assert out.content is None
    assert json.loads(out.tool_calls[0].arguments) == {"city": "Rome"}


@pytest.mark.parametrize("marker", GLM_END_MARKERS)
def test_end_markers_are_dropped(marker: str) -> None:
    out = parse(f"ok</think>Done.{marker}\n")
    assert out == ParsedOutput(reasoning="ok", content="Done.")


def test_empty_output() -> None:
    assert parse("") == ParsedOutput()
    assert parse("", ctx(in_reasoning=False)) == ParsedOutput()


MALFORMED = [
    ("<tool_call>get_weather<arg_key>city</arg_key><arg_value>Os", "unclosed <tool_call>"),
    ("<tool_call><arg_key>city</arg_key><arg_value>Oslo</arg_value></tool_call>", "no name"),
    ('<tool_call>{"name": "get_weather"}</tool_call>', "is not a name"),
    (
        "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Oslo</tool_call>",
        "unclosed <arg_value>",
    ),
    ("<tool_call>get_weather<arg_key>city</arg_key></tool_call>", "has no <arg_value>"),
    ("<tool_call>get_weather<arg_key>city</tool_call>", "unclosed <arg_key>"),
    ("<tool_call>get_weather<arg_key> </arg_key><arg_value>x</arg_value></tool_call>", "empty"),
    (pairs("get_weather", city="Oslo")[:-12] + "and more</tool_call>", "unexpected text"),
    (pairs("get_weather", city="Oslo", days="soon"), "argument 'days' of 'get_weather'"),
    (pairs("configure", enabled="yes"), "argument 'enabled'"),
    (pairs("configure", options="{not json"), "argument 'options'"),
    (pairs("configure", tags='{"a": 1}'), "argument 'tags'"),
    (pairs("launch_rocket"), "unknown tool 'launch_rocket'"),
]


@pytest.mark.parametrize(("block", "reason"), MALFORMED)
def test_malformed_call_comes_back_as_text(block: str, reason: str) -> None:
    out = parse("Trying.</think>Calling now." + block + "<|observation|>")
    assert out.reasoning == "Trying."
    assert out.content == "Calling now." + block
    assert out.tool_calls == []
    assert out.parse_error is not None and reason in out.parse_error, out.parse_error


def test_a_malformed_block_does_not_swallow_the_next_one() -> None:
    """A value left open ends with its block: the next block is its own call, not text
    folded into the first call's value."""
    broken = "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Oslo</tool_call>"
    out = parse("</think>" + broken + pairs("get_weather", city="Rome"))
    assert out.content == broken
    assert [json.loads(c.arguments) for c in out.tool_calls] == [{"city": "Rome"}]
    assert out.tool_calls[0].id == tool_call_id("c7", 0)
    assert out.parse_error is not None and "block 1" in out.parse_error


def test_same_text_same_ids() -> None:
    text = "</think>" + pairs("list_files") + pairs("list_files")
    assert PARSER.parse(text, ctx()) == PARSER.parse(text, ctx())
    assert PARSER.parse(text, ParseContext("other", True, TOOLS)).tool_calls[0].id != (
        PARSER.parse(text, ctx()).tool_calls[0].id
    )


# -- round trip through the real template ---------------------------------------------

HISTORY = [
    Message(role="system", content="You configure things."),
    Message(role="user", content="Set it up, then tell me the weather in Oslo."),
]


def _reply(reasoning: str | None, content: str) -> Message:
    configure = {
        "count": 3,
        "ratio": 0.25,
        "enabled": True,
        "options": {"depth": 2, "nested": {"k": [1, None]}},
        "tags": ["a b", "ü"],
        "cleared": None,
        "limit": None,
        "label": "007",
    }
    calls = [
        ToolCall(
            id=tool_call_id("c7", 0),
            name="configure",
            arguments=json.dumps(configure, ensure_ascii=False),
        ),
        ToolCall(
            id=tool_call_id("c7", 1),
            name="get_weather",
            arguments=json.dumps({"city": "Oslo\nNorway", "days": 2}, ensure_ascii=False),
        ),
    ]
    return Message(role="assistant", content=content, reasoning=reasoning, tool_calls=calls)


@pytest.mark.parametrize(
    ("kwargs", "reply"),
    [
        ({}, _reply("Two calls: configure, then the weather.", "Setting up first.")),
        ({}, _reply("Straight to the calls.", "")),
        ({"enable_thinking": False}, _reply(None, "Setting up first.")),
    ],
    ids=["thinking", "thinking-no-content", "thinking-off"],
)
def test_the_templates_rendering_of_a_call_parses_back_to_it(
    kwargs: dict[str, Any], reply: Message
) -> None:
    template = ChatTemplate(
        real_template_text("glm-4.7-flash"), bos_token="", eos_token="<|endoftext|>"
    )
    tools = [Tool(name=name, parameters=schema) for name, schema in TOOLS.items()]
    prompt = template.render(HISTORY, tools, add_generation_prompt=True, **kwargs)
    opener, closer = PARSER.reasoning_tags
    context = ParseContext.of("c7", prompt.rfind(opener) > prompt.rfind(closer), tools)
    assert context.starts_in_reasoning is ("enable_thinking" not in kwargs)
    # The template closes the turn with the next message's marker: the model writes it.
    text = assistant_output(template, HISTORY, reply, tools, kwargs) + "<|observation|>"
    assert_streams_like_whole(PARSER, text, context)
    out = PARSER.parse(text, context)
    assert out.parse_error is None
    assert out.tool_calls == reply.tool_calls  # ids, names and argument text alike
    assert out.reasoning == reply.reasoning
    assert out.content == (reply.content or None)
