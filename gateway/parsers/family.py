"""What a model family declares about itself, in its own parser module: its name, its
parser, the strings that identify its chat template and the vLLM parser names that
select it. The registry and the selection read these declarations; nothing else lists
a family's facts. (Its end-of-turn markers are its parser's `end_markers`.)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gateway.parsers.base import OutputParser


@dataclass(frozen=True)
class Family:
    """One model family: a chat-template lineage with one output format."""

    name: str
    """The family's name: its chat template's name in the real-templates manifest."""
    parser: Callable[[str], OutputParser]
    """Builds a fresh parser, given the family's name (a parser class, or a partial of one)."""
    template_signature: tuple[str, ...]
    """Strings its chat templates all contain; () when no template is recognised as it.
    Detection tries the families in registry order and takes the first whose strings
    all appear, so a family whose strings another's template also contains comes first."""
    vllm_parsers: tuple[tuple[str, str | None], ...]
    """The (vLLM `--tool-call-parser`, `--reasoning-parser` or None) pairs that name it."""
    vllm_reasoning_alone: tuple[str, ...] = ()
    """vLLM `--reasoning-parser` names that name it when no tool-call parser is given."""

    def new_parser(self) -> OutputParser:
        return self.parser(self.name)
