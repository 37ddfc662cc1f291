"""Our output parsers against vLLM's, family by family, on the same model output texts.

vLLM is the reference a user switching to the Gateway compares with: for each family in
the parser registry (`test_every_registered_family_is_compared`) the parsers vLLM would
run for it (its `--tool-call-parser` / `--reasoning-parser` names, see `FAMILIES`) split
the same text, whole and streamed in groups of 1-8 tokens of that family's tiny
tokenizer. Our whole parse must agree with vLLM's whole parse, and our stream (the
Gateway's `OutputStream` fed the same groups, its deltas folded as a client folds them)
with vLLM's stream for each group size:

* arguments are compared as parsed JSON (so `{"a": 1}` equals `{"a":1}`), content and
  reasoning after stripping surrounding whitespace (an empty field equals a missing one);
* a difference we keep on purpose is a row of `DIFFERENCES` with its reason, and the test
  asserts the row still differs, so a difference that disappears shows up here;
* how it differs is pinned: both sides' exact output on every case with a row, whole and
  streamed, not normalised, is in `PINS` (parsers_vs_vllm_pins.json, next to this file),
  and any change in it fails `test_exempt_output_is_pinned`.

The texts are written by `Family.write` from one table of scenarios (`SCENARIOS`), so
every family meets the same content, reasoning, calls and typed arguments, plus texts
built per family (malformed calls, text after the calls, replies cut by `max_tokens`).
`test_vllm_reads_the_written_format` checks the writers against vLLM alone (it runs for
families whose parser we do not have yet). All of vLLM's work is one subprocess for the
whole module.
"""

from __future__ import annotations

import functools
import json
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pytest

from devstack.tiny_families import ensure_family_model
from gateway.canonical import ParsedOutput
from gateway.parsers.base import ParseContext, ToolCallDone
from gateway.parsers.registry import FAMILIES, get_parser, parser_names
from gateway.parsers.selection import family_for
from gateway.parsers.stream import OutputStream
from gateway.prompt.incremental import Tokenizer, load_tokenizer
from gateway.protocols.sse import Sent
from tests.fixtures.vllm_reference import (
    ReferenceCase,
    ReferenceParse,
    ReferenceResult,
    VllmReferenceFailed,
    vllm_reference,
)

pytestmark = pytest.mark.needs("vllm_venv")

CHUNK_SIZES = list(range(1, 9))
UNKNOWN_PARSER = "no_such_parser"

# ---------------------------------------------------------------- tools and scenarios


def _tool(name: str, properties: dict[str, Any], required: Sequence[str] = ()) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": f"{name} (a test tool)",
            "parameters": {"type": "object", "properties": properties, "required": [*required]},
        },
    }


TOOLS = [
    _tool(
        "get_weather",
        {"city": {"type": "string"}, "days": {"type": "integer"}},
        required=["city"],
    ),
    _tool("list_files", {"path": {"type": "string"}, "recursive": {"type": "boolean"}}),
    _tool(
        "configure",
        {
            "ratio": {"type": "number"},
            "enabled": {"type": "boolean"},
            "limits": {"type": "object"},
            "tags": {"type": "array", "items": {"type": "string"}},
            "note": {"anyOf": [{"type": "string"}, {"type": "null"}]},
            "count": {"type": "integer"},
        },
    ),
    _tool("echo", {"text": {"type": "string"}, "code": {"type": "string"}}),
]
TOOL_SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


@dataclass(frozen=True)
class Call:
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class Scenario:
    """What the model meant to say; each family writes it in its own format."""

    id: str
    reasoning: str | None = None
    content: str | None = None
    calls: tuple[Call, ...] = ()


WEATHER = Call("get_weather", {"city": "Paris", "days": 3})
SCENARIOS = [
    Scenario("plain", content="The forecast for tomorrow is sunny and mild."),
    Scenario(
        "reasoning_content",
        reasoning="The user wants a short greeting, so I answer briefly.",
        content="Hello there, nice to meet you!",
    ),
    Scenario("one_call", calls=(WEATHER,)),
    Scenario("content_then_call", content="Let me look that up for you.", calls=(WEATHER,)),
    Scenario("reasoning_then_call", reasoning="I need the weather tool here.", calls=(WEATHER,)),
    Scenario(
        "two_calls",
        calls=(
            Call("get_weather", {"city": "Oslo", "days": 2}),
            Call("list_files", {"path": "/srv/data", "recursive": True}),
        ),
    ),
    Scenario(
        "typed_args",
        calls=(
            Call(
                "configure",
                {
                    "ratio": 0.75,
                    "enabled": False,
                    "limits": {"max": 10, "names": ["a", "b"]},
                    "tags": ["x", "y"],
                    "note": None,
                    "count": -4,
                },
            ),
        ),
    ),
    Scenario("string_lookalikes", calls=(Call("echo", {"text": "42", "code": "true"}),)),
    Scenario(
        "multiline_string",
        calls=(Call("echo", {"text": "line one\nline two", "code": "if a < b:\n    pass"}),),
    ),
    Scenario("unicode", calls=(Call("get_weather", {"city": "Zürich – 東京", "days": 1}),)),
    Scenario("no_arguments", calls=(Call("list_files", {}),)),
    Scenario("unknown_tool", calls=(Call("launch_rocket", {"target": "moon"}),)),
]
SCENARIO_IDS = {s.id for s in SCENARIOS}

# ---------------------------------------------------------------- how each family writes


def _value_text(value: Any) -> str:
    """An XML parameter's text: strings as they are, everything else as JSON."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _hermes_calls(calls: Sequence[Call]) -> str:
    return "\n".join(
        "<tool_call>\n"
        + json.dumps({"name": c.name, "arguments": c.arguments}, ensure_ascii=False)
        + "\n</tool_call>"
        for c in calls
    )


def _qwen_xml_calls(calls: Sequence[Call]) -> str:
    blocks = []
    for c in calls:
        params = "".join(
            f"<parameter={k}>\n{_value_text(v)}\n</parameter>\n" for k, v in c.arguments.items()
        )
        blocks.append(f"<tool_call>\n<function={c.name}>\n{params}</function>\n</tool_call>")
    return "\n".join(blocks)


def _glm_calls(calls: Sequence[Call]) -> str:
    return "".join(
        f"<tool_call>{c.name}"
        + "".join(
            f"<arg_key>{k}</arg_key><arg_value>{_value_text(v)}</arg_value>"
            for k, v in c.arguments.items()
        )
        + "</tool_call>"
        for c in calls
    )


def _kimi_calls(calls: Sequence[Call]) -> str:
    body = "".join(
        f"<|tool_call_begin|>functions.{c.name}:{i}<|tool_call_argument_begin|>"
        f"{json.dumps(c.arguments, ensure_ascii=False)}<|tool_call_end|>"
        for i, c in enumerate(calls)
    )
    return f"<|tool_calls_section_begin|>{body}<|tool_calls_section_end|>"


def _deepseek_v31_calls(calls: Sequence[Call]) -> str:
    body = "".join(
        f"<｜tool▁call▁begin｜>{c.name}<｜tool▁sep｜>"
        f"{json.dumps(c.arguments, ensure_ascii=False)}<｜tool▁call▁end｜>"
        for c in calls
    )
    return f"<｜tool▁calls▁begin｜>{body}<｜tool▁calls▁end｜>"


def _deepseek_r1_calls(calls: Sequence[Call]) -> str:
    body = "\n".join(
        f"<｜tool▁call▁begin｜>function<｜tool▁sep｜>{c.name}\n```json\n"
        f"{json.dumps(c.arguments, ensure_ascii=False)}\n```<｜tool▁call▁end｜>"
        for c in calls
    )
    return f"<｜tool▁calls▁begin｜>{body}<｜tool▁calls▁end｜>"


def _llama_calls(calls: Sequence[Call]) -> str:
    return "; ".join(
        json.dumps({"name": c.name, "parameters": c.arguments}, ensure_ascii=False) for c in calls
    )


def _python_literal(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return repr(value)
    if isinstance(value, dict):
        items = ", ".join(f"{json.dumps(k)}: {_python_literal(v)}" for k, v in value.items())
        return "{" + items + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_python_literal(v) for v in value) + "]"
    return json.dumps(value, ensure_ascii=False)


def _pythonic_calls(calls: Sequence[Call]) -> str:
    return (
        "["
        + ", ".join(
            f"{c.name}("
            + ", ".join(f"{k}={_python_literal(v)}" for k, v in c.arguments.items())
            + ")"
            for c in calls
        )
        + "]"
    )


def _minimax_calls(calls: Sequence[Call]) -> str:
    invokes = "".join(
        f'<invoke name="{c.name}">\n'
        + "".join(
            f'<parameter name="{k}">{_value_text(v)}</parameter>\n' for k, v in c.arguments.items()
        )
        + "</invoke>\n"
        for c in calls
    )
    return f"<minimax:tool_call>\n{invokes}</minimax:tool_call>"


def _mistral_calls(calls: Sequence[Call]) -> str:
    return "".join(
        f"[TOOL_CALLS]{c.name}[ARGS]{json.dumps(c.arguments, ensure_ascii=False)}" for c in calls
    )


def _mistral_nemo_calls(calls: Sequence[Call]) -> str:
    items = [{"name": c.name, "arguments": c.arguments} for c in calls]
    return "[TOOL_CALLS]" + json.dumps(items, ensure_ascii=False)


@dataclass(frozen=True)
class Family:
    """One of our families, the vLLM parsers that answer to it, and how it writes."""

    name: str
    tool_parser: str | None
    reasoning_parser: str | None
    write_calls: Callable[[Sequence[Call]], str]
    model: str = ""
    """The tiny family model whose tokenizer splits the text ("": the family's own)."""
    variant: str = ""
    """Names a second configuration of the same family (e.g. thinking switched off)."""
    think: tuple[str, str] | None = None
    """Reasoning open/close tags; None: the family does not reason (in tags)."""
    prompt_tail: str = ""
    """The end of the generation prompt (vLLM reads from it whether reasoning is open)."""
    starts_in_reasoning: bool = False
    always_thinks: bool = False
    """The model opens its reasoning block even with nothing to think (an empty block)."""
    end: str = ""
    """The end-of-turn marker the output ends with (vLLM leaves it out of the text)."""
    call_end: str | None = None
    """A different end-of-turn marker after tool calls (None: `end`)."""
    content_gap: str = "\n\n"
    """Between content and the first tool call."""
    think_gap: str = "\n\n"
    """Between the end of reasoning and what follows."""
    malformed: dict[str, str] = field(default_factory=dict)
    """Malformed outputs by case id (written after the family's empty reasoning block)."""
    ids_from_text: bool = False
    """The model writes the tool-call ids (Kimi's `functions.NAME:N`): compare them too."""
    raw: dict[str, str] = field(default_factory=dict)
    """Whole outputs written out by hand (what the scenarios cannot say)."""
    request_overrides: dict[str, Any] = field(default_factory=dict)
    max_calls: int | None = None
    """How many calls one output can hold (harmony's sampling stops at its first)."""

    @property
    def label(self) -> str:
        return f"{self.name}:{self.variant}" if self.variant else self.name

    def applies(self, scenario: Scenario) -> bool:
        if scenario.reasoning is not None and self.think is None:
            return False
        return self.max_calls is None or len(scenario.calls) <= self.max_calls

    def head(self, reasoning: str | None) -> str:
        """The reasoning block (the part of it the output writes), if the output has one."""
        thinks = reasoning is not None or self.starts_in_reasoning or self.always_thinks
        if self.think is None or not thinks:
            return ""
        opened = "" if self.starts_in_reasoning else self.think[0]
        return f"{opened}{reasoning or ''}{self.think[1]}{self.think_gap}"

    def content_head(self) -> str:
        """What comes before the content of a reply without calls."""
        return self.head(None)

    def write(self, scenario: Scenario) -> str:
        head = self.head(scenario.reasoning)
        body = scenario.content or ""
        if scenario.calls:
            body += (self.content_gap if body else "") + self.write_calls(scenario.calls)
        end = self.call_end if scenario.calls and self.call_end is not None else self.end
        return head + body + end


def _harmony_write(scenario: Scenario) -> str:
    """gpt-oss: one message per channel; the generation prompt ends at `<|start|>assistant`
    and the output at `<|call|>` (a call) or `<|return|>`."""
    parts = []
    if scenario.reasoning is not None:
        parts.append(f"<|channel|>analysis<|message|>{scenario.reasoning}<|end|><|start|>assistant")
    if not scenario.calls:
        return "".join(parts) + f"<|channel|>final<|message|>{scenario.content or ''}<|return|>"
    if scenario.content is not None:
        parts.append(f"<|channel|>commentary<|message|>{scenario.content}<|end|><|start|>assistant")
    return "".join(parts) + _harmony_call(scenario.calls)


def _harmony_call(calls: Sequence[Call]) -> str:
    """The one call a harmony output can end with (sampling stops at `<|call|>`)."""
    (call,) = calls
    args = json.dumps(call.arguments, ensure_ascii=False)
    return (
        f"<|channel|>commentary to=functions.{call.name} <|constrain|>json<|message|>{args}<|call|>"
    )


class HarmonyFamily(Family):
    def head(self, reasoning: str | None) -> str:
        return ""

    def content_head(self) -> str:
        return "<|channel|>final<|message|>"

    def write(self, scenario: Scenario) -> str:
        return _harmony_write(scenario)


THINK = ("<think>", "</think>")
QWEN_END = "<|im_end|>"
DEEPSEEK_END = "<｜end▁of▁sentence｜>"

HERMES_MALFORMED = {
    # Not malformed: the closing marker inside a JSON string does not end the call.
    "marker_in_string": '<tool_call>\n{"name": "echo", "arguments": {"text": "a </tool_call> b"}}'
    "\n</tool_call>",
    "unclosed_call": 'Checking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa',
    "broken_json": '<tool_call>\n{"name": "get_weather", "arguments": {city: Paris}}\n</tool_call>',
}
QWEN_XML_MALFORMED = {
    "unclosed_call": "Checking.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nPar",
    "no_function": "<tool_call>\nget_weather city=Paris\n</tool_call>",
}

FAMILIES_UNDER_TEST = [
    Family(
        "qwen3",
        "hermes",
        "qwen3",
        _hermes_calls,
        think=THINK,
        prompt_tail="<|im_start|>assistant\n",
        always_thinks=True,
        end=QWEN_END,
        malformed=HERMES_MALFORMED,
    ),
    Family(
        "qwen3",
        "hermes",
        "qwen3",
        _hermes_calls,
        variant="no-thinking",
        prompt_tail="<|im_start|>assistant\n<think>\n\n</think>\n\n",
        end=QWEN_END,
        request_overrides={"chat_template_kwargs": {"enable_thinking": False}},
        malformed=HERMES_MALFORMED,
    ),
    Family(
        "qwq-32b",
        "hermes",
        "deepseek_r1",
        _hermes_calls,
        think=THINK,
        prompt_tail="<|im_start|>assistant\n<think>\n",
        starts_in_reasoning=True,
        end=QWEN_END,
        malformed=HERMES_MALFORMED,
    ),
    Family(
        "qwen2.5",
        "hermes",
        None,
        _hermes_calls,
        prompt_tail="<|im_start|>assistant\n",
        end=QWEN_END,
        malformed=HERMES_MALFORMED,
    ),
    Family(
        "hermes",
        "hermes",
        None,
        _hermes_calls,
        model="qwen3",
        prompt_tail="<|im_start|>assistant\n",
        end=QWEN_END,
        malformed=HERMES_MALFORMED,
        raw={
            # A reasoning model served with the hermes tool parser alone.
            "think_block": "<think>\nA greeting, so I answer briefly.\n</think>\n\nHello there!"
            + QWEN_END,
        },
    ),
    Family(
        "qwen3-coder",
        "qwen3_coder",
        None,
        _qwen_xml_calls,
        prompt_tail="<|im_start|>assistant\n",
        end=QWEN_END,
        malformed=QWEN_XML_MALFORMED,
    ),
    Family(
        "qwen3.5",
        "qwen3_coder",
        "qwen3",
        _qwen_xml_calls,
        think=THINK,
        prompt_tail="<|im_start|>assistant\n<think>\n",
        starts_in_reasoning=True,
        end=QWEN_END,
        malformed=QWEN_XML_MALFORMED,
        raw={
            # Qwen3.5 may call a tool before it closes its reasoning.
            "call_in_reasoning": "I need the weather first.\n"
            + _qwen_xml_calls([WEATHER])
            + QWEN_END,
        },
    ),
    Family(
        "glm-4.7-flash",
        "glm47",
        "glm45",
        _glm_calls,
        think=THINK,
        prompt_tail="<|assistant|><think>",
        starts_in_reasoning=True,
        end="<|user|>",
        call_end="<|observation|>",
        content_gap="",
        think_gap="",
        malformed={
            "unclosed_call": "Checking.<tool_call>get_weather<arg_key>city</arg_key><arg_value>Par",
            "no_value": "<tool_call>get_weather<arg_key>city</arg_key></tool_call>",
        },
    ),
    HarmonyFamily(
        "gpt-oss",
        "openai",
        "openai_gptoss",
        _harmony_call,
        think=("<|channel|>analysis<|message|>", "<|end|>"),
        prompt_tail="<|start|>assistant",
        max_calls=1,
        malformed={
            "unclosed_call": "<|channel|>commentary to=functions.get_weather <|constrain|>json"
            '<|message|>{"city": "Pa',
            "broken_json": "<|channel|>commentary to=functions.get_weather <|constrain|>json"
            "<|message|>{city: Paris}<|call|>",
        },
    ),
    Family(
        "kimi-k2",
        "kimi_k2",
        None,
        _kimi_calls,
        ids_from_text=True,
        prompt_tail="<|im_assistant|>assistant<|im_middle|>",
        end="<|im_end|>",
        content_gap="",
        malformed={
            "unclosed_call": "Checking.<|tool_calls_section_begin|><|tool_call_begin|>"
            'functions.get_weather:0<|tool_call_argument_begin|>{"city": "Pa',
            "broken_json": "<|tool_calls_section_begin|><|tool_call_begin|>functions."
            "get_weather:0<|tool_call_argument_begin|>{city: Paris}<|tool_call_end|>"
            "<|tool_calls_section_end|>",
        },
    ),
    Family(
        "kimi-k2-thinking",
        "kimi_k2",
        "kimi_k2",
        _kimi_calls,
        ids_from_text=True,
        think=THINK,
        prompt_tail="<|im_assistant|>assistant<|im_middle|>",
        always_thinks=True,
        end="<|im_end|>",
        content_gap="",
        think_gap="",
        malformed={
            "unclosed_call": "Checking.<|tool_calls_section_begin|>"
            "<|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>"
            '{"city": "Pa',
        },
    ),
    Family(
        "deepseek-v3.1",
        "deepseek_v31",
        "deepseek_v3",
        _deepseek_v31_calls,
        think=THINK,
        prompt_tail="<｜Assistant｜><think>",
        starts_in_reasoning=True,
        end=DEEPSEEK_END,
        content_gap="",
        think_gap="",
        request_overrides={"chat_template_kwargs": {"thinking": True}},
        malformed={
            "unclosed_call": "Checking.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>"
            'get_weather<｜tool▁sep｜>{"city": "Pa',
            "broken_json": "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather"
            "<｜tool▁sep｜>{city: Paris}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
        },
    ),
    Family(
        "deepseek-v3.1",
        "deepseek_v31",
        "deepseek_v3",
        _deepseek_v31_calls,
        variant="no-thinking",
        prompt_tail="<｜Assistant｜></think>",
        end=DEEPSEEK_END,
        content_gap="",
        request_overrides={"chat_template_kwargs": {"thinking": False}},
    ),
    Family(
        "deepseek-r1-distill-qwen",
        "deepseek_v3",
        "deepseek_r1",
        _deepseek_r1_calls,
        think=THINK,
        prompt_tail="<｜Assistant｜><think>\n",
        starts_in_reasoning=True,
        end=DEEPSEEK_END,
        malformed={
            "unclosed_call": "Checking.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>"
            'function<｜tool▁sep｜>get_weather\n```json\n{"city": "Pa',
        },
    ),
    *(
        Family(
            name,
            "llama3_json",
            None,
            _llama_calls,
            prompt_tail="<|start_header_id|>assistant<|end_header_id|>\n\n",
            end="<|eot_id|>",
            content_gap=" ",
            malformed={
                "broken_json": '{"name": "get_weather", "parameters": {city: Paris}}',
                "python_tag": '<|python_tag|>{"name": "get_weather", "parameters": '
                '{"city": "Paris", "days": 3}}',
            },
        )
        for name in ("llama3.1", "llama3.2")
    ),
    Family(
        "pythonic",
        "pythonic",
        None,
        _pythonic_calls,
        model="llama3.2",
        prompt_tail="<|start_header_id|>assistant<|end_header_id|>\n\n",
        end="<|eot_id|>",
        content_gap=" ",
        malformed={
            "unclosed_call": '[get_weather(city="Pa',
            "positional": '[get_weather("Paris", 3)]',
        },
    ),
    Family(
        "minimax-m2",
        "minimax_m2",
        "minimax_m2",
        _minimax_calls,
        think=THINK,
        prompt_tail="]~b]ai\n<think>\n",
        starts_in_reasoning=True,
        end="[e~[",
        content_gap="\n",
        malformed={
            "unclosed_call": "Checking.\n<minimax:tool_call>\n"
            '<invoke name="get_weather">\n<parameter name="city">Par',
        },
    ),
    Family(
        "ministral-3-reasoning",
        "mistral",
        "mistral",
        _mistral_calls,
        think=("[THINK]", "[/THINK]"),
        prompt_tail="[/INST]",
        end="</s>",
        content_gap="",
        think_gap="",
        malformed={
            "unclosed_call": 'Checking.[TOOL_CALLS]get_weather[ARGS]{"city": "Pa',
            "broken_json": "[TOOL_CALLS]get_weather[ARGS]{city: Paris}",
        },
    ),
    Family(
        "mistral-nemo",
        "mistral",
        None,
        _mistral_nemo_calls,
        prompt_tail="[/INST]",
        end="</s>",
        content_gap="",
        malformed={
            "unclosed_call": 'Checking.[TOOL_CALLS][{"name": "get_weather", "arguments": '
            '{"city": "Pa',
            "broken_json": '[TOOL_CALLS][{"name": "get_weather", "arguments": {city: Paris}}]',
        },
    ),
]


@dataclass(frozen=True)
class Case:
    family: Family
    id: str
    text: str
    scenario: Scenario | None
    """None: a malformed text (no intent to compare with)."""

    @property
    def key(self) -> str:
        return f"{self.family.label}/{self.id}"


def _cases(family: Family) -> list[Case]:
    cases = [Case(family, s.id, family.write(s), s) for s in SCENARIOS if family.applies(s)]
    # A malformed call comes after the (empty) reasoning block, where the family has one.
    head = family.head(None)
    cases += [Case(family, k, head + v + family.end, None) for k, v in family.malformed.items()]
    cases += [Case(family, k, v, None) for k, v in family.raw.items()]
    if family.max_calls is None:
        # Text after the calls (some of vLLM's parsers drop it).
        calls = family.write(Scenario("after", calls=(WEATHER,))).removesuffix(
            family.call_end or family.end
        )
        text = calls + "\nThat should do it." + (family.call_end or family.end)
        cases.append(Case(family, "text_after_call", text, None))
    # Replies cut by max_tokens: no end-of-turn marker, maybe inside the reasoning.
    cut = Scenario("cut_in_content", content="The answer is")
    cases.append(Case(family, cut.id, family.content_head() + "The answer is", cut))
    if family.think is not None:
        cut = Scenario("cut_in_reasoning", reasoning="Still weighing the")
        opened = "" if family.starts_in_reasoning else family.think[0]
        cases.append(Case(family, cut.id, opened + "Still weighing the", cut))
    return cases


ALL_CASES = [case for family in FAMILIES_UNDER_TEST for case in _cases(family)]

# ---------------------------------------------------------------- documented differences

_AS_CONTENT = (
    "we answer it as content with a parse note: the agent sees what the model wrote, and "
    "an agent cannot run a call that does not parse or names no declared tool"
)
UNKNOWN_TOOL_KEPT = f"vLLM returns a call to a tool the request did not declare; {_AS_CONTENT}"
UNKNOWN_TOOL_DROPPED = (
    f"vLLM drops a call to a tool the request did not declare, text and all; {_AS_CONTENT}"
)
STREAM_SENDS_BROKEN_CALL = (
    "vLLM's streaming sends a tool call for a block that never closes or does not parse "
    "(its arguments not JSON, or empty), where its own whole parse gives the text back"
)
PYTHONIC_TEXT_BEFORE_CALL = (
    "vLLM's pythonic parser reads calls only when the whole output is the call list: after "
    "text it all stays text (and so it does for us)"
)
UNCLOSED_CALL_KEPT = (
    "vLLM's whole parse returns a call whose block never closed, with the parameters that "
    f"did close (none here, so `{{}}`); {_AS_CONTENT}"
)
NON_JSON_ARGUMENTS_KEPT = f"vLLM returns a call whose arguments are not JSON; {_AS_CONTENT}"
STREAM_LOSES_ARGUMENT_END = (
    "vLLM's deepseek tool parsers drop the end of the arguments (the closing brace) when the "
    "call's end marker arrives in the same streamed chunk as the last argument tokens "
    "(chunks of 2+ tokens); per-token streaming and the whole parse agree with ours"
)
LLAMA_TEXT_BEFORE_CALL = (
    "vLLM's llama3_json whole parse takes JSON after text as a call and drops the text; its "
    "streaming, like us, reads a call only at the start of the output, so all stays text"
)
UNCLOSED_CALL_RETURNED = (
    "vLLM returns a call whose block never closed, with its partial arguments (not JSON); "
    f"{_AS_CONTENT}"
)
UNCLOSED_CALL_DROPPED = (
    "vLLM's whole parse drops a call block that never closed: content keeps only the text "
    f"before it; {_AS_CONTENT}"
)
EMPTY_BLOCK_DROPPED = (
    f"vLLM drops a tool-call block with no function in it, text and all; {_AS_CONTENT}"
)
VALUELESS_PARAMETER_DROPPED = (
    f"vLLM returns the call without the parameter that has no value; {_AS_CONTENT}"
)
MISTRAL_MARKER_DROPPED = (
    "vLLM's content for a [TOOL_CALLS] block that does not parse drops the marker (and the "
    f"text before it); {_AS_CONTENT}"
)

TEXT_AFTER_CALLS_KEPT = (
    "we keep text after the tool calls as content; vLLM drops it (in some parsers only "
    "when streaming, or only in the whole parse)"
)
WHOLE_MESSAGE_CALLS = (
    "for us the message is calls only when nothing but calls follows the marker: calls "
    "followed by text are all content, with a parse note; vLLM takes the calls and drops "
    "the text (or, streaming, adds it to the arguments)"
)
MARKER_IN_JSON_STRING = (
    "a closing marker inside a JSON string does not end the call for us; vLLM's hermes "
    "cuts the block there (whole: all content; streamed: a call with broken arguments)"
)

THINK_WITHOUT_REASONING_PARSER = (
    "with no reasoning parser named, vLLM leaves a `<think>` block in the content; our hermes "
    "family reads it as reasoning, as every family with `<think>` tags does"
)

EMPTY_ARGUMENTS_STREAMED = (
    'vLLM\'s streaming sends a call without arguments with arguments `""` (not JSON), and '
    "DeepSeek's may lose the call when several tokens arrive in one step; we give `{}`, as "
    "vLLM's whole parse does"
)

Mode = Literal["whole", "streamed", "intent"]


def _rows(
    families: Sequence[str], case_ids: Sequence[str], modes: Sequence[Mode], reason: str
) -> dict[tuple[str, Mode], str]:
    return {(f"{f}/{c}", m): reason for f in families for c in case_ids for m in modes}


HERMES = ("qwen3", "qwen3:no-thinking", "qwq-32b", "qwen2.5", "hermes")
ENGINE_XML = ("qwen3-coder", "qwen3.5", "glm-4.7-flash", "minimax-m2")
LLAMA = ("llama3.1", "llama3.2")
DEEPSEEK = ("deepseek-v3.1", "deepseek-v3.1:no-thinking", "deepseek-r1-distill-qwen")
DROPS_UNKNOWN_TOOL = ("glm-4.7-flash", "minimax-m2")
WHOLE_AND_STREAMED: tuple[Mode, ...] = ("whole", "streamed")
LOSES_ARGUMENT_END = {
    "deepseek-v3.1": "one_call content_then_call reasoning_then_call two_calls typed_args "
    "string_lookalikes multiline_string unicode",
    "deepseek-v3.1:no-thinking": "one_call content_then_call two_calls typed_args "
    "string_lookalikes unicode",
    "deepseek-r1-distill-qwen": "content_then_call reasoning_then_call string_lookalikes "
    "multiline_string unicode",
}
"""Where vLLM's streaming happens to split a deepseek call's end into one chunk with the
last argument tokens, for the tiny family tokenizers (a new tokenizer moves them)."""

DIFFERENCES: dict[tuple[str, Mode], str] = {
    # What vLLM makes of the written scenario (checked for every family).
    **_rows(DROPS_UNKNOWN_TOOL, ["unknown_tool"], ["intent"], UNKNOWN_TOOL_DROPPED),
    **_rows(LLAMA, ["content_then_call"], ["intent"], LLAMA_TEXT_BEFORE_CALL),
    ("pythonic/content_then_call", "intent"): PYTHONIC_TEXT_BEFORE_CALL,
    # Our parse against vLLM's (checked for the families in the registry).
    **_rows(
        [f.label for f in FAMILIES_UNDER_TEST if f.name not in DROPS_UNKNOWN_TOOL],
        ["unknown_tool"],
        WHOLE_AND_STREAMED,
        UNKNOWN_TOOL_KEPT,
    ),
    **_rows(DROPS_UNKNOWN_TOOL, ["unknown_tool"], WHOLE_AND_STREAMED, UNKNOWN_TOOL_DROPPED),
    **_rows(HERMES, ["unclosed_call", "broken_json"], ["streamed"], STREAM_SENDS_BROKEN_CALL),
    **_rows(ENGINE_XML, ["unclosed_call"], WHOLE_AND_STREAMED, UNCLOSED_CALL_KEPT),
    **_rows(LLAMA, ["content_then_call"], ["whole"], LLAMA_TEXT_BEFORE_CALL),
    **_rows(LLAMA, ["broken_json"], ["streamed"], STREAM_SENDS_BROKEN_CALL),
    **_rows(
        ("pythonic",), ["unclosed_call", "positional"], ["streamed"], (STREAM_SENDS_BROKEN_CALL)
    ),
    **_rows(
        ("deepseek-v3.1", "deepseek-r1-distill-qwen"),
        ["unclosed_call"],
        ["streamed"],
        STREAM_SENDS_BROKEN_CALL,
    ),
    **_rows(
        ("deepseek-v3.1", "deepseek-r1-distill-qwen"),
        ["unclosed_call"],
        ["whole"],
        (UNCLOSED_CALL_DROPPED),
    ),
    **_rows(
        ("gpt-oss", "kimi-k2", "kimi-k2-thinking", "ministral-3-reasoning"),
        ["unclosed_call"],
        WHOLE_AND_STREAMED,
        UNCLOSED_CALL_RETURNED,
    ),
    **_rows(
        ("deepseek-v3.1", "gpt-oss", "kimi-k2", "ministral-3-reasoning"),
        ["broken_json"],
        WHOLE_AND_STREAMED,
        NON_JSON_ARGUMENTS_KEPT,
    ),
    **_rows(("qwen3-coder", "qwen3.5"), ["no_function"], WHOLE_AND_STREAMED, EMPTY_BLOCK_DROPPED),
    **_rows(("glm-4.7-flash",), ["no_value"], WHOLE_AND_STREAMED, VALUELESS_PARAMETER_DROPPED),
    **_rows(("mistral-nemo",), ["unclosed_call", "broken_json"], ["whole"], MISTRAL_MARKER_DROPPED),
    **{
        (f"{label}/{case_id}", "streamed"): STREAM_LOSES_ARGUMENT_END
        for label, case_ids in LOSES_ARGUMENT_END.items()
        for case_id in case_ids.split()
    },
    **_rows(
        ("mistral-nemo",), ["unclosed_call", "broken_json"], ["streamed"], STREAM_SENDS_BROKEN_CALL
    ),
    **_rows(HERMES, ["marker_in_string"], WHOLE_AND_STREAMED, MARKER_IN_JSON_STRING),
    **_rows(
        (*HERMES, "kimi-k2", "kimi-k2-thinking", *DEEPSEEK),
        ["text_after_call"],
        WHOLE_AND_STREAMED,
        TEXT_AFTER_CALLS_KEPT,
    ),
    **_rows(ENGINE_XML, ["text_after_call"], ["whole"], TEXT_AFTER_CALLS_KEPT),
    **_rows(
        (*LLAMA, "ministral-3-reasoning", "mistral-nemo"),
        ["text_after_call"],
        WHOLE_AND_STREAMED,
        WHOLE_MESSAGE_CALLS,
    ),
    ("pythonic/text_after_call", "streamed"): WHOLE_MESSAGE_CALLS,
    **_rows(
        (*LLAMA, "deepseek-v3.1", "deepseek-v3.1:no-thinking"),
        ["no_arguments"],
        ["streamed"],
        EMPTY_ARGUMENTS_STREAMED,
    ),
    **_rows(("hermes",), ["think_block"], WHOLE_AND_STREAMED, THINK_WITHOUT_REASONING_PARSER),
}
"""(case key, mode) → why our parser (or vLLM's reading of the written text, for "intent")
differs from vLLM there. "streamed": vLLM's streamed result differs from ours for some
chunk size; "intent": vLLM's whole parse does not read the scenario as meant. Both sides'
exact output on every case named here is pinned in `PINS`."""

# ---------------------------------------------------------------- our side


@dataclass(frozen=True)
class Ours:
    """Our output for one case: the whole parse, and per chunk size what a client of our
    stream ends up with (its deltas folded, plus what the stream's finish sends)."""

    whole: ParsedOutput
    streamed: dict[int, ParsedOutput]


@functools.cache
def _tokenizer(model: str) -> Tokenizer:
    return load_tokenizer(ensure_family_model(model) / "tokenizer.json")


def _context(family: Family) -> ParseContext:
    return ParseContext(
        call_id="vref", starts_in_reasoning=family.starts_in_reasoning, tools=TOOL_SCHEMAS
    )


def _our_stream(case: Case, ids: list[int], chunk: int, whole: ParsedOutput) -> ParsedOutput:
    """The text through the Gateway's stream (`OutputStream`: decoder and splitter) in
    groups of `chunk` tokens, folded as a client does; the finish adds what the stream
    writers' `Sent.rest` adds to what was sent."""
    family = case.family
    stream = OutputStream(
        _tokenizer(family.model or family.name), get_parser(family.name), _context(family)
    )
    sent = Sent()
    for start in range(0, len(ids), chunk):
        for event in stream.feed(ids[start : start + chunk]):
            if isinstance(event, ToolCallDone):
                sent.tool_calls.append(event.call)
            elif event.field == "reasoning":
                sent.reasoning += event.text
            else:
                sent.content += event.text
    reasoning, content, calls = sent.rest(whole, "vref")
    return ParsedOutput(
        reasoning=sent.reasoning + reasoning or None,
        content=sent.content + content or None,
        tool_calls=[*sent.tool_calls, *calls],
    )


def our_output(case: Case) -> Ours:
    family = case.family
    whole = get_parser(family.name).parse(case.text, _context(family))
    tokenizer = _tokenizer(family.model or family.name)
    ids = tokenizer.encode(case.text)
    assert tokenizer.decode(ids) == case.text, f"{case.key}: the tokenizer does not round-trip"
    return Ours(whole, {size: _our_stream(case, ids, size, whole) for size in CHUNK_SIZES})


# ---------------------------------------------------------------- comparison


def _text(value: str | None) -> str | None:
    return (value or "").strip() or None


def _args(raw: str) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return {"<not JSON>": raw}


def _normal(reasoning: str | None, content: str | None, calls: list[tuple[str | None, Any]]):
    return {"reasoning": _text(reasoning), "content": _text(content), "tool_calls": calls}


def ours_normal(parsed: ParsedOutput, ids: bool = False) -> dict[str, Any]:
    out = _normal(
        parsed.reasoning,
        parsed.content,
        [(c.name, _args(c.arguments)) for c in parsed.tool_calls],
    )
    return {**out, "ids": [c.id for c in parsed.tool_calls]} if ids else out


def reference_normal(parse: ReferenceParse, ids: bool = False) -> dict[str, Any]:
    if parse.error is not None:
        return {"vLLM raised": parse.error}
    out = _normal(
        parse.reasoning,
        parse.content,
        [(c.name, _args(c.arguments)) for c in parse.tool_calls],
    )
    return {**out, "ids": [c.id for c in parse.tool_calls]} if ids else out


def intent_normal(scenario: Scenario) -> dict[str, Any]:
    return _normal(
        scenario.reasoning, scenario.content, [(c.name, c.arguments) for c in scenario.calls]
    )


def run_reference() -> dict[str, ReferenceResult]:
    """vLLM's results for every case of every family (and for one case it must refuse
    with a reason rather than crash on), from one subprocess."""
    requests = [
        ReferenceCase(
            tool_parser=case.family.tool_parser,
            reasoning_parser=case.family.reasoning_parser,
            model_dir=ensure_family_model(case.family.model or case.family.name),
            text=case.text,
            tools=TOOLS,
            request_overrides=case.family.request_overrides,
            prompt_text=case.family.prompt_tail or None,
            chunk_sizes=CHUNK_SIZES,
        )
        for case in ALL_CASES
    ]
    requests.append(requests[0].model_copy(update={"tool_parser": UNKNOWN_PARSER}))
    *results, refused = vllm_reference(requests)
    by_key = {case.key: result for case, result in zip(ALL_CASES, results, strict=True)}
    return {**by_key, UNKNOWN_PARSER: refused}


def _verdict(key: str, mode: Mode, differs: bool, detail: str) -> str | None:
    """What is wrong with one comparison, None if nothing: an undocumented difference, or
    a documented one that is gone (how it differs is the pin's to check)."""
    reason = DIFFERENCES.get((key, mode))
    if reason is None:
        return f"{key} ({mode}) differs from vLLM:\n{detail}" if differs else None
    if not differs:
        return f"{key} ({mode}) now agrees with vLLM: drop its row in DIFFERENCES ({reason})"
    return None


def _loaded(result: ReferenceResult, case: Case) -> ReferenceParse:
    assert result.error is None, f"vLLM's parsers did not run for {case.key}:\n{result.error}"
    assert result.whole is not None
    return result.whole


# ---------------------------------------------------------------- pins

PINS = Path(__file__).with_name("parsers_vs_vllm_pins.json")
"""Both sides' exact output on every case `DIFFERENCES` names, keyed by case: so a change
in how a kept difference differs fails `test_exempt_output_is_pinned`. Rewrite it with
`python -m tests.integration.test_parsers_vs_vllm` (vLLM venv needed) and review the diff."""
EXEMPT = {key for key, _ in DIFFERENCES}
EXEMPT_CASES = [case for case in ALL_CASES if case.key in EXEMPT]


def _by_chunk_size(outputs: dict[int, dict[str, Any]]) -> list[dict[str, Any]]:
    """Per chunk size → one entry per distinct output, with the sizes that gave it."""
    groups: list[dict[str, Any]] = []
    for size, output in sorted(outputs.items()):
        same = next((g for g in groups if g["output"] == output), None)
        if same is None:
            groups.append({"chunk_sizes": [size], "output": output})
        else:
            same["chunk_sizes"].append(size)
    return groups


MINTED_ID = re.compile(r"chatcmpl-tool-[0-9a-f]{16}|[A-Za-z0-9]{9}")
"""The random tool-call ids vLLM mints (Mistral's parser: 9 alphanumerics); pinned as
`MINTED`, so a run does not change the pin but a new form of id does."""
MINTED = "<minted by vLLM>"


def _vllm_pin(parse: ReferenceParse, ids_from_text: bool) -> dict[str, Any]:
    out = parse.model_dump(mode="json")
    if not ids_from_text:
        for call in out["tool_calls"]:
            if call["id"] is not None and MINTED_ID.fullmatch(call["id"]):
                call["id"] = MINTED
    return out


def observed_pin(case: Case, ours: Ours, result: ReferenceResult) -> dict[str, Any]:
    """Both sides' exact output for one case: ours whole (with its parse note) and streamed,
    vLLM's whole and streamed (with the exception a parser raised)."""
    ids = case.family.ids_from_text
    return {
        "text": case.text,
        "ours whole": ours.whole.model_dump(mode="json"),
        "ours streamed": _by_chunk_size(
            {
                size: parsed.model_dump(mode="json", exclude={"parse_error"})
                for size, parsed in ours.streamed.items()
            }
        ),
        "vllm whole": _vllm_pin(_loaded(result, case), ids),
        "vllm streamed": _by_chunk_size(
            {size: _vllm_pin(parse, ids) for size, parse in result.streamed.items()}
        ),
    }


def _json_lines(value: Any, indent: str = "") -> str:
    """JSON laid out for review: nested objects and lists indented, each output (and each
    chunk-size group of outputs) on one line."""
    inner = indent + " "
    if isinstance(value, dict) and not {"tool_calls", "output"} & value.keys():
        items = [f"{inner}{json.dumps(k)}: {_json_lines(v, inner)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + f"\n{indent}}}"
    if isinstance(value, list) and value and isinstance(value[0], dict):
        items = [inner + _json_lines(v, inner) for v in value]
        return "[\n" + ",\n".join(items) + f"\n{indent}]"
    return json.dumps(value, ensure_ascii=False)


def write_pins() -> None:
    results = run_reference()
    pins = {
        case.key: observed_pin(case, our_output(case), results[case.key]) for case in EXEMPT_CASES
    }
    PINS.write_text(_json_lines(pins) + "\n", encoding="utf-8")
    print(f"wrote {len(pins)} pinned cases to {PINS}")


@functools.cache
def _pinned() -> dict[str, Any]:
    return json.loads(PINS.read_text(encoding="utf-8")) if PINS.exists() else {}


# ---------------------------------------------------------------- tests


@pytest.fixture(scope="module")
def reference() -> dict[str, ReferenceResult]:
    return run_reference()


@pytest.fixture(scope="module")
def ours() -> dict[str, Ours]:
    return {case.key: our_output(case) for case in ALL_CASES}


def test_every_registered_family_is_compared() -> None:
    compared = {family.name for family in FAMILIES_UNDER_TEST}
    missing = sorted(set(parser_names()) - compared)
    assert not missing, (
        f"families in the parser registry without a row in FAMILIES_UNDER_TEST: {missing}"
    )


@pytest.mark.parametrize("family", FAMILIES_UNDER_TEST, ids=lambda f: f.label)
def test_family_table_matches_parser_selection(family: Family) -> None:
    """The vLLM names each family is compared under are the ones that select it (or the
    family that shares its format, where vLLM's names cannot tell the two apart)."""
    same_format = {"qwen2.5": "hermes", "llama3.2": "llama3.1"}
    selected = family_for(family.tool_parser, family.reasoning_parser, None)
    assert selected == same_format.get(family.name, family.name)


def test_documented_differences_name_cases() -> None:
    keys = {case.key for case in ALL_CASES}
    intents = {case.key for case in ALL_CASES if case.scenario is not None}
    stale = [
        (key, mode)
        for key, mode in DIFFERENCES
        if key not in keys or (mode == "intent" and key not in intents)
    ]
    assert not stale, f"rows for cases that do not exist: {stale}"


def test_pins_are_the_exempt_cases() -> None:
    pinned = set(_pinned())
    assert pinned == EXEMPT, (
        f"{PINS.name}: not pinned {sorted(EXEMPT - pinned)}, pinned but not exempt "
        f"{sorted(pinned - EXEMPT)}; rewrite it with `python -m {__name__}` and review the diff"
    )


def test_a_broken_reference_fails_with_its_output() -> None:
    """The project's python cannot import vLLM: the helper says so instead of returning
    half the results."""
    case = ReferenceCase(
        tool_parser="hermes", reasoning_parser=None, model_dir=Path("."), text="hi"
    )
    with pytest.raises(VllmReferenceFailed, match="No module named 'vllm'"):
        vllm_reference([case], python=Path(sys.executable))


def test_reference_reports_an_unknown_parser(reference: dict[str, ReferenceResult]) -> None:
    refused = reference[UNKNOWN_PARSER]
    assert refused.whole is None
    assert refused.error is not None and UNKNOWN_PARSER in refused.error


@pytest.mark.parametrize("case", ALL_CASES, ids=lambda c: c.key)
def test_vllm_reads_the_written_format(case: Case, reference: dict[str, ReferenceResult]) -> None:
    """The writers write what vLLM's parsers read as the scenario (else the comparison
    below would compare two readings of a text neither family would produce)."""
    whole = _loaded(reference[case.key], case)
    if case.scenario is None:
        return
    got = reference_normal(whole)
    want = intent_normal(case.scenario)
    problem = _verdict(case.key, "intent", got != want, f"vLLM: {got}\nmeant: {want}")
    assert problem is None, problem


@pytest.mark.parametrize("case", ALL_CASES, ids=lambda c: c.key)
def test_parse_matches_vllm(
    case: Case, reference: dict[str, ReferenceResult], ours: dict[str, Ours]
) -> None:
    """Our whole parse against vLLM's, and per chunk size our stream against vLLM's."""
    assert case.family.name in FAMILIES, f"family {case.family.name!r} has no parser"
    result = reference[case.key]
    mine = ours[case.key]
    ids = case.family.ids_from_text
    our_whole = ours_normal(mine.whole, ids=ids)
    whole = reference_normal(_loaded(result, case), ids=ids)
    assert sorted(result.streamed) == CHUNK_SIZES
    streamed = {
        size: (our_streamed, got)
        for size, parse in sorted(result.streamed.items())
        if (got := reference_normal(parse, ids=ids))
        != (our_streamed := ours_normal(mine.streamed[size], ids=ids))
    }
    problems = [
        _verdict(case.key, "whole", our_whole != whole, f"ours: {our_whole}\nvLLM: {whole}"),
        _verdict(
            case.key,
            "streamed",
            bool(streamed),
            "\n".join(
                f"in chunks of {k}:\n  ours: {mine_k}\n  vLLM: {theirs}"
                for k, (mine_k, theirs) in streamed.items()
            ),
        ),
    ]
    failed = [p for p in problems if p is not None]
    assert not failed, "\n\n".join(failed)


@pytest.mark.parametrize("case", EXEMPT_CASES, ids=lambda c: c.key)
def test_exempt_output_is_pinned(
    case: Case, reference: dict[str, ReferenceResult], ours: dict[str, Ours]
) -> None:
    """A kept difference keeps its form: both sides' exact output (whole and streamed, not
    normalised) is what `PINS` recorded; a change on either side fails here."""
    pinned = _pinned().get(case.key)
    assert pinned is not None, f"{case.key} is exempt but not pinned in {PINS.name}"
    seen = observed_pin(case, ours[case.key], reference[case.key])
    changed = [
        f"{part}:\n  pinned: {json.dumps(pinned.get(part), ensure_ascii=False)}\n"
        f"  now:    {json.dumps(now, ensure_ascii=False)}"
        for part, now in seen.items()
        if pinned.get(part) != now
    ]
    reasons = "; ".join(sorted({why for (key, _), why in DIFFERENCES.items() if key == case.key}))
    assert not changed, (
        f"{case.key} ({reasons}) changed; if on purpose, rewrite {PINS.name} with "
        f"`python -m {__name__}`:\n" + "\n".join(changed)
    )


if __name__ == "__main__":
    write_pins()
