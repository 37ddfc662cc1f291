"""MiniMax-M2 output: reasoning, content and `<minimax:tool_call>` blocks of `<invoke>`
calls typed by the request's schema; whole and streamed alike, never raising, and the
real template's rendering of calls parses back to those calls."""

from __future__ import annotations

import json
from typing import Any

import pytest

from devstack.family_output import assistant_output
from gateway.canonical import Message, ParsedOutput, Tool, ToolCall
from gateway.parsers.base import ParseContext, tool_call_id
from gateway.parsers.minimax import MINIMAX_END_MARKERS, MinimaxParser
from gateway.prompt.chat_template import ChatTemplate
from tests.fixtures.real_templates import real_template_text
from tests.unit.parsers.conformance import assert_streams_like_whole

TOOLS: dict[str, dict[str, Any]] = {
    "search": {
        "type": "object",
        "properties": {"query": {"type": "string"}, "top_k": {"type": "integer"}},
    },
    "tune": {
        "type": "object",
        "properties": {
            "steps": {"type": "integer"},
            "lr": {"type": "number"},
            "verbose": {"type": "boolean"},
            "config": {"type": "object"},
            "layers": {"type": "array", "items": {"type": "integer"}},
            "reset": {"type": "null"},
            "seed": {"type": ["integer", "null"]},
            "title": {"type": "string"},
        },
    },
    "now": {"type": "object", "properties": {}},
}

PARSER = MinimaxParser()


def ctx() -> ParseContext:
    """The generation prompt always opens `<think>`."""
    return ParseContext("m3", True, TOOLS)


def parse(text: str, context: ParseContext | None = None) -> ParsedOutput:
    """The whole parse, after checking that every chunking streams a start of it."""
    context = context or ctx()
    assert_streams_like_whole(PARSER, text, context)
    return PARSER.parse(text, context)


def invoke(name: str, quote: str = '"', **values: str) -> str:
    params = "".join(f'<parameter name="{k}">{v}</parameter>\n' for k, v in values.items())
    return f"<invoke name={quote}{name}{quote}>\n{params}</invoke>\n"


def block(*invokes: str) -> str:
    return "<minimax:tool_call>\n" + "".join(invokes) + "</minimax:tool_call>"


def test_reasoning_then_answer() -> None:
    out = parse("The user says hi.\nBe brief.\n</think>\n\nHello! What do you need?[e~[\n")
    assert out == ParsedOutput(
        reasoning="The user says hi.\nBe brief.", content="Hello! What do you need?"
    )


def test_reasoning_cut_by_max_tokens_is_all_reasoning() -> None:
    assert parse("first I should che") == ParsedOutput(reasoning="first I should che")


def test_plain_answer_when_the_prompt_left_no_reasoning_open() -> None:
    out = parse("Just an answer.[e~[", ParseContext("m3", False, TOOLS))
    assert out == ParsedOutput(content="Just an answer.")


def test_one_call() -> None:
    text = "Look it up.\n</think>\n\n" + block(invoke("search", query="vllm parsers", top_k="5"))
    out = parse(text + "[e~[")
    assert out.reasoning == "Look it up."
    assert out.content is None and out.parse_error is None
    assert out.tool_calls == [
        ToolCall(
            id=tool_call_id("m3", 0),
            name="search",
            arguments='{"query": "vllm parsers", "top_k": 5}',
        )
    ]


def test_several_invokes_in_one_block_and_a_second_block() -> None:
    text = (
        "Three calls.</think>\n"
        + block(invoke("search", query="a"), invoke("now", quote="'"))
        + "\n"
        + block("<invoke name=search>\n<parameter name=query>b</parameter>\n</invoke>\n")
        + "[e~["
    )
    out = parse(text)
    assert out.parse_error is None and out.content is None
    assert [(c.id, c.name, json.loads(c.arguments)) for c in out.tool_calls] == [
        (tool_call_id("m3", 0), "search", {"query": "a"}),
        (tool_call_id("m3", 1), "now", {}),
        (tool_call_id("m3", 2), "search", {"query": "b"}),
    ]


def test_calls_go_out_while_streaming() -> None:
    text = "ok</think>" + block(invoke("search", query="a"), invoke("now")) + "[e~["
    shown = assert_streams_like_whole(PARSER, text, ctx())
    assert [c.name for c in shown.tool_calls] == ["search", "now"]


def test_values_typed_by_the_schema_every_kind() -> None:
    first = invoke(
        "tune",
        steps="\n100\n",
        lr="3e-4",
        verbose="true",
        config='{"opt": "adam", "betas": [0.9, 0.95]}',
        layers="[1, 2, 3]",
        reset="null",
        seed="null",
        title="1e5",
        extra="undeclared stays text",
    )
    second = invoke("tune", seed="42", lr="-2", verbose="FALSE")
    out = parse("</think>" + block(first, second))
    assert out.parse_error is None
    assert [json.loads(c.arguments) for c in out.tool_calls] == [
        {
            "steps": 100,
            "lr": 3e-4,
            "verbose": True,
            "config": {"opt": "adam", "betas": [0.9, 0.95]},
            "layers": [1, 2, 3],
            "reset": None,
            "seed": None,
            "title": "1e5",
            "extra": "undeclared stays text",
        },
        {"seed": 42, "lr": -2, "verbose": False},
    ]


def test_strings_stay_verbatim() -> None:
    value = "\n  indented line\n<tag attr='1'>x</tag> — naïve 中文 \n"
    out = parse("</think>" + block(invoke("search", query=value)))
    assert json.loads(out.tool_calls[0].arguments) == {"query": value}


def test_without_declared_tools_values_stay_strings() -> None:
    out = parse("</think>" + block(invoke("anything", n="3")), ParseContext("m3", True))
    assert json.loads(out.tool_calls[0].arguments) == {"n": "3"}


def test_content_before_and_after_the_block() -> None:
    text = "plan</think>\n\nSearching now.\n" + block(invoke("now")) + "\nBack soon.[e~["
    out = parse(text)
    assert out.content == "Searching now.\n\nBack soon."
    assert [c.name for c in out.tool_calls] == ["now"]


def test_call_opened_inside_reasoning_ends_it() -> None:
    out = parse("I must search\n" + block(invoke("search", query="x")) + "[e~[")
    assert out.reasoning == "I must search"
    assert out.content is None
    assert json.loads(out.tool_calls[0].arguments) == {"query": "x"}


@pytest.mark.parametrize("marker", MINIMAX_END_MARKERS)
def test_end_marker_is_dropped(marker: str) -> None:
    assert parse(f"r</think>Done.{marker}\n") == ParsedOutput(reasoning="r", content="Done.")


def test_empty_output() -> None:
    assert parse("") == ParsedOutput()


MALFORMED = [
    ('<minimax:tool_call>\n<invoke name="now">\n</invoke>\n', "unclosed <minimax:tool_call>"),
    (block(invoke("")), "no valid name"),
    (block("<invoke>\n</invoke>\n"), "unexpected text in the block"),
    (block('<invoke name="now">\n'), "unclosed <invoke>"),
    (
        block('<invoke name="search">\n<parameter name="query">a\n</invoke>\n'),
        "unclosed <parameter>",
    ),
    (
        block('<invoke name="search">\n<parameter name="">a</parameter>\n</invoke>\n'),
        "has no name",
    ),
    (block(invoke("now"), "and then some\n"), "unexpected text in the block"),
    (block('<invoke name="search">\nquery=a\n</invoke>\n'), "unexpected text in the parameters"),
    (block(), "no <invoke>"),
    (block(invoke("search", top_k="five")), "argument 'top_k' of 'search'"),
    (block(invoke("tune", layers='{"a": 1}')), "argument 'layers'"),
    (block(invoke("tune", verbose="maybe")), "argument 'verbose'"),
    (block(invoke("now"), invoke("delete_everything")), "unknown tool 'delete_everything'"),
]


@pytest.mark.parametrize(("text", "reason"), MALFORMED)
def test_malformed_block_comes_back_as_text(text: str, reason: str) -> None:
    out = parse("Thinking.</think>Calling." + text + "[e~[")
    assert out.reasoning == "Thinking."
    assert out.content == ("Calling." + text).strip()
    assert out.tool_calls == []
    assert out.parse_error is not None and reason in out.parse_error, out.parse_error


def test_a_malformed_block_does_not_swallow_the_next_one() -> None:
    broken = block('<invoke name="search">\n<parameter name="query">a\n</invoke>\n')
    out = parse("</think>" + broken + "\n" + block(invoke("search", query="b")))
    assert out.content == broken
    assert [json.loads(c.arguments) for c in out.tool_calls] == [{"query": "b"}]
    assert out.tool_calls[0].id == tool_call_id("m3", 0)
    assert out.parse_error is not None and "block 1" in out.parse_error


# -- round trip through the real template ---------------------------------------------

HISTORY = [Message(role="user", content="Tune the model, then search for the paper.")]


def _reply(reasoning: str | None, content: str) -> Message:
    tune = {
        "steps": 200,
        "lr": 0.001,
        "verbose": False,
        "config": {"opt": "sgd", "momentum": [0.9], "extra": None},
        "layers": [4, 8],
        "reset": None,
        "seed": 7,
        "title": "true",
    }
    calls = [
        ToolCall(id=tool_call_id("m3", 0), name="tune", arguments=json.dumps(tune)),
        ToolCall(
            id=tool_call_id("m3", 1),
            name="search",
            arguments=json.dumps({"query": "attention\n is all «you» need"}, ensure_ascii=False),
        ),
        ToolCall(id=tool_call_id("m3", 2), name="now", arguments="{}"),
    ]
    return Message(role="assistant", content=content, reasoning=reasoning, tool_calls=calls)


@pytest.mark.parametrize(
    "reply",
    [_reply("Tune first, then search.", "On it."), _reply("Calls only.", "")],
    ids=["with-content", "calls-only"],
)
def test_the_templates_rendering_of_calls_parses_back_to_them(reply: Message) -> None:
    template = ChatTemplate(real_template_text("minimax-m2"), bos_token="", eos_token="[e~[")
    tools = [Tool(name=name, parameters=schema) for name, schema in TOOLS.items()]
    prompt = template.render(HISTORY, tools, add_generation_prompt=True)
    opener, closer = PARSER.reasoning_tags
    context = ParseContext.of("m3", prompt.rfind(opener) > prompt.rfind(closer), tools)
    assert context.starts_in_reasoning
    text = assistant_output(template, HISTORY, reply, tools)
    assert text.rstrip().endswith(MINIMAX_END_MARKERS[0])
    assert_streams_like_whole(PARSER, text, context)
    out = PARSER.parse(text, context)
    assert out.parse_error is None
    assert out.tool_calls == reply.tool_calls  # ids, names and argument text alike
    assert out.reasoning == reply.reasoning
    assert out.content == (reply.content or None)
