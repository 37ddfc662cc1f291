"""Tools converted once per distinct list, their `tojson` text remembered: renders stay
exactly those of converting and serialising the tools anew on every call."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import pytest

from devstack.real_templates import template_names
from gateway.canonical import Message, Tool
from gateway.prompt.chat_template import ChatTemplate
from gateway.prompt.jinja_env import compile_template, tojson
from gateway.prompt.tool_dicts import ToolDicts, ToolList, _containers, tool_dict, tools_text
from tests.fixtures.real_templates import real_template_text

CLOCK = datetime(2025, 1, 2)


def agent_tools(count: int) -> list[Tool]:
    """Tools shaped like an agent's: long descriptions, nested schemas, enums, numbers."""
    tools = []
    for i in range(count):
        properties: dict[str, Any] = {
            f"arg{j}": {"type": "string", "description": f"Argument {j} of tool {i}: é ü."}
            for j in range(4)
        }
        properties["mode"] = {"type": "string", "enum": ["fast", "safe"], "default": "safe"}
        properties["limit"] = {"type": "number", "minimum": 0.5, "maximum": 1e6}
        properties["paths"] = {"type": "array", "items": {"type": "string"}}
        schema = {"type": "object", "properties": properties, "required": ["arg0"]}
        tools.append(
            Tool(name=f"tool_{i}", description=f"Tool {i} does one thing. " * 8, parameters=schema)
        )
    return tools


def stock_render(text: str, messages: list[Message], tools: list[Tool]) -> str:
    """The reference: a template compiled with the plain `tojson`, tools converted anew."""
    template = ChatTemplate(text, bos_token="<s>", eos_token="</s>", clock=lambda: CLOCK)
    stock = compile_template(text, lambda: CLOCK)
    return stock.render(
        messages=template.message_dicts(messages),
        tools=[tool_dict(t) for t in tools] or None,
        add_generation_prompt=True,
        bos_token="<s>",
        eos_token="</s>",
    )


CONVERSATION = [
    Message(role="system", content="You are an agent."),
    Message(role="user", content="Do the task."),
]


@pytest.mark.parametrize("name", template_names())
def test_renders_from_memory_equal_renders_from_scratch(name: str) -> None:
    text = real_template_text(name)
    template = ChatTemplate(text, bos_token="<s>", eos_token="</s>", clock=lambda: CLOCK)
    tools = agent_tools(15)
    expected = stock_render(text, CONVERSATION, tools)
    first = template.render(CONVERSATION, tools)
    again = template.render(CONVERSATION, [t.model_copy(deep=True) for t in tools])
    assert first == again == expected
    assert template._tools.dicts(tools) is template._tools.dicts(ToolList(agent_tools(15)))


def test_remembered_json_is_served_for_the_same_tools_only() -> None:
    calls: list[Any] = []

    def counting(value: Any, *args: Any) -> str:
        calls.append(value)
        return tojson(value, *args)

    tool_dicts = ToolDicts(counting)
    dicts = tool_dicts.dicts(agent_tools(2))
    assert tool_dicts.tojson(dicts[0]) == tool_dicts.tojson(dicts[0]) == tojson(dicts[0])
    assert len(calls) == 1
    spaced = tool_dicts.tojson(dicts[0], separators=[",", ":"])
    assert (
        spaced
        == tool_dicts.tojson(dicts[0], separators=(",", ":"))
        == json.dumps(dicts[0], ensure_ascii=False, separators=(",", ":"))
    )
    assert len(calls) == 2
    equal_but_other = json.loads(json.dumps(dicts[0]))  # not remembered: serialised each time
    tool_dicts.tojson(equal_but_other)
    tool_dicts.tojson(equal_but_other)
    assert len(calls) == 4


def test_a_tool_changed_after_its_render_renders_changed() -> None:
    template = ChatTemplate(
        real_template_text("qwen3"), bos_token="<s>", eos_token="</s>", clock=lambda: CLOCK
    )
    tools = agent_tools(2)
    template.render(CONVERSATION, tools)
    tools[0].parameters["properties"]["arg0"]["description"] = "changed in place"
    assert "changed in place" in template.render(CONVERSATION, tools)


def test_key_order_and_number_types_are_told_apart() -> None:
    template = ChatTemplate(
        real_template_text("qwen3"), bos_token="<s>", eos_token="</s>", clock=lambda: CLOCK
    )
    variants = [
        Tool(name="t", parameters={"a": 1, "b": 2}),
        Tool(name="t", parameters={"b": 2, "a": 1}),
        Tool(name="t", parameters={"a": 1.0, "b": 2}),
        Tool(name="t", parameters={"a": True, "b": 2}),
        Tool(name="t", description="", parameters={"a": 1, "b": 2}),
    ]
    renders = [template.render(CONVERSATION, [tool]) for tool in variants]
    assert len(set(renders)) == len(variants)
    assert renders == [stock_render(template.text, CONVERSATION, [tool]) for tool in variants]


def test_nan_and_null_share_an_orjson_text_yet_render_apart() -> None:
    nan, null = (Tool(name="t", parameters={"x": value}) for value in (float("nan"), None))
    assert tools_text([nan]) == tools_text([null])  # control: the text alone would merge them
    template = ChatTemplate(
        real_template_text("qwen3"), bos_token="<s>", eos_token="</s>", clock=lambda: CLOCK
    )
    for first, second in ((nan, null), (null, nan)):
        assert template.render(CONVERSATION, [first]) != template.render(CONVERSATION, [second])
        assert template.render(CONVERSATION, [second]) == stock_render(
            template.text, CONVERSATION, [second]
        )


def test_tools_with_null_defaults_are_remembered_too() -> None:
    tool_dicts = ToolDicts(tojson)
    optional = {"type": ["string", "null"], "default": None}
    tools = [Tool(name="t", parameters={"type": "object", "properties": {"o": optional}})]
    first = tool_dicts.dicts(tools)
    assert tool_dicts.dicts([t.model_copy(deep=True) for t in tools]) is first
    assert first == [tool_dict(t) for t in tools]


def test_only_the_last_lists_are_kept() -> None:
    tool_dicts = ToolDicts(tojson, max_lists=2)
    lists = [[Tool(name=f"t{i}", parameters={"n": i})] for i in range(3)]
    first = [tool_dicts.dicts(tools) for tools in lists]
    assert tool_dicts.dicts(lists[2]) is first[2] and tool_dicts.dicts(lists[1]) is first[1]
    assert tool_dicts.dicts(lists[0]) is not first[0]  # dropped, converted again
    assert len(tool_dicts._texts) == 2 * len(_containers(first[0]))
