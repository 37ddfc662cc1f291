"""ChatTemplate: transformers rendering semantics, message conversion, the input probe."""

from __future__ import annotations

import hashlib
import json
from datetime import datetime

import pytest

from devstack.real_templates import template_names
from gateway.canonical import Message, Tool, ToolCall
from gateway.prompt.chat_template import ChatTemplate, TemplateRenderError, ToolCallStyle
from tests.fixtures.real_templates import real_template_text


def real(name: str, bos: str = "<s>", eos: str = "</s>") -> ChatTemplate:
    text = real_template_text(name)
    return ChatTemplate(text, bos_token=bos, eos_token=eos, clock=lambda: datetime(2025, 1, 2))


def tiny(text: str, **kwargs: object) -> ChatTemplate:
    return ChatTemplate(text, bos_token="<s>", eos_token="</s>", **kwargs)  # type: ignore[arg-type]


USER = Message(role="user", content="hi")
CALL = ToolCall(id="call00001", name="get_weather", arguments='{"city": "Paris"}')
TOOL = Tool(name="get_weather", description="Weather.", parameters={"type": "object"})


# -- environment ----------------------------------------------------------------------


def test_tojson_accepts_transformers_kwargs_and_does_not_escape() -> None:
    t = tiny(
        "{{ messages[0].content | tojson }}|"
        "{{ {'b': 1, 'a': '<é>'} | tojson(sort_keys=True, indent=1) }}"
    )
    out = t.render([Message(role="user", content="<b>ü</b>")], add_generation_prompt=False)
    assert out == '"<b>ü</b>"|' + json.dumps({"a": "<é>", "b": 1}, indent=1, ensure_ascii=False)
    t = tiny("{{ [1, 2] | tojson(separators=(',', ':'), ensure_ascii=True) }}")
    assert t.render([USER], add_generation_prompt=False) == "[1,2]"


def test_trim_and_lstrip_blocks_and_loop_controls() -> None:
    text = (
        "{% for m in messages %}\n    {% if loop.index > 1 %}{% break %}{% endif %}\n"
        "[{{ m.content }}]\n{% endfor %}\n"
    )
    out = tiny(text).render([USER, USER], add_generation_prompt=False)
    assert out == "[hi]\n"


def test_strftime_now_uses_the_injected_clock() -> None:
    t = tiny("{{ strftime_now('%d %b %Y') }}", clock=lambda: datetime(2024, 7, 26))
    assert t.render([USER]) == "26 Jul 2024"


def test_raise_exception_becomes_template_render_error_with_its_message() -> None:
    t = tiny("{{ raise_exception('Roles must alternate!') }}")
    with pytest.raises(TemplateRenderError, match="Roles must alternate!"):
        t.render([USER])


def test_python_errors_inside_templates_become_template_render_errors() -> None:
    t = tiny("{{ messages[0].content + 1 }}")
    with pytest.raises(TemplateRenderError, match="TypeError"):
        t.render([USER])


def test_syntax_error_is_reported_at_construction() -> None:
    with pytest.raises(TemplateRenderError, match="syntax"):
        tiny("{% for m in messages %}")


def test_version_is_sha256_of_the_text_and_none_bos_renders_empty() -> None:
    text = "{{ bos_token }}[{{ eos_token }}]{{ add_generation_prompt }}"
    t = ChatTemplate(text, bos_token=None, eos_token="</s>")
    assert t.version == hashlib.sha256(text.encode()).hexdigest()
    assert t.render([USER], add_generation_prompt=True) == "[</s>]True"


def test_template_kwargs_and_extra_context_reach_the_template() -> None:
    t = tiny(
        "{{ who }}/{{ enable_thinking }}", extra_context={"who": "ctx", "enable_thinking": True}
    )
    assert t.render([USER]) == "ctx/True"
    assert t.render([USER], enable_thinking=False) == "ctx/False"


def test_no_tools_is_passed_as_none() -> None:
    t = tiny("{{ tools is none }}")
    assert t.render([USER]) == "True"
    assert t.render([USER], [TOOL]) == "False"


# -- conversion -----------------------------------------------------------------------


def test_message_conversion_shapes() -> None:
    t = tiny("{{ messages | tojson }}|{{ tools | tojson }}{# reasoning_content thinking #}")
    messages = [
        Message(role="user", content=None),
        Message(role="assistant", content=None, reasoning="hmm", tool_calls=[CALL]),
        Message(role="tool", content="sunny", tool_call_id="call00001", name="get_weather"),
        Message(role="assistant", content="done"),
    ]
    rendered, tools = t.render(messages, [TOOL]).split("|")
    user, call, tool, answer = json.loads(rendered)
    assert user == {"role": "user", "content": ""}
    assert call == {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": "call00001",
                "type": "function",
                "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
            }
        ],
        "reasoning_content": "hmm",
        "thinking": "hmm",
    }
    assert tool == {
        "role": "tool",
        "content": "sunny",
        "tool_call_id": "call00001",
        "name": "get_weather",
    }
    assert answer == {"role": "assistant", "content": "done"}  # no empty keys
    assert json.loads(tools) == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Weather.",
                "parameters": {"type": "object"},
            },
        }
    ]


def test_reasoning_is_only_passed_in_fields_the_template_reads() -> None:
    t = tiny("{{ messages[0] | tojson }}")
    out = json.loads(t.render([Message(role="assistant", content="x", reasoning="r")]))
    assert out == {"role": "assistant", "content": "x"}


def test_arguments_that_are_not_a_json_object_stay_text_for_dict_templates() -> None:
    t = tiny("{{ messages }}")
    calls = [
        CALL.model_copy(update={"arguments": "not json"}),
        CALL.model_copy(update={"arguments": ""}),
        CALL.model_copy(update={"arguments": "[1]"}),
    ]
    style = ToolCallStyle(content_none=False, arguments_as_dict=True)
    dicts = t.message_dicts([Message(role="assistant", tool_calls=calls)], style)
    assert [c["function"]["arguments"] for c in dicts[0]["tool_calls"]] == ["not json", {}, "[1]"]


# -- probe ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "content_none", "as_dict", "via_ids"),
    [
        ("qwen3", False, True, False),  # content None crashes it
        ("qwen3.5", False, True, False),  # string arguments crash `|items`
        ("deepseek-v3.1", False, False, False),  # dict arguments crash string concatenation
        ("deepseek-r1-distill-qwen", True, False, False),  # drops tool calls unless None
        ("glm-4.7-flash", False, True, False),  # None would render as the text "None"
        ("minimax-m2", False, True, False),
        ("llama3.1", False, True, False),  # string arguments get JSON-encoded twice
        ("gpt-oss", False, True, False),
        ("mistral-nemo", False, True, False),
        ("kimi-k2-thinking", False, True, True),  # renders a call by its id only
    ],
)
def test_probe_picks_the_variant_each_real_template_needs(
    name: str, content_none: bool, as_dict: bool, via_ids: bool
) -> None:
    t = real(name)
    assert t.supports_tools
    assert t.tool_call_style == ToolCallStyle(content_none=content_none, arguments_as_dict=as_dict)
    assert t.tool_names_via_ids is via_ids


PUBLISHED_TEMPLATES = 16
"""Real templates in the manifest (devstack/chat_template_sources.json); more may be added."""


def test_every_real_template_renders_a_tool_conversation_after_normalisation() -> None:
    names = template_names()
    assert len(names) >= PUBLISHED_TEMPLATES, names
    for name in names:
        t = real(name)
        messages = [
            Message(role="system", content="sys"),
            Message(role="user", content="weather?"),
            Message(role="assistant", content=None, tool_calls=[CALL]),
            Message(role="tool", content="sunny", tool_call_id="call00001"),
        ]
        out = t.render(messages, [TOOL], add_generation_prompt=True)
        assert "Paris" in out, name


def test_template_without_tool_calls_does_not_support_tools() -> None:
    t = tiny("{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}")
    assert not t.supports_tools
    assert t.tool_call_style == ToolCallStyle(content_none=False, arguments_as_dict=True)


def test_real_template_errors_carry_the_templates_own_message() -> None:
    no_user = [Message(role="system", content="only a system prompt")]
    with pytest.raises(TemplateRenderError, match="No user query found"):
        real("qwen3.5").render(no_user)
    bad_id = [
        USER,
        Message(role="assistant", tool_calls=[CALL.model_copy(update={"id": "x"})]),
    ]
    with pytest.raises(TemplateRenderError, match="length 9"):
        real("mistral-nemo").render(bad_id, [TOOL])


def test_forcing_the_wrong_variant_fails_where_sources_say_it_does() -> None:
    t = real("deepseek-v3.1")
    wrong = ToolCallStyle(content_none=False, arguments_as_dict=True)
    messages = t.message_dicts([USER, Message(role="assistant", tool_calls=[CALL])], wrong)
    with pytest.raises(TemplateRenderError):
        t.render_dicts(messages, None, True)


def test_enable_thinking_kwarg_reaches_qwen3() -> None:
    out = real("qwen3").render([USER], add_generation_prompt=True, enable_thinking=False)
    assert out.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


# -- system messages after the first --------------------------------------------------

SYSTEM = Message(role="system", content="You are terse.")
ENVIRONMENT = Message(role="system", content="Working directory: /workspace")
ANSWER = Message(role="assistant", content="Sure.")


@pytest.mark.parametrize(
    ("name", "folds"),
    [
        ("qwen3.5", True),  # raise_exception: system message must be at the beginning
        ("mistral-nemo", True),  # raise_exception: only an initial system message
        ("gpt-oss", True),  # renders only the first one: the later text is lost
        ("minimax-m2", True),
        ("deepseek-r1-distill-qwen", True),  # keeps the last one: the earlier text is lost
        ("qwen3", False),  # renders each where it stands
        ("glm-4.7-flash", False),
    ],
)
def test_a_later_system_message_is_folded_where_the_template_would_refuse_or_drop_it(
    name: str, folds: bool
) -> None:
    """Claude Code sends its environment as a system message after the first user turn:
    templates that take one leading system message get both texts in it, in order."""
    t = real(name)
    assert t.one_system_message is folds
    conversation = [SYSTEM, USER, ENVIRONMENT, ANSWER, USER]
    out = t.render(conversation)
    assert out.index("You are terse.") < out.index("Working directory: /workspace")
    folded = Message(role="system", content="You are terse.\n\nWorking directory: /workspace")
    if folds:
        assert out == t.render([folded, USER, ANSWER, USER])
    else:  # rendered where it stands, after the first user turn
        assert out.index("hi") < out.index("Working directory: /workspace") < out.index("Sure.")


def test_folding_gathers_leading_and_later_system_messages_and_keeps_a_lone_one() -> None:
    t = real("qwen3.5")
    codex_like = [SYSTEM, ENVIRONMENT, USER]  # two developer messages first
    assert t.message_dicts(codex_like)[0] == {
        "role": "system",
        "content": "You are terse.\n\nWorking directory: /workspace",
    }
    assert [d["role"] for d in t.message_dicts([USER, ENVIRONMENT, ANSWER])] == [
        "system",
        "user",
        "assistant",
    ]
    assert t.message_dicts([SYSTEM, USER]) == real("qwen3").message_dicts([SYSTEM, USER])


DEVELOPER = Message(role="system", content="Answer in English.", developer=True)


@pytest.mark.parametrize("name", ["qwen3", "glm-4.7-flash", "llama3.1"])
def test_a_developer_message_folds_every_system_message_where_the_template_has_no_developer_role(
    name: str,
) -> None:
    """vLLM's rule: with a developer message in the conversation and no developer role in
    the template, every system message goes, in order, into one leading one (empty ones
    skipped). These templates otherwise render a later system message where it stands."""
    t = real(name)
    assert not t.developer_role and not t.one_system_message
    empty = Message(role="system", content="")
    out = t.render([SYSTEM, USER, DEVELOPER, empty, ANSWER, USER])
    folded = Message(role="system", content="You are terse.\n\nAnswer in English.")
    assert out == t.render([folded, USER, ANSWER, USER])
    # control: the same text as a plain system message stays where it stands
    plain = DEVELOPER.model_copy(update={"developer": False})
    in_place = t.render([SYSTEM, USER, plain, ANSWER, USER])
    assert in_place.index("hi") < in_place.index("Answer in English.") < in_place.index("Sure.")
    # a lone leading developer message is left as it is, as vLLM leaves it
    assert t.render([DEVELOPER, USER]) == t.render([plain, USER])


def test_only_gpt_oss_names_the_developer_role() -> None:
    """vLLM hands a developer message over as such where the template's text names the
    role; of the shipped templates only gpt-oss does (it folds anyway: one system message)."""
    assert [n for n in template_names() if real(n).developer_role] == ["gpt-oss"]
    assert real("gpt-oss").folds_system_messages([SYSTEM, USER])


def test_content_reasoning_and_calls_drop_the_reasoning_where_the_template_refuses_both() -> None:
    """gpt-oss's template refuses content beside `thinking` on a call turn; vLLM renders the
    message (its reasoning field is one that template never reads): so do we, and only
    for that message shape."""
    t = real("gpt-oss")
    assert t.reasoning_beside_content is False
    assert real("qwen3.5").reasoning_beside_content is True
    call = ToolCall(id="call00001", name="probe_lookup_tool", arguments='{"k": "v"}')
    both = Message(
        role="assistant", content="Let me look.", reasoning="I should look.", tool_calls=[call]
    )
    out = t.render([USER, both], add_generation_prompt=False)
    assert "Let me look." in out and "I should look." not in out
    without = both.model_copy(update={"reasoning": None})
    assert out == t.render([USER, without], add_generation_prompt=False)
    only_reasoning = both.model_copy(update={"content": None})
    assert "I should look." in t.render([USER, only_reasoning], add_generation_prompt=False)
