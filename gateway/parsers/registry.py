"""Output parsers by name: each model family is one module behind this registry.

A gateway process is started with a parser name (`--parser`); adding a family is its
module (`gateway/parsers/<family>.py`, implementing `base.OutputParser`) plus its
registrations in `FAMILIES` below. Nothing else in the Gateway names a family.
"""

from __future__ import annotations

from collections.abc import Callable

from gateway.parsers.base import OutputParser
from gateway.parsers.hermes import HermesParser

FAMILIES: dict[str, Callable[[], OutputParser]] = {
    "qwen3": lambda: HermesParser("qwen3"),
    "hermes": lambda: HermesParser("hermes"),
}
"""Parser name → factory of a fresh parser."""


def register_parser(name: str, factory: Callable[[], OutputParser]) -> None:
    """Register a parser factory under a model-family name (e.g. "qwen3")."""
    FAMILIES[name] = factory


def get_parser(name: str) -> OutputParser:
    try:
        factory = FAMILIES[name]
    except KeyError:
        raise KeyError(f"unknown output parser {name!r}; known: {sorted(FAMILIES)}") from None
    return factory()


def parser_names() -> list[str]:
    return sorted(FAMILIES)
