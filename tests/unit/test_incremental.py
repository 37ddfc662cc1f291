"""Incremental tokenization with held tokens: one segment per conversation, token-exact.

A tiny byte-level BPE is trained here (milliseconds) on text with CJK, so that two
single-character tokens re-encode to one merged token, and a small ChatML template
written for this test drops earlier reasoning on re-render, as Qwen3-style ones do.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path

import pytest
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

from gateway.canonical import Message, Tool, ToolCall
from gateway.prompt.chat_template import ChatTemplate
from gateway.prompt.incremental.held_segments import HeldSegment
from gateway.prompt.incremental.matching import request_keys
from gateway.prompt.incremental.message_keys import hash_template_kwargs, hash_tools, message_key
from gateway.prompt.incremental.normalisers import DEFAULT_NORMALISERS
from gateway.prompt.incremental.planner import IncrementalTokenizer, PromptPlan
from gateway.prompt.incremental.tokenizer_adapter import TokenizersAdapter, load_tokenizer
from schemas.trajectory import MatchKind

IM_START, IM_END = "<|im_start|>", "<|im_end|>"
MARKUP = [
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
]

TEMPLATE = """\
{#- Test template: ChatML turns; reasoning is shown only after the last user turn. -#}
{%- set ns = namespace(last_user=-1) -%}
{%- for m in messages -%}
  {%- if m.role == 'user' -%}{%- set ns.last_user = loop.index0 -%}{%- endif -%}
{%- endfor -%}
{%- for m in messages -%}
  {%- if m.role == 'system' -%}
    {{- '<|im_start|>system\\n' + m.content -}}
    {%- for t in tools or [] -%}{{- '\\n' + (t | tojson) -}}{%- endfor -%}
    {{- '<|im_end|>\\n' -}}
  {%- elif m.role == 'assistant' -%}
    {{- '<|im_start|>assistant\\n' -}}
    {%- if loop.index0 > ns.last_user and m.reasoning_content -%}
      {{- '<think>\\n' + m.reasoning_content + '\\n</think>\\n\\n' -}}
    {%- endif -%}
    {{- m.content -}}
    {%- for c in m.tool_calls or [] -%}
      {%- set call = {'name': c.function.name, 'arguments': c.function.arguments} -%}
      {{- '<tool_call>\\n' + (call | tojson) + '\\n</tool_call>' -}}
    {%- endfor -%}
    {{- '<|im_end|>\\n' -}}
  {%- elif m.role == 'tool' -%}
    {%- if loop.first or loop.previtem.role != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}
    {{- '\\n<tool_response>\\n' + m.content + '\\n</tool_response>' -}}
    {%- if loop.last or loop.nextitem.role != 'tool' -%}{{- '<|im_end|>\\n' -}}{%- endif -%}
  {%- else -%}
    {{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' -}}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}
"""

CORPUS = [
    "你好 你好 你 好 你们 好的 天气 很好 北京 你好吗",
    "List the files and read them, then run the tests again.",
    "The file a.py prints hi; b.py has five lines of code.",
    '{"name": "bash", "arguments": {"cmd": "ls -la"}}',
    "Summary: both files are small. It printed hi. Thanks, bye!",
] * 40


@pytest.fixture(scope="module")
def hf_tokenizer() -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=700,
        min_frequency=2,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer)
    tok.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in (IM_START, IM_END)]
    )
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in MARKUP])
    return tok


class CountingTokenizer(TokenizersAdapter):
    """Records how many characters were encoded: the held part must never be."""

    def __init__(self, tok: Tokenizer) -> None:
        super().__init__(tok)
        self.encoded_chars: list[int] = []

    def encode(self, text: str) -> list[int]:
        self.encoded_chars.append(len(text))
        return super().encode(text)


@pytest.fixture()
def tokenizer(hf_tokenizer: Tokenizer) -> CountingTokenizer:
    return CountingTokenizer(hf_tokenizer)


@pytest.fixture()
def planner(tokenizer: CountingTokenizer) -> IncrementalTokenizer:
    template = ChatTemplate(TEMPLATE, bos_token=None, eos_token=IM_END)
    return IncrementalTokenizer(template, tokenizer, eot_token=IM_END)


TOOLS = [
    Tool(name="bash", description="Run a command.", parameters={"type": "object"}),
    Tool(name="read", description="Read a file.", parameters={"type": "object"}),
]


def call(i: int, name: str, **args: str) -> ToolCall:
    return ToolCall(id=f"call_{i}", name=name, arguments=json.dumps(args))


def tool(i: int, content: str) -> Message:
    return Message(role="tool", content=content, tool_call_id=f"call_{i}")


def user(content: str) -> Message:
    return Message(role="user", content=content)


def chatml(messages: Sequence[Message]) -> str:
    """Independent oracle: how TEMPLATE renders new user/tool messages."""
    out, i = "", 0
    while i < len(messages):
        if messages[i].role == "tool":
            out += IM_START + "user"
            while i < len(messages) and messages[i].role == "tool":
                out += f"\n<tool_response>\n{messages[i].content}\n</tool_response>"
                i += 1
            out += IM_END + "\n"
        else:
            out += f"{IM_START}{messages[i].role}\n{messages[i].content}{IM_END}\n"
            i += 1
    return out


def sampled(
    tok: CountingTokenizer, reply: Message, cut: bool = False, split: str = ""
) -> list[int]:
    """What "the engine" samples for a reply: reasoning, content, tool calls, <|im_end|>.

    `split` (a CJK word in the content) is sampled one token per character, a legal
    sample whose text re-encodes to fewer tokens.
    """
    encode = lambda text: TokenizersAdapter.encode(tok, text)  # noqa: E731
    text = f"<think>\n{reply.reasoning}\n</think>\n\n" if reply.reasoning is not None else ""
    text += reply.content or ""
    for c in reply.tool_calls:
        body = json.dumps({"name": c.name, "arguments": json.loads(c.arguments)})
        text += f"<tool_call>\n{body}\n</tool_call>"
    if split:
        before, after = text.split(split)
        singles = [encode(ch) for ch in split]
        assert all(len(ids) == 1 for ids in singles) and len(encode(split)) == 1
        ids = encode(before) + [i[0] for i in singles] + encode(after)
        assert tok.decode(ids) == text and encode(text) != ids
    else:
        ids = encode(text)
    return ids if cut else [*ids, encode(IM_END)[0]]


# -- the 10-turn conversation ---------------------------------------------------------


@dataclass
class Turn:
    new: list[Message]
    reply: Message
    echo: Message | None = None  # how the client echoes the reply next turn (None: exact)
    expect: MatchKind = MatchKind.clean  # kind of the NEXT call
    drift: list[str] = field(default_factory=list)
    cut: bool = False
    split: str | None = None


def ten_turns() -> list[Turn]:
    r = lambda content="", reasoning=None, calls=(): Message(  # noqa: E731
        role="assistant", content=content, reasoning=reasoning, tool_calls=list(calls)
    )
    t0 = r("", "I will list files.", [call(0, "bash", cmd="ls")])
    t1 = r("", "Read a.py next.", [call(1, "read", path="a.py", mode="text")])
    t2 = r("a.py prints hi. 你好", "It prints.")
    t3 = r("", "Run it.", [call(3, "bash", cmd="python a.py")])
    t4 = r("It printed hi.", "Ok.")
    t5 = r(
        "", "Count both.", [call(50, "bash", cmd="wc -l a.py"), call(51, "bash", cmd="wc -l b.py")]
    )
    t6 = r("a.py has 3 lines, b.py has 5 lines.", "Easy.")
    t7 = r("", "Let me think about the summ")  # cut by max_tokens inside reasoning
    t8 = r("Summary: both files are small.", "Now.")
    t9 = r("Bye!", "Done.")
    reserialised = '{ "mode" : "text", "path" : "a.py" }'
    return [
        Turn(
            [
                Message(role="system", content="You are a coding agent."),
                user("List the files, 你好"),
            ],
            t0,
        ),
        Turn(
            [tool(0, "a.py b.py")],
            t1,
            echo=t1.model_copy(
                update={
                    "tool_calls": [t1.tool_calls[0].model_copy(update={"arguments": reserialised})]
                }
            ),
            expect=MatchKind.realign,
            drift=["message 4 (assistant): tool-call arguments re-serialised"],
        ),
        Turn(
            [tool(1, "print('hi')")],
            t2,
            echo=t2.model_copy(update={"reasoning": None}),
            expect=MatchKind.realign,
            drift=["message 6 (assistant): reasoning dropped by client"],
            split="你好",
        ),
        Turn(
            [user("Run it")],
            t3,
            echo=t3.model_copy(update={"content": None}),
            expect=MatchKind.realign,
            drift=["message 8 (assistant): content None vs empty"],
        ),
        Turn(
            [tool(3, "hi")],
            t4,
            echo=t4.model_copy(update={"content": "  It printed hi.\n"}),
            expect=MatchKind.realign,
            drift=["message 10 (assistant): surrounding whitespace"],
        ),
        Turn(
            [user("Two things: count lines in both files.")],
            t5,
            echo=t5.model_copy(
                update={
                    "reasoning": None,
                    "tool_calls": [
                        c.model_copy(update={"id": f"toolu_{c.id}"}) for c in t5.tool_calls
                    ],
                }
            ),
            expect=MatchKind.realign,
            drift=["message 12 (assistant): reasoning dropped by client, tool-call ids rewritten"],
        ),
        Turn([tool(50, "3 a.py"), tool(51, "5 b.py")], t6),
        Turn(
            [user("Make a summary")],
            t7,
            echo=t7.model_copy(update={"reasoning": None}),
            expect=MatchKind.realign,
            drift=[
                "message 17 (assistant): reasoning dropped by client",
                "message 17 (assistant): cut at max_tokens, closed with '<|im_end|>' "
                "(prompt tokens, not trained)",
            ],
            cut=True,
        ),
        Turn([user("Please continue.")], t8),
        Turn([user("Thanks")], t9),
    ]


def _tool_results_follow_ids(turns: list[Turn]) -> None:
    """Tool results answer the ids as the client knows them (rewritten at turn 5)."""
    turns[6].new = [tool(50, "3 a.py"), tool(51, "5 b.py")]
    for m in turns[6].new:
        m.tool_call_id = f"toolu_{m.tool_call_id}"


def test_ten_turn_tool_conversation_stays_one_token_exact_segment(
    planner: IncrementalTokenizer, tokenizer: CountingTokenizer
) -> None:
    turns = ten_turns()
    _tool_results_follow_ids(turns)
    segments: list[HeldSegment] = []
    history: list[Message] = []
    expected_ids: list[int] = []
    expected_mask: list[int] = []
    previous: Turn | None = None
    for turn in turns:
        history = [*history, *turn.new]
        tokenizer.encoded_chars.clear()
        plan = planner.prepare(segments, history, TOOLS)
        if previous is None:
            assert plan.kind is MatchKind.fork and plan.parent_id is None
            new_ids = TokenizersAdapter.encode(tokenizer, planner.template.render(history, TOOLS))
        else:
            assert (plan.kind, plan.drift) == (previous.expect, previous.drift)
            opener = IM_END if previous.cut else ""  # the template closes a cut reply
            new_text = opener + "\n" + chatml(turn.new) + IM_START + "assistant\n"
            assert plan.new_text == new_text
            new_ids = TokenizersAdapter.encode(tokenizer, new_text)
            assert plan.prompt_ids[: plan.base_length] == segments[0].ids
            assert tokenizer.encoded_chars == [len(new_text)]  # never the held part
        assert plan.new_token_count == len(new_ids)
        expected_ids += new_ids
        expected_mask += [0] * len(new_ids)
        assert plan.prompt_ids == expected_ids

        out = sampled(tokenizer, turn.reply, cut=turn.cut, split=turn.split or "")
        logprobs = [-0.25 - i / 1000 for i in range(len(out))]
        seg = planner.commit(
            segments, plan, out, logprobs, turn.reply, finished_with_eot=not turn.cut
        )
        expected_ids += out
        expected_mask += [1] * len(out)
        assert len(segments) == 1 and seg is segments[0]
        assert seg.ids == expected_ids and seg.mask == expected_mask
        assert [lp for lp, m in zip(seg.logprobs, seg.mask, strict=True) if m][
            -len(out) :
        ] == logprobs
        history = [*history, turn.echo or turn.reply]
        previous = turn

    seg = segments[0]
    assert seg.calls == 10 and seg.version == 9
    assert all(lp == 0.0 for lp, m in zip(seg.logprobs, seg.mask, strict=True) if not m)
    held_text = tokenizer.decode(seg.ids)
    assert "I will list files." in held_text  # reasoning the agent never sees is held
    assert "I will list files." not in planner.template.render(history, TOOLS)
    assert (
        TokenizersAdapter.encode(tokenizer, held_text) != seg.ids
    )  # re-encoding would lose the sampled split
    view = seg.export()
    first_prompt = len(
        TokenizersAdapter.encode(tokenizer, planner.template.render(history[:2], TOOLS))
    )
    assert view.prompt_ids == seg.ids[:first_prompt]
    assert view.response_ids == seg.ids[first_prompt:]
    assert (
        view.loss_mask == seg.mask[first_prompt:] and view.logprobs == seg.logprobs[first_prompt:]
    )


def test_windowed_and_full_renders_plan_the_same_ids(tokenizer: CountingTokenizer) -> None:
    """The ten turns (drifting echoes, a cut reply, CJK split samples) through a planner
    rendering windows and one rendering whole conversations: the same ids at every call."""
    template = ChatTemplate(TEMPLATE, bos_token=None, eos_token=IM_END)
    windowed = IncrementalTokenizer(template, tokenizer, eot_token=IM_END)
    full = IncrementalTokenizer(template, tokenizer, eot_token=IM_END, windowing=False)
    assert (windowed.windowing.mode, windowed.windowing.head) == ("window", "system")
    assert full.windowing.mode == "full"
    turns = ten_turns()
    _tool_results_follow_ids(turns)
    held: dict[str, list[HeldSegment]] = {"window": [], "full": []}
    history: list[Message] = []
    for index, turn in enumerate(turns):
        history = [*history, *turn.new]
        plans = {
            mode: planner.prepare(held[mode], history, TOOLS)
            for mode, planner in (("window", windowed), ("full", full))
        }
        assert plans["window"].prompt_ids == plans["full"].prompt_ids
        assert plans["window"].new_text == plans["full"].new_text
        assert plans["window"].rendered == ("window" if index else "full")
        assert plans["full"].rendered == "full"
        out = sampled(tokenizer, turn.reply, cut=turn.cut, split=turn.split or "")
        for mode, planner in (("window", windowed), ("full", full)):
            planner.commit(held[mode], plans[mode], out, [0.0] * len(out), turn.reply, not turn.cut)
        history = [*history, turn.echo or turn.reply]
    assert held["window"][0].ids == held["full"][0].ids
    assert len(held["window"]) == len(held["full"]) == 1


def test_non_canonical_sampled_tokens_are_kept(
    planner: IncrementalTokenizer, tokenizer: CountingTokenizer
) -> None:
    segments: list[HeldSegment] = []
    history = [user("Say hello in Chinese")]
    plan = planner.prepare(segments, history, [])
    reply = Message(role="assistant", content="你好")
    out = sampled(tokenizer, reply, split="你好")
    assert tokenizer.decode(out[:-1]) == "你好" and len(out) == 3
    planner.commit(segments, plan, out, [-1.0] * 3, reply, True)
    history = [*history, reply, user("again")]
    plan = planner.prepare(segments, history, [])
    assert plan.kind is MatchKind.clean
    assert plan.prompt_ids[plan.base_length - 3 : plan.base_length] == out


# -- forks ----------------------------------------------------------------------------


def _two_calls(
    planner: IncrementalTokenizer, tokenizer: CountingTokenizer
) -> tuple[list[HeldSegment], list[Message]]:
    segments: list[HeldSegment] = []
    history = [Message(role="system", content="sys"), user("list files")]
    reply = Message(role="assistant", content="", tool_calls=[call(0, "bash", cmd="ls")])
    plan = planner.prepare(segments, history, TOOLS)
    out = sampled(tokenizer, reply)
    planner.commit(segments, plan, out, [0.0] * len(out), reply, True)
    return segments, [*history, reply, tool(0, "a.py")]


def test_held_messages_passed_again_keep_their_keys(
    planner: IncrementalTokenizer, tokenizer: CountingTokenizer
) -> None:
    """Messages the request passes again as the held objects take the held keys; equal
    copies are keyed anew, to the same keys and the same plan."""
    segments, history = _two_calls(planner, tokenizer)
    held = segments[0]
    plan = planner.prepare(segments, history, TOOLS)
    assert plan.message_keys == [message_key(m) for m in history]
    assert [a is b for a, b in zip(plan.message_keys, held.message_keys, strict=False)] == [
        True,
        True,
        True,  # the reply: the held segment holds the very object the client sent back
    ]
    copies = [m.model_copy(deep=True) for m in history]
    again = planner.prepare(segments, copies, TOOLS)
    assert again.message_keys == plan.message_keys
    assert not any(a is b for a, b in zip(again.message_keys, held.message_keys, strict=False))
    assert (again.kind, again.prompt_ids) == (plan.kind, plan.prompt_ids)
    new_system = [history[0].model_copy(), *history[1:]]  # converted anew, as Messages does
    keys = planner.prepare(segments, new_system, TOOLS).message_keys
    assert [a is b for a, b in zip(keys, held.message_keys, strict=False)] == [False, True, True]
    edited = [*history[:1], user("list ALL files"), *history[2:]]
    assert planner.prepare(segments, edited, TOOLS).kind is MatchKind.fork


def test_injected_reminders_dropped_on_resend_are_forgiven(
    planner: IncrementalTokenizer, tokenizer: CountingTokenizer
) -> None:
    """Claude Code puts <system-reminder> blocks into a user turn and resends that turn
    without them later: still the same conversation, and the held tokens (what the model
    saw, reminder included) win."""
    segments: list[HeldSegment] = []
    asked = user("list files\n<system-reminder>\nTodo list is empty.\n</system-reminder>")
    history = [Message(role="system", content="sys"), asked]
    reply = Message(role="assistant", content="", tool_calls=[call(0, "bash", cmd="ls")])
    plan = planner.prepare(segments, history, TOOLS)
    out = sampled(tokenizer, reply)
    planner.commit(segments, plan, out, [0.0] * len(out), reply, True)
    held = list(segments[0].ids)
    resent = [history[0], user("list files"), reply, tool(0, "a.py")]
    plan = planner.prepare(segments, resent, TOOLS)
    assert plan.kind is MatchKind.realign
    assert plan.drift == ["message 1 (user): injected blocks"]
    assert plan.prompt_ids[: len(held)] == held
    assert "Todo list is empty." in tokenizer.decode(plan.prompt_ids)
    strict = IncrementalTokenizer(
        planner.template,
        tokenizer,
        normalisers=[n for n in DEFAULT_NORMALISERS if n.name != "injected blocks"],
    )
    segments2: list[HeldSegment] = []
    plan = strict.prepare(segments2, history, TOOLS)
    strict.commit(segments2, plan, out, [0.0] * len(out), reply, True)
    assert strict.prepare(segments2, resent, TOOLS).kind is MatchKind.fork


def test_fork_when_history_is_edited(
    planner: IncrementalTokenizer, tokenizer: CountingTokenizer
) -> None:
    segments, history = _two_calls(planner, tokenizer)
    held = list(segments[0].ids)
    edited = [history[0], user("list ALL files"), *history[2:]]
    plan = planner.prepare(segments, edited, TOOLS)
    assert plan.kind is MatchKind.fork and plan.base_length == 0
    assert plan.parent_id is None  # only the system prompt is shared
    assert plan.fork_reason == "no held segment starts like this conversation"
    edited_reply = [*history[:2], history[2].model_copy(update={"content": "changed"}), history[3]]
    plan = planner.prepare(segments, edited_reply, TOOLS)
    assert plan.kind is MatchKind.fork and plan.parent_id == segments[0].segment_id
    seg = planner.commit(
        segments, plan, [1, 2], [0.0, 0.0], Message(role="assistant", content="x"), False
    )
    assert len(segments) == 2 and seg.parent_id == segments[0].segment_id
    assert segments[0].ids == held  # the original is untouched
    assert seg.ids == [*plan.prompt_ids, 1, 2] and seg.mask == [0] * len(plan.prompt_ids) + [1, 1]


def test_fork_when_tools_or_template_kwargs_change(
    planner: IncrementalTokenizer, tokenizer: CountingTokenizer
) -> None:
    segments, history = _two_calls(planner, tokenizer)
    plan = planner.prepare(segments, history, TOOLS[:1])
    assert (plan.kind, plan.fork_reason) == (MatchKind.fork, "tools changed")
    assert plan.parent_id == segments[0].segment_id
    plan = planner.prepare(segments, history, TOOLS, {"enable_thinking": False})
    assert (plan.kind, plan.fork_reason) == (MatchKind.fork, "template kwargs changed")
    assert planner.prepare(segments, history, TOOLS).kind is MatchKind.clean


def test_fork_when_the_request_does_not_go_beyond_held_messages(
    planner: IncrementalTokenizer, tokenizer: CountingTokenizer
) -> None:
    segments, history = _two_calls(planner, tokenizer)
    retry = history[:2]  # the same call again
    plan = planner.prepare(segments, retry, TOOLS)
    assert plan.kind is MatchKind.fork and plan.parent_id == segments[0].segment_id
    assert plan.fork_reason == "request does not go beyond the held messages (retry or rewind)"
    assert plan.prompt_ids == segments[0].ids[: segments[0].prompt_length]


def test_reasoning_must_be_forgiven_only_by_the_configured_normalisers(
    tokenizer: CountingTokenizer,
) -> None:
    template = ChatTemplate(TEMPLATE, bos_token=None, eos_token=IM_END)
    strict = IncrementalTokenizer(template, tokenizer, normalisers=DEFAULT_NORMALISERS[1:])
    segments: list[HeldSegment] = []
    reply = Message(role="assistant", content="hi", reasoning="think")
    plan = strict.prepare(segments, [user("q")], [])
    strict.commit(
        segments,
        plan,
        sampled(tokenizer, reply),
        [0.0] * len(sampled(tokenizer, reply)),
        reply,
        True,
    )
    stripped = reply.model_copy(update={"reasoning": None})
    assert strict.prepare(segments, [user("q"), stripped, user("q2")], []).kind is MatchKind.fork


# -- boundaries -----------------------------------------------------------------------


def test_reply_cut_by_length_is_closed_by_the_template(
    planner: IncrementalTokenizer, tokenizer: CountingTokenizer
) -> None:
    segments: list[HeldSegment] = []
    reply = Message(role="assistant", content="A long ans")
    plan = planner.prepare(segments, [user("q")], [])
    out = sampled(tokenizer, reply, cut=True)
    seg = planner.commit(segments, plan, out, [0.0] * len(out), reply, finished_with_eot=False)
    assert not seg.reply_finished
    plan = planner.prepare(segments, [user("q"), reply, user("shorter please")], [])
    assert plan.kind is MatchKind.clean
    assert (
        plan.new_text == f"{IM_END}\n{IM_START}user\nshorter please{IM_END}\n{IM_START}assistant\n"
    )
    closing = plan.prompt_ids[plan.base_length]
    assert tokenizer.decode([closing]) == IM_END


def test_eot_flag_without_an_end_of_turn_token_leaves_the_turn_open(
    planner: IncrementalTokenizer, tokenizer: CountingTokenizer
) -> None:
    segments: list[HeldSegment] = []
    reply = Message(role="assistant", content="stopped on a stop string")
    out = sampled(tokenizer, reply, cut=True)
    planner.commit(
        segments, planner.prepare(segments, [user("q")], []), out, [0.0] * len(out), reply, True
    )
    assert not segments[0].reply_finished
    plan = planner.prepare(segments, [user("q"), reply, user("go on")], [])
    assert plan.kind is MatchKind.clean
    assert plan.new_text == f"{IM_END}\n{IM_START}user\ngo on{IM_END}\n{IM_START}assistant\n"


NOT_VERIFIED = "end of our previous reply could not be verified in the rendered request"


def patched(old: str, new: str) -> str:
    """TEMPLATE with one piece replaced (asserting it was there)."""
    assert TEMPLATE.count(old) == 1
    return TEMPLATE.replace(old, new)


HOISTING = patched(
    "{%- for m in messages -%}\n  {%- if m.role == 'system' -%}",
    "{%- for m in (messages | selectattr('role', 'eq', 'system') | list)"
    " + (messages | rejectattr('role', 'eq', 'system') | list) -%}\n"
    "  {%- if m.role == 'system' -%}",
)


def test_untrusted_boundary_forks_instead_of_producing_wrong_tokens(
    tokenizer: CountingTokenizer,
) -> None:
    """A template that hoists system messages: a new one is not in the new part."""
    template = ChatTemplate(HOISTING, bos_token=None, eos_token=IM_END)
    planner = IncrementalTokenizer(template, tokenizer)
    segments: list[HeldSegment] = []
    reply = Message(role="assistant", content="hello there")
    out = sampled(tokenizer, reply)
    planner.commit(
        segments, planner.prepare(segments, [user("q")], []), out, [0.0] * len(out), reply, True
    )
    plan = planner.prepare(
        segments, [user("q"), reply, Message(role="system", content="be brief")], []
    )
    assert plan.kind is MatchKind.fork and plan.parent_id == segments[0].segment_id
    assert plan.fork_reason == NOT_VERIFIED
    # The window was tried first (the probe accepts this template: the window forks
    # exactly where the full render does) and did not verify either.
    assert planner.windowing.enabled and plan.rendered == "full"
    assert plan.window_fallback == f"{NOT_VERIFIED} (window)"


def test_missing_end_of_turn_markers_fork(tokenizer: CountingTokenizer) -> None:
    template = ChatTemplate(
        patched(
            "{{- '<|im_end|>\\n' -}}\n  {%- elif m.role == 'tool'",
            "{{- '\\n' -}}\n  {%- elif m.role == 'tool'",
        ),
        bos_token=None,
        eos_token=IM_END,
    )
    planner = IncrementalTokenizer(template, tokenizer)
    segments: list[HeldSegment] = []
    reply = Message(role="assistant", content="hello there")
    out = sampled(tokenizer, reply)
    planner.commit(
        segments, planner.prepare(segments, [user("q")], []), out, [0.0] * len(out), reply, True
    )
    plan = planner.prepare(segments, [user("q"), reply, user("more")], [])
    assert plan.kind is MatchKind.fork and plan.parent_id == segments[0].segment_id
    # User turns still close with a marker, so the re-render holds as many markers as
    # the held ids: the count lands on the one closing the new user turn, and the
    # verification (new message after the boundary) rejects it, in window and full.
    assert (plan.fork_reason, plan.window_fallback) == (NOT_VERIFIED, f"{NOT_VERIFIED} (window)")


# -- concurrency, selection, restart --------------------------------------------------


def test_concurrent_commits_fork_the_second_call(
    planner: IncrementalTokenizer, tokenizer: CountingTokenizer
) -> None:
    segments, history = _two_calls(planner, tokenizer)
    first = planner.prepare(segments, history, TOOLS)
    second = planner.prepare(segments, history, TOOLS)
    assert first.kind is second.kind is MatchKind.clean
    answer = Message(role="assistant", content="done")
    out_a, out_b = (
        sampled(tokenizer, answer),
        sampled(tokenizer, answer.model_copy(update={"content": "x"})),
    )
    a = planner.commit(segments, first, out_a, [0.0] * len(out_a), answer, True)
    snapshot = list(a.ids)
    b = planner.commit(segments, second, out_b, [-1.0] * len(out_b), answer, True)
    assert a is segments[0] and a.ids == snapshot and a.version == 1
    assert b is segments[1] and b.segment_id != second.segment_id and b.parent_id == a.segment_id
    assert b.ids == second.prompt_ids + out_b
    assert b.mask == [0] * len(second.prompt_ids) + [1] * len(out_b)
    assert b.export().prompt_ids == second.prompt_ids


def test_a_checkpoint_undoes_an_extension_exactly(
    planner: IncrementalTokenizer, tokenizer: CountingTokenizer
) -> None:
    """What the Gateway relies on when a call's record cannot be written: after the undo
    the segment is as before, and the same request plans and commits as if nothing happened."""
    segments, history = _two_calls(planner, tokenizer)
    held = segments[0]
    before = copy.deepcopy(held)
    plan = planner.prepare(segments, history, TOOLS)
    answer = Message(role="assistant", content="done")
    out = sampled(tokenizer, answer)
    restore = held.checkpoint()
    assert planner.commit(segments, plan, out, [-0.5] * len(out), answer, True) is held
    assert held.version == before.version + 1
    restore()
    assert {f.name: getattr(held, f.name) for f in fields(held)} == {
        f.name: getattr(before, f.name) for f in fields(before)
    }
    again = planner.prepare(segments, history, TOOLS)
    assert (again.kind, again.prompt_ids) == (plan.kind, plan.prompt_ids)
    assert planner.commit(segments, again, out, [-0.5] * len(out), answer, True) is held


def test_each_conversation_continues_its_own_segment(
    planner: IncrementalTokenizer, tokenizer: CountingTokenizer
) -> None:
    segments: dict[str, HeldSegment] = {}
    main = [Message(role="system", content="main agent"), user("task")]
    sub = [Message(role="system", content="sub agent"), user("subtask")]
    for history in (main, sub):
        reply = Message(role="assistant", content=f"reply to {history[1].content}")
        out = sampled(tokenizer, reply)
        planner.commit(
            segments, planner.prepare(segments, history, []), out, [0.0] * len(out), reply, True
        )
        history.append(reply)
    assert len(segments) == 2
    main_id, sub_id = list(segments)
    plan = planner.prepare(segments, [*main, user("next")], [])
    assert (plan.kind, plan.segment_id) == (MatchKind.clean, main_id)
    plan = planner.prepare(segments, [*sub, user("next")], [])
    assert (plan.kind, plan.segment_id) == (MatchKind.clean, sub_id)


def test_restore_from_recorded_calls_matches_the_live_segment(
    planner: IncrementalTokenizer, tokenizer: CountingTokenizer
) -> None:
    """Replaying each recorded call (its request messages, prompt and sampled ids) rebuilds
    the segment the live process held, so the next request plans the same prompt."""
    segments: list[HeldSegment] = []
    history = [Message(role="system", content="sys"), user("list files")]
    replayed: list[tuple[list[Message], list[int], list[int], list[float], Message, bool]] = []
    answers = [
        (Message(role="assistant", content="", tool_calls=[call(0, "bash", cmd="ls")]), True),
        (Message(role="assistant", content="partial"), False),
    ]
    for index, (answer, finished) in enumerate(answers):
        plan = planner.prepare(segments, history, TOOLS)
        out = sampled(tokenizer, answer, cut=not finished)
        logprobs = [-0.5] * len(out)
        planner.commit(segments, plan, out, logprobs, answer, finished)
        replayed.append((list(history), plan.prompt_ids, out, logprobs, answer, finished))
        history = [*history, answer, tool(0, "a.py") if index == 0 else user("go on")]
    (live,) = segments
    restored: dict[str, HeldSegment] = {}
    for messages, prompt_ids, out, logprobs, answer, finished in replayed:
        planner.restore(
            restored,
            segment_id=live.segment_id,
            parent_id=None,
            prompt_ids=prompt_ids,
            output_ids=out,
            output_logprobs=logprobs,
            reply=answer,
            finished_with_eot=finished,
            messages=messages,
            tools_hash=hash_tools(TOOLS),
            kwargs_hash=hash_template_kwargs({}),
        )
    rebuilt = restored[live.segment_id]
    for f in fields(HeldSegment):
        if f.name != "touched":
            assert getattr(rebuilt, f.name) == getattr(live, f.name), f.name
    plan = planner.prepare([rebuilt], history, TOOLS)
    assert plan.kind is MatchKind.clean
    assert plan.prompt_ids == planner.prepare(segments, history, TOOLS).prompt_ids
    with pytest.raises(ValueError, match="does not extend"):
        planner.restore(
            restored,
            segment_id=live.segment_id,
            parent_id=None,
            prompt_ids=[9],
            output_ids=[],
            output_logprobs=[],
            reply=answers[0][0],
            finished_with_eot=True,
            messages=replayed[0][0],
            tools_hash=hash_tools(TOOLS),
            kwargs_hash=hash_template_kwargs({}),
        )


# -- small pieces ---------------------------------------------------------------------


def test_markers_must_be_single_tokens(tokenizer: CountingTokenizer) -> None:
    template = ChatTemplate(TEMPLATE, bos_token=None, eos_token=IM_END)
    with pytest.raises(ValueError, match="single token"):
        IncrementalTokenizer(template, tokenizer, eot_token="not one token")


def test_prompt_opens_reasoning(tokenizer: CountingTokenizer) -> None:
    opening = patched(
        "{{- '<|im_start|>assistant\\n' -}}{%- endif -%}",
        "{{- '<|im_start|>assistant\\n<think>\\n' -}}{%- endif -%}",
    )
    for text, expected in ((TEMPLATE, False), (opening, True)):
        planner = IncrementalTokenizer(
            ChatTemplate(text, bos_token=None, eos_token=IM_END), tokenizer
        )
        plan = planner.prepare([], [user("q")], [])
        assert planner.prompt_opens_reasoning(plan.prompt_ids) is expected


def test_load_tokenizer_reads_tokenizer_json(hf_tokenizer: Tokenizer, tmp_path: Path) -> None:
    path = tmp_path / "tokenizer.json"
    hf_tokenizer.save(str(path))
    loaded = load_tokenizer(path)
    text = f"{IM_START}user\n你好<think>{IM_END}"
    assert loaded.decode(loaded.encode(text)) == text
    assert len(loaded.encode(IM_END)) == 1


def test_plan_invariant_fields(planner: IncrementalTokenizer, tokenizer: CountingTokenizer) -> None:
    segments, history = _two_calls(planner, tokenizer)
    plan: PromptPlan = planner.prepare(segments, history, TOOLS)
    assert plan.segment_id == segments[0].segment_id and plan.base_length == len(segments[0].ids)
    assert plan.messages == history and plan.boundary == "count"
    assert plan.new_token_count == len(plan.prompt_ids) - plan.base_length


def test_tool_and_kwargs_hashes_follow_content_not_key_order() -> None:
    tool = Tool(name="t", description="d", parameters={"a": 1, "b": [1, 2]})
    reordered = Tool(name="t", description="d", parameters={"b": [1, 2], "a": 1})
    assert hash_tools([tool]) == hash_tools([reordered])
    for changed in (
        {"name": "u"},
        {"description": None},
        {"parameters": {"a": 1, "b": [2, 1]}},
    ):
        assert hash_tools([tool]) != hash_tools([tool.model_copy(update=changed)])
    assert hash_tools([tool, reordered]) != hash_tools([tool])
    huge = hash_template_kwargs({"x": 2**70})  # past what orjson encodes: the stdlib's JSON
    assert huge == hash_template_kwargs({"x": 2**70}) != hash_template_kwargs({"x": 2**71})
    assert hash_template_kwargs({"a": 1, "b": 2}) == hash_template_kwargs({"b": 2, "a": 1})


def test_plans_hash_tools_as_hash_tools_does_for_each_list(planner: IncrementalTokenizer) -> None:
    reordered = Tool(name="t", parameters={"b": 2, "a": 1})
    lists = [TOOLS, [Tool(name="t", parameters={"a": 1, "b": 2})], [reordered], TOOLS, []]
    messages = [Message(role="user", content="hi")]
    for tools in lists:  # the planner remembers each list's hash; it must stay hash_tools'
        assert planner.prepare([], messages, tools).tools_hash == hash_tools(tools)
    assert hash_tools(lists[1]) == hash_tools(lists[2]) != hash_tools(TOOLS)


def test_request_keys_take_each_held_object_s_key_from_whichever_segment_holds_it() -> None:
    def held(messages: list[Message]) -> HeldSegment:
        keys = [message_key(m) for m in messages]
        return HeldSegment("s", None, messages, keys, "", "", [], [], [], 0, 0, 0, True)

    system, first, second = Message(role="system", content="sys"), user("one"), user("two")
    reply = Message(role="assistant", content="ok")
    a, b = held([system, first]), held([system.model_copy(), second, reply])
    request = [system, second, reply, user("new")]
    keys = request_keys(request, [a, b])
    assert keys == [message_key(m) for m in request]
    assert [k is a.message_keys[0] for k in keys[:1]] == [True]
    assert [k is h for k, h in zip(keys[1:3], b.message_keys[1:], strict=True)] == [True, True]
    shorter = request_keys([system], [b, a])  # a request shorter than a held segment
    assert len(shorter) == 1 and shorter[0] is a.message_keys[0]
    assert request_keys([], [a, b]) == []
    fresh = request_keys(request, [])
    assert fresh == keys and not any(k is h for k in fresh for h in a.message_keys)
