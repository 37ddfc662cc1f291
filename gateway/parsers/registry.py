"""The model families the Gateway parses: each declares itself (`family.Family`) in its
own module, and this registry lists the modules, one line each.

Adding a family is its module (`gateway/parsers/<family>.py`: its parser, implementing
`base.OutputParser`, and its `FAMILIES` declarations), one line in `SHIPPED` below and a
row in docs/model-families.md. Nothing else in the Gateway names a family.
"""

from __future__ import annotations

from collections.abc import Callable

from gateway.parsers import (
    deepseek,
    glm,
    harmony,
    hermes,
    kimi_k2,
    llama,
    minimax,
    mistral,
    qwen3_coder,
)
from gateway.parsers.base import OutputParser
from gateway.parsers.family import Family


class ParserSelectionError(ValueError):
    """The names given (or the template) do not point at one family; says what would."""


SHIPPED: tuple[Family, ...] = (
    *harmony.FAMILIES,
    *minimax.FAMILIES,
    *glm.FAMILIES,
    *kimi_k2.FAMILIES,
    *deepseek.FAMILIES,
    *qwen3_coder.FAMILIES,
    *mistral.FAMILIES,
    *llama.FAMILIES,
    *hermes.FAMILIES,
)
"""Every shipped family, in the order template detection tries them: a family comes
before every family whose signature its own template also contains."""

FAMILIES: dict[str, Callable[[], OutputParser]] = {
    family.name: family.new_parser for family in SHIPPED
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
