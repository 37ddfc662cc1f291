"""One streamed call's sampled ids in, stream events out: the ids decoded as they arrive
and the text handed to the parser's splitter (`base.Splitter`, which says why every event
is a prefix of the finished parse).
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.parsers.base import OutputParser, ParseContext, StreamEvent
from gateway.prompt.incremental import Tokenizer


class IncrementalDecoder:
    """Token ids → text deltas. A token that ends inside a multi-byte character decodes to
    U+FFFD on its own, so text is released only once the character is complete, and
    decoded with a few tokens before it so a byte-level tokenizer joins them right."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self._prefix = 0  # start of the window decoded for context
        self._read = 0  # ids up to here are already in the released text

    def feed(self, ids: Sequence[int]) -> str:
        self.ids.extend(ids)
        if len(self.ids) == self._read:
            return ""
        before = self.tokenizer.decode(self.ids[self._prefix : self._read])
        after = self.tokenizer.decode(self.ids[self._prefix :])
        if len(after) <= len(before) or after.endswith("\ufffd"):
            return ""
        self._prefix, self._read = self._read, len(self.ids)
        return after[len(before) :]


class OutputStream:
    """Sampled ids of one call in, stream events out."""

    def __init__(self, tokenizer: Tokenizer, parser: OutputParser, ctx: ParseContext) -> None:
        self.decoder = IncrementalDecoder(tokenizer)
        # A family without an incremental form has no splitter: its output comes at the finish.
        self.splitter = parser.splitter(ctx)

    def feed(self, ids: Sequence[int]) -> list[StreamEvent]:
        text = self.decoder.feed(ids)
        if not text or self.splitter is None:
            return []
        return self.splitter.feed(text)
