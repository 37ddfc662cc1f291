"""Text ↔ token ids: the `Tokenizer` protocol the planner needs, and its tokenizer.json form."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import tokenizers

__all__ = ["Tokenizer", "TokenizersAdapter", "load_tokenizer"]


class Tokenizer(Protocol):
    """Text ↔ ids. `encode` must recognise added/special tokens written in the text."""

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


class TokenizersAdapter:
    """A `tokenizers.Tokenizer` (tokenizer.json) as a `Tokenizer`.

    No special tokens are added on encode: the chat template writes BOS itself, as
    transformers' `apply_chat_template(tokenize=True)` assumes. Encoding goes through
    `encode_batch_fast`, which skips the character offsets `encode` computes and nothing
    here reads: the same ids for a fifth less CPU.
    """

    def __init__(self, tokenizer: tokenizers.Tokenizer) -> None:
        self._tok = tokenizer

    @classmethod
    def from_file(cls, path: str | Path) -> TokenizersAdapter:
        return cls(tokenizers.Tokenizer.from_file(str(path)))

    def encode(self, text: str) -> list[int]:
        return self._tok.encode_batch_fast([text], add_special_tokens=False)[0].ids

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=False)


def load_tokenizer(path: str | Path) -> TokenizersAdapter:
    """The `Tokenizer` for a tokenizer.json file."""
    return TokenizersAdapter.from_file(path)
