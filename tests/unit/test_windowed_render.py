"""Windowed rendering: extensions render only the head, our previous reply and the new
messages, and must plan exactly the ids the full render plans.

The real templates are read in place (see `test_real_templates`); the probe's decision is
pinned per template with its reason, and the window and full paths are compared call by
call on that module's conversation. Cost is measured by what is handed to the template
(messages and characters per call), never by wall-clock time.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import pytest

from devstack.tiny_model import chat_template_text
from gateway.canonical import Message, Tool, ToolCall
from gateway.prompt.chat_template import ChatTemplate, TemplateRenderError
from gateway.prompt.incremental import HeldSegment, IncrementalTokenizer
from gateway.prompt.incremental.window import WINDOW_HEADS
from schemas.trajectory import MatchKind
from tests.fixtures.real_templates import (
    FAMILIES,
    QWEN,
    TINY,
    TOOLS,
    CharTokenizer,
    load,
    run,
    template_names,
)

TEMPLATES = template_names()

SYSTEM, FIRST_USER = WINDOW_HEADS

EXPECTED_WINDOWING: dict[str, str | None] = {
    "deepseek-r1-distill-qwen": None,
    "deepseek-v3.1": SYSTEM,
    "glm-4.7-flash": SYSTEM,
    "gpt-oss": FIRST_USER,
    "kimi-k2": FIRST_USER,
    "kimi-k2-thinking": SYSTEM,
    "llama3.1": FIRST_USER,
    "llama3.2": FIRST_USER,
    "minimax-m2": SYSTEM,
    "ministral-3-reasoning": FIRST_USER,
    "mistral-nemo": None,
    "qwen2.5": FIRST_USER,
    "qwen3": FIRST_USER,
    "qwen3-coder": FIRST_USER,
    "qwen3.5": FIRST_USER,
    "qwq-32b": FIRST_USER,
    TINY: SYSTEM,
}
"""The probe's choice per template: the window head, or None (always render fully).

`system+first user` is needed where the head must contain a user turn: Llama 3.x put the
tools into the first user message, Qwen3.5 raises without a user query, Qwen3/QwQ decide
which reasoning to show from the last user query, Kimi-K2 and Qwen2.5 inject a default
system prompt when the first message is not a system one. Kimi-K2 numbers tool calls by
their index *within* one message (`functions.<name>:<i>`, this published copy), so a
window renders them the same; a template numbering them across the conversation is
rejected (`test_a_template_numbering_across_the_conversation_renders_fully`)."""

EXPECTED_FULL_REASONS: dict[str, list[str]] = {
    # A single tool call is rendered without its closing tokens unless a later call
    # closes the list: in a window the reply is the only call, its end is not rendered.
    "deepseek-r1-distill-qwen": [
        "head 'system': tool loop, call 2: window not usable "
        "(end of our previous reply not found in the window)",
        "head 'system+first user': tool loop, call 2: window not usable "
        "(end of our previous reply not found in the window)",
    ],
    # Roles must alternate after the system message, and the system prompt is rendered
    # into the *last* message only when that is a user message.
    "mistral-nemo": [
        "head 'system': tool loop, call 3: window not usable (window render failed: After "
        "the optional system message, conversation roles must alternate",
        "head 'system+first user': tool loop, call 2: window not usable "
        "(the head rendered alone is not a prefix of the window)",
    ],
}


def planner_for(name: str, windowing: bool | None = None) -> IncrementalTokenizer:
    template, family = load(name)
    tokenizer = CharTokenizer([*family.markers, family.bos, family.eos])
    return IncrementalTokenizer(template, tokenizer, eot_token=family.markers, windowing=windowing)


def test_every_template_has_an_expected_decision() -> None:
    assert sorted(EXPECTED_WINDOWING) == sorted(TEMPLATES)


@pytest.mark.parametrize("name", TEMPLATES)
def test_probe_decision_per_template(name: str) -> None:
    decision = planner_for(name).windowing
    head = EXPECTED_WINDOWING[name]
    assert (decision.enabled, decision.head) == (head is not None, head), decision.reason
    if head is not None:
        assert decision.mode == "window"
        assert decision.reason.startswith(f"head '{head}': the window gave the full render's")
        assert decision.probe_steps >= 10
    else:
        assert decision.mode == "full"
        for part in EXPECTED_FULL_REASONS[name]:
            assert part in decision.reason, decision.reason


@pytest.mark.parametrize("drifting", [True, False], ids=["drifting-echoes", "exact-echoes"])
@pytest.mark.parametrize("name", TEMPLATES)
def test_window_and_full_paths_plan_identical_ids(name: str, drifting: bool) -> None:
    """Windowing forced on (for rejected templates, the runtime fallback must save it)."""
    windowed = run(name, drifting_echoes=drifting, windowing=True)
    full = run(name, drifting_echoes=drifting, windowing=False)
    assert len(windowed.plans) == len(full.plans)
    for i, (w, f) in enumerate(zip(windowed.plans, full.plans, strict=True)):
        assert w.prompt_ids == f.prompt_ids, f"call {i}"
        assert (w.kind, w.base_length, w.new_text) == (f.kind, f.base_length, f.new_text)
        # (`boundary` may differ: gpt-oss drops sampled analysis markers from a full
        # re-render, found by anchor, while the window keeps them, found by count.)
        assert (w.fork_reason, w.drift) == (f.fork_reason, f.drift)
        assert f.rendered == "full" and f.window_fallback is None
    for wseg, fseg in zip(windowed.segments, full.segments, strict=True):
        assert (wseg.ids, wseg.mask, wseg.marker_count, wseg.reply_markers) == (
            fseg.ids,
            fseg.mask,
            fseg.marker_count,
            fseg.reply_markers,
        )
    # Calls 2+ extend with a window whose head is shorter than the conversation.
    later = [p for p in windowed.plans[2:] if p.kind is not MatchKind.fork]
    assert later
    if EXPECTED_WINDOWING[name] is not None:
        assert all(p.rendered == "window" and p.window_fallback is None for p in later)
    else:  # forced on where the probe said no: every unusable window fell back
        assert any(p.window_fallback for p in later)
        assert all(p.rendered == "window" or p.window_fallback for p in later)


@pytest.mark.parametrize("name", [n for n in TEMPLATES if EXPECTED_WINDOWING[n] is not None])
def test_probe_decided_planner_uses_windows(name: str) -> None:
    result = run(name)  # windowing=None: the probe decides
    rendered = [p.rendered for p in result.plans[2:] if p.kind is not MatchKind.fork]
    assert rendered and set(rendered) == {"window"}


# -- a template the window must not be used for ---------------------------------------

GLOBAL_NUMBERING = """\
{#- Test template: tool results are numbered across the whole conversation. -#}
{%- set ns = namespace(calls=0, results=0) -%}
{%- for m in messages -%}
  {%- if m.role == 'assistant' -%}
    {{- '<|im_start|>assistant\\n' + (m.content or '') -}}
    {%- for c in m.tool_calls or [] -%}
      {{- '<tool_call>#' + (ns.calls | string) + ' ' + c.function.name + ' ' -}}
      {{- (c.function.arguments | tojson) + '</tool_call>' -}}
      {%- set ns.calls = ns.calls + 1 -%}
    {%- endfor -%}
    {{- '<|im_end|>\\n' -}}
  {%- elif m.role == 'tool' -%}
    {{- '<|im_start|>tool\\nresult #' + (ns.results | string) + ': ' + m.content -}}
    {{- '<|im_end|>\\n' -}}
    {%- set ns.results = ns.results + 1 -%}
  {%- else -%}
    {{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' -}}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}
"""


def qwen_planner(text: str, windowing: bool | None = None, **kwargs: Any) -> IncrementalTokenizer:
    template = ChatTemplate(text, bos_token=None, eos_token=QWEN.eos, **kwargs)
    tokenizer = CharTokenizer([*QWEN.markers, "<|im_start|>"])
    return IncrementalTokenizer(template, tokenizer, eot_token=QWEN.markers, windowing=windowing)


def call(n: int) -> ToolCall:
    return ToolCall(id=f"call{n:05d}", name="get_weather", arguments=json.dumps({"city": f"c{n}"}))


def tool_loop(
    planner: IncrementalTokenizer, calls: int, tools: Sequence[Tool] = TOOLS
) -> list[list[int]]:
    """Prompt ids of a tool loop: system, user, then (tool call, tool result) pairs."""
    segments: list[HeldSegment] = []
    history = [Message(role="system", content="Be useful."), Message(role="user", content="Go.")]
    prompts: list[list[int]] = []
    for n in range(calls):
        plan = planner.prepare(segments, history, tools)
        prompts.append(plan.prompt_ids)
        reply = Message(role="assistant", content="", tool_calls=[call(n)])
        out = planner.tokenizer.encode(f"calling {n}<|im_end|>")
        planner.commit(segments, plan, out, [0.0] * len(out), reply, True)
        result = Message(role="tool", content=f"sunny {n}", tool_call_id=call(n).id)
        history = [*history, reply, result]
    return prompts


def test_a_template_numbering_across_the_conversation_renders_fully() -> None:
    planner = qwen_planner(GLOBAL_NUMBERING)
    assert not planner.windowing.enabled and planner.windowing.mode == "full"
    assert "the window's new text differs from the full render's" in planner.windowing.reason
    # The probe is what protects it: forced on, the window renders "result #0" again.
    forced, full = qwen_planner(GLOBAL_NUMBERING, True), qwen_planner(GLOBAL_NUMBERING, False)
    assert tool_loop(planner, 4) == tool_loop(full, 4)
    assert tool_loop(forced, 4) != tool_loop(full, 4)


# -- runtime behaviour ----------------------------------------------------------------


def test_a_bad_new_message_still_raises_in_windowed_mode() -> None:
    """Ministral checks that user and assistant turns alternate: a second user turn among
    the new messages raises, though the window holds none of the earlier turns."""
    planner = planner_for("ministral-3-reasoning")
    _, family = load("ministral-3-reasoning")
    assert planner.windowing.enabled
    segments: list[HeldSegment] = []
    history = [Message(role="system", content="Be useful."), Message(role="user", content="Hi")]
    for text in ("Hello.", "Sure."):
        plan = planner.prepare(segments, history, TOOLS)
        reply = Message(role="assistant", content=text)
        out = planner.tokenizer.encode(f"{text}{family.eos}")
        planner.commit(segments, plan, out, [0.0] * len(out), reply, True)
        history = [*history, reply, Message(role="user", content="More.")]
    assert planner.prepare(segments, history, TOOLS).rendered == "window"
    two_users = [*history, Message(role="user", content="Again.")]
    with pytest.raises(TemplateRenderError, match="roles must alternate"):
        planner.prepare(segments, two_users, TOOLS)


def test_the_head_is_rendered_again_when_it_changes() -> None:
    """Llama 3.2 dates its system header: a cached head from yesterday is not reused."""
    now = [datetime(2025, 1, 2, 12, 0)]
    template_text = load("llama3.2")[0].text
    family = FAMILIES["llama3.2"]

    def planner(windowing: bool) -> IncrementalTokenizer:
        template = ChatTemplate(
            template_text, bos_token=family.bos, eos_token=family.eos, clock=lambda: now[0]
        )
        tokenizer = CharTokenizer([*family.markers, family.bos, family.eos])
        return IncrementalTokenizer(
            template, tokenizer, eot_token=family.markers, windowing=windowing
        )

    windowed, full = planner(True), planner(False)
    assert windowed.windowing.head == FIRST_USER
    held: dict[bool, list[HeldSegment]] = {True: [], False: []}
    history = [Message(role="system", content="Be useful."), Message(role="user", content="Hi")]
    plans = []
    for turn in range(4):
        if turn == 3:
            now[0] = datetime(2025, 1, 3, 0, 1)
        step = {}
        for mode, p in ((True, windowed), (False, full)):
            step[mode] = p.prepare(held[mode], history, TOOLS)
            out = p.tokenizer.encode(f"Answer {turn}.<|eot_id|>")
            p.commit(
                held[mode],
                step[mode],
                out,
                [0.0] * len(out),
                Message(role="assistant", content=f"Answer {turn}."),
                True,
            )
        plans.append(step)
        history = [
            *history,
            Message(role="assistant", content=f"Answer {turn}."),
            Message(role="user", content=f"Question {turn}?"),
        ]
    for step in plans:
        assert step[True].prompt_ids == step[False].prompt_ids
    assert [s[True].rendered for s in plans[2:]] == ["window", "window"]
    (head_text, _), *others = windowed._window.heads.values()
    assert "Today Date: 03 Jan 2025" in head_text and not others  # replaced, not added


def test_a_developer_message_the_window_does_not_hold_still_folds_its_system_messages() -> None:
    """Qwen3 has no developer role, so a developer message anywhere folds every system
    message into the leading one (vLLM's rule). Codex-like: the developer message comes
    after the first user turn, in the held middle a window skips; a system message arrives
    later. Each call's window must plan the full render's ids."""
    planners = {mode: planner_for("qwen3", windowing=mode) for mode in (True, False)}
    held: dict[bool, list[HeldSegment]] = {True: [], False: []}
    developer = Message(role="system", content="Answer in English.", developer=True)
    late_system = Message(role="system", content="Working directory: /workspace")
    history = [Message(role="system", content="Be useful."), Message(role="user", content="Hi")]
    history += [developer]
    plans = []
    for turn in range(4):
        if turn:
            history += [Message(role="assistant", content=f"Answer {turn - 1}.")]
            history += [late_system] if turn == 3 else []
            history += [Message(role="user", content=f"Question {turn}?")]
        step = {}
        for mode, p in planners.items():
            step[mode] = p.prepare(held[mode], history, TOOLS)
            out = p.tokenizer.encode(f"Answer {turn}.<|im_end|>")
            reply = Message(role="assistant", content=f"Answer {turn}.")
            p.commit(held[mode], step[mode], out, [0.0] * len(out), reply, True)
        plans.append(step)
    # control: the last window alone holds no developer message, so would not fold
    template = planners[True].template
    window = [*history[:2], *history[-3:]]  # the head, our previous reply and the new ones
    assert late_system in window and developer not in window
    assert not template.folds_system_messages(window) and template.folds_system_messages(history)
    for i, step in enumerate(plans):
        assert step[True].prompt_ids == step[False].prompt_ids, f"call {i}"
        assert (step[True].kind, step[True].new_text) == (step[False].kind, step[False].new_text)
    assert [s[True].rendered for s in plans[1:3]] == ["window", "window"]
    # the late system message joins the leading one: the held prompt no longer holds
    last = plans[-1]
    assert last[False].kind is MatchKind.fork
    assert last[True].window_fallback == "the head rendered alone is not a prefix of the window"
    assert "Be useful.\n\nAnswer in English.\n\nWorking directory" in last[True].new_text


def test_windowing_is_probed_per_template_kwargs_and_can_be_disabled() -> None:
    text = chat_template_text()
    planner = qwen_planner(text)
    decision = planner.windowing_for({"enable_thinking": False})
    assert decision.enabled and planner.windowing_for({"enable_thinking": False}) is decision
    assert planner.windowing_for({}) is planner.windowing
    off = qwen_planner(text, windowing=False)
    assert (off.windowing.mode, off.windowing.reason) == ("full", "disabled by configuration")
    assert off.windowing_for({"enable_thinking": False}).mode == "full"


# -- cost -----------------------------------------------------------------------------


class RecordingTemplate(ChatTemplate):
    """Records how many messages and rendered characters each render handled (every
    render goes through `render_with_fold`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.calls: list[tuple[int, int]] = []

    def render_with_fold(self, messages: Sequence[Message], *args: Any) -> str:
        text = super().render_with_fold(messages, *args)
        self.calls.append((len(messages), len(text)))
        return text


def long_conversation(windowing: bool, turns: int = 80) -> list[tuple[int, int]]:
    """Per call: (messages, characters) handed to/rendered by the template."""
    text = chat_template_text()
    template = RecordingTemplate(text, bos_token=None, eos_token=QWEN.eos)
    tokenizer = CharTokenizer([*QWEN.markers, "<|im_start|>"])
    planner = IncrementalTokenizer(template, tokenizer, eot_token=QWEN.markers, windowing=windowing)
    segments: list[HeldSegment] = []
    history = [
        Message(role="system", content="You are a coding agent."),
        Message(role="user", content="Fix the bug."),
    ]
    per_call: list[tuple[int, int]] = []
    for turn in range(turns):
        template.calls.clear()
        plan = planner.prepare(segments, history, TOOLS)
        per_call.append((sum(m for m, _ in template.calls), sum(c for _, c in template.calls)))
        assert plan.kind is (MatchKind.fork if turn == 0 else MatchKind.clean)
        reasoning = f"Step {turn:03d}."
        if turn % 10 == 9:  # now and then an answer and a new user query
            reply = Message(role="assistant", content=f"Done {turn:03d}.", reasoning=reasoning)
            sampled = f"<think>\n{reasoning}\n</think>\n\nDone {turn:03d}.<|im_end|>"
            follow = Message(role="user", content=f"Next {turn:03d}.")
        else:
            args = json.dumps({"city": f"c{turn:03d}"})
            reply = Message(
                role="assistant",
                content="",
                reasoning=reasoning,
                tool_calls=[ToolCall(id=f"call{turn:05d}", name="get_weather", arguments=args)],
            )
            body = f'{{"name": "get_weather", "arguments": {args}}}'
            sampled = f"<think>\n{reasoning}\n</think>\n\n<tool_call>\n{body}\n</tool_call>"
            sampled += "<|im_end|>"
            follow = Message(
                role="tool", content=f"Sunny {turn:03d}", tool_call_id=f"call{turn:05d}"
            )
        out = tokenizer.encode(sampled)
        planner.commit(segments, plan, out, [0.0] * len(out), reply, True)
        history = [*history, reply, follow]
    assert len(segments) == 1
    return per_call


def test_windowed_render_cost_is_constant_while_full_render_grows() -> None:
    windowed, full = long_conversation(True), long_conversation(False)
    # From turn 5 on, every call hands the template the same number of messages (system,
    # our reply, the new one) and renders a bounded number of characters.
    messages = {m for m, _ in windowed[4:]}
    assert messages == {3}
    chars = [c for _, c in windowed[4:]]
    assert max(chars) <= max(c for _, c in windowed[4:14])
    # The full render grows with the conversation: 2 messages per turn.
    assert [m for m, _ in full[4:]] == [2 + 2 * t for t in range(4, 80)]
    assert full[79][1] > 9 * full[4][1]
    assert windowed[79][1] * 15 < full[79][1]
