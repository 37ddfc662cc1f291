"""A reply cut at `max_tokens`, then the next call, on every real chat template.

The cut reply has no end-of-turn marker of its own. The next call must extend the same
segment: the sampled ids stay exactly as they are (mask 1), then the marker the template
closes the turn with and the new messages follow as prompt tokens (mask 0), and the
call's drift names the added marker. Cut points: mid-answer, inside reasoning (families
that reason), inside a tool call the agent saw as text, and inside a second tool call
after a complete first one (the agent runs the first and sends its result).

The "sampled" text is the template's own rendering of the reply after the prompt, cut
at a nonce; the reply message is what a parser makes of the cut text. The oracle for
the new text is independent of the planner: the full render from the last end-of-turn
marker before the new message's text.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

import pytest

from gateway.canonical import Message, ToolCall
from gateway.prompt.chat_template import ChatTemplate, TemplateRenderError
from gateway.prompt.incremental import HeldSegment, IncrementalTokenizer, PromptPlan
from schemas.trajectory import MatchKind
from tests.fixtures.real_templates import (
    TOOLS,
    CharTokenizer,
    Family,
    load,
    template_names,
)

TEMPLATES = template_names()

SYSTEM = Message(role="system", content="You are a careful weather assistant.")
USER = Message(role="user", content="What is the weather in Paris? Answer at length.")
THOUGHT = "I should look up Paris first [th-01] and then compare it with last week."
ANSWER = "Paris is mild and sunny today [ans-01] with a light breeze from the west."
FOLLOW_UP = Message(role="user", content="Too long; just the temperature [new-02].")


def _call(n: int, city: str) -> ToolCall:
    arguments = json.dumps({"city": city, "request": f"req-0{n}-long-value"})
    return ToolCall(id=f"call0000{n}", name="get_weather", arguments=arguments)


RESULT = Message(role="tool", content="Sunny, 21C [tool-02]", tool_call_id="call00001")

REASONING_FAMILIES = {
    "deepseek-r1-distill-qwen",
    "glm-4.7-flash",
    "gpt-oss",
    "kimi-k2-thinking",
    "minimax-m2",
    "qwen3",
    "qwen3.5",
    "qwq-32b",
    "tiny-model",
}
"""Templates whose replies carry reasoning right after the generation prompt (the others
have none, or only under template kwargs)."""

SECOND_CALL_FAMILIES = {
    "deepseek-v3.1",
    "glm-4.7-flash",
    "kimi-k2",
    "kimi-k2-thinking",
    "minimax-m2",
    "ministral-3-reasoning",
    "qwen2.5",
    "qwen3",
    "qwen3-coder",
    "qwen3.5",
    "tiny-model",
}
"""Templates that render two tool calls of one reply right after the generation prompt
(Llama 3.x rejects parallel calls, gpt-oss renders only the first; the synthetic replies
below have one call at most)."""

OPENS_REASONING = {"deepseek-r1-distill-qwen", "qwq-32b"}
"""Templates whose reply is not rendered as an extension of the prompt, and whose
generation prompt opens `<think>`: their synthetic reply starts inside reasoning."""

_REASONING_CLOSERS = re.compile(r"^\s*(</think>|\[/THINK\]|<\|end\|>)\s*")


@dataclass(frozen=True)
class Cut:
    """What "the engine" sampled (cut), what the parser made of it, what the agent sends."""

    sampled: str
    reply: Message
    new: Message


def _tail(name: str, template: ChatTemplate, history: list[Message], reply: Message) -> str | None:
    """What the model would sample for `reply`: the template's rendering of it after the
    prompt; a plain synthetic reply when the template does not render replies that way
    (None: it rejects the reply)."""
    before = template.render(history, TOOLS, add_generation_prompt=True)
    try:
        after = template.render([*history, reply], TOOLS, add_generation_prompt=False)
    except TemplateRenderError:
        return None
    if after.startswith(before):
        return after[len(before) :]
    if len(reply.tool_calls) > 1:
        return None
    calls = [{"name": c.name, "arguments": json.loads(c.arguments)} for c in reply.tool_calls]
    thought = f"{reply.reasoning}\n</think>\n\n" if name in OPENS_REASONING else ""
    return thought + (reply.content or json.dumps(calls))


def _after_reasoning(text: str) -> str:
    """The cut text as a parser shows it as content: without the reasoning before it."""
    if THOUGHT in text:
        text = text[text.index(THOUGHT) + len(THOUGHT) :]
    return _REASONING_CLOSERS.sub("", text)


def _upto(text: str, nonce: str, keep: int | None = None) -> str:
    """`text` cut right after `nonce` (or after its first `keep` characters)."""
    return text[: text.index(nonce) + (len(nonce) if keep is None else keep)]


def cuts(name: str, template: ChatTemplate) -> dict[str, Cut]:
    history = [SYSTEM, USER]
    found: dict[str, Cut] = {}

    answer = _tail(
        name, template, history, Message(role="assistant", content=ANSWER, reasoning=THOUGHT)
    )
    assert answer is not None
    thought = THOUGHT if "[th-01]" in answer else None
    content = _upto(ANSWER, "[ans-01]")
    found["mid-answer"] = Cut(
        _upto(answer, "[ans-01]"),
        Message(role="assistant", content=content, reasoning=thought),
        FOLLOW_UP,
    )

    one = Message(role="assistant", content="", reasoning=THOUGHT, tool_calls=[_call(1, "Paris")])
    calling = _tail(name, template, history, one)
    assert calling is not None
    thought = THOUGHT if "[th-01]" in calling else None
    sampled = _upto(calling, "req-01", keep=5)
    found["in a tool call"] = Cut(
        sampled,
        Message(role="assistant", content=_after_reasoning(sampled), reasoning=thought),
        FOLLOW_UP,
    )

    reasoned = answer if "[th-01]" in answer else calling
    if "[th-01]" in reasoned:
        thought_cut = _upto(THOUGHT, "[th-01]")
        found["in reasoning"] = Cut(
            _upto(reasoned, "[th-01]"),
            Message(role="assistant", content=None, reasoning=thought_cut),
            FOLLOW_UP,
        )

    two = one.model_copy(update={"tool_calls": [_call(1, "Paris"), _call(2, "Tokyo")]})
    both = _tail(name, template, history, two)
    if both is not None and "req-02" in both:
        sampled = _upto(both, "req-02", keep=5)
        # The second call as far as it was sampled (Kimi names calls by their ids).
        broken = sampled[max(sampled.rfind("get_weather"), sampled.rfind("call00002")) :]
        reply = Message(
            role="assistant", content=broken, reasoning=thought, tool_calls=[_call(1, "Paris")]
        )
        found["in a second tool call"] = Cut(sampled, reply, RESULT)
    return found


def oracle(full: str, family: Family, new: Message) -> str:
    """The full render from the last end-of-turn marker before the new message's text."""
    assert new.content is not None
    at = full.rindex(new.content)
    pattern = re.compile("|".join(re.escape(m) for m in family.markers))
    starts = [m.start() for m in pattern.finditer(full, 0, at)]
    assert starts, "no end-of-turn marker before the new message"
    return full[starts[-1] :]


@dataclass
class Run:
    planner: IncrementalTokenizer
    tokenizer: CharTokenizer
    segments: list[HeldSegment]
    held: list[int]
    plan: PromptPlan
    full: str


def run(
    name: str, cut: Cut, echo: Message, windowing: bool | None = None, finished: bool = False
) -> Run:
    """Call 1 (cut, unless `finished`: then its text ends with the stop marker), then
    call 2 with the agent's echo and its new message."""
    template, family = load(name)
    tokenizer = CharTokenizer([*family.markers, family.bos, family.eos])
    planner = IncrementalTokenizer(
        template, tokenizer, eot_token=family.markers, windowing=windowing
    )
    segments: list[HeldSegment] = []
    history = [SYSTEM, USER]
    first = planner.prepare(segments, history, TOOLS)
    out = tokenizer.encode(cut.sampled)
    planner.commit(segments, first, out, [-0.5] * len(out), cut.reply, finished)
    held = list(segments[0].ids)
    assert held == first.prompt_ids + out
    history = [*history, echo, cut.new]
    plan = planner.prepare(segments, history, TOOLS)
    full = template.render(history, TOOLS, add_generation_prompt=True)
    return Run(planner, tokenizer, segments, held, plan, full)


def cases() -> list[tuple[str, str, str]]:
    out = []
    for name in TEMPLATES:
        kinds = ["mid-answer", "in a tool call"]
        if name in REASONING_FAMILIES:
            kinds.append("in reasoning")
        if name in SECOND_CALL_FAMILIES:
            kinds.append("in a second tool call")
        for kind in kinds:
            for echo in ("exact", "without reasoning"):
                out.append((name, kind, echo))
    return out


@pytest.mark.parametrize("name", TEMPLATES)
def test_the_families_that_reason_or_call_twice_are_listed(name: str) -> None:
    """The per-family sets above are what the templates do (no case silently skipped)."""
    template, _ = load(name)
    found = cuts(name, template)
    assert ("in reasoning" in found) == (name in REASONING_FAMILIES)
    assert ("in a second tool call" in found) == (name in SECOND_CALL_FAMILIES)


@pytest.mark.parametrize(("name", "kind", "echo"), cases())
def test_a_cut_reply_is_closed_by_a_prompt_marker_and_the_segment_continues(
    name: str, kind: str, echo: str
) -> None:
    template, family = load(name)
    cut = cuts(name, template)[kind]
    echoed = cut.reply if echo == "exact" else cut.reply.model_copy(update={"reasoning": None})
    result = run(name, cut, echoed)
    plan = result.plan

    assert plan.kind is not MatchKind.fork, plan.fork_reason
    drifted = echoed != cut.reply
    assert plan.kind is (MatchKind.realign if drifted else MatchKind.clean)
    # The held ids (prompt and the cut sample) come back unchanged, then the new text.
    assert plan.base_length == len(result.held)
    assert plan.prompt_ids[: plan.base_length] == result.held
    assert plan.new_text == oracle(result.full, family, cut.new)
    assert plan.prompt_ids[plan.base_length :] == result.tokenizer.encode(plan.new_text)
    marker = next(m for m in family.markers if plan.new_text.startswith(m))
    note = f"message 2 (assistant): cut at max_tokens, closed with {marker!r}"
    assert [d for d in plan.drift if "cut at max_tokens" in d] == [
        f"{note} (prompt tokens, not trained)"
    ]

    # Call 2 finishes: the segment is one, the added marker is a prompt token.
    out = result.tokenizer.encode(f"Fine.{family.stop_answer}")
    seg = result.planner.commit(result.segments, plan, out, [-0.5] * len(out), echoed, True)
    assert len(result.segments) == 1 and seg.segment_id == plan.segment_id
    sampled_ids = result.tokenizer.encode(cut.sampled)
    start = len(result.held) - len(sampled_ids)
    assert seg.ids[: len(result.held)] == result.held
    assert seg.mask[start : len(result.held)] == [1] * len(sampled_ids)
    assert seg.ids[len(result.held)] == result.tokenizer.encode(marker)[0]
    assert seg.mask[len(result.held) : len(plan.prompt_ids)] == [0] * plan.new_token_count
    assert seg.mask[len(plan.prompt_ids) :] == [1] * len(out)


@pytest.mark.parametrize("name", TEMPLATES)
def test_window_and_full_render_close_a_cut_reply_the_same(name: str) -> None:
    template, _ = load(name)
    for kind, cut in cuts(name, template).items():
        windowed = run(name, cut, cut.reply, windowing=None).plan
        full = run(name, cut, cut.reply, windowing=False).plan
        assert (windowed.prompt_ids, windowed.drift) == (full.prompt_ids, full.drift), kind
        assert full.rendered == "full"


# -- when the re-render changes the cut text ------------------------------------------


def test_the_template_reordering_a_cut_reply_does_not_change_the_held_tokens() -> None:
    """Qwen3 renders an assistant turn as content, then its tool calls. Cut in a second
    call, the broken call is content and the first call a tool call: the re-render puts
    the broken text first and closes the reasoning it shows. The held tokens keep the
    order the model sampled; only the marker and what follows are added."""
    template, family = load("qwen3")
    cut = cuts("qwen3", template)["in a second tool call"]
    result = run("qwen3", cut, cut.reply)
    turn = result.full[: result.full.rindex(result.plan.new_text)]
    assert not turn.endswith(cut.sampled)  # the template renders this turn differently
    held_text = result.tokenizer.decode(result.plan.prompt_ids[: result.plan.base_length])
    assert held_text.endswith(cut.sampled)
    assert result.plan.new_text.startswith(family.markers[0])


def test_reasoning_dropped_by_the_rerender_stays_in_the_held_tokens() -> None:
    """A cut inside reasoning: Qwen3 drops reasoning of turns before the last user query
    (and renders no `</think>` for them); the held tokens keep the open reasoning block,
    closed by the end-of-turn marker alone."""
    template, family = load("qwen3")
    cut = cuts("qwen3", template)["in reasoning"]
    result = run("qwen3", cut, cut.reply)
    assert "[th-01]" not in result.full
    held_text = result.tokenizer.decode(result.plan.prompt_ids)
    assert f"[th-01]{family.markers[0]}\n<|im_start|>user" in held_text


def test_whitespace_the_template_trims_from_a_cut_reply_stays_sampled() -> None:
    """Qwen3.5 trims the content it renders; a reply cut after whitespace keeps it."""
    template, family = load("qwen3.5")
    base = cuts("qwen3.5", template)["mid-answer"]
    cut = Cut(
        base.sampled + " \n",
        base.reply.model_copy(update={"content": f"{base.reply.content} \n"}),
        base.new,
    )
    result = run("qwen3.5", cut, cut.reply)
    assert result.plan.kind is MatchKind.clean
    assert f"[ans-01] \n{family.markers[0]}" not in result.full
    assert f"[ans-01] \n{family.markers[0]}" in result.tokenizer.decode(result.plan.prompt_ids)


@pytest.mark.parametrize("finished", [False, True])
def test_a_reply_holding_marker_text_is_found_before_it(finished: bool) -> None:
    """A reply whose text holds an end-of-turn marker (sampled mid-reply, echoed as
    text): the reply is looked for from before that marker, so it still verifies, cut
    or finished."""
    _, family = load("tiny-model")
    text = f"Paris is mild{family.markers[0]} and sunny [ans-01]"
    stop = family.stop_answer if finished else ""
    cut = Cut(text + stop, Message(role="assistant", content=text), FOLLOW_UP)
    result = run("tiny-model", cut, cut.reply, finished=finished)
    assert result.plan.kind is MatchKind.clean, result.plan.fork_reason
    assert result.plan.new_text == oracle(result.full, family, FOLLOW_UP)[len(stop) :]
    assert any("cut at max_tokens" in d for d in result.plan.drift) is not finished
