"""Each family declares its own facts (name, parser, end markers, template signature,
vLLM parser names) and the registry and selection read them: every family says all of
it, and selection answers as it did when the tables were written out by hand."""

from __future__ import annotations

import pytest

from devstack.real_templates import template_names
from devstack.tiny_families import family_names
from gateway.parsers import selection
from gateway.parsers.family import Family
from gateway.parsers.hermes import HermesParser
from gateway.parsers.registry import FAMILIES, SHIPPED
from gateway.parsers.selection import (
    VLLM_REASONING_PARSERS,
    VLLM_TOOL_CALL_PARSERS,
    detect_family,
    family_for,
)
from tests.fixtures.real_templates import real_template_text

EXPECTED_TOOL_CALL_PARSERS = {
    "hermes": {None: "hermes", "qwen3": "qwen3", "deepseek_r1": "qwq-32b"},
    "qwen3_coder": {None: "qwen3-coder", "qwen3": "qwen3.5"},
    "qwen3_xml": {None: "qwen3-coder", "qwen3": "qwen3.5"},
    "glm45": {None: "glm-4.7-flash", "glm45": "glm-4.7-flash", "glm47": "glm-4.7-flash"},
    "glm47": {None: "glm-4.7-flash", "glm45": "glm-4.7-flash", "glm47": "glm-4.7-flash"},
    "openai": {None: "gpt-oss", "openai_gptoss": "gpt-oss"},
    "kimi_k2": {None: "kimi-k2", "kimi_k2": "kimi-k2-thinking"},
    "deepseek_v3": {None: "deepseek-r1-distill-qwen", "deepseek_r1": "deepseek-r1-distill-qwen"},
    "deepseek_v31": {None: "deepseek-v3.1", "deepseek_v3": "deepseek-v3.1"},
    "llama3_json": {None: "llama3.1"},
    "pythonic": {None: "pythonic"},
    "minimax_m2": {None: "minimax-m2", "minimax_m2": "minimax-m2"},
    "mistral": {None: "mistral-nemo", "mistral": "ministral-3-reasoning"},
}
"""vLLM's (tool-call, reasoning) parser pairs → family, as selection answered them before
the families declared them."""

EXPECTED_REASONING_PARSERS = {
    "qwen3": "qwen3",
    "deepseek_r1": "deepseek-r1-distill-qwen",
    "glm45": "glm-4.7-flash",
    "glm47": "glm-4.7-flash",
    "openai_gptoss": "gpt-oss",
    "kimi_k2": "kimi-k2-thinking",
    "deepseek_v3": "deepseek-v3.1",
    "minimax_m2": "minimax-m2",
    "mistral": "ministral-3-reasoning",
}

NAMES = [family.name for family in SHIPPED]


@pytest.mark.parametrize("family", SHIPPED, ids=NAMES)
def test_every_family_declares_all_its_facts(family: Family) -> None:
    parser = family.new_parser()
    assert parser.name == family.name
    assert type(FAMILIES[family.name]()) is type(parser)
    assert parser.end_markers and all(parser.end_markers)
    assert all(family.signature)
    assert family.signature or family.vllm_tool_parsers, "no way to select it"
    for tool in family.vllm_tool_parsers:
        for reasoning in family.vllm_reasoning_parsers:
            assert family_for(tool, reasoning, None) == family.name
    if family.vllm_reasoning_alone:
        for reasoning in filter(None, family.vllm_reasoning_parsers):
            assert family_for(None, reasoning, None) == family.name


def test_family_names_are_unique() -> None:
    assert len(set(NAMES)) == len(NAMES)


def test_the_detectable_families_are_the_shipped_templates_and_tiny_models() -> None:
    """A family recognised from its template has that template in the manifest and a
    tiny-model recipe; one without a signature (hermes, pythonic) is chosen by name."""
    detectable = sorted(family.name for family in SHIPPED if family.signature)
    assert detectable == template_names() == family_names()


def test_the_vllm_tables_are_unchanged() -> None:
    assert {tool: dict(pairs) for tool, pairs in VLLM_TOOL_CALL_PARSERS.items()} == (
        EXPECTED_TOOL_CALL_PARSERS
    )
    assert dict(VLLM_REASONING_PARSERS) == EXPECTED_REASONING_PARSERS


@pytest.mark.parametrize("name", template_names())
def test_selection_answers_are_unchanged_for_every_shipped_template(name: str) -> None:
    """The template alone names its own family, and every flag naming the family of
    its detected lineage selects as the hand-written tables did."""
    detected = detect_family(real_template_text(name))
    assert detected == name
    assert family_for(None, None, detected) == name
    for reasoning, alone in EXPECTED_REASONING_PARSERS.items():
        fits = any(pairs.get(reasoning) == name for pairs in EXPECTED_TOOL_CALL_PARSERS.values())
        assert family_for(None, reasoning, detected) == (name if fits else alone)


def test_two_families_claiming_one_vllm_pair_are_refused() -> None:
    twin = Family("twin", HermesParser, (), vllm_tool_parsers=("hermes",))
    with pytest.raises(ValueError, match=r"'hermes' and 'twin'.*\('hermes', None\)"):
        selection._tool_call_parsers([*SHIPPED, twin])
    alone = Family("twin", HermesParser, (), (), ("qwen3",), vllm_reasoning_alone=True)
    with pytest.raises(ValueError, match=r"'qwen3' and 'twin'.*'qwen3' alone"):
        selection._reasoning_parsers([*SHIPPED, alone])
