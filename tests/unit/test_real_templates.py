"""The incremental path against every real chat template in ../shared/chat_templates.

Templates are test data read in place (never copied). A character-level tokenizer makes
encoding exact on text, so any difference between the held text and what the template
renders is a boundary mistake, not a tokenizer artefact. The stop-token sets below are
the published end-of-turn tokens of each model family. The planner renders windows where
the template's probe allows it (`test_windowed_render` pins those decisions), so the
oracle checks here cover the windowed path for those templates.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import pytest

from gateway.canonical import Message, Tool, ToolCall
from gateway.chat_template import ChatTemplate
from gateway.incremental import HeldSegment, IncrementalTokenizer, PromptPlan
from schemas.trajectory import MatchKind


def shared_templates_dir() -> Path:
    root = os.environ.get("ROLLOUT_SHARED_DIR")
    base = Path(root) if root else Path(__file__).resolve().parents[3] / "shared"
    folder = base / "chat_templates"
    if not folder.is_dir() or not list(folder.glob("*.jinja")):
        pytest.fail(
            f"real chat templates not found in {folder}; set ROLLOUT_SHARED_DIR to the "
            "directory holding chat_templates/",
            pytrace=False,
        )
    return folder


class CharTokenizer:
    """One id per character, one id per listed special token: encode is exact on text."""

    OFFSET = 1000

    def __init__(self, specials: Sequence[str]) -> None:
        self.specials = sorted({s for s in specials if s}, key=len, reverse=True)
        self._ids = {s: i for i, s in enumerate(self.specials)}
        self._re = re.compile("|".join(re.escape(s) for s in self.specials))

    def encode(self, text: str) -> list[int]:
        ids: list[int] = []
        pos = 0
        for m in self._re.finditer(text):
            ids.extend(ord(c) + self.OFFSET for c in text[pos : m.start()])
            ids.append(self._ids[m.group()])
            pos = m.end()
        ids.extend(ord(c) + self.OFFSET for c in text[pos:])
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(self.specials[i] if i < self.OFFSET else chr(i - self.OFFSET) for i in ids)


@dataclass(frozen=True)
class Family:
    bos: str
    eos: str
    markers: tuple[str, ...]
    stop_tool: str
    stop_answer: str


QWEN = Family("", "<|im_end|>", ("<|im_end|>",), "<|im_end|>", "<|im_end|>")
LLAMA = Family(
    "<|begin_of_text|>", "<|eot_id|>", ("<|eot_id|>", "<|eom_id|>"), "<|eot_id|>", "<|eot_id|>"
)
DEEPSEEK_EOS = "<｜end▁of▁sentence｜>"
DEEPSEEK = Family(
    "<｜begin▁of▁sentence｜>", DEEPSEEK_EOS, (DEEPSEEK_EOS,), DEEPSEEK_EOS, DEEPSEEK_EOS
)
GLM = Family("", "<|endoftext|>", ("<|user|>", "<|observation|>"), "<|observation|>", "<|user|>")
MISTRAL = Family("<s>", "</s>", ("</s>",), "</s>", "</s>")
HARMONY = Family(
    "<|startoftext|>", "<|return|>", ("<|end|>", "<|call|>", "<|return|>"), "<|call|>", "<|return|>"
)
MINIMAX = Family("", "[e~[", ("[e~[",), "[e~[", "[e~[")

FAMILIES = {
    "qwen3": QWEN,
    "qwen3.5": QWEN,
    "qwen2.5": QWEN,
    "qwen3-coder": QWEN,
    "qwq-32b": QWEN,
    "kimi-k2": QWEN,
    "kimi-k2-thinking": QWEN,
    "llama3.1": LLAMA,
    "llama3.2": LLAMA,
    "deepseek-v3.1": DEEPSEEK,
    "deepseek-r1-distill-qwen": DEEPSEEK,
    "glm-4.7-flash": GLM,
    "mistral-nemo": MISTRAL,
    "ministral-3-reasoning": MISTRAL,
    "gpt-oss": HARMONY,
    "minimax-m2": MINIMAX,
}

EXPECTED_FORKS: dict[str, dict[int, str]] = {
    # A single tool call is rendered without `<｜tool▁calls▁end｜><｜end▁of▁sentence｜>`
    # (only a second call of the same conversation closes the list), so the turn the
    # model closed with its end-of-sentence token has no marker in the re-render: the
    # end of our reply cannot be located and call 1 (after the first tool call) forks.
    # Later calls extend the forked segment: the template closes later calls normally.
    "deepseek-r1-distill-qwen": {1: "end of our previous reply not found"},
}
"""Templates where the incremental path must fall back to fork: call index → reason."""

APPEND_ONLY = {
    "deepseek-v3.1",
    "kimi-k2",
    "llama3.1",
    "llama3.2",
    "ministral-3-reasoning",
    "qwen2.5",
    "qwen3-coder",
}
"""Templates whose final prompt text equals a full re-render on this conversation. The
others re-render earlier turns differently (dropped reasoning, moved system prompt or
tool list, `<|return|>` → `<|end|>`) or we sampled a synthetic reply for them."""

PINNED = datetime(2025, 1, 2, 12, 0, 0)

TOOLS = [
    Tool(
        name="get_weather",
        description="Current weather for a city.",
        parameters={
            "type": "object",
            "properties": {"city": {"type": "string"}, "request": {"type": "string"}},
            "required": ["city"],
        },
    )
]


def _call(n: int, city: str) -> ToolCall:
    return ToolCall(
        id=f"call0000{n}",
        name="get_weather",
        arguments=json.dumps({"city": city, "request": f"req-0{n}"}),
    )


@dataclass(frozen=True)
class Step:
    """Messages the client appends, then the reply "the engine" samples."""

    new: list[Message]
    reply: Message
    nonce: str
    cut: bool = False


def conversation() -> list[Step]:
    user = lambda text: Message(role="user", content=text)  # noqa: E731
    tool = lambda n, text: Message(role="tool", content=text, tool_call_id=f"call0000{n}")  # noqa: E731

    def calls(n: int, city: str, thought: str) -> Message:
        return Message(role="assistant", content="", reasoning=thought, tool_calls=[_call(n, city)])

    def answer(text: str, thought: str) -> Message:
        return Message(role="assistant", content=text, reasoning=thought)

    return [
        Step(
            [
                Message(role="system", content="You are a careful weather assistant."),
                user("What is the weather in Paris and Tokyo?"),
            ],
            calls(1, "Paris", "I should look up Paris first."),
            "req-01",
        ),
        Step([tool(1, "Sunny, 21C")], calls(2, "Tokyo", "Now Tokyo."), "req-02"),
        Step(
            [tool(2, "Rainy, 17C")],
            answer("Paris is sunny (21C); Tokyo is rainy (17C). [ans-03]", "Both known."),
            "[ans-03]",
        ),
        Step(
            [user("And Berlin? Keep it short.")], calls(4, "Berlin", "One more lookup."), "req-04"
        ),
        Step(
            [tool(4, "Cloudy, 15C")], answer("Berlin is cloudy, 15C. [ans-05]", "Done."), "[ans-05]"
        ),
        Step(
            [user("Now write a long poem about all three cities.")],
            answer("Paris, city of light [cut-06]", "A poem, then."),
            "[cut-06]",
            cut=True,
        ),
        Step(
            [user("Too long, just say goodbye.")], answer("Goodbye! [ans-07]", "Short."), "[ans-07]"
        ),
    ]


TINY = "tiny-model"


def tiny_template_text() -> str | None:
    """The project's own template (devstack.tiny_model), once that package provides it."""
    try:
        from devstack.tiny_model import chat_template_text
    except ImportError:
        return None
    return chat_template_text()


def template_names() -> list[str]:
    names = sorted(p.stem for p in shared_templates_dir().glob("*.jinja"))
    return [*names, TINY] if tiny_template_text() is not None else names


def load(name: str) -> tuple[ChatTemplate, Family]:
    family = FAMILIES.get(name, QWEN)
    if name == TINY:
        text = tiny_template_text() or ""
    else:
        text = (shared_templates_dir() / f"{name}.jinja").read_text()
    template = ChatTemplate(text, bos_token=family.bos, eos_token=family.eos, clock=lambda: PINNED)
    return template, family


def sampled_text(template: ChatTemplate, family: Family, history: list[Message], step: Step) -> str:
    """What the model produced: the template's own rendering of the reply when rendering
    the reply as the last message extends the prompt, else a plain synthetic reply."""
    before = template.render(history, TOOLS, add_generation_prompt=True)
    after = template.render([*history, step.reply], TOOLS, add_generation_prompt=False)
    if after.startswith(before):
        tail = after[len(before) :]
    else:
        calls = [
            {"name": c.name, "arguments": json.loads(c.arguments)} for c in step.reply.tool_calls
        ]
        tail = f"{step.reply.reasoning}\n\n{step.reply.content or json.dumps(calls)}"
    at = tail.find(step.nonce)
    assert at >= 0, f"reply nonce {step.nonce!r} not rendered"
    if step.cut:  # cut by max_tokens right after the nonce: no end-of-turn sampled
        return tail[: at + len(step.nonce)]
    marker = re.compile("|".join(re.escape(m) for m in family.markers)).search(tail, at)
    if marker:
        return tail[: marker.end()]
    return tail + (family.stop_tool if step.reply.tool_calls else family.stop_answer)


def expected_new_text(full: str, family: Family, nonce: str, finished: bool) -> str:
    """Oracle: the template's text after our reply, found from the reply's own nonce."""
    at = full.rfind(nonce)
    assert at >= 0, f"nonce {nonce!r} not rendered"
    closing = re.compile("|".join(re.escape(m) for m in family.markers)).search(full, at)
    assert closing is not None
    return full[closing.end() if finished else closing.start() :]


def echo(message: Message, turn: int) -> Message:
    """The client's echo of our reply, cycling through: without reasoning and re-formatted
    (tool-call JSON re-serialised with other spacing and key order, content None), exact,
    without reasoning."""
    if turn % 3 == 1:
        return message
    stripped = message.model_copy(update={"reasoning": None})
    if turn % 3 == 2:
        return stripped
    calls = [
        c.model_copy(
            update={
                "arguments": json.dumps(dict(reversed(json.loads(c.arguments).items())), indent=1)
            }
        )
        for c in message.tool_calls
    ]
    return stripped.model_copy(update={"tool_calls": calls, "content": message.content or None})


@dataclass
class Run:
    segments: list[HeldSegment]
    plans: list[PromptPlan]
    renders: list[str]
    """`render(history, add_generation_prompt=True)` at each call, for the oracle."""
    held_before: list[list[int]]
    """The planned segment's ids when each call was planned ([] for forks)."""
    outputs: dict[str, list[int]]
    """Per segment, the sampled ids committed to it, in order."""
    tokenizer: CharTokenizer


def run(name: str, drifting_echoes: bool = True, windowing: bool | None = None) -> Run:
    """Drive the conversation through prepare/commit as the Gateway core does.

    `windowing` as `IncrementalTokenizer` takes it (None: the template's probe decides).
    """
    template, family = load(name)
    tokenizer = CharTokenizer([*family.markers, family.bos, family.eos])
    planner = IncrementalTokenizer(
        template, tokenizer, eot_token=family.markers, windowing=windowing
    )
    result = Run([], [], [], [], {}, tokenizer)
    history: list[Message] = []

    def plan_call() -> PromptPlan:
        plan = planner.prepare(result.segments, history, TOOLS)
        held = [s.ids for s in result.segments if s.segment_id == plan.segment_id]
        result.plans.append(plan)
        result.held_before.append(list(held[0]) if held else [])
        result.renders.append(template.render(history, TOOLS, add_generation_prompt=True))
        return plan

    for turn, step in enumerate(conversation()):
        history = [*history, *step.new]
        plan = plan_call()
        out = tokenizer.encode(sampled_text(template, family, history, step))
        seg = planner.commit(
            result.segments, plan, out, [-0.5] * len(out), step.reply, not step.cut
        )
        result.outputs.setdefault(seg.segment_id, []).extend(out)
        history = [*history, echo(step.reply, turn) if drifting_echoes else step.reply]
    history = [*history, Message(role="user", content="Bye.")]
    plan_call()
    return result


TEMPLATES = template_names()


def test_every_model_family_has_its_template() -> None:
    """The real templates are exactly those with a known family (none missing, none
    silently run with the Qwen default)."""
    assert sorted(set(TEMPLATES) - {TINY}) == sorted(FAMILIES)


@pytest.mark.parametrize("name", TEMPLATES)
def test_probe_finds_a_way_to_express_tool_calls(name: str) -> None:
    assert load(name)[0].supports_tools


@pytest.mark.parametrize("name", TEMPLATES)
def test_new_parts_are_exactly_what_the_template_renders_after_our_reply(name: str) -> None:
    result = run(name)
    steps = conversation()
    family = FAMILIES.get(name, QWEN)
    encode = result.tokenizer.encode
    forks: dict[int, str] = {}
    for i, plan in enumerate(result.plans):
        full = result.renders[i]
        if plan.kind is MatchKind.fork:
            forks[i] = plan.fork_reason or ""
            assert plan.prompt_ids == encode(full)
            continue
        previous = steps[i - 1]
        drifted = echo(previous.reply, i - 1) != previous.reply
        assert plan.kind is (MatchKind.realign if drifted else MatchKind.clean)
        assert plan.new_text == expected_new_text(full, family, previous.nonce, not previous.cut)
        assert plan.prompt_ids == result.held_before[i] + encode(plan.new_text)
        assert plan.new_token_count == len(encode(plan.new_text))
    expected = {0: "no held segment", **EXPECTED_FORKS.get(name, {})}
    assert sorted(forks) == sorted(expected), forks
    for i, reason in expected.items():
        assert forks[i].startswith(reason), forks[i]
    assert len(result.segments) == len(expected)


@pytest.mark.parametrize("name", TEMPLATES)
def test_held_tokens_keep_every_sampled_id_under_the_loss_mask(name: str) -> None:
    result = run(name)
    for seg in result.segments:
        trained = [i for i, m in zip(seg.ids, seg.mask, strict=True) if m]
        assert trained == result.outputs[seg.segment_id]
        assert all(lp == -0.5 for lp, m in zip(seg.logprobs, seg.mask, strict=True) if m)


@pytest.mark.parametrize("name", TEMPLATES)
def test_append_only_templates_hold_exactly_the_full_render(name: str) -> None:
    """With exact echoes; a re-formatted echo re-renders differently by design."""
    result = run(name, drifting_echoes=False)
    final = result.tokenizer.decode(result.plans[-1].prompt_ids)
    if name in APPEND_ONLY:
        assert final == result.renders[-1]
    else:
        assert final != result.renders[-1]
