"""Output parsers by family: each model family is one module behind this registry.

Adding a family is its module (`gateway/parsers/<family>.py`, implementing
`base.OutputParser`), its registrations in `FAMILIES` below, its vLLM names and template
signature in `selection.py`, and a row in docs/model-families.md. Nothing else in the
Gateway names a family.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from gateway.parsers.base import OutputParser
from gateway.parsers.deepseek import DeepSeekParser
from gateway.parsers.glm import GlmParser
from gateway.parsers.harmony import HarmonyParser
from gateway.parsers.hermes import HermesParser
from gateway.parsers.kimi_k2 import KimiK2Parser
from gateway.parsers.llama import LlamaJsonParser, PythonicParser
from gateway.parsers.minimax import MinimaxParser
from gateway.parsers.mistral import MinistralParser, MistralNemoParser
from gateway.parsers.qwen3_coder import qwen3_5, qwen3_coder
from gateway.parsers.selection import ParserSelectionError, detect_family, family_for

FAMILIES: dict[str, Callable[[], OutputParser]] = {
    "hermes": lambda: HermesParser("hermes"),
    "qwen3": lambda: HermesParser("qwen3"),
    "qwq-32b": lambda: HermesParser("qwq-32b"),
    "qwen2.5": lambda: HermesParser("qwen2.5"),
    "qwen3-coder": qwen3_coder,
    "qwen3.5": qwen3_5,
    "gpt-oss": HarmonyParser,
    "kimi-k2": lambda: KimiK2Parser("kimi-k2"),
    "kimi-k2-thinking": lambda: KimiK2Parser("kimi-k2-thinking", thinking=True),
    "deepseek-v3.1": lambda: DeepSeekParser("deepseek-v3.1"),
    "deepseek-r1-distill-qwen": lambda: DeepSeekParser("deepseek-r1-distill-qwen", fenced=True),
    "glm-4.7-flash": GlmParser,
    "minimax-m2": MinimaxParser,
    "llama3.1": lambda: LlamaJsonParser("llama3.1"),
    "llama3.2": lambda: LlamaJsonParser("llama3.2"),
    "pythonic": lambda: PythonicParser("pythonic"),
    "mistral-nemo": lambda: MistralNemoParser("mistral-nemo"),
    "ministral-3-reasoning": lambda: MinistralParser("ministral-3-reasoning"),
}
"""Family name (a chat template's name) → factory of a fresh parser."""


def register_parser(name: str, factory: Callable[[], OutputParser]) -> None:
    """Register a parser factory under a model-family name (e.g. "qwen3")."""
    FAMILIES[name] = factory


def get_parser(name: str) -> OutputParser:
    try:
        factory = FAMILIES[name]
    except KeyError:
        raise ParserSelectionError(
            f"unknown model family {name!r}; known: {', '.join(sorted(FAMILIES))}"
        ) from None
    return factory()


def parser_names() -> list[str]:
    return sorted(FAMILIES)


def parser_for_model(
    chat_template: str,
    end_of_turn: Sequence[str] = (),
    *,
    family: str | None = None,
    tool_call_parser: str | None = None,
    reasoning_parser: str | None = None,
) -> OutputParser:
    """The parser for a served model: the family named, else the one vLLM's parser names
    point at, else the one its chat template shows. The model's own end-of-turn markers
    (its generation config's stop tokens) join the family's."""
    if family is not None and (tool_call_parser or reasoning_parser):
        raise ParserSelectionError(
            "name the family either with --family or with --tool-call-parser/--reasoning-parser"
        )
    name = family or family_for(tool_call_parser, reasoning_parser, detect_family(chat_template))
    parser = get_parser(name)
    parser.end_markers = tuple(dict.fromkeys((*parser.end_markers, *end_of_turn)))
    return parser
