"""End-of-turn markers: how the planner counts turns in rendered text and in token ids.

The markers are the tokens the engine stops on and the template closes assistant turns
with (e.g. `<|im_end|>`, or gpt-oss `<|end|>`, `<|call|>`, `<|return|>`). Counting them
is how the end of our previous reply is found in a new rendering.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from gateway.prompt.incremental.tokenizer_adapter import Tokenizer

__all__ = ["EndOfTurnMarkers"]


class EndOfTurnMarkers:
    """The markers as text (`texts`) and as token ids (`ids`); each must be one token."""

    def __init__(self, texts: Sequence[str], tokenizer: Tokenizer) -> None:
        self.texts = tuple(texts)
        self.ids = frozenset(_single_token(tokenizer, m) for m in self.texts)
        alternatives = sorted(self.texts, key=len, reverse=True)
        self._pattern = re.compile("|".join(re.escape(m) for m in alternatives))

    def count_ids(self, ids: Iterable[int]) -> int:
        return sum(1 for i in ids if i in self.ids)

    def count_text(self, text: str) -> int:
        return sum(1 for _ in self._pattern.finditer(text))

    def spans(self, text: str, start: int = 0) -> list[tuple[int, int]]:
        """(start, end) of every marker in `text` from `start` on, in order."""
        return [(m.start(), m.end()) for m in self._pattern.finditer(text, start)]

    def closes_turn(self, output_ids: Sequence[int], finished_with_eot: bool) -> bool:
        """Did the engine end the turn itself? Only if its last sampled id is a marker."""
        return bool(finished_with_eot and output_ids and output_ids[-1] in self.ids)


def _single_token(tokenizer: Tokenizer, marker: str) -> int:
    ids = tokenizer.encode(marker)
    if len(ids) != 1:
        raise ValueError(f"end-of-turn marker {marker!r} is not a single token: {ids}")
    return ids[0]
