"""Every shipped model family through the real Gateway: tool conversations on the
family's tiny model (its tokenizer, its real chat template, its end-of-turn ids) in front
of the scripted engine (a FAKE LLM) writing that family's own output format, driven by the
official `openai` and `anthropic` SDKs on Chat Completions, Responses and Anthropic
Messages, whole and streamed. Two plans: one call per turn over three turns, and two calls
in one turn (for a family whose template renders one call a turn, the test checks that
its template refuses or drops the second call, `ONE_CALL_A_TURN`).

Each conversation checks what an agent and a trainer rely on:
- the agent gets real tool calls (the name, arguments typed by the tool's schema) and the
  reasoning in its protocol's shape, and a tool-call turn ends as one (`tool_calls`,
  `tool_use`, function-call items) while the answer ends as a stop;
- the agent echoes the calls and results as agents do (Chat: verbatim with the reasoning,
  or the arguments re-serialised and the reasoning dropped; Responses and Messages: items
  or content blocks replayed, with or without the reasoning);
- the session is ONE trainable segment whose sampled tokens are exactly the ids the engine
  returned, and every prompt the engine got continues the tokens held before it. A
  template that cannot continue a conversation (`EXPECTED_FORKS`) forks exactly where
  documented, and nowhere else.

One engine and one Gateway serve each family for the whole module; conversations run one
after another, each in its own session.

What the engine writes is the family's real template's rendering of each assistant message
(`devstack.family_output`), cut at the family's end-of-turn marker, so no format is
written by hand here. Where a template never shows the text a model writes (it drops the
reasoning, or renders a lone call differently from the prompt it then continues), the
rendering is taken in the shortest history that shows the message, and a dropped
reasoning block is written back in the family's own tags.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from devstack.family_output import NotAContinuation, assistant_output
from devstack.scripted_engine import Script, ScriptedEngine, ScriptRule
from devstack.tiny_families import ensure_family_model, family_names, served_model_name
from gateway.canonical import Message, Tool, ToolCall
from gateway.parsers.registry import FAMILIES as REGISTERED
from gateway.parsers.registry import get_parser
from gateway.prompt.chat_template import ChatTemplate, TemplateRenderError
from gateway.prompt.model_files import load_model_files
from tests.fixtures.gateway import served_gateway
from tests.fixtures.real_templates import EXPECTED_FORKS, real_templates_dir
from tests.fixtures.real_templates import FAMILIES as TEMPLATE_STOPS
from workers.local_stack import InProcessGateway

pytestmark = pytest.mark.integration

SYSTEM = "You are a careful weather agent."
QUESTION = "What is the weather in Paris and Tokyo?"
PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "days": {"type": "integer"},
        "hourly": {"type": "boolean"},
        "fields": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["city", "days"],
}
TOOL = Tool(name="get_weather", description="Forecast for a city.", parameters=PARAMETERS)
PARIS: dict[str, Any] = {"city": "Paris", "days": 3, "hourly": True}
TOKYO: dict[str, Any] = {"city": "Tokyo", "days": 2, "fields": ["rain", "wind"]}
FORECASTS = {"Paris": "Paris: sunny, 21C", "Tokyo": "Tokyo: rainy, 17C"}
ANSWER = "Paris is sunny (21C); Tokyo is rainy (17C)."


@dataclass(frozen=True)
class Turn:
    """One model turn: its reasoning, then its tool calls (none: the answer)."""

    thought: str
    calls: tuple[dict[str, Any], ...] = ()
    preamble: str = ""
    """Text before the calls, where the family's template writes one."""


PLANS: dict[str, tuple[Turn, ...]] = {
    # one call per turn, then the answer
    "sequential": (
        Turn("I should look up Paris first.", (PARIS,)),
        Turn("Now Tokyo.", (TOKYO,)),
        Turn("Both forecasts are in."),
    ),
    # both calls in one turn (ids must tell their results apart), then the answer
    "parallel": (
        Turn("Both cities at once.", (PARIS, TOKYO), preamble="Checking both cities."),
        Turn("Both forecasts are in."),
    ),
}


PARALLEL_FORKS: dict[str, dict[int, str]] = {}
"""Like `EXPECTED_FORKS` (call index → reason), for the parallel plan: none. (The
DeepSeek-R1 distill template closes a turn of two calls, so its fork needs a lone call.)"""


def forecast(arguments: dict[str, Any]) -> str:
    """The tool's result, as the agent runs it."""
    return FORECASTS[arguments["city"]]


MAX_TOKENS = 512

CHAT_TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {"name": TOOL.name, "description": TOOL.description, "parameters": PARAMETERS},
    }
]
RESPONSES_TOOLS: list[Any] = [{"type": "function", **CHAT_TOOLS[0]["function"]}]
MESSAGES_TOOLS: list[Any] = [
    {"name": TOOL.name, "description": TOOL.description, "input_schema": PARAMETERS}
]


# -- what the family's model writes ------------------------------------------------------


def _canonical_call_id(family: str, index: int) -> str:
    """Ids the templates can render (`index`: the call's place in the conversation):
    Kimi's `functions.NAME:N`, and 9 alphanumerics elsewhere (Mistral-Nemo's template
    refuses any other)."""
    if family.startswith("kimi-k2"):
        return f"functions.{TOOL.name}:{index}"
    return f"call0000{index + 1}"


def _model_messages(family: str, plan: tuple[Turn, ...]) -> list[Message]:
    """The conversation as the model wrote it: system, question, then per turn the
    assistant message and (after calls) their tool results."""
    messages = [Message(role="system", content=SYSTEM), Message(role="user", content=QUESTION)]
    made = 0
    for turn in plan:
        if not turn.calls:
            messages.append(Message(role="assistant", content=ANSWER, reasoning=turn.thought))
            continue
        calls = [
            ToolCall(
                id=_canonical_call_id(family, made + n), name=TOOL.name, arguments=json.dumps(a)
            )
            for n, a in enumerate(turn.calls)
        ]
        made += len(calls)
        messages.append(
            Message(
                role="assistant", content=turn.preamble, reasoning=turn.thought, tool_calls=calls
            )
        )
        messages += [
            Message(role="tool", content=forecast(json.loads(c.arguments)), tool_call_id=c.id)
            for c in calls
        ]
    return messages


def _rendered(
    template: ChatTemplate, history: list[Message], reply: Message, opener: str | None
) -> str:
    """The template's text for `reply`, in the first history that renders it as the
    continuation of its prompt: the real one; the one the template shows (no system
    prompt, no earlier reasoning); the question alone."""
    shown = [m.model_copy(update={"reasoning": None}) for m in history if m.role != "system"]
    contexts = (history, shown, [Message(role="user", content=QUESTION)])
    for context in contexts:
        try:
            return assistant_output(template, context, reply, [TOOL])
        except NotAContinuation:
            continue
    # The generation prompt opens a reasoning block (`opener`) the rendered history never
    # shows (DeepSeek-R1 distills, QwQ): the message's rendering continues the prompt
    # without it.
    prompt = template.render(contexts[2], [TOOL], add_generation_prompt=True).rstrip()
    full = template.render([*contexts[2], reply], [TOOL], add_generation_prompt=False)
    assert opener is not None and prompt.endswith(opener), f"no rendering of {reply}"
    head = prompt.removesuffix(opener)
    assert full.startswith(head), f"no rendering of {reply} continues its prompt"
    return full[len(head) :]


def _with_reasoning(
    text: str, reasoning: str, tags: tuple[str, str], opener: str, opened: bool
) -> str:
    """Write a reasoning block the template dropped back into the model's text, in the
    family's tags spaced as its first generation prompt opens them (`opener`, e.g.
    `<think>\n`): closing the block the prompt `opened`, else in place of an empty block
    the template left, or in front."""
    start, end = tags
    if opened:
        return f"{reasoning}\n{end}\n\n{text}"
    spaced = opener.endswith("\n")
    block = f"{start}\n{reasoning}\n{end}\n\n" if spaced else f"{start}{reasoning}{end}"
    if text.startswith(f"{start}{end}"):
        return block + text.removeprefix(f"{start}{end}").lstrip()
    return block + text


@dataclass(frozen=True)
class FamilyScript:
    """What the engine answers on each turn, and what the agent should get from it."""

    plan: tuple[Turn, ...]
    replies: list[str]
    reasoning: list[str | None]
    """Per turn, the reasoning the model wrote (None: the family writes none)."""
    content: list[str | None]
    """Per turn, the text the model wrote besides reasoning and calls."""
    call_ids: list[list[str | None]]
    """Per turn and call, the id the model wrote in its text (Kimi, Mistral-Nemo)."""


class CannotWrite(Exception):
    """The family's template cannot render the plan (say, two calls in one turn)."""


ONE_CALL_A_TURN = {"gpt-oss", "llama3.1", "llama3.2"}
"""Families whose template renders at most one tool call per assistant turn: for them
the parallel plan must be refused (a template that starts writing two is a change)."""


def family_script(family: str, model_dir: Path, plan: tuple[Turn, ...]) -> FamilyScript:
    files = load_model_files(model_dir)
    template = ChatTemplate(
        files.chat_template, bos_token=files.bos_token, eos_token=files.eos_token
    )
    tags = get_parser(family).reasoning_tags
    first_prompt = template.render(
        _model_messages(family, plan)[:2], [TOOL], add_generation_prompt=True
    )
    # The family reasons when its template has reasoning tags and its first generation
    # prompt does not switch thinking off (DeepSeek-V3.1 closes the block at once).
    reasons = (
        tags is not None
        and tags[0] in files.chat_template
        and not first_prompt.rstrip().endswith(tags[1])
    )
    writer = _Writer(template, tags if reasons else None, first_prompt, files.end_of_turn, family)
    messages = _model_messages(family, plan)
    script = FamilyScript(plan, [], [], [], [])
    for at, reply in enumerate(messages):
        if reply.role != "assistant":
            continue
        if reply.tool_calls and reply.content:  # a preamble, where the template writes one
            try:
                text = writer.text(messages[:at], reply)
            except CannotWrite:
                reply = messages[at] = reply.model_copy(update={"content": ""})
                text = writer.text(messages[:at], reply)
        else:
            text = writer.text(messages[:at], reply)
        script.replies.append(text)
        script.reasoning.append(reply.reasoning if reply.reasoning in text else None)
        script.content.append(reply.content or None)
        script.call_ids.append([c.id if c.id in text else None for c in reply.tool_calls])
    return script


@dataclass(frozen=True)
class _Writer:
    """What a family's model writes for one assistant message."""

    template: ChatTemplate
    tags: tuple[str, str] | None
    """The reasoning tags, when the family reasons."""
    first_prompt: str
    end_of_turn: list[str]
    family: str

    def text(self, history: list[Message], reply: Message) -> str:
        try:
            text = _rendered(self.template, history, reply, self.tags[0] if self.tags else None)
        except TemplateRenderError as e:
            raise CannotWrite(f"its template refuses the turn: {e}") from None
        thought = reply.reasoning or ""
        if self.tags is not None and thought not in text:
            prompt = self.template.render(history, [TOOL], add_generation_prompt=True)
            opener = self.first_prompt[self.first_prompt.rfind(self.tags[0]) :]
            opened = prompt.rstrip().endswith(self.tags[0])
            text = _with_reasoning(text, thought, self.tags, opener, opened)
        for part in [json.loads(c.arguments)["city"] for c in reply.tool_calls] + [reply.content]:
            if part and part not in text:
                raise CannotWrite(f"its template renders only part of the turn (no {part!r})")
        nonce = json.loads(reply.tool_calls[-1].arguments)["city"] if reply.tool_calls else ANSWER
        marker = re.compile("|".join(map(re.escape, self.end_of_turn))).search(
            text, text.rindex(nonce)
        )
        if marker is not None:
            return text[: marker.end()]
        # the template closes the turn only with the next message's header
        stops = TEMPLATE_STOPS[self.family]
        return text + (stops.stop_tool if reply.tool_calls else stops.stop_answer)


# -- one engine and one Gateway per family ------------------------------------------------


@dataclass
class FamilyStack:
    family: str
    model: str
    engine: ScriptedEngine
    gateway: InProcessGateway
    scripts: dict[str, FamilyScript | str]
    """Per plan, what the engine says; or why the family cannot say it."""
    script: FamilyScript | None = None
    session_id: str = ""

    @property
    def forks(self) -> dict[int, str]:
        """Where this conversation must fork (the sequential plan is the conversation
        `EXPECTED_FORKS` documents)."""
        assert self.script is not None
        if self.script.plan is PLANS["sequential"]:
            return EXPECTED_FORKS.get(self.family, {})
        return PARALLEL_FORKS.get(self.family, {})

    def start_conversation(self, plan: str) -> dict[str, Any]:
        """A fresh session, and the engine set to answer the plan's turns in order (each
        later turn only once the previous turn's last tool result is in the prompt)."""
        script = self.scripts[plan]
        if isinstance(script, str):
            raise CannotWrite(script)
        self.script = script
        rules = [ScriptRule(reply=script.replies[0])]
        rules += [
            ScriptRule(reply=reply, when_contains=forecast(turn.calls[-1]))
            for reply, turn in zip(script.replies[1:], script.plan, strict=False)
        ]
        self.engine.reset(Script(rules=rules, default_reply="UNSCRIPTED"))
        session = self.gateway.create_session()
        self.session_id = session["session_id"]
        return session


def _scripts(family: str, model_dir: Path) -> dict[str, FamilyScript | str]:
    scripts: dict[str, FamilyScript | str] = {}
    for name, plan in PLANS.items():
        try:
            scripts[name] = family_script(family, model_dir, plan)
        except CannotWrite as e:
            scripts[name] = str(e)
    return scripts


@pytest.fixture(scope="module", params=family_names())
def stack(request: pytest.FixtureRequest, tmp_path_factory: Any) -> Iterator[FamilyStack]:
    family: str = request.param
    assert family in REGISTERED, f"{family}: a shipped template with no output parser"
    real_templates_dir()
    model_dir = ensure_family_model(family)
    model = served_model_name(family)
    files = load_model_files(model_dir)
    engine = ScriptedEngine(
        model_dir / "tokenizer.json",
        Script(),
        eos_token=files.eos_token,
        model=model,
        stop_tokens=files.end_of_turn,  # every scripted reply ends with one of them
    )
    scripts = _scripts(family, model_dir)
    data_dir = tmp_path_factory.mktemp(f"gateway-{family}")
    with served_gateway(engine.app(), model_dir, data_dir, model) as gateway:
        yield FamilyStack(family, model, engine, gateway, scripts)


# -- what the agent saw -------------------------------------------------------------------


@dataclass
class Seen:
    """One reply in protocol-neutral terms."""

    reasoning: str | None
    content: str | None
    calls: list[tuple[str, str, Any]]
    """(id, name, arguments as the agent reads them)."""
    end: str
    """"tool_calls" or "stop", from the protocol's own signal."""
    shape: list[str]
    """The protocol's parts in order (blocks, items; Chat: its fields present)."""


def chat_conversation(stack: FamilyStack, plan: str, stream: bool, echo: str) -> list[Seen]:
    session = stack.start_conversation(plan)
    client = openai.OpenAI(
        base_url=session["openai_base_url"], api_key=session["token"], max_retries=0
    )
    messages: list[Any] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": QUESTION},
    ]
    seen: list[Seen] = []
    for _ in PLANS[plan]:
        kwargs: dict[str, Any] = {
            "model": stack.model,
            "messages": messages,
            "tools": CHAT_TOOLS,
            "max_tokens": MAX_TOKENS,
        }
        if stream:
            with client.chat.completions.stream(**kwargs) as events:
                for _ in events:
                    pass
                completion = events.get_final_completion()
        else:
            completion = client.chat.completions.create(**kwargs)
        choice = completion.choices[0]
        message = choice.message
        reasoning = (message.model_extra or {}).get("reasoning_content")
        calls = message.tool_calls or []
        seen.append(
            Seen(
                reasoning,
                message.content,
                [(c.id, c.function.name, json.loads(c.function.arguments)) for c in calls],  # type: ignore[union-attr]
                choice.finish_reason,
                [
                    name
                    for name, value in (
                        ("reasoning", reasoning),
                        ("content", message.content),
                        ("tool_calls", calls),
                    )
                    if value
                ],
            )
        )
        if not calls:
            break
        echoed: dict[str, Any] = {"role": "assistant", "content": message.content, "tool_calls": []}
        for call in calls:
            arguments = call.function.arguments  # type: ignore[union-attr]
            if echo == "reserialised":
                arguments = json.dumps(json.loads(arguments), separators=(",", ":"))
            echoed["tool_calls"].append(
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.function.name, "arguments": arguments},  # type: ignore[union-attr]
                }
            )
        if echo == "verbatim" and reasoning:
            echoed["reasoning_content"] = reasoning
        messages.append(echoed)
        messages += [
            {
                "role": "tool",
                "tool_call_id": call.id,
                "content": forecast(json.loads(call.function.arguments)),  # type: ignore[union-attr]
            }
            for call in calls
        ]
    return seen


def responses_conversation(stack: FamilyStack, plan: str, stream: bool, echo: str) -> list[Seen]:
    session = stack.start_conversation(plan)
    client = openai.OpenAI(
        base_url=session["openai_base_url"], api_key=session["token"], max_retries=0
    )
    items: list[Any] = [{"role": "user", "content": QUESTION}]
    seen: list[Seen] = []
    for _ in PLANS[plan]:
        kwargs: dict[str, Any] = {
            "model": stack.model,
            "instructions": SYSTEM,
            "input": items,
            "tools": RESPONSES_TOOLS,
            "store": False,
            "include": ["reasoning.encrypted_content"],
            "max_output_tokens": MAX_TOKENS,
        }
        deltas: dict[str, str] = {"reasoning": "", "content": ""}
        arguments_done: list[str] = []
        if stream:
            with client.responses.stream(**kwargs) as events:
                for event in events:
                    if event.type == "response.reasoning_text.delta":
                        deltas["reasoning"] += event.delta
                    elif event.type == "response.output_text.delta":
                        deltas["content"] += event.delta
                    elif event.type == "response.function_call_arguments.done":
                        arguments_done.append(event.arguments)
                response = events.get_final_response()
        else:
            response = client.responses.create(**kwargs)
        assert response.status == "completed"
        reasoning = "".join(
            part.text
            for item in response.output
            if item.type == "reasoning"
            for part in item.content or []
        )
        content = "".join(
            part.text
            for item in response.output
            if item.type == "message"
            for part in item.content
            if part.type == "output_text"
        )
        calls = [item for item in response.output if item.type == "function_call"]
        if stream:  # what the events showed is the response they completed
            assert deltas == {"reasoning": reasoning, "content": content}
            assert arguments_done == [call.arguments for call in calls]
        seen.append(
            Seen(
                reasoning or None,
                content or None,
                [(c.call_id, c.name, json.loads(c.arguments)) for c in calls],
                "tool_calls" if calls else "stop",
                [item.type for item in response.output],
            )
        )
        if not calls:
            break
        # Codex replays the whole history itself, reasoning items verbatim; a client
        # that keeps no reasoning replays the rest.
        items += [
            item.model_dump(exclude_none=True)
            for item in response.output
            if echo == "verbatim" or item.type != "reasoning"
        ]
        items += [
            {
                "type": "function_call_output",
                "call_id": c.call_id,
                "output": forecast(json.loads(c.arguments)),
            }
            for c in calls
        ]
    return seen


def messages_conversation(stack: FamilyStack, plan: str, stream: bool, echo: str) -> list[Seen]:
    session = stack.start_conversation(plan)
    client = anthropic.Anthropic(
        base_url=session["anthropic_base_url"], api_key=session["token"], max_retries=0
    )
    messages: list[Any] = [{"role": "user", "content": QUESTION}]
    seen: list[Seen] = []
    for _ in PLANS[plan]:
        kwargs: dict[str, Any] = {
            "model": stack.model,
            "max_tokens": MAX_TOKENS,
            "system": [{"type": "text", "text": SYSTEM}],
            "messages": messages,
            "tools": MESSAGES_TOOLS,
        }
        if stream:
            with client.messages.stream(**kwargs) as events:
                message = events.get_final_message()
        else:
            message = client.messages.create(**kwargs)
        blocks = message.content
        calls = [b for b in blocks if b.type == "tool_use"]
        assert message.stop_reason in ("tool_use", "end_turn"), message.stop_reason
        seen.append(
            Seen(
                "".join(b.thinking for b in blocks if b.type == "thinking") or None,
                "".join(b.text for b in blocks if b.type == "text") or None,
                [(b.id, b.name, b.input) for b in calls],
                "tool_calls" if message.stop_reason == "tool_use" else "stop",
                [b.type for b in blocks],
            )
        )
        if not calls:
            break
        # Claude Code sends the content blocks back as they came, signatures included; a
        # client that keeps no reasoning sends the rest.
        kept = [b for b in blocks if echo == "verbatim" or b.type != "thinking"]
        messages.append(
            {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in kept]}
        )
        messages.append(
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": b.id, "content": forecast(b.input)}
                    for b in calls
                ],
            }
        )
    return seen


# -- the checks ---------------------------------------------------------------------------

SHAPES: dict[str, tuple[str, str, str]] = {
    # protocol: (reasoning part, content part, call part)
    "chat": ("reasoning", "content", "tool_calls"),
    "responses": ("reasoning", "message", "function_call"),
    "messages": ("thinking", "text", "tool_use"),
}


def assert_agent_saw_the_model(stack: FamilyStack, protocol: str, seen: list[Seen]) -> None:
    script = stack.script
    assert script is not None
    assert len(seen) == len(script.plan), f"the conversation stopped early: {seen[-1]}"
    reasoning_part, content_part, call_part = SHAPES[protocol]
    for turn, (planned, got) in enumerate(zip(script.plan, seen, strict=True)):
        thought = script.reasoning[turn]
        assert (got.reasoning or "").strip() == (thought or ""), (turn, got)
        calls = [(name, arguments) for _, name, arguments in got.calls]
        assert calls == [(TOOL.name, arguments) for arguments in planned.calls], (turn, got)
        content = script.content[turn]
        if planned.calls:
            assert (got.content or "").strip() == (content or ""), (turn, got)
            assert got.end == "tool_calls", (turn, got)
            ids = [call_id for call_id, _, _ in got.calls]
            assert len(set(ids)) == len(ids), ids
            for written, call_id in zip(script.call_ids[turn], ids, strict=True):
                assert written in (None, call_id), "the id the model wrote is not kept"
        else:
            assert (got.content or "").strip() == ANSWER, got
            assert got.end == "stop", got
        expected_shape = [reasoning_part] if thought else []
        expected_shape += [content_part] if content else []
        if planned.calls:
            expected_shape += [call_part] * (1 if protocol == "chat" else len(planned.calls))
        assert got.shape == expected_shape, (turn, got.shape)


def assert_one_token_exact_segment(stack: FamilyStack, session_id: str) -> None:
    """One trainable segment per conversation (or exactly the documented forks), whose
    sampled tokens are the engine's, each prompt continuing the tokens held before it."""
    replies = stack.engine.replies
    turns = len(replies)
    assert [r.rule for r in replies] == list(range(turns)), "the engine answered out of script"
    trajectory = stack.gateway.trajectory(session_id)
    calls = trajectory["calls"]
    assert len(calls) == turns
    for index, call in enumerate(calls):
        assert call["output_ids"] == replies[index].output_ids
        assert call["prompt_ids"] == replies[index].prompt_ids
        if index == 0:
            continue  # the first call opens the segment
        if index in stack.forks:
            assert call["match"] == "fork", (index, call["match"])
            assert stack.forks[index] in (call["fork_reason"] or ""), call["fork_reason"]
        else:
            assert call["match"] != "fork", (index, call["fork_reason"])
    segments = trajectory["segments"]
    assert len(segments) == 1 + len(stack.forks), [c["match"] for c in calls]
    by_id = {call["call_id"]: index for index, call in enumerate(calls)}
    for segment in segments:
        assert segment["trainable"]
        indices = [by_id[call_id] for call_id in segment["call_ids"]]
        assert indices == sorted(indices)
        mask = segment["loss_mask"]
        sampled = [t for t, m in zip(segment["response_ids"], mask, strict=True) if m]
        assert sampled == [t for i in indices for t in replies[i].output_ids]
        logprobs = [lp for lp, m in zip(segment["logprobs"], mask, strict=True) if m]
        assert logprobs == [lp for i in indices for lp in replies[i].output_logprobs]
        held = [*segment["prompt_ids"], *segment["response_ids"]]
        for index, start in zip(indices, segment["call_starts"], strict=True):
            assert replies[index].prompt_ids == held[: len(segment["prompt_ids"]) + start]
    assert sum(len(s["call_ids"]) for s in segments) == turns


def run_and_check(
    stack: FamilyStack, protocol: str, conversation: Callable[[], list[Seen]]
) -> None:
    try:
        seen = conversation()
    except CannotWrite as refused:
        assert stack.family in ONE_CALL_A_TURN, f"{stack.family}: {refused}"
        return
    assert stack.family not in ONE_CALL_A_TURN or isinstance(stack.scripts["parallel"], str)
    assert_agent_saw_the_model(stack, protocol, seen)
    assert_one_token_exact_segment(stack, stack.session_id)


def cases(echoes: tuple[str, str]) -> Any:
    """(plan, echo, stream): the sequential plan with either echo, the parallel plan with
    the echo that drifts (the other one adds nothing a second call would change)."""
    return pytest.mark.parametrize(
        ("plan", "echo", "stream"),
        [
            pytest.param(
                plan, echo, stream, id=f"{plan}-{echo}-{'streamed' if stream else 'whole'}"
            )
            for plan in PLANS
            for echo in (echoes if plan == "sequential" else echoes[1:])
            for stream in (False, True)
        ],
    )


@cases(("verbatim", "reserialised"))
def test_chat_completions_tool_conversation(
    stack: FamilyStack, plan: str, echo: str, stream: bool
) -> None:
    run_and_check(stack, "chat", lambda: chat_conversation(stack, plan, stream, echo))


@cases(("verbatim", "reasoning-dropped"))
def test_responses_tool_conversation(
    stack: FamilyStack, plan: str, echo: str, stream: bool
) -> None:
    run_and_check(stack, "responses", lambda: responses_conversation(stack, plan, stream, echo))


@cases(("verbatim", "reasoning-dropped"))
def test_messages_tool_conversation(stack: FamilyStack, plan: str, echo: str, stream: bool) -> None:
    run_and_check(stack, "messages", lambda: messages_conversation(stack, plan, stream, echo))
