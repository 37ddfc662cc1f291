"""Which family parses a served model's output: detected from its chat template, or named
with vLLM's own parser flags (`--tool-call-parser`, `--reasoning-parser`) so a vLLM
user's command line carries over.

A family here is one chat-template lineage: its tool-call and its reasoning format. vLLM
splits them into two parsers; a (tool-call parser, reasoning parser) pair maps to one
family. The tables below are read from the families' own declarations (`registry`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gateway.parsers.base import OutputParser
from gateway.parsers.family import Family
from gateway.parsers.registry import SHIPPED, ParserSelectionError, get_parser

__all__ = [
    "VLLM_REASONING_PARSERS",
    "VLLM_TOOL_CALL_PARSERS",
    "ParserSelectionError",
    "detect_family",
    "family_for",
    "parser_for_model",
]


def _tool_call_parsers(families: Sequence[Family]) -> dict[str, dict[str | None, str]]:
    table: dict[str, dict[str | None, str]] = {}
    for family in families:
        for tool in family.vllm_tool_parsers:
            pairs = table.setdefault(tool, {})
            for reasoning in family.vllm_reasoning_parsers:
                _claim(pairs, reasoning, family.name, f"the vLLM parsers ({tool!r}, {reasoning!r})")
    return table


def _reasoning_parsers(families: Sequence[Family]) -> dict[str, str]:
    table: dict[str, str] = {}
    for family in families:
        if family.vllm_reasoning_alone:
            for reasoning in filter(None, family.vllm_reasoning_parsers):
                _claim(
                    table, reasoning, family.name, f"the vLLM reasoning parser {reasoning!r} alone"
                )
    return table


def _claim(table: dict[Any, str], key: str | None, family: str, what: str) -> None:
    """Give `key` to `family`; two families declaring the same selection is an error."""
    if table.setdefault(key, family) != family:
        raise ValueError(f"families {table[key]!r} and {family!r} both declare {what}")


VLLM_TOOL_CALL_PARSERS: Mapping[str, Mapping[str | None, str]] = _tool_call_parsers(SHIPPED)
"""vLLM tool-call parser name → {vLLM reasoning parser name or None: our family}."""

VLLM_REASONING_PARSERS: Mapping[str, str] = _reasoning_parsers(SHIPPED)
"""vLLM reasoning parser name → our family, when no tool-call parser is named."""


def family_for(
    tool_call_parser: str | None, reasoning_parser: str | None, detected: str | None
) -> str:
    """The family the flags name; without flags, the one detected from the template.

    A reasoning parser alone keeps the detected family when the two agree (e.g. a Qwen3
    template with `--reasoning-parser qwen3`)."""
    if tool_call_parser is not None:
        pairs = VLLM_TOOL_CALL_PARSERS.get(tool_call_parser)
        if pairs is None:
            raise ParserSelectionError(
                f"unknown --tool-call-parser {tool_call_parser!r}; "
                f"known: {', '.join(sorted(VLLM_TOOL_CALL_PARSERS))}"
            )
        if reasoning_parser not in pairs:
            known = ", ".join(sorted(name for name in pairs if name is not None)) or "none"
            raise ParserSelectionError(
                f"--reasoning-parser {reasoning_parser!r} does not go with --tool-call-parser "
                f"{tool_call_parser!r}; with it: {known} (or no --reasoning-parser)"
            )
        return pairs[reasoning_parser]
    if reasoning_parser is not None:
        if reasoning_parser not in VLLM_REASONING_PARSERS:
            raise ParserSelectionError(
                f"unknown --reasoning-parser {reasoning_parser!r}; "
                f"known: {', '.join(sorted(VLLM_REASONING_PARSERS))}"
            )
        if detected is not None and any(
            pairs.get(reasoning_parser) == detected for pairs in VLLM_TOOL_CALL_PARSERS.values()
        ):
            return detected
        return VLLM_REASONING_PARSERS[reasoning_parser]
    if detected is None:
        raise ParserSelectionError(
            "cannot tell the model family from its chat template; name it with "
            "--tool-call-parser (and --reasoning-parser) as for vLLM, or --family"
        )
    return detected


def detect_family(chat_template: str) -> str | None:
    """The first family (in registry order) whose signature the chat template writes;
    None when none matches."""
    for family in SHIPPED:
        needles = family.signature
        if needles and all(needle in chat_template for needle in needles):
            return family.name
    return None


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
