"""Which family parses a model: read from its real chat template, or named with vLLM's
parser flags; a wrong name stops with the names that would work."""

from pathlib import Path

import pytest

from devstack.tiny_model.template import chat_template_text
from gateway.parsers.registry import get_parser
from gateway.parsers.selection import (
    VLLM_TOOL_CALL_PARSERS,
    ParserSelectionError,
    detect_family,
    family_for,
    parser_for_model,
)
from tests.fixtures.real_templates import real_template_text, real_templates_dir

TEMPLATES = sorted(p.stem for p in real_templates_dir().glob("*.jinja"))


@pytest.mark.parametrize("name", TEMPLATES)
def test_each_real_template_is_recognised_as_its_own_family(name: str) -> None:
    """Templates of one parser lineage may share a parser, but detection names the
    template's own family, except llama3.1/3.2 and qwen3/qwq, told apart by markers."""
    assert detect_family(real_template_text(name)) == name


def test_our_tiny_model_is_a_qwen3() -> None:
    assert detect_family(chat_template_text()) == "qwen3"


def test_an_unknown_template_is_not_guessed() -> None:
    assert detect_family("{{ messages[0].content }}") is None
    with pytest.raises(ParserSelectionError, match="--tool-call-parser"):
        family_for(None, None, None)


@pytest.mark.parametrize(
    ("tool", "reasoning", "family"),
    [
        ("hermes", "qwen3", "qwen3"),
        ("hermes", None, "hermes"),
        ("hermes", "deepseek_r1", "qwq-32b"),
        ("qwen3_coder", None, "qwen3-coder"),
        ("qwen3_coder", "qwen3", "qwen3.5"),
        ("glm47", "glm45", "glm-4.7-flash"),
        ("openai", "openai_gptoss", "gpt-oss"),
        ("kimi_k2", "kimi_k2", "kimi-k2-thinking"),
        ("deepseek_v31", "deepseek_v3", "deepseek-v3.1"),
        ("llama3_json", None, "llama3.1"),
        ("mistral", "mistral", "ministral-3-reasoning"),
        ("minimax_m2", "minimax_m2", "minimax-m2"),
    ],
)
def test_vllm_flag_pairs_name_a_family(tool: str, reasoning: str | None, family: str) -> None:
    assert family_for(tool, reasoning, detected="qwen3") == family


def test_a_reasoning_parser_alone_keeps_a_detected_family_it_fits() -> None:
    assert family_for(None, "qwen3", detected="qwen3.5") == "qwen3.5"
    assert family_for(None, "glm45", detected="qwen3") == "glm-4.7-flash"


def test_unknown_names_stop_with_the_known_ones() -> None:
    with pytest.raises(ParserSelectionError, match=r"unknown --tool-call-parser 'nope'.*hermes"):
        family_for("nope", None, None)
    with pytest.raises(ParserSelectionError, match=r"unknown --reasoning-parser 'nope'.*qwen3"):
        family_for(None, "nope", None)
    with pytest.raises(ParserSelectionError, match="with it: qwen3"):
        family_for("qwen3_coder", "glm45", None)


def test_every_vllm_pair_points_at_a_detectable_family() -> None:
    """A flag pair never names a family no template signature could also produce, so
    the two ways of choosing agree on the vocabulary."""
    detectable = {detect_family(real_template_text(name)) for name in TEMPLATES}
    for pairs in VLLM_TOOL_CALL_PARSERS.values():
        for family in pairs.values():
            assert family in detectable | {"hermes", "pythonic"}, family


def test_parser_for_model_adds_the_models_end_markers(tiny_model_dir: Path) -> None:
    parser = parser_for_model(chat_template_text(), ["<|im_end|>", "<|custom_stop|>"])
    assert parser.name == "qwen3"
    assert parser.end_markers.count("<|im_end|>") == 1 and "<|custom_stop|>" in parser.end_markers
    assert "<|custom_stop|>" not in get_parser("qwen3").end_markers
    with pytest.raises(ParserSelectionError, match="either with --family"):
        parser_for_model("", family="qwen3", tool_call_parser="hermes")
