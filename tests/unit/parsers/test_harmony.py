"""gpt-oss (harmony) output: channels, recipients and terminators, parsed whole and streamed.

The texts are written the way the model samples them (special tokens kept by the
detokenizer); the round-trip cases render a parsed reply back through the real gpt-oss
template and parse what it wrote.
"""

from __future__ import annotations

import json
import random

import pytest

from gateway.canonical import Message, ParsedOutput, Tool, ToolCall
from gateway.parsers.base import ParseContext, TextDelta, ToolCallDone, tool_call_id
from gateway.parsers.harmony import END_MARKERS, HarmonyParser
from tests.fixtures.real_templates import load
from tests.unit.parsers.conformance import assert_streams_like_whole

CALL_ID = "hx1"
PARSER = HarmonyParser()
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOLS = {"get_weather": WEATHER, "get_time": {"type": "object", "properties": {}}}


def ctx(**kw: object) -> ParseContext:
    return ParseContext(CALL_ID, **kw)  # type: ignore[arg-type]


def analysis(text: str, *, opened: bool = True) -> str:
    return ("<|start|>assistant" if opened else "") + f"<|channel|>analysis<|message|>{text}<|end|>"


def final(text: str, *, opened: bool = True, end: str = "<|return|>") -> str:
    return ("<|start|>assistant" if opened else "") + f"<|channel|>final<|message|>{text}{end}"


def tool(name: str, args: str, *, opened: bool = True, constrain: bool = True) -> str:
    ctype = " <|constrain|>json" if constrain else ""
    head = "<|start|>assistant" if opened else ""
    return f"{head}<|channel|>commentary to=functions.{name}{ctype}<|message|>{args}<|call|>"


def parse(text: str, context: ParseContext | None = None) -> ParsedOutput:
    """The whole parse, checked against the stream for every chunking first. Once a
    terminator has closed the output, nothing is left to hold back: the stream showed it
    all (the finish adds only the parse note)."""
    context = context or ctx()
    streamed = assert_streams_like_whole(PARSER, text, context)
    whole = PARSER.parse(text, context)
    if text.endswith(("<|end|>", "<|call|>", "<|return|>")):
        assert streamed == whole.model_copy(update={"parse_error": None})
    return whole


def calls(*pairs: tuple[str, str]) -> list[ToolCall]:
    return [
        ToolCall(id=tool_call_id(CALL_ID, i), name=n, arguments=a) for i, (n, a) in enumerate(pairs)
    ]


# -- whole output ---------------------------------------------------------------------


def test_final_only() -> None:
    out = parse(final("Paris is the capital of France.", opened=False))
    assert out == ParsedOutput(content="Paris is the capital of France.")


def test_analysis_then_final() -> None:
    text = analysis("The user asks a capital.", opened=False) + final("It is Paris.")
    out = parse(text)
    assert out == ParsedOutput(reasoning="The user asks a capital.", content="It is Paris.")


def test_bodies_are_kept_as_written() -> None:
    """No stripping: the template renders thinking and content back verbatim."""
    text = analysis("\n  indented thought \n", opened=False) + final(" two  spaces\n\n")
    out = parse(text)
    assert out.reasoning == "\n  indented thought \n"
    assert out.content == " two  spaces\n\n"


def test_analysis_then_tool_call_keeps_the_arguments_as_written() -> None:
    args = '{"city":"Paris",  "unit": "C"}'
    text = analysis("Need the weather.", opened=False) + tool("get_weather", args)
    out = parse(text)
    assert out.reasoning == "Need the weather."
    assert out.content is None and out.parse_error is None
    assert out.tool_calls == calls(("get_weather", args))


def test_several_tool_calls_get_consecutive_ids() -> None:
    text = (
        analysis("Two lookups.", opened=False)
        + tool("get_weather", '{"city": "Oslo"}')
        + analysis("Now the time.")
        + tool("get_time", "{}")
    )
    out = parse(text)
    assert out.reasoning == "Two lookups.\nNow the time."
    assert out.tool_calls == calls(("get_weather", '{"city": "Oslo"}'), ("get_time", "{}"))


def test_preamble_commentary_is_content() -> None:
    text = (
        analysis("Tell the user first.", opened=False)
        + "<|start|>assistant<|channel|>commentary<|message|>Checking the forecast now.<|end|>"
        + tool("get_weather", '{"city": "Rome"}')
    )
    out = parse(text)
    assert out.reasoning == "Tell the user first."
    assert out.content == "Checking the forecast now."
    assert [c.name for c in out.tool_calls] == ["get_weather"]


def test_messages_of_one_field_are_joined_by_a_newline_and_empty_ones_skipped() -> None:
    text = (
        analysis("first", opened=False)
        + analysis("")
        + analysis("second")
        + "<|start|>assistant<|channel|>commentary<|message|>preamble<|end|>"
        + final("answer")
    )
    out = parse(text)
    assert out.reasoning == "first\nsecond"
    assert out.content == "preamble\nanswer"


@pytest.mark.parametrize("opened", [False, True], ids=["first-message", "after-start"])
@pytest.mark.parametrize("ctype", ["", " json", " <|constrain|>json", "<|constrain|>json"])
def test_recipient_before_the_channel(opened: bool, ctype: str) -> None:
    """The template writes `assistant to=functions.X<|channel|>commentary json`."""
    lead = analysis("Look it up.", opened=False) if opened else ""
    head = "<|start|>assistant" if opened else ""
    text = lead + f"{head} to=functions.get_weather<|channel|>commentary{ctype}<|message|>"
    text += '{"city": "Lima"}<|call|>'
    out = parse(text)
    assert out.parse_error is None
    assert out.tool_calls == calls(("get_weather", '{"city": "Lima"}'))


@pytest.mark.parametrize("ctype", ["", " json", " <|constrain|>json", "<|constrain|>json"])
def test_recipient_after_the_channel(ctype: str) -> None:
    """The model writes `<|constrain|>json`; harmony's own renderer a bare ` json`."""
    text = f"<|channel|>commentary to=functions.get_weather{ctype}<|message|>"
    out = parse(text + '{"city": "Kyiv"}<|call|>')
    assert out.parse_error is None
    assert out.tool_calls == calls(("get_weather", '{"city": "Kyiv"}'))


def test_tool_call_on_the_analysis_channel_is_still_a_call() -> None:
    """The recipient decides, whatever the channel (as vLLM does)."""
    head = "<|channel|>analysis to=functions.get_time <|constrain|>json<|message|>"
    text = head + '{"tz": "UTC"}<|call|>'
    out = parse(text)
    assert out.reasoning is None
    assert out.tool_calls == calls(("get_time", '{"tz": "UTC"}'))


def test_a_bare_recipient_names_a_function() -> None:
    text = '<|channel|>commentary to=get_time <|constrain|>json<|message|>{"tz": "CET"}<|call|>'
    out = parse(text)
    assert out.tool_calls == calls(("get_time", '{"tz": "CET"}'))


def test_empty_arguments_are_an_empty_object() -> None:
    out = parse(tool("get_time", "", opened=False))
    assert out.tool_calls == calls(("get_time", "{}"))


def test_a_tool_call_closed_by_end_instead_of_call() -> None:
    text = '<|channel|>commentary to=functions.get_time<|message|>{"tz": "EST"}<|end|>'
    out = parse(text)
    assert out.tool_calls == calls(("get_time", '{"tz": "EST"}'))


def test_whitespace_around_arguments_is_trimmed_and_the_json_left_alone() -> None:
    out = parse(tool("get_weather", ' \n{"city":"Baku"}\n', opened=False))
    assert out.tool_calls == calls(("get_weather", '{"city":"Baku"}'))


def test_reasoning_started_by_the_prompt() -> None:
    text = "still thinking<|end|>" + final("done")
    out = parse(text, ctx(starts_in_reasoning=True))
    assert out == ParsedOutput(reasoning="still thinking", content="done")


def test_known_tool_names_are_accepted_when_the_request_lists_tools() -> None:
    out = parse(tool("get_weather", '{"city": "Quito"}', opened=False), ctx(tools=TOOLS))
    assert out.tool_calls == calls(("get_weather", '{"city": "Quito"}'))


def test_non_ascii_arguments_stay_unescaped() -> None:
    out = parse(tool("get_weather", '{"city": "Zürich"}', opened=False))
    assert out.tool_calls == calls(("get_weather", '{"city": "Zürich"}'))


def test_end_of_text_after_the_return_adds_nothing() -> None:
    out = parse(final("bye", opened=False) + "<|endoftext|>")
    assert out == ParsedOutput(content="bye")


def test_a_served_model_s_own_end_marker_closes_a_message() -> None:
    """`parser_for_model` adds the model's stop tokens to `end_markers`."""
    parser = HarmonyParser()
    parser.end_markers = (*parser.end_markers, "<|eot|>")
    text = "<|channel|>final<|message|>short<|eot|>"
    assert_streams_like_whole(parser, text, ctx())
    assert parser.parse(text, ctx()) == ParsedOutput(content="short")
    assert PARSER.parse(text, ctx()).content == "short<|eot|>"


def test_end_markers() -> None:
    assert set(END_MARKERS) >= {"<|call|>", "<|return|>"}
    assert "<|end|>" not in END_MARKERS  # it closes a message, not the turn
    assert PARSER.end_markers == END_MARKERS
    assert PARSER.reasoning_tags is None


# -- malformed output: content with a parse error, never dropped ----------------------


def test_unknown_channel_comes_back_as_content() -> None:
    bad = "<|start|>assistant<|channel|>scratchpad<|message|>notes"
    out = parse(analysis("ok", opened=False) + bad + "<|end|>" + final("fine"))
    assert out.reasoning == "ok"
    assert out.content == bad + "\nfine"
    assert out.parse_error is not None and "scratchpad" in out.parse_error


def test_message_without_a_channel_comes_back_as_content() -> None:
    out = parse("<|message|>hello<|end|>")
    assert out.content == "<|message|>hello"
    assert out.parse_error is not None and "channel" in out.parse_error


def test_missing_message_token_comes_back_as_content() -> None:
    bad = "<|start|>assistant<|channel|>final The answer is 4."
    out = parse(analysis("think", opened=False) + bad + "<|return|>")
    assert out.reasoning == "think"
    assert out.content == bad
    assert out.parse_error is not None and "<|message|>" in out.parse_error


def test_plain_text_without_any_header_is_content() -> None:
    out = parse("Just an answer, no channels.")
    assert out.content == "Just an answer, no channels."
    assert out.parse_error is not None


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        ('{"city": "Paris"', "not JSON"),
        ("city=Paris", "not JSON"),
        ('["Paris"]', "not a JSON object"),
        ('{"city": "Paris"} trailing', "not JSON"),
    ],
)
def test_broken_arguments_come_back_as_content(args: str, problem: str) -> None:
    bad = tool("get_weather", args, opened=True).removesuffix("<|call|>")
    out = parse(analysis("try", opened=False) + bad + "<|call|>")
    assert out.tool_calls == []
    assert out.content == bad
    assert out.parse_error is not None and problem in out.parse_error


def test_a_broken_call_does_not_spoil_the_next_one() -> None:
    bad = tool("get_weather", "{oops}", opened=False)
    good = tool("get_time", '{"tz": "JST"}')
    out = parse(bad + good)
    assert out.content == bad.removesuffix("<|call|>")
    assert out.tool_calls == calls(("get_time", '{"tz": "JST"}'))


def test_unknown_tool_name_comes_back_as_content_when_the_request_lists_tools() -> None:
    text = tool("send_mail", '{"to": "x"}', opened=False)
    out = parse(text, ctx(tools=TOOLS))
    assert out.tool_calls == []
    assert out.content == text.removesuffix("<|call|>")
    assert out.parse_error is not None and "send_mail" in out.parse_error


@pytest.mark.parametrize("recipient", ["python", "browser.search", "functions.", "assistant"])
def test_a_message_to_something_other_than_a_function_is_content(recipient: str) -> None:
    bad = f"<|channel|>analysis to={recipient} code<|message|>print(2 + 2)"
    out = parse(bad + "<|call|>")
    assert out.tool_calls == [] and out.reasoning is None
    assert out.content == bad
    assert out.parse_error is not None


def test_a_message_from_another_role_is_content() -> None:
    """A model writing the tool's answer itself."""
    bad = '<|start|>functions.get_time to=assistant<|channel|>commentary<|message|>"noon"'
    out = parse(tool("get_time", "{}", opened=False) + bad + "<|end|>")
    assert out.tool_calls == calls(("get_time", "{}"))
    assert out.content == bad
    assert out.parse_error is not None and "functions.get_time" in out.parse_error


def test_a_message_left_open_before_the_next_start() -> None:
    text = "<|channel|>analysis<|message|>forgot to close" + final("answer")
    out = parse(text)
    assert out == ParsedOutput(reasoning="forgot to close", content="answer")


# -- cut at max_tokens ------------------------------------------------------------------


def test_cut_in_analysis_is_reasoning() -> None:
    out = parse(analysis("a long thou", opened=False).removesuffix("<|end|>"))
    assert out == ParsedOutput(reasoning="a long thou")


def test_cut_in_final_is_content() -> None:
    out = parse(
        analysis("ok", opened=False) + "<|start|>assistant<|channel|>final<|message|>The ans"
    )
    assert out == ParsedOutput(reasoning="ok", content="The ans")


def test_cut_after_complete_arguments_is_a_call() -> None:
    text = tool("get_weather", '{"city": "Doha"}', opened=False).removesuffix("<|call|>")
    out = parse(text)
    assert out.tool_calls == calls(("get_weather", '{"city": "Doha"}'))


def test_cut_inside_arguments_is_content() -> None:
    text = tool("get_weather", '{"city": "Do', opened=False).removesuffix("<|call|>")
    out = parse(text)
    assert out.tool_calls == []
    assert out.content == text
    assert out.parse_error is not None and "cut off" in out.parse_error


@pytest.mark.parametrize("tail", ["<|start|>assistant", "<|start|>", "\n"])
def test_cut_before_a_header_said_anything_adds_nothing(tail: str) -> None:
    out = parse(analysis("done", opened=False) + tail)
    assert out == ParsedOutput(reasoning="done")


def test_cut_inside_a_header_is_content() -> None:
    tail = "<|start|>assistant<|channel|>commentary to=functions.get_we"
    out = parse(analysis("done", opened=False) + tail)
    assert out.reasoning == "done"
    assert out.content == tail
    assert out.parse_error is not None


# -- streaming --------------------------------------------------------------------------


def test_body_text_is_sent_as_it_arrives() -> None:
    """Only a tail that may start a terminator waits."""
    splitter = PARSER.splitter(ctx())
    assert splitter.feed("<|channel|>analysis<|message|>") == []
    assert splitter.feed("abc") == [TextDelta("reasoning", "abc")]
    assert splitter.feed("d<") == [TextDelta("reasoning", "d")]
    assert splitter.feed("|e") == []
    assert splitter.feed("x") == [TextDelta("reasoning", "<|ex")]
    assert splitter.feed("<|end|><|start|>assistant<|channel|>final<|message|>Hi") == [
        TextDelta("content", "Hi")
    ]


def test_a_header_waits_for_its_message_token() -> None:
    splitter = PARSER.splitter(ctx())
    assert splitter.feed("<|channel|>fin") == []
    assert splitter.feed("al<|message|>ok") == [TextDelta("content", "ok")]


def test_a_tool_call_is_done_at_its_call_token() -> None:
    splitter = PARSER.splitter(ctx())
    head = "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
    assert splitter.feed(head + '{"city": "Oslo"}') == []
    events = splitter.feed("<|call|>")
    assert events == [ToolCallDone(calls(("get_weather", '{"city": "Oslo"}'))[0])]


def test_a_broken_call_is_sent_as_content_once_closed() -> None:
    splitter = PARSER.splitter(ctx())
    head = "<|channel|>commentary to=functions.get_weather<|message|>"
    assert splitter.feed(head + "{nope") == []
    assert splitter.feed("<|call|>") == [TextDelta("content", head + "{nope")]


def test_a_second_message_of_a_field_starts_with_the_newline() -> None:
    splitter = PARSER.splitter(ctx())
    splitter.feed(analysis("one", opened=False))
    events = splitter.feed("<|start|>assistant<|channel|>analysis<|message|>two")
    assert events == [TextDelta("reasoning", "\ntwo")]


PIECES = (
    "<|start|>", "assistant", "<|channel|>", "analysis", "final", "commentary", "junk",
    " to=functions.get_time", " to=python", "to=functions.f", "<|constrain|>", "json", " ",
    "<|message|>", "<|end|>", "<|call|>", "<|return|>", "<|endoftext|>", '{"tz": "UTC"}',
    "{", "}", "text", "\n", "<", "|", "<|",
)  # fmt: skip


@pytest.mark.parametrize("seed", range(6))
def test_any_sequence_of_harmony_pieces_streams_like_the_whole(seed: int) -> None:
    """Well-formed or not, every chunking shows only a start of the whole parse, and once
    a terminator ends the text the stream has shown all of it."""
    rng = random.Random(seed)
    for _ in range(60):
        text = "".join(rng.choice(PIECES) for _ in range(rng.randint(1, 16)))
        context = ctx(starts_in_reasoning=rng.random() < 0.2)
        parse(text, context)


# -- echo through the real template -----------------------------------------------------

TEMPLATE_TOOLS = [
    Tool(name="get_weather", description="Current weather.", parameters=WEATHER),
    Tool(
        name="get_time",
        description="Current time.",
        parameters={"type": "object", "properties": {}},
    ),
]
QUESTION = Message(role="user", content="Weather in Paris?")


def echo(parsed: ParsedOutput) -> Message:
    """The assistant message an agent sends back for a parsed reply."""
    return Message(
        role="assistant",
        content=parsed.content,
        reasoning=parsed.reasoning,
        tool_calls=parsed.tool_calls,
    )


def rendered_reply(history: list[Message], reply: Message, after: Message) -> str:
    """What the template writes for `reply` where the model had sampled it: the text
    between the generation prompt and the message that follows."""
    template, _ = load("gpt-oss")
    prompt = template.render(history, TEMPLATE_TOOLS)
    assert prompt.endswith("<|start|>assistant")
    full = template.render([*history, reply, after], TEMPLATE_TOOLS)
    assert full.startswith(prompt)
    rest = full[len(prompt) :]
    follows = template.render([*history, reply, after], TEMPLATE_TOOLS, add_generation_prompt=False)
    # What comes after the reply: `after`'s own rendering, opened by `<|start|>`.
    tail = "<|start|>" + follows.rsplit("<|start|>", 1)[1]
    assert rest.endswith(tail + "<|start|>assistant")
    return rest[: -len(tail + "<|start|>assistant")]


def tool_result(parsed: ParsedOutput) -> Message:
    return Message(role="tool", content="18 C, clear", tool_call_id=parsed.tool_calls[0].id)


@pytest.mark.parametrize(
    "args", ['{"city": "Paris"}', '{"city":"Paris"}'], ids=["spaced", "compact"]
)
def test_a_tool_call_echo_parses_back_to_the_same_call_and_reasoning(args: str) -> None:
    sampled = analysis("I should call the weather tool.", opened=False) + tool("get_weather", args)
    parsed = PARSER.parse(sampled, ctx())
    assert parsed.tool_calls and parsed.parse_error is None
    text = rendered_reply([QUESTION], echo(parsed), tool_result(parsed))
    # The template's spelling differs from the model's: recipient before the channel,
    # a bare `json` content type, arguments re-serialised by `tojson`.
    assert " to=functions.get_weather<|channel|>commentary json<|message|>" in text
    again = parse(text)
    assert again.reasoning == parsed.reasoning and again.content is None
    assert [(c.id, c.name) for c in again.tool_calls] == [(c.id, c.name) for c in parsed.tool_calls]
    assert json.loads(again.tool_calls[0].arguments) == json.loads(args)
    if args == json.dumps(json.loads(args), ensure_ascii=False):
        assert again == parsed


def test_a_final_answer_echo_keeps_its_content_and_drops_its_reasoning() -> None:
    """Earlier turns' analysis is never rendered back (the template drops it)."""
    sampled = analysis("Simple.", opened=False) + final("It is 18 C in Paris.")
    parsed = PARSER.parse(sampled, ctx())
    text = rendered_reply([QUESTION], echo(parsed), Message(role="user", content="Thanks"))
    assert parse(text) == ParsedOutput(content="It is 18 C in Paris.")


def test_a_preamble_echo_comes_back_as_reasoning() -> None:
    """The template renders a tool-call message's content on the analysis channel."""
    sampled = "<|channel|>commentary<|message|>Let me check.<|end|>" + tool("get_time", "{}")
    parsed = PARSER.parse(sampled, ctx())
    assert parsed.content == "Let me check." and parsed.reasoning is None
    text = rendered_reply([QUESTION], echo(parsed), tool_result(parsed))
    again = parse(text)
    assert again.reasoning == "Let me check." and again.content is None
    assert again.tool_calls == parsed.tool_calls


def test_a_preamble_beside_reasoning_is_echoed_as_vllm_renders_it() -> None:
    """A tool-call turn with analysis and a preamble: the template refuses both (its own
    rule), so the echo renders as vLLM renders it, the preamble without the analysis."""
    sampled = (
        analysis("Think.", opened=False)
        + "<|start|>assistant<|channel|>commentary<|message|>Checking.<|end|>"
        + tool("get_time", "{}")
    )
    parsed = PARSER.parse(sampled, ctx())
    assert parsed.reasoning and parsed.content and parsed.tool_calls
    template, _ = load("gpt-oss")
    out = template.render([QUESTION, echo(parsed), tool_result(parsed)], TEMPLATE_TOOLS)
    assert "Checking." in out and "Think." not in out


def test_the_template_s_training_rendering_of_a_reply_parses_back_to_it() -> None:
    """A last assistant turn without a generation prompt is rendered as the model is
    trained to sample it: its analysis, then the final answer closed by `<|return|>`."""
    reply = ParsedOutput(reasoning="Short question.", content="Paris.")
    template, _ = load("gpt-oss")
    prompt = template.render([QUESTION], TEMPLATE_TOOLS)
    full = template.render([QUESTION, echo(reply)], TEMPLATE_TOOLS, add_generation_prompt=False)
    assert full.startswith(prompt) and full.endswith("<|return|>")
    assert parse(full[len(prompt) :]) == reply
