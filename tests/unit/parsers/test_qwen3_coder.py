"""Qwen3-Coder and Qwen3.5: XML-like tool calls (`<function=…><parameter=…>`) typed by the
request's schema, Qwen3.5's reasoning (also when a call opens inside it), malformed blocks
kept as content, every text streamed like its whole parse, and a call rendered by the real
templates parsed back to itself."""

from __future__ import annotations

import json
from typing import Any

import pytest

from devstack.family_output import assistant_output
from gateway.canonical import Message, Tool, ToolCall
from gateway.parsers.base import ParseContext, tool_call_id
from gateway.parsers.qwen3_coder import Qwen3CoderParser, qwen3_5, qwen3_coder
from tests.fixtures.real_templates import load
from tests.unit.parsers.conformance import assert_streams_like_whole

SCHEMAS: dict[str, dict[str, Any]] = {
    "run_shell": {
        "type": "object",
        "properties": {"command": {"type": "string"}, "timeout": {"type": "integer"}},
        "required": ["command"],
    },
    "write_file": {
        "type": "object",
        "properties": {"path": {"type": "string"}, "text": {"type": "string"}},
    },
    "tune": {
        "type": "object",
        "properties": {
            "retries": {"type": "integer"},
            "ratio": {"type": "number"},
            "verbose": {"type": "boolean"},
            "options": {"type": "object"},
            "paths": {"type": "array", "items": {"type": "string"}},
            "nothing": {"type": "null"},
            "limit": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
            "label": {"type": ["string", "null"]},
        },
    },
}

CODER = qwen3_coder()
QWEN35 = qwen3_5()
BOTH = [CODER, QWEN35]


def ctx(starts_in_reasoning: bool = False, tools: bool = True) -> ParseContext:
    return ParseContext("c7", starts_in_reasoning, SCHEMAS if tools else {})


def call(name: str, params: dict[str, str]) -> str:
    """A block the way the model writes it: each value between two newlines."""
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params.items())
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


def parsed_calls(parser: Qwen3CoderParser, text: str, c: ParseContext) -> list[tuple[str, Any]]:
    out = parser.parse(text, c)
    assert out.parse_error is None, out.parse_error
    return [(tc.name, json.loads(tc.arguments)) for tc in out.tool_calls]


# -- text and reasoning ----------------------------------------------------------------


@pytest.mark.parametrize("parser", BOTH, ids=lambda p: p.name)
def test_plain_text_is_content(parser: Qwen3CoderParser) -> None:
    text = "Three files changed.\nAll tests pass.<|im_end|>"
    out = parser.parse(text, ctx())
    assert (out.reasoning, out.content, out.tool_calls, out.parse_error) == (
        None,
        "Three files changed.\nAll tests pass.",
        [],
        None,
    )
    assert_streams_like_whole(parser, text, ctx())


def test_qwen35_output_continues_the_reasoning_the_prompt_opened() -> None:
    text = "The user wants a sum.\n2 + 2 = 4.\n</think>\n\nIt is 4.<|im_end|>"
    out = QWEN35.parse(text, ctx(starts_in_reasoning=True))
    assert (out.reasoning, out.content) == ("The user wants a sum.\n2 + 2 = 4.", "It is 4.")
    assert_streams_like_whole(QWEN35, text, ctx(starts_in_reasoning=True))


def test_qwen35_reasoning_cut_before_its_end_is_all_reasoning() -> None:
    text = "Still weighing the options"
    out = QWEN35.parse(text, ctx(starts_in_reasoning=True))
    assert (out.reasoning, out.content, out.tool_calls) == (text, None, [])
    assert_streams_like_whole(QWEN35, text, ctx(starts_in_reasoning=True))


def test_qwen35_with_thinking_off_is_content_and_calls() -> None:
    # enable_thinking=false: the generation prompt closed an empty block already.
    text = "Listing.\n\n" + call("run_shell", {"command": "ls"}) + "<|im_end|>"
    out = QWEN35.parse(text, ctx(starts_in_reasoning=False))
    assert (out.reasoning, out.content) == (None, "Listing.")
    assert [(c.name, c.arguments) for c in out.tool_calls] == [("run_shell", '{"command": "ls"}')]


def test_qwen3_coder_reads_no_reasoning_block() -> None:
    text = "I wrote </think> in a comment; this is all content."
    out = CODER.parse(text, ctx(starts_in_reasoning=True))
    assert (out.reasoning, out.content) == (None, text)
    assert CODER.reasoning_tags is None and QWEN35.reasoning_tags == ("<think>", "</think>")


# -- tool calls ------------------------------------------------------------------------


@pytest.mark.parametrize("parser", BOTH, ids=lambda p: p.name)
def test_one_call_with_content_before_it(parser: Qwen3CoderParser) -> None:
    text = "Let me look.\n\n" + call("run_shell", {"command": "ls -la", "timeout": "30"})
    text += "<|im_end|>"
    out = parser.parse(text, ctx())
    assert out.content == "Let me look."
    assert out.tool_calls == [
        ToolCall(
            id=tool_call_id("c7", 0),
            name="run_shell",
            arguments='{"command": "ls -la", "timeout": 30}',
        )
    ]
    shown = assert_streams_like_whole(parser, text, ctx())
    assert shown.tool_calls == out.tool_calls, "the call streams before the finish"


def test_reasoning_content_and_several_calls() -> None:
    text = (
        "Two things to do.\n</think>\n\nDoing both.\n\n"
        + call("run_shell", {"command": "make"})
        + "\n"
        + call("write_file", {"path": "a.txt", "text": "hi"})
        + "<|im_end|>"
    )
    c = ctx(starts_in_reasoning=True)
    out = QWEN35.parse(text, c)
    assert (out.reasoning, out.content) == ("Two things to do.", "Doing both.")
    assert [t.id for t in out.tool_calls] == [tool_call_id("c7", 0), tool_call_id("c7", 1)]
    assert parsed_calls(QWEN35, text, c) == [
        ("run_shell", {"command": "make"}),
        ("write_file", {"path": "a.txt", "text": "hi"}),
    ]
    assert_streams_like_whole(QWEN35, text, c)


def test_several_functions_in_one_block_are_several_calls() -> None:
    text = (
        "<tool_call>\n<function=run_shell>\n<parameter=command>\npwd\n</parameter>\n"
        "</function>\n<function=run_shell>\n<parameter=command>\nid\n</parameter>\n"
        "</function>\n</tool_call>"
    )
    assert parsed_calls(CODER, text, ctx()) == [
        ("run_shell", {"command": "pwd"}),
        ("run_shell", {"command": "id"}),
    ]
    assert [t.id for t in CODER.parse(text, ctx()).tool_calls] == [
        tool_call_id("c7", 0),
        tool_call_id("c7", 1),
    ]
    assert_streams_like_whole(CODER, text, ctx())


def test_content_after_a_call_is_kept() -> None:
    text = "First.\n" + call("run_shell", {"command": "true"}) + "\nThen this.<|im_end|>"
    out = CODER.parse(text, ctx())
    assert out.content == "First.\n\nThen this."
    assert [t.name for t in out.tool_calls] == ["run_shell"]
    assert_streams_like_whole(CODER, text, ctx())


def test_a_call_opened_inside_reasoning_ends_it_and_reaches_the_agent() -> None:
    text = "I need the listing first.\n\n" + call("run_shell", {"command": "ls"}) + "<|im_end|>"
    c = ctx(starts_in_reasoning=True)
    out = QWEN35.parse(text, c)
    assert (out.reasoning, out.content, out.parse_error) == (
        "I need the listing first.",
        None,
        None,
    )
    assert parsed_calls(QWEN35, text, c) == [("run_shell", {"command": "ls"})]
    shown = assert_streams_like_whole(QWEN35, text, c)
    assert shown.reasoning == "I need the listing first."


def test_a_reasoning_close_after_a_call_from_inside_reasoning_is_not_content() -> None:
    text = "Need the files.\n" + call("run_shell", {"command": "ls"}) + "\n</think>\n\nOn it."
    c = ctx(starts_in_reasoning=True)
    out = QWEN35.parse(text + "<|im_end|>", c)
    assert (out.reasoning, out.content) == ("Need the files.", "On it.")
    assert [t.name for t in out.tool_calls] == ["run_shell"]
    assert_streams_like_whole(QWEN35, text, c)


def test_every_schema_type_is_typed() -> None:
    params = {
        "retries": "3",
        "ratio": "0.25",
        "verbose": "True",
        "options": '{"depth": 2, "tags": ["a"]}',
        "paths": '["src", "tests"]',
        "nothing": "null",
        "limit": "null",
        "label": "null",
    }
    text = call("tune", params)
    [(name, args)] = parsed_calls(CODER, text, ctx())
    assert name == "tune"
    assert args == {
        "retries": 3,
        "ratio": 0.25,
        "verbose": True,
        "options": {"depth": 2, "tags": ["a"]},
        "paths": ["src", "tests"],
        "nothing": None,
        "limit": None,
        "label": None,
    }
    assert_streams_like_whole(CODER, text, ctx())


def test_a_nullable_value_takes_its_other_type_and_strings_stay_strings() -> None:
    text = call("tune", {"limit": "12", "label": "12", "verbose": "false"})
    text += call("run_shell", {"command": "42", "timeout": "-5"})
    assert parsed_calls(CODER, text, ctx()) == [
        ("tune", {"limit": 12, "label": "12", "verbose": False}),
        ("run_shell", {"command": "42", "timeout": -5}),
    ]


def test_the_templates_spelling_of_null_reads_as_null_only_where_null_fits() -> None:
    text = call("tune", {"limit": "None", "nothing": "None", "label": "None"})
    assert parsed_calls(CODER, text, ctx()) == [
        ("tune", {"limit": None, "nothing": None, "label": "None"})
    ]
    out = CODER.parse(call("tune", {"retries": "None"}), ctx())
    assert out.tool_calls == [] and out.parse_error is not None


def test_without_declared_tools_values_stay_strings() -> None:
    text = call("tune", {"retries": "3", "verbose": "true"})
    assert parsed_calls(CODER, text, ctx(tools=False)) == [
        ("tune", {"retries": "3", "verbose": "true"})
    ]


def test_a_parameter_the_schema_does_not_declare_stays_a_string() -> None:
    text = call("run_shell", {"command": "ls", "cwd": "7"})
    assert parsed_calls(CODER, text, ctx()) == [("run_shell", {"command": "ls", "cwd": "7"})]


def test_multiline_values_lose_only_the_wrapping_newlines() -> None:
    value = "\n  def f():\n      return 1\n\n"  # leading and trailing blank lines of its own
    text = call("write_file", {"path": "f.py", "text": value})
    [(_, args)] = parsed_calls(QWEN35, text, ctx())
    assert args["text"] == value
    assert_streams_like_whole(QWEN35, text, ctx())


def test_a_value_written_on_the_tag_lines_is_taken_as_is() -> None:
    text = (
        "<tool_call><function=run_shell><parameter=command>echo  hi </parameter>"
        "<parameter=timeout> 9 </parameter></function></tool_call>"
    )
    assert parsed_calls(CODER, text, ctx()) == [
        ("run_shell", {"command": "echo  hi ", "timeout": 9})
    ]


def test_values_holding_tag_text_are_kept_as_written() -> None:
    value = "x = '</function>'\ny = '<parameter=z>'\nz = '</tool_call>'"
    text = call("write_file", {"path": "t.py", "text": value}) + "<|im_end|>"
    out = CODER.parse(text, ctx())
    assert out.parse_error is None and out.content is None
    assert json.loads(out.tool_calls[0].arguments)["text"] == value
    assert_streams_like_whole(CODER, text, ctx())


def test_a_call_without_parameters_has_empty_arguments() -> None:
    text = "<tool_call>\n<function=run_shell>\n</function>\n</tool_call>"
    assert [(t.name, t.arguments) for t in CODER.parse(text, ctx()).tool_calls] == [
        ("run_shell", "{}")
    ]


# -- bad input: content with a parse note ----------------------------------------------

OPEN, SHELL, END = "<tool_call>\n", "<function=run_shell>\n", "</function>\n</tool_call>"
LS = "<parameter=command>\nls\n</parameter>\n"
MALFORMED = {
    "unclosed tool_call": OPEN + SHELL + LS + "</function>\n",
    "unclosed function": OPEN + SHELL + LS + "</tool_call>",
    "unclosed parameter": OPEN + SHELL + "<parameter=command>\nls\n" + END,
    "parameter closed by the next one": (
        OPEN + SHELL + "<parameter=command>\nls\n<parameter=timeout>\n5\n</parameter>\n" + END
    ),
    "function tag not closed": OPEN + "<function=run_shell\n" + LS + END,
    "empty function name": OPEN + "<function=>\n" + LS + END,
    "no function": OPEN + LS + "</tool_call>",
    "empty block": OPEN + "</tool_call>",
    "empty parameter name": OPEN + SHELL + "<parameter=>\nls\n</parameter>\n" + END,
    "text between tags": OPEN + SHELL + "now\n" + LS + END,
    "json body": OPEN + '{"name": "run_shell", "arguments": {"command": "ls"}}\n</tool_call>',
    "integer that is not one": call("run_shell", {"command": "ls", "timeout": "soon"}),
    "boolean that is not one": call("tune", {"verbose": "yes"}),
    "object that is not one": call("tune", {"options": "{depth: 2}"}),
    "unknown tool": call("delete_everything", {"path": "/"}),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
@pytest.mark.parametrize("parser", BOTH, ids=lambda p: p.name)
def test_a_malformed_block_stays_content_with_a_note(parser: Qwen3CoderParser, case: str) -> None:
    block = MALFORMED[case]
    text = "Trying.\n" + block + "<|im_end|>"
    out = parser.parse(text, ctx())
    assert out.tool_calls == []
    assert out.content == ("Trying.\n" + block).strip()
    assert out.parse_error is not None
    assert_streams_like_whole(parser, text, ctx())


def test_a_malformed_block_does_not_spoil_a_good_one_after_it() -> None:
    text = (
        call("run_shell", {"timeout": "later"})
        + "\n"
        + call("run_shell", {"command": "ls"})
        + "<|im_end|>"
    )
    out = CODER.parse(text, ctx())
    assert [(t.name, t.id) for t in out.tool_calls] == [("run_shell", tool_call_id("c7", 0))]
    assert out.content == call("run_shell", {"timeout": "later"})
    assert out.parse_error is not None and "later" in out.parse_error
    assert_streams_like_whole(CODER, text, ctx())


def test_an_unknown_tool_is_a_call_when_the_request_declared_none() -> None:
    text = call("delete_everything", {"path": "/"})
    assert parsed_calls(CODER, text, ctx(tools=False)) == [("delete_everything", {"path": "/"})]


# -- round trip through the real templates ---------------------------------------------

TOOLS = [Tool(name=name, description=f"{name} tool", parameters=s) for name, s in SCHEMAS.items()]

ECHOED_CALLS = [
    ToolCall(
        id="call_a",
        name="tune",
        arguments=json.dumps(
            {
                "retries": 4,
                "ratio": 1.5,
                "verbose": True,
                "options": {"mode": "fast", "levels": [1, 2]},
                "paths": ["a b", "c\nd"],
                "nothing": None,
                "limit": None,
                "label": "7",
            }
        ),
    ),
    ToolCall(
        id="call_b",
        name="write_file",
        arguments=json.dumps({"path": "notes.md", "text": "\n# Title\n\nbody line\n"}),
    ),
    ToolCall(id="call_c", name="run_shell", arguments=json.dumps({"command": "false"})),
]


@pytest.mark.parametrize(
    ("template", "parser", "thinking"),
    [("qwen3-coder", CODER, None), ("qwen3.5", QWEN35, True), ("qwen3.5", QWEN35, False)],
    ids=["coder", "3.5", "3.5-thinking-off"],
)
@pytest.mark.parametrize("content", ["", "I will tune it, then write notes."])
def test_a_call_rendered_by_the_real_template_parses_back_to_itself(
    template: str, parser: Qwen3CoderParser, thinking: bool | None, content: str
) -> None:
    chat, _ = load(template)
    kwargs = {} if thinking is None else {"enable_thinking": thinking}
    history = [Message(role="user", content="Set it up.")]
    reasoning = "Tuning first." if thinking else None
    reply = Message(role="assistant", content=content, reasoning=reasoning, tool_calls=ECHOED_CALLS)
    sampled = assistant_output(chat, history, reply, TOOLS, kwargs)
    prompt = chat.render(history, TOOLS, add_generation_prompt=True, **kwargs)
    c = ParseContext("c9", prompt.endswith("<think>\n"), SCHEMAS)
    assert c.starts_in_reasoning == bool(thinking)

    out = parser.parse(sampled, c)
    assert out.parse_error is None
    assert (out.reasoning, out.content) == (reasoning, content or None)
    assert [(t.name, t.arguments) for t in out.tool_calls] == [
        (t.name, json.dumps(json.loads(t.arguments), ensure_ascii=False)) for t in ECHOED_CALLS
    ]
    assert_streams_like_whole(parser, sampled, c)
