"""Qwen3/Hermes output parser: reasoning, content and tool calls; never raises."""

import json

import pytest

from gateway.parsers.base import ParseContext, tool_call_id
from gateway.parsers.hermes import HermesParser
from gateway.parsers.registry import get_parser, parser_names


@pytest.fixture
def parser() -> HermesParser:
    p = get_parser("qwen3")
    assert isinstance(p, HermesParser)
    return p


def call(name: str, args: object) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": args}) + "\n</tool_call>"


def test_registry() -> None:
    assert {"qwen3", "hermes"} <= set(parser_names())
    with pytest.raises(ValueError, match=r"unknown model family 'nope'; known: .*qwen3"):
        get_parser("nope")


def test_plain_content(parser: HermesParser) -> None:
    out = parser.parse("Hello there.<|im_end|>", ParseContext("c1"))
    assert out.content == "Hello there."
    assert out.reasoning is None and out.tool_calls == [] and out.parse_error is None


def test_reasoning_with_explicit_open_tag(parser: HermesParser) -> None:
    out = parser.parse("<think>\nLet me think.\n</think>\n\nThe answer is 4.", ParseContext("c"))
    assert out.reasoning == "Let me think."
    assert out.content == "The answer is 4."


def test_reasoning_opened_by_generation_prompt(parser: HermesParser) -> None:
    out = parser.parse("step 1\nstep 2\n</think>\n\nDone.", ParseContext("c", True))
    assert out.reasoning == "step 1\nstep 2"
    assert out.content == "Done."
    # The model re-opening the block it was already in changes nothing.
    again = parser.parse("<think>step</think>ok", ParseContext("c", True))
    assert (again.reasoning, again.content) == ("step", "ok")


def test_unclosed_reasoning_is_all_reasoning(parser: HermesParser) -> None:
    out = parser.parse("thinking and then the budget ran o", ParseContext("c", True))
    assert out.reasoning == "thinking and then the budget ran o"
    assert out.content is None and out.parse_error is None
    out = parser.parse("<think>\nhalf a thou", ParseContext("c"))
    assert out.reasoning == "half a thou" and out.content is None


def test_bare_close_tag_without_flag(parser: HermesParser) -> None:
    out = parser.parse("hidden thoughts</think>\n\nvisible", ParseContext("c"))
    assert out.reasoning == "hidden thoughts"
    assert out.content == "visible"


def test_no_reasoning_when_thinking_disabled(parser: HermesParser) -> None:
    out = parser.parse("Just content, no tags.", ParseContext("c"))
    assert out.reasoning is None and out.content == "Just content, no tags."


def test_empty_reasoning_block(parser: HermesParser) -> None:
    out = parser.parse("<think>\n\n</think>\n\nHi", ParseContext("c"))
    assert out.reasoning is None and out.content == "Hi"


def test_single_tool_call_object_arguments(parser: HermesParser) -> None:
    out = parser.parse(call("bash", {"command": "ls -la"}) + "<|im_end|>", ParseContext("abc"))
    assert out.content is None and out.parse_error is None
    assert len(out.tool_calls) == 1
    tc = out.tool_calls[0]
    assert tc.id == "call_abc_0" == tool_call_id("abc", 0)
    assert tc.name == "bash"
    assert json.loads(tc.arguments) == {"command": "ls -la"}


def test_nested_braces_and_close_tag_inside_string(parser: HermesParser) -> None:
    args = {"path": "x.py", "text": "def f():\n    return {'a': {'b': 1}}  # </tool_call> }"}
    out = parser.parse(call("write", args), ParseContext("c"))
    assert out.parse_error is None
    assert json.loads(out.tool_calls[0].arguments) == args


def test_multiple_tool_calls_with_text_around(parser: HermesParser) -> None:
    text = (
        "<think>plan</think>\n\nI'll check two files.\n"
        + call("read", {"path": "a"})
        + "\n"
        + call("read", {"path": "b"})
        + "\n<|im_end|>"
    )
    out = parser.parse(text, ParseContext("k"))
    assert out.reasoning == "plan"
    assert out.content == "I'll check two files."
    assert [tc.id for tc in out.tool_calls] == ["call_k_0", "call_k_1"]
    assert [json.loads(tc.arguments)["path"] for tc in out.tool_calls] == ["a", "b"]


def test_string_arguments_kept_verbatim(parser: HermesParser) -> None:
    raw = '{"x":  1, "y": [1,2]}'
    out = parser.parse(call("f", raw), ParseContext("c"))
    assert out.tool_calls[0].arguments == raw


def test_missing_or_null_arguments_become_empty_object(parser: HermesParser) -> None:
    out = parser.parse('<tool_call>\n{"name": "now"}\n</tool_call>', ParseContext("c"))
    assert out.tool_calls[0].arguments == "{}"
    out = parser.parse(
        '<tool_call>\n{"name": "now", "arguments": null}\n</tool_call>', ParseContext("c")
    )
    assert out.tool_calls[0].arguments == "{}"


def test_parameters_alias(parser: HermesParser) -> None:
    out = parser.parse(
        '<tool_call>{"name": "f", "parameters": {"a": 1}}</tool_call>', ParseContext("c")
    )
    assert json.loads(out.tool_calls[0].arguments) == {"a": 1}


def test_malformed_json_is_left_as_text_and_flagged(parser: HermesParser) -> None:
    bad = '<tool_call>\n{"name": "f", "arguments": {"a": 1,}}\n</tool_call>'
    text = "Before " + bad + "\n" + call("ok", {"b": 2})
    out = parser.parse(text, ParseContext("z"))
    assert out.parse_error is not None and "block 1" in out.parse_error
    assert out.content is not None and bad in out.content and out.content.startswith("Before")
    # The valid call still parses and gets index 0 among the parsed calls.
    assert [(tc.id, tc.name) for tc in out.tool_calls] == [("call_z_0", "ok")]


@pytest.mark.parametrize(
    ("block", "reason"),
    [
        ('<tool_call>\n{"arguments": {}}\n</tool_call>', "no name"),
        ('<tool_call>\n{"name": "", "arguments": {}}\n</tool_call>', "no name"),
        ('<tool_call>\n["f", {}]\n</tool_call>', "not an object"),
        ('<tool_call>\n{"name": "f", "arguments": "not json"}\n</tool_call>', "not JSON"),
        ('<tool_call>\n{"name": "f", "arguments": "[1]"}\n</tool_call>', "not a JSON object"),
        ('<tool_call>\n{"name": "f", "arguments": 3}\n</tool_call>', "not an object"),
        ('<tool_call>\n{"name": "f"} trailing\n</tool_call>', "unexpected text"),
        ('<tool_call>\n{"name": "f", "arguments": {"a": 1}}', "unclosed"),
        ('<tool_call>\n{"name": "f", "argum', "unclosed"),
    ],
)
def test_malformed_variants(parser: HermesParser, block: str, reason: str) -> None:
    out = parser.parse("x " + block, ParseContext("c"))
    assert out.tool_calls == []
    assert out.parse_error is not None and reason in out.parse_error
    assert out.content == ("x " + block).strip()


def test_cjk_everywhere(parser: HermesParser) -> None:
    text = "<think>用户想要中文</think>\n\n好的，我来看看。" + call("搜索", {"查询": "天气 北京"})
    out = parser.parse(text, ParseContext("c"))
    assert out.reasoning == "用户想要中文"
    assert out.content == "好的，我来看看。"
    assert out.tool_calls[0].name == "搜索"
    # Non-ASCII stays literal (as the chat template's tojson renders it), not \\u-escaped.
    assert out.tool_calls[0].arguments == '{"查询": "天气 北京"}'


def test_end_markers_stripped(parser: HermesParser) -> None:
    out = parser.parse("Hi<|im_end|>\n<|endoftext|>", ParseContext("c"))
    assert out.content == "Hi"
    # A marker in the middle is not an end marker; it stays.
    out = parser.parse("a<|im_end|>b", ParseContext("c"))
    assert out.content == "a<|im_end|>b"


def test_tool_call_inside_reasoning_is_not_a_call(parser: HermesParser) -> None:
    text = "<think>maybe " + call("f", {}) + "</think>\n\nNo call after all."
    out = parser.parse(text, ParseContext("c"))
    assert out.tool_calls == []
    assert out.reasoning is not None and "<tool_call>" in out.reasoning
    assert out.content == "No call after all."


def test_deterministic(parser: HermesParser) -> None:
    text = "<think>r</think>" + call("f", {"a": 1}) + call("g", {"b": 2})
    assert parser.parse(text, ParseContext("same")) == parser.parse(text, ParseContext("same"))


def test_empty_text(parser: HermesParser) -> None:
    out = parser.parse("", ParseContext("c"))
    assert out.content is None and out.reasoning is None and out.tool_calls == []
