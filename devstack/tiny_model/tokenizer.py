"""Byte-level BPE tokenizer for the tiny model, plus the re-encode divergence finder.

Byte-level BPE (as Qwen uses) so that any text, including CJK, round-trips through bytes,
and so that multi-character merges exist: decoding two single-character tokens and
re-encoding the text yields one merged token. The Gateway records token IDs rather than
text because of exactly that case, so tests need a real example.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable
from pathlib import Path

from pydantic import BaseModel
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS: tuple[str, ...] = (ENDOFTEXT, IM_START, IM_END)
"""Control tokens: special, dropped by ``skip_special_tokens``."""

MARKUP_TOKENS: tuple[str, ...] = (
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
)
"""Single tokens that stay visible in decoded text (non-special), so parsers can see them."""

VOCAB_MULTIPLE = 64
"""The model's embedding rows are the tokenizer size rounded up to this multiple."""

TARGET_VOCAB = 6016
"""Total tokenizer size aimed at: a multiple of 64, so no embedding row lacks a token."""


def train_tokenizer(lines: Iterable[str], target_vocab: int = TARGET_VOCAB) -> Tokenizer:
    """Train the BPE so that BPE vocab + added tokens == ``target_vocab``.

    Making the total a multiple of 64 means the model never samples an ID the tokenizer
    cannot decode (a randomly initialised model samples every ID sooner or later).
    """
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=target_vocab - len(SPECIAL_TOKENS) - len(MARKUP_TOKENS),
        min_frequency=2,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(lines, trainer)
    tokenizer.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS]
    )
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in MARKUP_TOKENS])
    return tokenizer


def padded_vocab_size(tokenizer: Tokenizer) -> int:
    size = tokenizer.get_vocab_size(with_added_tokens=True)
    return -(-size // VOCAB_MULTIPLE) * VOCAB_MULTIPLE


class ReencodeExample(BaseModel):
    """A text with two tokenizations that decode to it; encoding gives ``reencoded_ids``.

    ``sampled_ids`` is what an engine may legitimately sample (one token per character);
    ``reencoded_ids`` is what a text-only pipeline would record after decode -> encode.
    """

    text: str
    sampled_ids: list[int]
    reencoded_ids: list[int]


def _is_cjk(text: str) -> bool:
    return bool(text) and all(unicodedata.name(ch, "").startswith("CJK UNIFIED") for ch in text)


def find_reencode_divergence(
    tokenizer: Tokenizer | str | Path, preferred: tuple[str, ...] = ("天气", "北京")
) -> ReencodeExample:
    """Find a CJK text whose per-character token sequence re-encodes to fewer tokens.

    Tries ``preferred`` first, then scans the vocabulary for any merged CJK token whose
    characters are each a single token. Raises ``LookupError`` if none exists.
    """
    if not isinstance(tokenizer, Tokenizer):
        tokenizer = Tokenizer.from_file(str(tokenizer))
    decoded = {
        tid: tokenizer.decode([tid])
        for tid in range(tokenizer.get_vocab_size(with_added_tokens=False))
    }
    candidates = [*preferred, *sorted({t for t in decoded.values() if len(t) >= 2 and _is_cjk(t)})]
    for text in candidates:
        sampled: list[int] = []
        for ch in text:
            ids = tokenizer.encode(ch, add_special_tokens=False).ids
            if len(ids) != 1:
                break
            sampled.extend(ids)
        else:
            reencoded = tokenizer.encode(text, add_special_tokens=False).ids
            if tokenizer.decode(sampled) == text and reencoded != sampled:
                return ReencodeExample(text=text, sampled_ids=sampled, reencoded_ids=reencoded)
    raise LookupError("tokenizer has no multi-character CJK merge")
