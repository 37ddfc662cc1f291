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
    signature: tuple[str, ...]
    """Strings its chat templates all contain; () when no template is recognised as it.
    Detection tries the families in registry order and takes the first whose strings
    all appear."""
    vllm_tool_parsers: tuple[str, ...]
    """vLLM `--tool-call-parser` names that select it, each with any of
    `vllm_reasoning_parsers`."""
    vllm_reasoning_parsers: tuple[str | None, ...] = (None,)
    """vLLM `--reasoning-parser` names that go with those (None: none named)."""
    vllm_reasoning_alone: bool = False
    """Whether one of its reasoning parsers named without a tool-call parser selects it."""

    def new_parser(self) -> OutputParser:
        return self.parser(self.name)
